"""The interventions study's table: every arm against the ``adamw`` baseline, seed by seed.

The interventions on the orbit change only how training moves along the symmetry orbit and are trained
exactly like ``adamw`` (the same model, learning rate, schedule, seeds and batches), so each arm's run
with seed ``s`` is compared with the baseline's run with seed ``s``. Gathering reads only ``run.json``
and ``metrics.csv`` (torch-free, testable on synthetic runs):

    attnid interventions-table --runs RUN_DIR... --out-dir results/tables [--baseline adamw]

writes ``interventions.csv``, one row per arm and metric with the columns :data:`INTERVENTION_COLUMNS`, and
``interventions.tex`` (templates/interventions.tex.j2). Every arm among the runs other than the baseline
is compared with it, in the case registry's order (cases it does not know last). An arm is a case, or a
rebalancing case with its AdamW moments transported or reset
(:func:`attnid.plan.interventions.arm_name`:
``adamw_rebalance_transport``); such an arm is also compared with its case's runs with the moments kept,
when those are among the runs (a row with that case as the baseline).

The metrics (docs/design.md §11.5) are the final val loss, the best val loss and
the val loss at equal wall time; the statistics (§11.1, §11.2) are
:mod:`attnid.reports.statistics`'. Lower loss is better, so a negative ``delta_mean`` (arm minus
baseline) is a gain of the arm.

A pairing that is missing (an arm seed without a baseline run), a run listed twice or a pair trained for
different step counts is an error. A pair in which a run diverged has no loss to compare: it is left out
of the statistics, said on stdout, and ``n_seeds`` counts the pairs that remain; with fewer than
:data:`attnid.reports.statistics.MIN_PAIRED_SEEDS` left, the row has no CI and its verdict is
:data:`TOO_FEW_SEEDS`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.plan.interventions import BASELINE_CASE, arm_name
from attnid.reports.latex import records, render_table
from attnid.reports.statistics import (
    BOOTSTRAP_RESAMPLES,
    EXACT_SIGN_FLIP_SEEDS,
    MIN_PAIRED_SEEDS,
    compare_paired,
    paired_differences,
    smallest_sign_flip_p_value,
)
from attnid.reports.tables import summarize_run
from attnid.training.rundir import find_run_dirs, load_run

METRICS = ("final_val_loss", "best_val_loss", "val_loss_at_equal_wall_time")
INTERVENTION_COLUMNS = (
    "arm",
    "baseline",
    "n_seeds",
    "metric",
    "delta_mean",
    "ci_low",
    "ci_high",
    "p_value",
    "verdict",
)
# The verdict of a row with too few usable pairs for a CI (not one of attnid.reports.statistics.VERDICTS).
TOO_FEW_SEEDS = "too few seeds"
METRIC_TEX = {
    "final_val_loss": "final val loss",
    "best_val_loss": "best val loss",
    "val_loss_at_equal_wall_time": "at equal wall time",
}


# ---------------------------------------------------------------------------- one run


def run_arm_name(info: dict) -> str:
    """The arm a finished run belongs to, from its run.json: its case and its arm options
    (``--rebalance-moments``, :data:`attnid.plan.interventions.ARM_OPTIONS`)."""
    return arm_name(str(info.get("case")), info.get("config") or {})


def load_runs_by_arm(
    runs_dir: str | Path | None, listed: list[str] | None = None
) -> dict[str, list[tuple[dict, pd.DataFrame]]]:
    """{arm: [(run.json, metrics.csv)]} for the listed runs (or every run under ``runs_dir``), in the case
    registry's order of the arms' cases (unknown cases last), an arm right after its case."""
    from attnid.training.cases import CASES

    by_arm: dict[str, list] = {}
    for run_dir in find_run_dirs(runs_dir, listed):
        info, metrics = load_run(run_dir)
        by_arm.setdefault(run_arm_name(info), []).append((info, metrics))
    order = {case: i for i, case in enumerate(CASES)}

    def position(arm: str):
        case = str(by_arm[arm][0][0].get("case"))
        return order.get(case, len(order)), arm != case, arm

    return {arm: by_arm[arm] for arm in sorted(by_arm, key=position)}


def kept_moments_baseline(arm: str, runs: list[tuple[dict, pd.DataFrame]]) -> str | None:
    """The case an arm with transported or reset moments is also compared with (its moments kept), or None."""
    case = str(runs[0][0].get("case"))
    return case if arm != case else None


def eval_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """The logged evaluations of a run: ``step``, ``wall_s`` and ``val_loss`` of the rows with a finite val
    loss and wall clock, in step order (the rows between evaluations log no val loss)."""
    frame = pd.DataFrame(
        {
            name: pd.to_numeric(metrics[name], errors="coerce") if name in metrics else np.nan
            for name in ("step", "wall_s", "val_loss")
        }
    )
    finite = frame.replace([np.inf, -np.inf], np.nan).dropna()
    return finite.sort_values("step", kind="stable").reset_index(drop=True)


def val_loss_reached_by(evals: pd.DataFrame, wall_time: float) -> float:
    """The val loss a run had reached by ``wall_time`` seconds of its wall clock (§11.5): that of its last
    evaluation logged at ``wall_s <= wall_time`` (a step function, never interpolated); NaN before the
    first."""
    reached = evals[evals["wall_s"] <= wall_time]
    return float(reached["val_loss"].iloc[-1]) if len(reached) else math.nan


def run_losses(info: dict, metrics: pd.DataFrame) -> dict:
    """What a run contributes: its final and best val loss, its evaluations, status and planned steps. A
    diverged run's losses are NaN: it has none to compare."""
    summary = summarize_run(info, metrics)
    evals = eval_rows(metrics)
    diverged = summary["status"] == "diverged"
    config = info.get("config") or {}
    return {
        "status": summary["status"],
        "max_iters": info.get("max_iters", config.get("max_iters")),
        "final_val_loss": math.nan if diverged else summary["final_val_loss"],
        "best_val_loss": math.nan if diverged or evals.empty else float(evals["val_loss"].min()),
        "evals": evals.iloc[0:0] if diverged else evals,
    }


