"""The interventions' effect along training and the plateau check, from the runs' curves of the whole-split
val loss (docs/design.md §11.3): ``interventions_along.csv`` and ``interventions_plateau.csv``, written by
``attnid interventions-table`` (:mod:`attnid.reports.interventions_table`) beside its verdicts.

A run trained with ``--full-val-every N`` has metrics.csv's ``val_loss_full`` at step 0, every ``N``-th step
and its last, the last equal to run.json's ``final_val_loss_full`` (the verdict's metric). Each comparison's
per-seed value at a step is computed from its cells exactly as the seeds table computes the final one
(:func:`comparison_terms`, :func:`contrast_value`), so the curve's last point is the verdict table's row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.plan.interventions import contrast_named
from attnid.reports.statistics import ALPHA, MIN_PAIRED_SEEDS, t_interval

# interventions_along.csv: each comparison's mean difference at each declared step of the whole-split val
# loss (metrics.csv's val_loss_full), with its Student-t interval.
ALONG_COLUMNS = ("comparison", "step", "n_seeds", "delta_mean", "ci_low", "ci_high")
# interventions_plateau.csv: per arm, the whole-split val loss over the last part of training.
PLATEAU_COLUMNS = (
    "arm",
    "n_seeds",
    "step_from",
    "step_to",
    "loss_from",
    "loss_to",
    "relative_improvement",
    "largest_seed_improvement",
    "threshold",
    "plateau",
)
ALONG_METRIC = "val_loss_full"


def run_steps(info: dict) -> int | None:
    """The steps a run was trained for (run.json's ``max_iters``, else its config's)."""
    return info.get("max_iters", (info.get("config") or {}).get("max_iters"))


def contrast_value(
    terms: tuple[tuple[float, str], ...], values: dict[tuple[str, int], float], seed: int
) -> float:
    """One side of a contrast for ``seed``: the weighted sum of its cells' values."""
    return float(sum(weight * values[(arm, seed)] for weight, arm in terms))


def comparison_terms(
    seeds: pd.DataFrame, name: str
) -> tuple[tuple[tuple[float, str], ...], tuple[tuple[float, str], ...]]:
    """The two sides of comparison ``name`` as weighted cells: a 2 x 2 contrast's
    (:func:`attnid.plan.interventions.contrast_named`), or an arm against its baseline."""
    contrast = contrast_named(name)
    if contrast is not None:
        return contrast.arm_terms, contrast.baseline_terms
    first = seeds[seeds["comparison"] == name].iloc[0]
    return ((1.0, str(first["arm"])),), ((1.0, str(first["baseline"])),)


def loss_along(runs: list[tuple[dict, pd.DataFrame]]) -> dict[int, pd.Series]:
    """{seed: the whole-split val loss by step} of one arm's runs (metrics.csv's ``val_loss_full`` rows;
    none for a diverged run, whose later rows are missing)."""
    along = {}
    for info, metrics in runs:
        if info.get("status") == "diverged" or ALONG_METRIC not in metrics:
            continue
        frame = metrics[["step", ALONG_METRIC]].apply(pd.to_numeric, errors="coerce").dropna()
        along[int(info["seed"])] = pd.Series(frame[ALONG_METRIC].to_numpy(), index=frame["step"].astype(int))
    return along


def along_table(
    seeds: pd.DataFrame, by_arm: dict[str, list[tuple[dict, pd.DataFrame]]], alpha: float = ALPHA
) -> pd.DataFrame:
    """interventions_along.csv (:data:`ALONG_COLUMNS`): every comparison of the seeds table at every step
    where all its runs evaluated the whole val split (``--full-val-every``): the mean over the seeds of the
    comparison's per-seed difference of that loss, computed as the seeds table computes the final one, and
    its ``1 - alpha`` Student-t interval. The verdict is taken at the last step only (docs/design.md §11.3);
    there this table's mean is the verdict table's. Runs without such evaluations add no rows."""
    curves = {arm: loss_along(runs) for arm, runs in by_arm.items()}
    rows = []
    for name in dict.fromkeys(seeds["comparison"]):
        arm_terms, baseline_terms = comparison_terms(seeds, name)
        cells = [arm for _, arm in (*arm_terms, *baseline_terms)]
        used = seeds.loc[
            (seeds["comparison"] == name) & np.isfinite(seeds["difference"].astype(float)), "seed"
        ].astype(int)
        used = [seed for seed in used if all(seed in curves.get(cell, {}) for cell in cells)]
        if not used:
            continue
        steps = sorted(set.intersection(*(set(curves[cell][seed].index) for cell in cells for seed in used)))
        for step in steps:
            values = {(cell, seed): float(curves[cell][seed][step]) for cell in cells for seed in used}
            differences = np.array(
                [
                    contrast_value(arm_terms, values, seed) - contrast_value(baseline_terms, values, seed)
                    for seed in used
                ]
            )
            low, high = (
                t_interval(differences, 1 - alpha) if len(used) >= MIN_PAIRED_SEEDS else (math.nan,) * 2
            )
            rows.append(
                {
                    "comparison": name,
                    "step": step,
                    "n_seeds": len(used),
                    "delta_mean": float(differences.mean()),
                    "ci_low": low,
                    "ci_high": high,
                }
            )
    return pd.DataFrame(rows, columns=list(ALONG_COLUMNS))


@dataclass(frozen=True)
class PlateauRule:
    """The plateau check (docs/design.md §11.3): over the last ``last_fraction`` of training the whole-split
    val loss improves, relative to its value there, by less than ``improvement`` (mean over the seeds)."""

    last_fraction: float
    improvement: float


def plateau_table(by_arm: dict[str, list[tuple[dict, pd.DataFrame]]], rule: PlateauRule) -> pd.DataFrame:
    """interventions_plateau.csv (:data:`PLATEAU_COLUMNS`), one row per arm: the seeds' mean whole-split val
    loss at ``1 - last_fraction`` of the run and at its end, the relative improvement of the means and the
    largest seed's, and whether it is below the rule's threshold. A run that did not evaluate at that step
    (no ``--full-val-every`` there) is a one-line error: the check was declared for it."""
    rows = []
    for arm, runs in by_arm.items():
        curves = loss_along(runs)
        if not curves:
            continue
        steps = {run_steps(info) for info, _ in runs}
        if len(steps) != 1:
            raise UserError(
                f"arm {arm}: its runs train {sorted(map(str, steps))} steps; the plateau check needs one"
            )
        (end,) = steps
        if end is None:
            raise UserError(f"arm {arm}: its run.json records no max_iters: train it again with this attnid")
        start = end - round(rule.last_fraction * end)
        missing = sorted(
            seed for seed, curve in curves.items() if start not in curve.index or end not in curve.index
        )
        if missing:
            raise UserError(
                f"arm {arm}: seed(s) {', '.join(map(str, missing))} have no whole-split val loss at step "
                f"{start} "
                f"or {end}: train them with --full-val-every dividing both"
            )
        before = np.array([curve[start] for curve in curves.values()])
        after = np.array([curve[end] for curve in curves.values()])
        relative = float((before.mean() - after.mean()) / before.mean())
        rows.append(
            {
                "arm": arm,
                "n_seeds": len(curves),
                "step_from": start,
                "step_to": end,
                "loss_from": float(before.mean()),
                "loss_to": float(after.mean()),
                "relative_improvement": relative,
                "largest_seed_improvement": float(np.max((before - after) / before)),
                "threshold": rule.improvement,
                "plateau": relative < rule.improvement,
            }
        )
    return pd.DataFrame(rows, columns=list(PLATEAU_COLUMNS))
