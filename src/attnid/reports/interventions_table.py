"""The interventions study's tables: every arm against its baseline, seed by seed, and the verdicts.

The interventions on the orbit change only how training moves along the symmetry orbit and are trained
exactly like their baseline (the same model, learning rate, schedule, seeds and batches), so each arm's
run with seed ``s`` is compared with the baseline's run with seed ``s``. An arm's baseline is the plain
case of its optimizer (:func:`attnid.plan.interventions.arm_baseline`): ``adamw`` (the table's baseline,
``--baseline``) for the AdamW arms, ``sgd`` for ``sgd_gauge_fixed``, and for an arm at its own best lr
(``<arm>_best_lr``) its baseline at the baseline's (``adamw_best_lr``). Gathering reads only ``run.json``
(torch-free, testable on synthetic runs):

    attnid interventions-table --runs RUN_DIR... --out-dir results/tables [--baseline adamw]
        [--alpha 0.05] [--equivalence-margin 0.01] [--family COMPARISON...] [--arm-costs arms_cost.csv]

writes three files:

* ``interventions_seeds.csv`` (:data:`SEED_COLUMNS`): one row per comparison and seed, the arm's and the
  baseline's value of the primary metric and their difference (:func:`paired_seed_table`). Every number
  of the next table is computed from it alone (:func:`comparisons_table`), so a reader can recompute
  every verdict.
* ``interventions.csv`` (:data:`INTERVENTION_COLUMNS`): one row per comparison: the mean difference, the
  paired sd, the Student-t CI and the equivalence test's interval, the exact sign-flip p and its Holm
  adjustment over the declared family, the smallest effect the comparison could detect, the arm's
  per-step cost, and the verdict of the rule (docs/design.md §11).
* ``interventions.tex`` (templates/interventions.tex.j2).

The **primary metric** is ``final_val_loss_full``: the final model's loss on the whole val split, at
equal optimizer steps (docs/design.md §11.5). Lower loss is better, so a negative ``delta_mean`` (arm minus
baseline) is a gain of the arm.

The **comparisons**: every arm among the runs other than a baseline, against its baseline, in the case
registry's order (cases it does not know last), named by the arm alone against the table's baseline and
``arm-baseline`` against another (``sgd_gauge_fixed-sgd``); an arm with moved or reset moments also
against its case's runs with the moments kept (:func:`comparison_name`
``adamw_rebalance_first_moment-adamw_rebalance``); and,
when its four arms are among the runs, the 2 x 2 interaction of starting point and frozen blocks
(:data:`INTERACTION`, docs/design.md §14). An arm is named by its run (:func:`run_arm_name`).

A pairing that is missing (an arm seed without a baseline run), a run listed twice or a pair trained for
different step counts is an error. A pair in which a run diverged has no loss to compare: it stays in the
seeds table with an empty difference, is left out of the statistics, and is said on stdout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.plan.interventions import (
    AT_INIT_ARM,
    BASELINE_CASE,
    FROM_GAUGE_ARM,
    GAUGE_ARM,
    INTERACTION,
    INTERACTION_TERMS,
    arm_baseline,
    arm_name,
    comparison_name,
    kept_moments_arm,
)
from attnid.reports.latex import records, render_table, siunitx_number, table_number, tex_escape
from attnid.reports.statistics import (
    ALPHA,
    BOOTSTRAP_MIN_SEEDS,
    EXACT_SIGN_FLIP_SEEDS,
    MIN_PAIRED_SEEDS,
    NOT_IN_FAMILY,
    PairedEstimate,
    VerdictRule,
    estimate_paired,
    holm_adjusted,
    smallest_sign_flip_p_value,
)
from attnid.training.cases import CASES
from attnid.training.rundir import find_run_dirs, load_run

# The primary metric (docs/design.md §11.5): run.json's loss of the final model on the whole val split.
PRIMARY_METRIC = "final_val_loss_full"

SEED_COLUMNS = ("comparison", "arm", "baseline", "seed", "arm_value", "baseline_value", "difference")
INTERVENTION_COLUMNS = (
    "comparison",
    "arm",
    "baseline",
    "metric",
    "n_seeds",
    "delta_mean",
    "sd",
    "ci_low",
    "ci_high",
    "tost_low",
    "tost_high",
    "boot_ci_low",
    "boot_ci_high",
    "p_value",
    "in_family",
    "p_holm",
    "alpha",
    "equivalence_margin",
    "min_seeds",
    "detectable_effect",
    "cost_ratio",
    "verdict",
)


# ---------------------------------------------------------------------------- one run


def run_arm_name(info: dict) -> str:
    """The arm a finished run belongs to, from its run.json: its ``--arm`` name, or the name its case and
    options give (:func:`attnid.plan.interventions.arm_name`)."""
    return arm_name(str(info.get("case")), info.get("config") or {})


def load_runs_by_arm(
    runs_dir: str | Path | None, listed: list[str] | None = None
) -> dict[str, list[tuple[dict, pd.DataFrame]]]:
    """{arm: [(run.json, metrics.csv)]} for the listed runs (or every run under ``runs_dir``), in the case
    registry's order of the arms' cases (unknown cases last), an arm right after its case."""
    by_arm: dict[str, list] = {}
    for run_dir in find_run_dirs(runs_dir, listed):
        info, metrics = load_run(run_dir)
        by_arm.setdefault(run_arm_name(info), []).append((info, metrics))
    order = {case: i for i, case in enumerate(CASES)}

    def position(arm: str):
        case = str(by_arm[arm][0][0].get("case"))
        return order.get(case, len(order)), arm != case, arm

    return {arm: by_arm[arm] for arm in sorted(by_arm, key=position)}


def compared_with(arm: str, runs: list[tuple[dict, pd.DataFrame]], table_baseline: str) -> list[str]:
    """The arms ``arm`` is compared with, in order: its baseline (``table_baseline`` for the arms of
    ``adamw``'s optimizer), and with moved moments its case's kept-moments arm; none for a baseline."""
    info = runs[0][0]
    case = str(info.get("case"))
    own = arm_baseline(arm, case)
    baseline = table_baseline if own == BASELINE_CASE else own
    if arm in (baseline, table_baseline):
        return []
    kept = kept_moments_arm(arm, case, info.get("config") or {})
    return [baseline] + ([kept] if kept is not None and kept != baseline else [])


def run_value(info: dict) -> float:
    """A run's primary metric (:data:`PRIMARY_METRIC`); NaN for a diverged run, which has none."""
    if info.get("status") == "diverged":
        return math.nan
    value = info.get(PRIMARY_METRIC)
    if value is None:
        raise UserError(
            f"{info.get('run_dir')}/run.json has no {PRIMARY_METRIC} (the loss on the whole val split, "
            f"recorded since attnid evaluates it at the end of training): train that run again"
        )
    return float(value)


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


# ---------------------------------------------------------------------------- the seeds table


def runs_by_seed(runs: list[tuple[dict, pd.DataFrame]], arm: str) -> dict[int, dict]:
    """``{seed: run.json}`` of one arm's runs; a seed listed twice is an error (which one would count?)."""
    by_seed: dict[int, dict] = {}
    for info, _ in runs:
        if info.get("seed") is None:
            raise UserError(f"{info.get('run_dir')}/run.json has no seed: the runs are paired by seed")
        seed = int(info["seed"])
        if seed in by_seed:
            raise UserError(
                f"two runs of arm {arm} with seed {seed} ({by_seed[seed].get('run_dir')} and "
                f"{info.get('run_dir')}): list each run once, or name them apart (attnid train --arm)"
            )
        by_seed[seed] = info
    return by_seed


def _steps(info: dict):
    return info.get("max_iters", (info.get("config") or {}).get("max_iters"))


def _paired_rows(
    arm: str, arm_runs: dict[int, dict], baseline: str, baseline_runs: dict[int, dict], table_baseline: str
) -> list[dict]:
    """The seeds-table rows of one arm against one baseline, after checking that every arm seed has a
    baseline run trained for as many steps."""
    unpaired = sorted(seed for seed in arm_runs if seed not in baseline_runs)
    if unpaired:
        raise UserError(
            f"arm {arm}: seed(s) {', '.join(map(str, unpaired))} have no {baseline} run to pair "
            f"with; pass the {baseline} runs of the same seeds (or leave those {arm} runs out)"
        )
    rows = []
    for seed, run in sorted(arm_runs.items()):
        base = baseline_runs[seed]
        if _steps(run) != _steps(base):
            raise UserError(
                f"arm {arm} seed {seed} trains {_steps(run)} steps, {baseline} seed {seed} "
                f"{_steps(base)}: an arm is compared with a baseline trained for as long"
            )
        arm_value, baseline_value = run_value(run), run_value(base)
        rows.append(
            {
                "comparison": comparison_name(arm, baseline, table_baseline),
                "arm": arm,
                "baseline": baseline,
                "seed": seed,
                "arm_value": arm_value,
                "baseline_value": baseline_value,
                "difference": arm_value - baseline_value,
            }
        )
    return rows


def _interaction_rows(seeds: pd.DataFrame) -> list[dict]:
    """The 2 x 2's interaction per seed (:data:`INTERACTION_TERMS`), from the seeds-table rows of its three
    arms against the baseline: ``arm_value`` is the effect of freezing at the gauge point, ``baseline_value``
    at the initialisation, over the seeds all four runs share."""
    (frozen, moved), (frozen_at_init, baseline) = INTERACTION_TERMS
    value: dict[tuple[str, int], tuple[float, float]] = {
        (str(row["arm"]), int(row["seed"])): (float(row["arm_value"]), float(row["baseline_value"]))
        for row in seeds.to_dict("records")
        if row["baseline"] == baseline
    }
    arms_seeds = [{seed for arm, seed in value if arm == name} for name in (frozen, moved, frozen_at_init)]
    rows = []
    for seed in sorted(set.intersection(*arms_seeds)):
        at_gauge = value[(frozen, seed)][0] - value[(moved, seed)][0]
        at_init = value[(frozen_at_init, seed)][0] - value[(frozen_at_init, seed)][1]
        rows.append(
            {
                "comparison": INTERACTION,
                "arm": f"{frozen}-{moved}",
                "baseline": f"{frozen_at_init}-{baseline}",
                "seed": seed,
                "arm_value": at_gauge,
                "baseline_value": at_init,
                "difference": at_gauge - at_init,
            }
        )
    return rows


def paired_seed_table(
    by_arm: dict[str, list[tuple[dict, pd.DataFrame]]], baseline: str = BASELINE_CASE
) -> tuple[pd.DataFrame, list[str]]:
    """interventions_seeds.csv (:data:`SEED_COLUMNS`) for every comparison of ``by_arm`` ({arm: [(run.json,
    metrics.csv)]}, as :func:`load_runs_by_arm` gives them): every arm against its baseline
    (:func:`compared_with`: ``baseline`` for the arms of adamw's optimizer), an arm with transported or
    reset moments also against its case with them kept when those runs are there, and the 2 x 2
    interaction when its arms are all there; and one note per pair without a value (a diverged run)."""
    if baseline not in by_arm:
        raise UserError(
            f"no {baseline} runs among the runs given (arms: {', '.join(by_arm) or 'none'}): "
            f"every arm is compared with the {baseline} runs of the same seeds"
        )
    by_seed = {arm: runs_by_seed(runs, arm) for arm, runs in by_arm.items()}  # one run per arm and seed
    pairs = []
    for arm, runs in by_arm.items():
        against = compared_with(arm, runs, baseline)
        if against and against[0] not in by_arm:
            raise UserError(
                f"arm {arm} is compared with {against[0]} (the baseline of its optimizer), and no "
                f"{against[0]} runs are among the runs given: pass them too"
            )
        pairs += [(arm, other) for other in against if other in by_arm]
    if not pairs:
        raise UserError(f"only {baseline} runs given: nothing to compare with them; pass the arms' runs too")
    rows = [
        row
        for arm, against in pairs
        for row in _paired_rows(arm, by_seed[arm], against, by_seed[against], baseline)
    ]
    seeds = pd.DataFrame(rows, columns=list(SEED_COLUMNS))
    if baseline == BASELINE_CASE and {GAUGE_ARM, AT_INIT_ARM, FROM_GAUGE_ARM} <= set(by_arm):
        seeds = pd.concat([seeds, pd.DataFrame(_interaction_rows(seeds), columns=list(SEED_COLUMNS))])
    notes = []
    for row in seeds[~np.isfinite(seeds["difference"].astype(float))].to_dict("records"):
        if row["comparison"] == INTERACTION:
            continue  # its seeds' pairs are noted as its arms'
        seed = int(row["seed"])
        pair = (str(row["arm"]), str(row["baseline"]))
        which = [name for name in pair if by_seed[name][seed].get("status") == "diverged"]
        why = f"{' and '.join(which)} diverged" if which else "no loss to compare"
        notes.append(f"{row['comparison']}: seed {seed} left out ({why})")
    return seeds.reset_index(drop=True), notes


# ---------------------------------------------------------------------------- the comparisons


@dataclass(frozen=True)
class ArmCosts:
    """Each arm's per-step cost as a ratio to ``adamw``'s (benchmarks/arms_cost.py), and where it was
    measured (the kept file's machine and date)."""

    ratio: dict[str, float]
    source: str

    def of(self, arm: str, baseline: str) -> float:
        """The arm's cost per step over the baseline's; NaN where either was not measured."""
        if arm not in self.ratio or baseline not in self.ratio:
            return math.nan
        return self.ratio[arm] / self.ratio[baseline]


def read_arm_costs(path: str | Path) -> ArmCosts:
    """The kept output of benchmarks/arms_cost.py: columns ``arm`` and ``ratio_to_adamw``, and the machine
    (``platform``, ``cpu``, ``torch``) and ``date`` it was measured on."""
    try:
        table = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(f"cannot read the arm costs {path} ({type(err).__name__}: {err})") from None
    missing = [c for c in ("arm", "ratio_to_adamw", "cpu", "torch", "date") if c not in table]
    if missing:
        raise UserError(f"{path}: no column(s) {', '.join(missing)}; write it with benchmarks/arms_cost.py")
    first = table.iloc[0]
    source = f"{Path(path).name}: {first['cpu']}, torch {first['torch']}, {first['date']}"
    return ArmCosts(dict(zip(table["arm"], table["ratio_to_adamw"].astype(float), strict=True)), source)


def _family_members(names: list[str], family: Sequence[str] | None) -> list[str]:
    """The comparisons Holm's correction runs over (docs/design.md §11.3): the declared ``family``, each once
    and each among ``names`` (the runs' comparisons), or every one of ``names`` when none is declared."""
    members = names if family is None else list(family)
    repeated = sorted({name for name in members if members.count(name) > 1})
    if repeated:
        raise UserError(
            f"the family names {', '.join(repeated)} twice: each comparison counts once in Holm's m"
        )
    unknown = [name for name in members if name not in names]
    if unknown:
        raise UserError(
            f"the family names {', '.join(unknown)}, not among the runs' comparisons "
            f"({', '.join(names)}): pass those arms' runs, or declare the family the runs make"
        )
    return members


def _paired_estimates(
    seeds: pd.DataFrame, names: list[str], alpha: float
) -> dict[str, PairedEstimate | None]:
    """Each comparison's estimate from its finite differences of interventions_seeds.csv (a diverged pair
    has none); None below :data:`MIN_PAIRED_SEEDS` of them (a mean's interval needs two)."""
    estimates: dict[str, PairedEstimate | None] = {}
    for name in names:
        differences = seeds.loc[seeds["comparison"] == name, "difference"].astype(float).to_numpy()
        finite = differences[np.isfinite(differences)]
        estimates[name] = estimate_paired(finite, alpha) if finite.size >= MIN_PAIRED_SEEDS else None
    return estimates


def comparisons_table(
    seeds: pd.DataFrame,
    alpha: float = ALPHA,
    equivalence_margin: float | None = None,
    family: Sequence[str] | None = None,
    costs: ArmCosts | None = None,
) -> pd.DataFrame:
    """interventions.csv (:data:`INTERVENTION_COLUMNS`) from interventions_seeds.csv alone (docs/design.md
    §11): per comparison, in the seeds table's order, the estimate of its finite differences
    (:func:`attnid.reports.statistics.estimate_paired`), Holm's adjustment over ``family`` (the declared
    comparisons; None: all of them), the rule's verdict (:class:`attnid.reports.statistics.VerdictRule`) and
    the smallest effect it could detect, and the arm's cost per step over the baseline's from ``costs``."""
    names = list(dict.fromkeys(seeds["comparison"]))
    members = _family_members(names, family)
    rule = VerdictRule(alpha, equivalence_margin, family_size=len(members))
    estimates = _paired_estimates(seeds, names, alpha)
    holm = dict(
        zip(
            members,
            holm_adjusted([getattr(estimates[name], "p_value", math.nan) for name in members]),
            strict=True,
        )
    )
    rows = []
    for name in names:
        first = seeds[seeds["comparison"] == name].iloc[0]
        estimate = estimates[name]
        n_seeds = (
            estimate.n_seeds
            if estimate is not None
            else int(np.isfinite(seeds.loc[seeds["comparison"] == name, "difference"].astype(float)).sum())
        )
        numbers = {
            key: getattr(estimate, key) if estimate is not None else math.nan
            for key in (
                "delta_mean",
                "sd",
                "ci_low",
                "ci_high",
                "tost_low",
                "tost_high",
                "boot_ci_low",
                "boot_ci_high",
                "p_value",
            )
        }
        in_family = name in holm
        rows.append(
            {
                "comparison": name,
                "arm": first["arm"],
                "baseline": first["baseline"],
                "metric": PRIMARY_METRIC,
                "n_seeds": n_seeds,
                **numbers,
                "in_family": in_family,
                # a member without a p enters Holm as 1 (the others are adjusted for it) but has none itself
                "p_holm": holm[name] if in_family and estimate is not None else math.nan,
                "alpha": alpha,
                "equivalence_margin": math.nan if equivalence_margin is None else equivalence_margin,
                "min_seeds": rule.minimum_seeds,
                "detectable_effect": rule.detectable_effect(numbers["sd"], n_seeds)
                if estimate is not None
                else math.nan,
                "cost_ratio": costs.of(first["arm"], first["baseline"]) if costs is not None else math.nan,
                "verdict": rule.label(estimate, holm[name]) if in_family else NOT_IN_FAMILY,
            }
        )
    return pd.DataFrame(rows, columns=list(INTERVENTION_COLUMNS))


def interventions_table(
    by_arm: dict[str, list[tuple[dict, pd.DataFrame]]],
    baseline: str = BASELINE_CASE,
    alpha: float = ALPHA,
    equivalence_margin: float | None = None,
    family: Sequence[str] | None = None,
    costs: ArmCosts | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """interventions.csv's rows for the runs ``by_arm`` (:func:`paired_seed_table`, then
    :func:`comparisons_table`) and the notes on the pairs left out."""
    seeds, notes = paired_seed_table(by_arm, baseline)
    return comparisons_table(seeds, alpha, equivalence_margin, family, costs), notes


# ---------------------------------------------------------------------------- writing


def comparison_tex(row: dict) -> str:
    """A comparison's name in the LaTeX table: the arm (against the table's baseline), the arm minus another
    baseline, or the interaction."""
    if row["comparison"] == INTERACTION:
        return r"interaction: starting point $\times$ frozen"
    text = rf"\texttt{{{tex_escape(row['arm'])}}}"
    if row["comparison"] != row["arm"]:
        text += rf" $-$ \texttt{{{tex_escape(row['baseline'])}}}"
    return text


def _detectable_tex(row: dict) -> str:
    """The detectable effect's cell of its siunitx column: ``none`` below the rule's minimum n (the test
    cannot reject at all)."""
    value = row["detectable_effect"]
    return "{none}" if value is not None and math.isinf(value) else table_number(value, 2)


def _interval_tex(row: dict) -> str:
    """The t-interval's cell, its ends written as the mean's column writes numbers; -- without one."""
    low, high = siunitx_number(row["ci_low"], 2, 1.0), siunitx_number(row["ci_high"], 2, 1.0)
    return "--" if low is None or high is None else rf"[\num{{{low}}}, \num{{{high}}}]"


def render_interventions_table(table: pd.DataFrame, costs: ArmCosts | None = None) -> str:
    """``interventions.tex`` from templates/interventions.tex.j2
    (:func:`attnid.reports.latex.render_table`)."""
    rows = [
        row
        | {
            "comparison_tex": comparison_tex(row),
            "detectable_tex": _detectable_tex(row),
            "interval_tex": _interval_tex(row),
        }
        for row in records(table)
    ]
    family = table[table["in_family"].astype(bool)] if len(table) else table
    n_seeds = int(table["n_seeds"].max()) if len(table) else 0
    first = table.iloc[0] if len(table) else None
    margin = float(first["equivalence_margin"]) if first is not None else math.nan
    return render_table(
        "interventions.tex.j2",
        rows=rows,
        n_seeds=n_seeds,
        smallest_p=smallest_sign_flip_p_value(n_seeds),
        alpha=float(first["alpha"]) if first is not None else ALPHA,
        margin=margin if math.isfinite(margin) else None,
        family_size=len(family),
        min_seeds=int(first["min_seeds"]) if first is not None else 0,
        exact_seeds=EXACT_SIGN_FLIP_SEEDS,
        bootstrap_seeds=BOOTSTRAP_MIN_SEEDS,
        cost_source=costs.source if costs is not None else None,
        interaction=INTERACTION in set(table["comparison"]) if len(table) else False,
    )


def write_interventions_table(
    runs_dir: str | Path | None,
    out_dir: str | Path,
    runs: list[str] | None = None,
    baseline: str = BASELINE_CASE,
    alpha: float = ALPHA,
    equivalence_margin: float | None = None,
    family: Sequence[str] | None = None,
    costs_path: str | Path | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Gather the listed runs (or every run under ``runs_dir``) and write interventions_seeds.csv,
    interventions.csv and interventions.tex."""
    by_arm = load_runs_by_arm(runs_dir, runs)
    if not by_arm:
        raise UserError(f"no runs (run.json) under {runs_dir}; run the training jobs first")
    seeds, notes = paired_seed_table(by_arm, baseline)
    costs = read_arm_costs(costs_path) if costs_path is not None else None
    table = comparisons_table(seeds, alpha, equivalence_margin, family, costs)
    out = Path(out_dir)
    write_csv_atomic(out / "interventions_seeds.csv", seeds)
    write_csv_atomic(out / "interventions.csv", table)
    write_text_atomic(out / "interventions.tex", render_interventions_table(table, costs))
    if costs is not None:
        notes.append(f"cost ratios from {costs.source}")
    return table, notes