def equal_wall_time_losses(arm_evals: pd.DataFrame, baseline_evals: pd.DataFrame) -> tuple[float, float]:
    """The val loss each run of a pair had reached by the wall time ``T`` at which the shorter one logged its
    last evaluation (§11.5): ``T = min`` of the two runs' last evaluation ``wall_s``, so the shorter run
    contributes its final val loss and the longer one its last evaluation at or before ``T``."""
    if arm_evals.empty or baseline_evals.empty:
        return math.nan, math.nan
    wall_time = min(float(arm_evals["wall_s"].iloc[-1]), float(baseline_evals["wall_s"].iloc[-1]))
    return val_loss_reached_by(arm_evals, wall_time), val_loss_reached_by(baseline_evals, wall_time)


# ---------------------------------------------------------------------------- the table


def runs_by_seed(runs: list[tuple[dict, pd.DataFrame]], case: str) -> dict[int, dict]:
    """``{seed: run_losses}`` of one case's runs; a seed listed twice is an error (which one would count?)."""
    by_seed: dict[int, dict] = {}
    for info, metrics in runs:
        if info.get("seed") is None:
            raise UserError(f"{info.get('run_dir')}/run.json has no seed: the runs are paired by seed")
        seed = int(info["seed"])
        if seed in by_seed:
            raise UserError(
                f"two runs of case {case} with seed {seed} ({by_seed[seed]['run_dir']} and "
                f"{info.get('run_dir')}): list each run once"
            )
        by_seed[seed] = run_losses(info, metrics) | {"run_dir": info.get("run_dir")}
    return by_seed


def _paired_values(
    arm: str, arm_runs: dict[int, dict], baseline: str, baseline_runs: dict[int, dict]
) -> dict[str, tuple[dict, dict]]:
    """{metric: ({seed: arm value}, {seed: baseline value})} over the arm's seeds, after checking that every
    arm seed has a baseline run trained for as many steps."""
    unpaired = sorted(seed for seed in arm_runs if seed not in baseline_runs)
    if unpaired:
        raise UserError(
            f"arm {arm}: seed(s) {', '.join(map(str, unpaired))} have no {baseline} run to pair "
            f"with; pass the {baseline} runs of the same seeds (or leave those {arm} runs out)"
        )
    values: dict[str, tuple[dict[int, float], dict[int, float]]] = {metric: ({}, {}) for metric in METRICS}
    for seed, run in sorted(arm_runs.items()):
        base = baseline_runs[seed]
        if run["max_iters"] != base["max_iters"]:
            raise UserError(
                f"arm {arm} seed {seed} trains {run['max_iters']} steps, {baseline} seed {seed} "
                f"{base['max_iters']}: an arm is compared with a baseline trained for as long"
            )
        for metric in ("final_val_loss", "best_val_loss"):
            values[metric][0][seed], values[metric][1][seed] = run[metric], base[metric]
        arm_value, baseline_value = equal_wall_time_losses(run["evals"], base["evals"])
        values["val_loss_at_equal_wall_time"][0][seed] = arm_value
        values["val_loss_at_equal_wall_time"][1][seed] = baseline_value
    return values


