"""The interventions' calibration: each calibrated arm's best lr, chosen on seeds of its own
(docs/design.md §6, docs/experiments.md).

An arm compared at ``adamw``'s lr may win or lose only because that lr suits it better or worse. So a
config may list arms to calibrate (``interventions/calibration``): each is trained at its lr times each
of ``lr_factors`` on the calibration's seeds (``<results_dir>/calibration/<arm>/lr<lr>/seed<N>``, none of
them a comparison seed), and then on the comparison seeds at the lr of the **lowest mean final
full-split val loss** (``final_val_loss_full``, the interventions' primary metric, docs/design.md §11.5)
as the arm ``<arm>_best_lr``, compared with its baseline at the baseline's best lr. An lr at which a
calibration run diverged has no mean and is never chosen; between equal means the smaller lr is. In two
rounds (:mod:`attnid.plan.rounds`): round 1 the whole grid, round 2 (``--refine-runs``) the arm's best
lrs of round 1 on more seeds, and the pick is the lowest mean over both rounds' seeds at those lrs.

    attnid calibration-table --runs RUN_DIR... [--refine-runs RUN_DIR...] --out-dir results/tables
                             [--pending-specs PENDING...]

writes ``calibration.csv`` (:data:`CALIBRATION_COLUMNS`, one row per round, arm and lr, ``round_best``
marking each round's lowest mean and ``best`` the final pick), ``calibration_picks.csv`` (each arm's
final pick, round 1's and that of round 1's first seed alone: the robustness variants' lrs,
:data:`attnid.plan.rounds.PICK_COLUMNS`) and, from each pending spec the plan wrote
(:func:`attnid.plan.runs.read_pending_spec`), that run's spec file with its lr: the final pick, or for a
round-2 run the lr of its rank in round 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.plan.rounds import FINAL, ONE_SEED, PICK_COLUMNS, ROUND_ONE
from attnid.plan.runs import PendingSpec, calibrated_spec_text
from attnid.reports.interventions_table import run_arm_name, run_value
from attnid.training.rundir import find_run_dirs, load_run

CALIBRATION_COLUMNS = (
    "round", "arm", "case", "lr", "n_seeds", "n_diverged", "mean", "sd", "round_best", "best", "at_edge"
)  # fmt: skip


def _grouped(runs: Sequence[dict]) -> dict[tuple[str, float], list[dict]]:
    groups: dict[tuple[str, float], list[dict]] = {}
    for info in runs:
        if info.get("lr") is None:
            raise UserError(f"{info.get('run_dir')}/run.json has no lr: it is no calibration run")
        groups.setdefault((run_arm_name(info), float(info["lr"])), []).append(info)
    return groups


def _round_rows(round_number: int, arm: str, groups: dict[tuple[str, float], list[dict]]) -> list[dict]:
    """One round's rows of an arm, lr ascending, ``round_best`` on the lowest finite mean (the smaller lr
    on a tie)."""
    rows: list[dict] = []
    for lr in sorted(lr for name, lr in groups if name == arm):
        infos = groups[(arm, lr)]
        values = np.array([run_value(info) for info in infos])
        diverged = int(np.isnan(values).sum())
        rows.append(
            {
                "round": round_number,
                "arm": arm,
                "case": str(infos[0].get("case")),
                "lr": lr,
                "n_seeds": len(infos),
                "n_diverged": diverged,
                "mean": float(values.mean()) if not diverged else math.nan,
                "sd": float(values.std(ddof=1)) if not diverged and len(values) > 1 else math.nan,
                "round_best": False,
                "best": False,
                "at_edge": False,
            }
        )
    finished = [row for row in rows if math.isfinite(float(row["mean"]))]
    if finished:
        min(finished, key=lambda row: (row["mean"], row["lr"]))["round_best"] = True
    return rows


def calibration_table(runs: Sequence[dict], refine_runs: Sequence[dict] = ()) -> pd.DataFrame:
    """calibration.csv from the calibration runs' run.json: per arm (in the order the runs come), round 1's
    rows (``runs``: each lr of the grid, ascending) and, where ``refine_runs`` has the arm's, round 2's (each
    lr the refine runs trained, over both rounds' runs at it): the seeds, the diverged ones, the mean and
    sample sd of the primary metric (:data:`attnid.reports.interventions_table.PRIMARY_METRIC`; none where
    a run diverged); ``round_best``: the round's lowest mean, the smaller lr on a tie; ``best``: the final
    pick, the last round's ``round_best``; ``at_edge``: on the best row, whether that lr is the smallest or
    largest of the arm's grid, where the best may lie beyond it (the grid is then too narrow:
    docs/experiments.md)."""
    first = _grouped(runs)
    second = _grouped(refine_runs)
    both = {key: first.get(key, []) + infos for key, infos in second.items()}
    rows = []
    for arm in dict.fromkeys(arm for arm, _ in first):
        grid = sorted(lr for name, lr in first if name == arm)
        arm_rows = _round_rows(1, arm, first)
        last = arm_rows
        if any(name == arm for name, _ in both):
            last = _round_rows(2, arm, both)
            arm_rows += last
        best = next((row for row in last if row["round_best"]), None)
        if best is not None:
            best["best"] = True
            best["at_edge"] = len(grid) > 1 and best["lr"] in (grid[0], grid[-1])
        rows += arm_rows
    return pd.DataFrame(rows, columns=list(CALIBRATION_COLUMNS))


def best_lrs(table: pd.DataFrame) -> dict[str, float]:
    """{arm: its chosen lr} from calibration.csv's ``best`` rows (the final pick)."""
    best = table[table["best"].astype(bool)]
    return dict(zip(best["arm"], best["lr"].astype(float), strict=True))


