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
  paired sd, the Student-t CI and the equivalence test's interval, the exact sign-flip p and the difference
  test's p (``p_holm``: Holm's over the declared family, the primary's own), the equivalence test's p
  (``p_equivalence``, TOST at the margin), the smallest effect the comparison could detect, the arm's
  per-step cost, and the verdict of the rule, the two tests' combined outcome (docs/design.md §11.3).
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
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.plan.interventions import (
    BASELINE_CASE,
    CALIBRATED_SUFFIX,
    CONTRASTS,
    FIXING_EFFECT,
    INTERACTION,
    START_EFFECT,
    Contrast,
    arm_baseline,
    arm_name,
    comparison_name,
    contrast_named,
    kept_moments_arm,
    like_for_like_arm,
    two_by_two_contrasts,
)
from attnid.reports.arm_costs import ArmCosts, read_arm_costs
from attnid.reports.interventions_curves import (
    PlateauRule,
    along_table,
    contrast_value,
    plateau_table,
    run_steps,
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
    "role",
    "in_family",
    "p_holm",
    "p_equivalence",
    "alpha",
    "equivalence_margin",
    "min_seeds",
    "detectable_effect",
    "power_at_margin",
    "cost_ratio",
    "verdict",
)
# A comparison's role in the verdict rule (docs/design.md §11.3): the primary comparison is tested alone at
# alpha, the secondary family with Holm over it; the others are shown without a verdict.
PRIMARY, SECONDARY, DESCRIPTIVE = "primary", "secondary", "descriptive"


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
    ``adamw``'s optimizer), with moved moments its case's kept-moments arm, and the frozen-MLP arm its
    like-for-like control (:func:`attnid.plan.interventions.like_for_like_arm`); none for a baseline."""
    info = runs[0][0]
    case = str(info.get("case"))
    own = arm_baseline(arm, case)
    baseline = table_baseline if own == BASELINE_CASE else own
    if arm in (baseline, table_baseline):
        return []
    kept = kept_moments_arm(arm, case, info.get("config") or {})
    others = [other for other in (kept, like_for_like_arm(arm)) if other is not None and other != baseline]
    return [baseline, *others]


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
        if run_steps(run) != run_steps(base):
            raise UserError(
                f"arm {arm} seed {seed} trains {run_steps(run)} steps, {baseline} seed {seed} "
                f"{run_steps(base)}: an arm is compared with a baseline trained for as long"
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


def cell_values(seeds: pd.DataFrame) -> dict[tuple[str, int], float]:
    """{(arm, seed): its loss} of every run the seeds table pairs (either side of a comparison)."""
    values: dict[tuple[str, int], float] = {}
    for row in seeds.to_dict("records"):
        values[(str(row["arm"]), int(row["seed"]))] = float(row["arm_value"])
        values[(str(row["baseline"]), int(row["seed"]))] = float(row["baseline_value"])
    return values


def _contrast_rows(seeds: pd.DataFrame, contrast: Contrast) -> list[dict]:
    """A 2 x 2 contrast per seed (:data:`attnid.plan.interventions.CONTRASTS`), from the seeds-table rows of
    its cells, over the seeds all four share: ``arm_value`` and ``baseline_value`` are its two sides (for
    the interaction, the effect of freezing at the gauge point and at the initialisation; for a main
    effect, the mean of the two cells with and without it), ``difference`` their difference."""
    values = cell_values(seeds)
    shared = set.intersection(*({seed for arm, seed in values if arm == cell} for cell in contrast.cells))
    rows = []
    for seed in sorted(shared):
        arm_value = contrast_value(contrast.arm_terms, values, seed)
        baseline_value = contrast_value(contrast.baseline_terms, values, seed)
        rows.append(
            {
                "comparison": contrast.name,
                "arm": Contrast.side_label(contrast.arm_terms),
                "baseline": Contrast.side_label(contrast.baseline_terms),
                "seed": seed,
                "arm_value": arm_value,
                "baseline_value": baseline_value,
                "difference": arm_value - baseline_value,
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
    contrasts = two_by_two_contrasts(set(by_arm)) if baseline == BASELINE_CASE else []
    for contrast in contrasts:
        seeds = pd.concat([seeds, pd.DataFrame(_contrast_rows(seeds, contrast), columns=list(SEED_COLUMNS))])
    notes = []
    for row in seeds[~np.isfinite(seeds["difference"].astype(float))].to_dict("records"):
        if row["comparison"] in {contrast.name for contrast in contrasts}:
            continue  # its seeds' pairs are noted as its arms'
        seed = int(row["seed"])
        pair = (str(row["arm"]), str(row["baseline"]))
        which = [name for name in pair if by_seed[name][seed].get("status") == "diverged"]
        why = f"{' and '.join(which)} diverged" if which else "no loss to compare"
        notes.append(f"{row['comparison']}: seed {seed} left out ({why})")
    return seeds.reset_index(drop=True), notes


# ---------------------------------------------------------------------------- the comparisons


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


# The numbers of a comparison's paired estimate (statistics.PairedEstimate) that interventions.csv shows.
ESTIMATE_COLUMNS = (
    "delta_mean", "sd", "ci_low", "ci_high", "tost_low", "tost_high", "boot_ci_low", "boot_ci_high", "p_value"
)  # fmt: skip


def _verdict_roles(
    names: list[str],
    estimates: dict[str, PairedEstimate | None],
    rule: VerdictRule,
    family: Sequence[str] | None,
    primary: str | None,
) -> tuple[dict[str, str], dict[str, float], dict[str, VerdictRule]]:
    """Each comparison's role (the ``primary``, alone at alpha; the secondary ``family``, Holm over it, None:
    every comparison but the primary; the rest descriptive), the p its verdict compares with alpha, and the
    rule of its family's size."""
    if primary is not None and primary not in names:
        raise UserError(
            f"the primary comparison {primary} is not among the runs' comparisons ({', '.join(names)}): pass "
            f"the runs of its arms"
        )
    if primary is not None and family is not None and primary in family:
        raise UserError(f"{primary} is the primary comparison and in the family: it is tested alone")
    members = _family_members([name for name in names if name != primary], family)
    adjusted: dict[str, float] = {}
    if primary is not None:
        adjusted[primary] = getattr(estimates[primary], "p_value", math.nan)
    adjusted.update(
        zip(
            members, holm_adjusted([getattr(estimates[n], "p_value", math.nan) for n in members]), strict=True
        )
    )
    rules = {
        PRIMARY: replace(rule, family_size=1),
        SECONDARY: replace(rule, family_size=max(len(members), 1)),
    }
    # a comparison outside both families is shown with the secondary family's numbers (or, with no family,
    # the primary's), without a verdict
    rules[DESCRIPTIVE] = rules[SECONDARY] if members else rules[PRIMARY]
    roles = {
        name: PRIMARY if name == primary else SECONDARY if name in adjusted else DESCRIPTIVE for name in names
    }
    return roles, adjusted, rules


