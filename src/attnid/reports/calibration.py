"""The interventions' calibration: each calibrated arm's best lr, chosen on seeds of its own
(docs/design.md §6, docs/experiments.md).

An arm compared at ``adamw``'s lr may win or lose only because that lr suits it better or worse. So a
config may list arms to calibrate (``interventions/calibration``): each is trained at its lr times each
of ``lr_factors`` on the calibration's seeds (``<results_dir>/calibration/<arm>/lr<lr>/seed<N>``, none of
them a comparison seed), and then on the comparison seeds at the lr of the **lowest mean final
full-split val loss** (``final_val_loss_full``, the interventions' primary metric, docs/design.md §11.5)
as the arm ``<arm>_best_lr``, compared with its baseline at the baseline's best lr. An lr at which a
calibration run diverged has no mean and is never chosen; between equal means the smaller lr is.

    attnid calibration-table --runs RUN_DIR... --out-dir results/tables [--pending-specs PENDING...]

writes ``calibration.csv`` (:data:`CALIBRATION_COLUMNS`, one row per arm and lr, ``best`` marking the
chosen one) and, from each pending spec the plan wrote for a run at an arm's best lr
(:func:`attnid.plan.runs.read_pending_spec`), that run's spec file with the chosen lr.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.plan.runs import PendingSpec, calibrated_spec_text
from attnid.reports.interventions_table import run_arm_name, run_value
from attnid.training.rundir import find_run_dirs, load_run

CALIBRATION_COLUMNS = ("arm", "case", "lr", "n_seeds", "n_diverged", "mean", "sd", "best", "at_edge")


def calibration_table(runs: Sequence[dict]) -> pd.DataFrame:
    """calibration.csv from the calibration runs' run.json: per arm (in the order the runs come) and lr
    (ascending), the seeds, the diverged ones, the mean and sample sd of the primary metric
    (:data:`attnid.reports.interventions_table.PRIMARY_METRIC`) over the
    seeds (none where a run diverged), ``best``: the lr of the lowest mean, the smaller lr on a tie, and
    ``at_edge``: on the best row, whether that lr is the smallest or largest of the arm's grid, where the
    best may lie beyond it (the grid is then too narrow: docs/experiments.md)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for info in runs:
        if info.get("lr") is None:
            raise UserError(f"{info.get('run_dir')}/run.json has no lr: it is no calibration run")
        groups.setdefault((run_arm_name(info), float(info["lr"])), []).append(info)
    arms = list(dict.fromkeys(arm for arm, _ in groups))
    rows = []
    for arm in arms:
        arm_rows: list[dict] = []
        for lr in sorted(lr for name, lr in groups if name == arm):
            infos = groups[(arm, lr)]
            values = np.array([run_value(info) for info in infos])
            diverged = int(np.isnan(values).sum())
            arm_rows.append(
                {
                    "arm": arm,
                    "case": str(infos[0].get("case")),
                    "lr": lr,
                    "n_seeds": len(infos),
                    "n_diverged": diverged,
                    "mean": float(values.mean()) if not diverged else math.nan,
                    "sd": float(values.std(ddof=1)) if not diverged and len(values) > 1 else math.nan,
                    "best": False,
                    "at_edge": False,
                }
            )
        finished = [row for row in arm_rows if math.isfinite(row["mean"])]
        if finished:
            best = min(finished, key=lambda row: (row["mean"], row["lr"]))
            best["best"] = True
            best["at_edge"] = len(arm_rows) > 1 and best in (arm_rows[0], arm_rows[-1])
        rows += arm_rows
    return pd.DataFrame(rows, columns=list(CALIBRATION_COLUMNS))


def best_lrs(table: pd.DataFrame) -> dict[str, float]:
    """{arm: its chosen lr} from calibration.csv's ``best`` rows."""
    best = table[table["best"].astype(bool)]
    return dict(zip(best["arm"], best["lr"].astype(float), strict=True))


def calibrated_spec_texts(
    pending: Sequence[PendingSpec], best: dict[str, float], arms: Sequence[str]
) -> dict:
    """{spec file: its text} of each pending calibrated run at its arm's best lr (``best``); an arm without
    calibration runs (not among ``arms``), or whose every lr diverged, is one line."""
    texts = {}
    for spec in pending:
        if spec.best_lr_of not in arms:
            raise UserError(
                f"{spec.run_dir} takes the best lr of arm {spec.best_lr_of}, which has no calibration runs "
                f"among those given ({', '.join(arms) or 'none'})"
            )
        if spec.best_lr_of not in best:
            raise UserError(
                f"arm {spec.best_lr_of}: a calibration run diverged at every lr of its grid, so it has no "
                f"best lr; widen interventions/calibration/lr_factors towards smaller lrs"
            )
        texts[spec.spec_file] = calibrated_spec_text(spec, best[spec.best_lr_of])
    return texts


def write_calibration(
    runs_dir: str | Path | None,
    out_dir: str | Path,
    runs: list[str] | None = None,
    pending: Sequence[PendingSpec] = (),
) -> tuple[pd.DataFrame, list[str]]:
    """Gather the listed calibration runs (or every run under ``runs_dir``), write calibration.csv into
    ``out_dir`` and the spec file of each ``pending`` run at its arm's best lr; returns the table and the
    spec files written."""
    infos = [load_run(run_dir)[0] for run_dir in find_run_dirs(runs_dir, runs)]
    if not infos:
        raise UserError(f"no calibration runs (run.json) under {runs_dir}; run the training jobs first")
    table = calibration_table(infos)
    texts = calibrated_spec_texts(pending, best_lrs(table), list(dict.fromkeys(table["arm"])))
    write_csv_atomic(Path(out_dir) / "calibration.csv", table)
    for path, text in texts.items():
        write_text_atomic(path, text)
    return table, list(texts)