def ranked_lrs(table: pd.DataFrame) -> dict[str, list[float]]:
    """{arm: its lrs of round 1 whose mean is finite, lowest mean first (the smaller lr on a tie)}: the
    lrs round 2 trains again, by rank."""
    first = table[(table["round"] == 1) & np.isfinite(table["mean"].astype(float))]
    ordered = first.sort_values(["mean", "lr"], kind="stable")
    return {str(arm): group["lr"].astype(float).tolist() for arm, group in ordered.groupby("arm", sort=False)}


def picks_table(table: pd.DataFrame, runs: Sequence[dict]) -> pd.DataFrame:
    """calibration_picks.csv (:data:`attnid.plan.rounds.PICK_COLUMNS`): per arm, its final pick, round 1's,
    and that of round 1's first (lowest) seed alone (:data:`attnid.plan.rounds.PICKS`), with the seeds
    each pick saw: the lrs of the robustness variants."""
    seed = min(int(info["seed"]) for info in runs)
    alone = calibration_table([info for info in runs if int(info["seed"]) == seed])
    rows = []
    for arm in dict.fromkeys(table["arm"]):
        of_arm = table[table["arm"] == arm]
        final = of_arm[of_arm["best"].astype(bool)]
        first = of_arm[(of_arm["round"] == 1) & of_arm["round_best"].astype(bool)]
        own = alone[(alone["arm"] == arm) & alone["best"].astype(bool)]
        for pick, row in ((FINAL, final), (ROUND_ONE, first), (ONE_SEED, own)):
            if not row.empty:
                rows.append(
                    {
                        "arm": arm,
                        "pick": pick,
                        "lr": float(row["lr"].iloc[0]),
                        "n_seeds": int(row["n_seeds"].iloc[0]),
                    }
                )
    return pd.DataFrame(rows, columns=list(PICK_COLUMNS))


def calibrated_spec_texts(
    pending: Sequence[PendingSpec],
    best: dict[str, float],
    arms: Sequence[str],
    ranked: dict[str, list[float]] | None = None,
) -> dict:
    """{spec file: its text} of each pending calibrated run at its arm's best lr (``best``), or for a
    round-2 run at the lr of its rank in round 1 (``ranked``, :func:`ranked_lrs`); an arm without
    calibration runs (not among ``arms``), or whose every lr diverged, is one line."""
    texts = {}
    for spec in pending:
        if spec.rank is not None:
            lrs = (ranked or {}).get(spec.best_lr_of, [])
            if spec.best_lr_of not in arms or len(lrs) < spec.rank:
                raise UserError(
                    f"{spec.run_dir} trains arm {spec.best_lr_of}'s lr of rank {spec.rank} in round 1, which "
                    f"has {len(lrs)} lr(s) that did not diverge among the runs given"
                )
            texts[spec.spec_file] = calibrated_spec_text(spec, lrs[spec.rank - 1])
            continue
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
    refine_runs: Sequence[str] = (),
) -> tuple[pd.DataFrame, list[str]]:
    """Gather the listed calibration runs (or every run under ``runs_dir``) and round 2's ``refine_runs``,
    write calibration.csv and calibration_picks.csv into ``out_dir`` and the spec file of each ``pending``
    run; returns the table and the spec files written."""
    infos = [load_run(run_dir)[0] for run_dir in find_run_dirs(runs_dir, runs)]
    if not infos:
        raise UserError(f"no calibration runs (run.json) under {runs_dir}; run the training jobs first")
    refined = [load_run(run_dir)[0] for run_dir in refine_runs]
    table = calibration_table(infos, refined)
    arms = list(dict.fromkeys(table["arm"]))
    texts = calibrated_spec_texts(pending, best_lrs(table), arms, ranked_lrs(table))
    write_csv_atomic(Path(out_dir) / "calibration.csv", table)
    write_csv_atomic(Path(out_dir) / "calibration_picks.csv", picks_table(table, infos))
    for path, text in texts.items():
        write_text_atomic(path, text)
    return table, list(texts)