def interventions_table(
    by_case: dict[str, list[tuple[dict, pd.DataFrame]]], baseline: str = BASELINE_CASE
) -> tuple[pd.DataFrame, list[str]]:
    """The rows of interventions.csv (:data:`INTERVENTION_COLUMNS`) for every arm of ``by_case`` ({arm:
    [(run.json, metrics.csv)]}, as :func:`load_runs_by_arm` gives them) against ``baseline`` (and an arm
    with transported or reset moments against its case with them kept, when present), and one note per
    pair left out of a metric (a diverged run)."""
    if baseline not in by_case:
        raise UserError(
            f"no {baseline} runs among the runs given (cases: {', '.join(by_case) or 'none'}): "
            f"every arm is compared with the {baseline} runs of the same seeds"
        )
    arms = [case for case in by_case if case != baseline]
    if not arms:
        raise UserError(f"only {baseline} runs given: nothing to compare with them; pass the arms' runs too")
    comparisons = [(arm, baseline) for arm in arms]
    for arm in arms:
        kept = kept_moments_baseline(arm, by_case[arm])
        if kept is not None and kept in by_case and kept != baseline:
            comparisons.insert(comparisons.index((arm, baseline)) + 1, (arm, kept))
    rows, notes = [], []
    for arm, baseline in comparisons:
        baseline_runs = runs_by_seed(by_case[baseline], baseline)
        arm_runs = runs_by_seed(by_case[arm], arm)
        paired = _paired_values(arm, arm_runs, baseline, baseline_runs)
        for metric, (arm_values, baseline_values) in paired.items():
            usable = {
                seed
                for seed in arm_values
                if math.isfinite(arm_values[seed]) and math.isfinite(baseline_values[seed])
            }
            for seed in sorted(set(arm_values) - usable):
                which = [
                    case
                    for case, runs in ((arm, arm_runs), (baseline, baseline_runs))
                    if runs[seed]["status"] == "diverged"
                ]
                why = f"{' and '.join(which)} diverged" if which else "no val loss to compare"
                notes.append(f"{arm} vs {baseline}, {metric}: seed {seed} left out ({why})")
            row = {"arm": arm, "baseline": baseline, "n_seeds": len(usable), "metric": metric}
            if len(usable) < MIN_PAIRED_SEEDS:
                rows.append(
                    row
                    | {
                        "delta_mean": math.nan,
                        "ci_low": math.nan,
                        "ci_high": math.nan,
                        "p_value": math.nan,
                        "verdict": TOO_FEW_SEEDS,
                    }
                )
                continue
            _, differences = paired_differences(
                {s: arm_values[s] for s in usable}, {s: baseline_values[s] for s in usable}
            )
            result = compare_paired(differences)
            rows.append(
                row
                | {
                    "delta_mean": result.delta_mean,
                    "ci_low": result.ci_low,
                    "ci_high": result.ci_high,
                    "p_value": result.p_value,
                    "verdict": result.verdict,
                }
            )
    return pd.DataFrame(rows, columns=list(INTERVENTION_COLUMNS)), notes


def render_interventions_table(table: pd.DataFrame) -> str:
    """``interventions.tex`` from templates/interventions.tex.j2 (attnid.tables' renderer)."""
    rows = [row | {"metric_tex": METRIC_TEX[row["metric"]]} for row in records(table)]
    n_seeds = int(table["n_seeds"].max()) if len(table) else 0
    return render_table(
        "interventions.tex.j2",
        rows=rows,
        n_seeds=n_seeds,
        smallest_p=smallest_sign_flip_p_value(n_seeds),
        bootstrap_resamples=BOOTSTRAP_RESAMPLES,
        exact_seeds=EXACT_SIGN_FLIP_SEEDS,
        too_few=TOO_FEW_SEEDS,
        min_seeds=MIN_PAIRED_SEEDS,
    )


def write_interventions_table(
    runs_dir: str | Path | None,
    out_dir: str | Path,
    runs: list[str] | None = None,
    baseline: str = BASELINE_CASE,
) -> tuple[pd.DataFrame, list[str]]:
    """Gather the listed runs (or every run under ``runs_dir``) and write interventions.csv and .tex."""
    by_case = load_runs_by_arm(runs_dir, runs)
    if not by_case:
        raise UserError(f"no runs (run.json) under {runs_dir}; run the training jobs first")
    table, notes = interventions_table(by_case, baseline)
    out = Path(out_dir)
    write_csv_atomic(out / "interventions.csv", table)
    write_text_atomic(out / "interventions.tex", render_interventions_table(table))
    return table, notes