def comparisons_table(
    seeds: pd.DataFrame,
    alpha: float = ALPHA,
    equivalence_margin: float | None = None,
    family: Sequence[str] | None = None,
    costs: ArmCosts | None = None,
    primary: str | None = None,
) -> pd.DataFrame:
    """interventions.csv (:data:`INTERVENTION_COLUMNS`) from interventions_seeds.csv alone (docs/design.md
    §11): per comparison, in the seeds table's order, the estimate of its finite differences
    (:func:`attnid.reports.statistics.estimate_paired`); its ``role``: the ``primary`` comparison, tested
    alone at ``alpha``, a member of the secondary ``family`` (None: every comparison but the primary), whose
    p-values Holm adjusts, or neither; the rule's verdict (:class:`attnid.reports.statistics.VerdictRule`,
    with the role's family size), the smallest effect the exact test detects with 80 % power and its power
    against an effect of the margin's size, and the arm's cost per step over the baseline's from ``costs``."""
    names = list(dict.fromkeys(seeds["comparison"]))
    estimates = _paired_estimates(seeds, names, alpha)
    roles, adjusted, rules = _verdict_roles(
        names, estimates, VerdictRule(alpha, equivalence_margin), family, primary
    )
    rows = []
    for name in names:
        first = seeds[seeds["comparison"] == name].iloc[0]
        estimate, rule, in_family = estimates[name], rules[roles[name]], roles[name] != DESCRIPTIVE
        differences = seeds.loc[seeds["comparison"] == name, "difference"].astype(float)
        n_seeds = estimate.n_seeds if estimate is not None else int(np.isfinite(differences).sum())
        numbers = {key: getattr(estimate, key, math.nan) for key in ESTIMATE_COLUMNS}
        rows.append(
            {
                "comparison": name,
                "arm": first["arm"],
                "baseline": first["baseline"],
                "metric": PRIMARY_METRIC,
                "n_seeds": n_seeds,
                **numbers,
                "role": roles[name],
                "in_family": in_family,
                # a member without a p enters Holm as 1 (the others are adjusted for it) but has none itself
                "p_holm": adjusted[name] if in_family and estimate is not None else math.nan,
                "p_equivalence": rule.equivalence_p_value(estimate),
                "alpha": alpha,
                "equivalence_margin": math.nan if equivalence_margin is None else equivalence_margin,
                "min_seeds": rule.minimum_seeds,
                "detectable_effect": rule.detectable_effect(numbers["sd"], n_seeds) if estimate else math.nan,
                "power_at_margin": rule.power_at_margin(numbers["sd"], n_seeds) if estimate else math.nan,
                "cost_ratio": costs.of(first["arm"], first["baseline"]) if costs is not None else math.nan,
                "verdict": rule.label(estimate, adjusted[name]) if in_family else NOT_IN_FAMILY,
            }
        )
    return pd.DataFrame(rows, columns=list(INTERVENTION_COLUMNS))


def calibrated_margin(calibration: str | Path, fraction: float, baseline: str = BASELINE_CASE) -> float:
    """The equivalence margin as a fraction of the baseline's mean final loss at its best lr on the
    calibration seeds (calibration.csv's ``best`` row of ``baseline``; docs/design.md §11.3)."""
    try:
        table = pd.read_csv(calibration)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(
            f"cannot read the calibration table {calibration} ({type(err).__name__}: {err})"
        ) from None
    if not {"arm", "best", "mean"} <= set(table.columns):
        raise UserError(f"{calibration}: no columns arm, best, mean; write it with attnid calibration-table")
    best = table[(table["arm"] == baseline) & table["best"].astype(bool)]
    if best.empty or not np.isfinite(float(best["mean"].iloc[0])):
        raise UserError(f"{calibration} has no best lr of {baseline}: its margin is a fraction of that loss")
    return fraction * float(best["mean"].iloc[0])


def interventions_table(
    by_arm: dict[str, list[tuple[dict, pd.DataFrame]]],
    baseline: str = BASELINE_CASE,
    alpha: float = ALPHA,
    equivalence_margin: float | None = None,
    family: Sequence[str] | None = None,
    costs: ArmCosts | None = None,
    primary: str | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """interventions.csv's rows for the runs ``by_arm`` (:func:`paired_seed_table`, then
    :func:`comparisons_table`) and the notes on the pairs left out."""
    seeds, notes = paired_seed_table(by_arm, baseline)
    return comparisons_table(seeds, alpha, equivalence_margin, family, costs, primary), notes


# ---------------------------------------------------------------------------- writing


# The 2 x 2 contrasts' names in the LaTeX table (docs/design.md §11.3).
CONTRAST_TEX = {
    FIXING_EFFECT: "main effect of fixing the unidentified blocks",
    START_EFFECT: "main effect of starting at the gauge point",
    INTERACTION: r"interaction: starting point $\times$ frozen",
}


def comparison_tex(row: dict) -> str:
    """A comparison's name in the LaTeX table: the arm (against the table's baseline), the arm minus another
    baseline, or a 2 x 2 contrast (at the arms' best lrs where they are); the primary one marked."""
    mark = r" \textbf{(primary)}" if row.get("role") == PRIMARY else ""
    name = str(row["comparison"])
    if contrast_named(name) is not None:
        base = name.removesuffix(CALIBRATED_SUFFIX)
        return CONTRAST_TEX[base] + (", each arm at its best lr" if base != name else "") + mark
    text = rf"\texttt{{{tex_escape(row['arm'])}}}"
    if row["comparison"] != row["arm"]:
        text += rf" $-$ \texttt{{{tex_escape(row['baseline'])}}}"
    return text + mark


def _detectable_tex(row: dict) -> str:
    """The detectable effect's cell of its siunitx column: ``none`` below the rule's minimum n (the test
    cannot reject at all)."""
    value = row["detectable_effect"]
    return "{none}" if value is not None and math.isinf(value) else table_number(value, 2)


def _verdict_tex(row: dict) -> str:
    """The verdict's cell: a label with the margin's clause (``worse, within the margin``) on two lines, so
    the column is no wider than ``inconclusive``'s and the widest table still fits the page."""
    verdict = str(row["verdict"])
    head, sep, tail = verdict.partition(", ")
    if not sep:
        return tex_escape(verdict)
    return rf"\shortstack[l]{{{tex_escape(head)},\\{tex_escape(tail)}}}"


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
            "power_tex": table_number(row["power_at_margin"], 2),
            "verdict_tex": _verdict_tex(row),
        }
        for row in records(table)
    ]
    family = table[table["role"] == SECONDARY] if len(table) else table
    primaries = (
        [str(name) for name in table.loc[table["role"] == PRIMARY, "comparison"]] if len(table) else []
    )
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
        interaction=bool(
            set(table["comparison"]) & {c.name + x for c in CONTRASTS for x in ("", CALIBRATED_SUFFIX)}
        )
        if len(table)
        else False,
        primary=primaries[0] if primaries else None,
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
    primary: str | None = None,
    plateau: PlateauRule | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Gather the listed runs (or every run under ``runs_dir``) and write interventions_seeds.csv,
    interventions.csv, interventions.tex, interventions_along.csv and, with a ``plateau`` rule,
    interventions_plateau.csv."""
    by_arm = load_runs_by_arm(runs_dir, runs)
    if not by_arm:
        raise UserError(f"no runs (run.json) under {runs_dir}; run the training jobs first")
    seeds, notes = paired_seed_table(by_arm, baseline)
    costs = read_arm_costs(costs_path) if costs_path is not None else None
    table = comparisons_table(seeds, alpha, equivalence_margin, family, costs, primary)
    along = along_table(seeds, by_arm, alpha)
    plateaus = plateau_table(by_arm, plateau) if plateau is not None else None
    out = Path(out_dir)
    write_csv_atomic(out / "interventions_seeds.csv", seeds)
    write_csv_atomic(out / "interventions.csv", table)
    write_csv_atomic(out / "interventions_along.csv", along)
    if plateaus is not None:
        write_csv_atomic(out / "interventions_plateau.csv", plateaus)
    write_text_atomic(out / "interventions.tex", render_interventions_table(table, costs))
    if costs is not None:
        notes.append(f"cost ratios from {costs.source}")
    return table, notes
