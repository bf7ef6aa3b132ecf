"""claims.csv: each claim of the paper (T1-T6 from the theory stage's Jacobians, E1-E3, docs/design.md
§1) and of this project's own identities (the drift split, the census, the interventions, the quantization
stage, §7, §12-§16) with the number measured in the pipeline's own runs, the threshold, the training
precision of the runs it reads, and pass, fail, missing or ``not applicable (dtype)`` (the runs' precision
cannot resolve the threshold). Each row has its kind (:mod:`attnid.reports.claim_kinds`): the paper's, a
finding of ours (its outcome: holds, rejected, or the interventions' verdict) or a check."""

from __future__ import annotations

import math

import pandas as pd

from attnid.plan.interventions import AT_INIT_ARM, CALIBRATED_SUFFIX, GAUGE_ARM, arm_baseline
from attnid.reports.alignment_table import (
    ALIGNMENT_EXACT_MAX,
    PLANTED_BARRIER_MAX,
    PLANTED_DISTANCE_MAX,
    alignment_claim_values,
    planted_claim_values,
)
from attnid.reports.claim_kinds import verdict_claims, with_kinds
from attnid.reports.quantization_table import QUANTIZATION_CLAIMS, claim_values
from attnid.reports.round_off import UNIT_ROUND_OFF, dtypes_of
from attnid.reports.theory_claims import theory_claim_rows
from attnid.theory.circuits import CIRCUITS
from attnid.training.cases import CASES, rebalancing_cases

# The cases E1 and E2 are claims about (and E2's prediction: every case with coupled weight decay)
# (E3 is about every case that rebalances, attnid.training.cases).
CLAIM_SGD_CASE, CLAIM_ADAMW_CASE = "sgd", "adamw"

# Thresholds of the claims checked in claims.csv (docs/design.md §1, §3, §7). E1 and E2 are exact
# identities of the drift split: SGD's first-order drift and ρ are zero up to round-off, which
# only float64 training resolves at these thresholds.
DRIFT_RATIO_SGD_MAX = 1e-9  # E1: drift1 / drift2 of SGD at the last row, both circuits
RHO_SGD_MAX = 1e-20  # E1: per-step ρ of SGD, both circuits
SGD_BETA_SLOPE = (1.8, 2.2)  # E1: SGD's β (its second-order drift) grows like lr², both circuits
DRIFT_PRED_RELERR_MAX = 1e-6  # E2: SGD + coupled L2 decay: drift1 equals Σ -2 lr λ I_s
DRIFT_RATIO_ADAMW_MIN = 10.0  # E2: AdamW moves along the orbit at first order
RHO_ADAMW_MIN = 1e-2  # E2: AdamW puts a share of every step into unidentified directions
CLOSURE_MAX = 1e-10  # the split closes to float64 round-off in every run, whatever the training dtype
TAU_MAX = 1e-5  # E3: an orbit move does not change the function
# E3: rebalancing to I_0 restores the conservation law: β right after a rebalance is ~0, i.e.
# tiny next to the β the run had built up just before it (the sawtooth of Figure 3).
BETA_REBALANCE_RATIO_MAX = 1e-2
# The interventions on the orbit (docs/design.md §13-§15): the projected step is orthogonal to the orbit,
# so in float64 its ρ and first-order drift are round-off (the thresholds of E1's SGD identities); the
# gauge-fixed arm starts from adamw's function (its logits and step-0 val loss equal to float32 rounding).
GAUGE_INITIAL_CHANGE_MAX = 1e-5
PROJECTED_CASE, GAUGE_FIXED_CASE, FIRST_MOMENT = "adamw_projected", "adamw_gauge_fixed", "first-moment"

# The coarsest unit round-off at which a round-off claim above is decidable: float64 only
# (float32 puts SGD's drift1 / drift2 near 1e-5, its ρ near 1e-9 and β_QK of the sweep at its floor).
FLOAT64_ONLY = 1e-12
NOT_APPLICABLE = "not applicable (dtype)"


def resolves(dtypes: str, max_round_off: float | None) -> bool:
    """Whether every precision in ``dtypes`` has a unit round-off of at most ``max_round_off`` (None: any)."""
    if max_round_off is None:
        return True
    return bool(dtypes) and all(UNIT_ROUND_OFF.get(d, math.inf) <= max_round_off for d in dtypes.split("+"))


def _claim(
    claim: str,
    paper: str,
    measured: float,
    relation: str,
    threshold,
    detail: str,
    dtypes: str = "",
    max_round_off: float | None = None,
) -> dict:
    """One row of claims.csv; ``max_round_off``: the coarsest training precision that resolves the
    threshold."""
    if dtypes and not resolves(dtypes, max_round_off):  # whether or not a number came out
        result = NOT_APPLICABLE
    elif measured is None or not math.isfinite(measured):
        result = "missing"
    elif relation == "<":
        result = "pass" if measured < threshold else "fail"
    elif relation == ">":
        result = "pass" if measured > threshold else "fail"
    elif relation == "=":
        result = "pass" if measured == threshold else "fail"
    else:  # "in": threshold is (low, high)
        result = "pass" if threshold[0] <= measured <= threshold[1] else "fail"
    shown = f"[{threshold[0]:g}, {threshold[1]:g}]" if relation == "in" else f"{threshold:g}"
    return {
        "claim": claim,
        "paper": paper,
        "measured": measured,
        "relation": relation,
        "threshold": shown,
        "dtype": dtypes,
        "result": result,
        "detail": detail,
    }


def _extreme(frame: pd.DataFrame, columns: list[str], largest: bool = True) -> float:
    """The largest (or smallest) finite value of ``columns`` over the rows of ``frame``; NaN if none."""
    if frame.empty:
        return math.nan
    values = pd.concat([pd.to_numeric(frame[c], errors="coerce") for c in columns if c in frame]).dropna()
    if not len(values):
        return math.nan
    return float(values.max() if largest else values.min())


def census_claim(census: pd.DataFrame) -> dict:
    """The whole-model census's row of claims.csv: how many shapes of ``census.csv`` close (sum of the
    closed forms = measured Jacobian nullity, gap >= 1e6; :mod:`attnid.theory.census`), against how many
    there are."""
    closing = int(census["closes"].astype(str).str.lower().eq("true").sum())
    worst = float(pd.to_numeric(census["gap"], errors="coerce").min()) if len(census) else math.nan
    return _claim(
        f"whole-model census closes on {len(census)} shapes",
        "census (ours)",
        float(closing),
        "=",
        len(census),
        f"shapes whose closed-form symmetry count equals the measured nullity of the "
        f"whole-model Jacobian, worst gap {worst:.1e}",
        "float64",
    )


def _finished(runs: pd.DataFrame | None) -> pd.DataFrame:
    """The runs that did not diverge (an empty frame for none)."""
    if runs is None or runs.empty:
        return pd.DataFrame() if runs is None else runs
    return runs[runs["status"] != "diverged"]


def _of_cases(done: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    return done[done["case"].isin(names)] if not done.empty else done


PLANTED_CLAIMS = (  # (key of planted_claim_values, claim, threshold)
    ("distance", "alignment: a planted element of every class of SmolLM2 is recovered", PLANTED_DISTANCE_MAX),
    (
        "barrier",
        "alignment: no loss barrier between SmolLM2 and its aligned planted element",
        PLANTED_BARRIER_MAX,
    ),
)


def claims_table(
    runs: pd.DataFrame,
    slopes: pd.DataFrame,
    sweep_runs: pd.DataFrame | None = None,
    census: pd.DataFrame | None = None,
    intervention_runs: pd.DataFrame | None = None,
    identity_runs: pd.DataFrame | None = None,
    plateau: pd.DataFrame | None = None,
    calibration: pd.DataFrame | None = None,
    quantization: tuple[pd.DataFrame, pd.DataFrame] | None = None,
    verdicts: pd.DataFrame | None = None,
    alignment: pd.DataFrame | None = None,
    nullity: pd.DataFrame | None = None,
    planted: dict | None = None,
) -> pd.DataFrame:
    """Given ``attnid verify``'s nullity.csv (``nullity``), the theory claims T1-T6 first
    (:mod:`attnid.reports.theory_claims`); then each experimental claim with the number measured in this
    pipeline's own runs (and, given ``census.csv``, the whole-model census's row).

    With the interventions' runs (``intervention_runs``: the arms and their ``adamw`` baselines;
    ``identity_runs``: the float64 run of the projected arm) the identities of the interventions follow
    (:func:`intervention_claims`); with interventions.csv (``verdicts``), their verdicts, as findings.

    ``result`` is pass, fail, missing (the runs the claim needs were not configured, or all
    diverged) or ``not applicable (dtype)``: the runs trained in a precision too coarse to
    resolve the claim's threshold; a finding's pass or fail is written holds or rejected, a verdict's is
    its label. ``dtype`` lists the precisions of the runs each claim reads.
    """
    done = _finished(runs) if not runs.empty else runs
    sweep_done = _finished(sweep_runs)
    claims = [] if nullity is None else [_claim(*row, "float64") for row in theory_claim_rows(nullity)]
    claims += _sgd_claims(_of_cases(done, [CLAIM_SGD_CASE]), slopes)
    claims += _coupled_and_adamw_claims(done)
    claims += _split_and_rebalance_claims(done, sweep_done)
    claims += [] if census is None else [census_claim(census)]
    if intervention_runs is not None or identity_runs is not None:
        claims += intervention_claims(
            pd.DataFrame() if intervention_runs is None else intervention_runs,
            pd.DataFrame() if identity_runs is None else identity_runs,
        )
    claims += protocol_claims(plateau, calibration)
    claims += [] if verdicts is None else verdict_claims(verdicts)
    if quantization is not None:
        claims += quantization_claims(*quantization)
    if alignment is not None:  # the alignment stage (attnid.reports.alignment_table)
        measured, detail = alignment_claim_values(alignment)["exact"]
        claim = f"alignment: exact on every pair of seeds in float64 (|dlogp| < {ALIGNMENT_EXACT_MAX:g})"
        claims.append(_claim(claim, "alignment (ours)", measured, "<", ALIGNMENT_EXACT_MAX, detail))
    if planted is not None:  # attnid barrier of SmolLM2 and a planted element (the alignment stage)
        values = planted_claim_values(planted)
        for key, claim, threshold in PLANTED_CLAIMS:
            claims.append(_claim(claim, "alignment (ours)", values[key][0], "<", threshold, values[key][1]))
    return with_kinds(pd.DataFrame(claims))


def quantization_claims(rows: pd.DataFrame, seeds: pd.DataFrame) -> list[dict]:
    """The quantization stage's claims (:mod:`attnid.reports.quantization_table`): those whose models the
    stage studied."""
    values = claim_values(rows, seeds)
    return [
        _claim(claim, "quantization (ours)", values[key][0], relation, threshold, values[key][1], precision)
        for key, claim, relation, threshold, precision in QUANTIZATION_CLAIMS
        if key in values
    ]


def _slope_claim(slopes: pd.DataFrame, circuit: str) -> dict:
    """E1: the log-log slope of SGD's final β of ``circuit`` against the sweep's lr."""
    quantity = f"beta_{circuit}_final"
    hit = slopes[(slopes["optimizer"] == CLAIM_SGD_CASE) & (slopes["quantity"] == quantity)]
    measured = float(hit["slope"].iloc[0]) if len(hit) else math.nan
    dtypes = (
        str(hit["dtype"].iloc[0]) if len(hit) and "dtype" in hit and pd.notna(hit["dtype"].iloc[0]) else ""
    )
    return _claim(
        f"E1 sgd sweep beta_{circuit} slope in [{SGD_BETA_SLOPE[0]:g}, {SGD_BETA_SLOPE[1]:g}]",
        "E1, Section 5",
        measured,
        "in",
        SGD_BETA_SLOPE,
        f"log-log slope of final beta_{circuit} (= its second-order drift) against lr over the sgd sweep",
        dtypes,
        FLOAT64_ONLY,
    )


def _sgd_claims(sgd: pd.DataFrame, slopes: pd.DataFrame) -> list[dict]:
    """E1: plain SGD's first-order drift and ρ are round-off; its β grows like lr²."""
    ratio_columns = [f"drift_ratio_{c}_final" for c in CIRCUITS]
    return [
        _claim(
            "E1 sgd drift1/drift2 < 1e-9",
            "E1, Lemma 5.1",
            _extreme(sgd, ratio_columns),
            "<",
            DRIFT_RATIO_SGD_MAX,
            f"largest first- over second-order drift at the last row, both circuits, "
            f"over {len(sgd)} sgd runs",
            dtypes_of(sgd),
            FLOAT64_ONLY,
        ),
        _claim(
            "E1 sgd rho max < 1e-20",
            "E1, Lemma 5.1",
            _extreme(sgd, [f"rho_{c}_max" for c in CIRCUITS]),
            "<",
            RHO_SGD_MAX,
            f"largest per-step rho, both circuits, over {len(sgd)} sgd runs",
            dtypes_of(sgd),
            FLOAT64_ONLY,
        ),
        _slope_claim(slopes, "qk"),
        _slope_claim(slopes, "ov"),
    ]


def _coupled_and_adamw_claims(done: pd.DataFrame) -> list[dict]:
    """E2: coupled weight decay's first-order drift is its prediction; AdamW moves along the orbit."""
    coupled = _of_cases(done, [case.name for case in CASES.values() if case.coupled_weight_decay])
    adamw = _of_cases(done, [CLAIM_ADAMW_CASE])
    return [
        _claim(
            "E2 sgd_wd drift1 = prediction (rel. error < 1e-6)",
            "E2, Section 5",
            _extreme(coupled, ["drift1_pred_relerr_max"]),
            "<",
            DRIFT_PRED_RELERR_MAX,
            f"largest ||D1 - sum_s -2 lr_s wd I_s|| / ||prediction||, both circuits, "
            f"over {len(coupled)} runs with coupled weight decay",
            dtypes_of(coupled),
            FLOAT64_ONLY,
        ),
        _claim(
            "E2 adamw drift1/drift2 > 10",
            "E2, Section 5",
            _extreme(adamw, [f"drift_ratio_{c}_final" for c in CIRCUITS], largest=False),
            ">",
            DRIFT_RATIO_ADAMW_MIN,
            f"smallest first- over second-order drift at the last row, both circuits, "
            f"over {len(adamw)} adamw runs",
            dtypes_of(adamw),
        ),
        _claim(
            "E2 rho_qk adamw mean > 1e-2",
            "E2, Section 5",
            _extreme(adamw, ["rho_qk_mean"], largest=False),
            ">",
            RHO_ADAMW_MIN,
            f"smallest per-run mean rho_qk over {len(adamw)} adamw runs",
            dtypes_of(adamw),
        ),
    ]


def _split_and_rebalance_claims(done: pd.DataFrame, sweep_done: pd.DataFrame) -> list[dict]:
    """The drift split closes in every run; E3: orbit moves keep the function, rebalancing resets β."""
    rebalancing = rebalancing_cases()
    rebalanced = _of_cases(done, rebalancing)
    every = pd.concat([frame for frame in (done, sweep_done) if not frame.empty]) if not done.empty else done
    return [
        _claim(
            "drift split closes: closure < 1e-10",
            "drift split (ours)",
            _extreme(every, ["closure_max"]),
            "<",
            CLOSURE_MAX,
            f"largest ||I_t - I_ref - D1 - D2|| / N0 over {len(every)} runs and sweep runs",
            dtypes_of(every),
        ),
        _claim(
            "E3 tau max < 1e-5",
            "E3, Lemma 4.1",
            _extreme(done, ["tau_max"]),
            "<",
            TAU_MAX,
            f"largest relative loss change of an orbit move (every rebalance, every probed row) over "
            f"{len(done)} runs",
            dtypes_of(done),
        ),
        _claim(
            "E3 beta after rebalance ~ 0 (< 1e-2 x before)",
            "E3, Section 5",
            _extreme(rebalanced, ["beta_rebalance_ratio_max"]),
            "<",
            BETA_REBALANCE_RATIO_MAX,
            f"largest ratio of beta right after a rebalance to beta at the log step before it, "
            f"over {len(rebalanced)} {'/'.join(rebalancing)} runs",
            dtypes_of(rebalanced),
        ),
    ]


def _paired(runs: pd.DataFrame, other: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """Each run of ``runs`` with the run of ``other`` that has its seed (runs without one left out)."""
    by_seed = {row["seed"]: row for _, row in other.iterrows()}
    return [(row, by_seed[row["seed"]]) for _, row in runs.iterrows() if row["seed"] in by_seed]


def _finished_case(frame: pd.DataFrame, case: str) -> pd.DataFrame:
    """The finished runs of ``case`` (of ``adamw``: only those that keep the moments, the baseline)."""
    if frame.empty:
        return frame
    done = frame[(frame["status"] != "diverged") & (frame["case"] == case)]
    return done[done["rebalance_moments"].fillna("keep") == "keep"] if case == CLAIM_ADAMW_CASE else done


def protocol_claims(plateau: pd.DataFrame | None, calibration: pd.DataFrame | None) -> list[dict]:
    """The interventions' protocol, checked on its own runs (docs/design.md §11.3): every compared arm at
    its plateau (interventions_plateau.csv), every calibrated arm's best lr inside its grid
    (calibration.csv); each only where the build has the table."""
    claims = []
    if plateau is not None and len(plateau):
        threshold = float(plateau["threshold"].iloc[0])
        fraction = 1 - float(plateau["step_from"].iloc[0]) / float(plateau["step_to"].iloc[0])
        claims.append(
            _claim(
                f"interventions: every arm at its plateau (last {fraction:.0%} improves < {threshold:.0%})",
                "protocol (ours)",
                float(plateau["relative_improvement"].max()),
                "<",
                threshold,
                f"largest relative improvement of the seeds' mean whole-split val loss over the last "
                f"{fraction:.0%} of training, over {len(plateau)} arms (interventions_plateau.csv)",
                "",
            )
        )
    if calibration is not None and len(calibration):
        best = calibration[calibration["best"].astype(bool)]
        claims.append(
            _claim(
                "interventions: every best lr inside its calibration grid",
                "protocol (ours)",
                int(best["at_edge"].astype(bool).sum()),
                "in",
                (0, 0),
                f"calibrated arms whose best lr is the smallest or largest of their grid, of {len(best)} "
                f"(calibration.csv)",
                "",
            )
        )
    return claims


def intervention_claims(arms: pd.DataFrame, identity: pd.DataFrame) -> list[dict]:
    """The identities of the interventions on the orbit (docs/design.md §13-§15), measured in their runs:

    - the projected step in float64 (``identity``): ρ and drift1/drift2 at round-off, as E1's for SGD;
    - the gauge-fixed arm: the trained attention entries drop (``adamw``'s run of the same seed minus
      the arm's) by exactly the closed form ``2 L G D^2``; its initial function equals ``adamw``'s (logits
      on the probe batch, and the step-0 val loss against ``adamw``'s run of the same seed);
    - the rebalancing arm with the first moment transported: its orbit moves keep the function (τ); only
      where the arms include it.
    """
    rebalancing = (
        arms[arms["case"].isin(rebalancing_cases()) & (arms["status"] != "diverged")]
        if not arms.empty
        else arms
    )
    transported = (
        rebalancing[rebalancing["rebalance_moments"] == FIRST_MOMENT]
        if not rebalancing.empty
        else rebalancing
    )
    # a config whose arms move no moments (the default's) makes no such claim, rather than a `missing` row
    moved_moments = (
        not arms.empty and "rebalance_moments" in arms and (arms["rebalance_moments"] == FIRST_MOMENT).any()
    )
    claims = _projected_claims(_finished_case(identity, PROJECTED_CASE)) + _gauge_fixed_claims(arms)
    if moved_moments:
        claims.append(
            _claim(
                "interventions: first-moment rebalance tau max < 1e-5",
                "design §15 (ours)",
                _extreme(transported, ["tau_max"]),
                "<",
                TAU_MAX,
                f"largest relative loss change of an orbit move over {len(transported)} rebalancing runs "
                f"with the first moment transported",
                dtypes_of(transported),
            )
        )
    return claims


def _projected_claims(projected: pd.DataFrame) -> list[dict]:
    """§13: the projected step is orthogonal to the orbit: in float64 its ρ and drift1 are round-off."""
    return [
        _claim(
            "interventions: projected rho max < 1e-20",
            "design §13 (ours)",
            _extreme(projected, [f"rho_{c}_max" for c in CIRCUITS]),
            "<",
            RHO_SGD_MAX,
            f"largest per-step rho of {PROJECTED_CASE}, both circuits, over {len(projected)} float64 "
            f"run(s): a step with its orbit component removed is orthogonal to the orbit",
            dtypes_of(projected),
            FLOAT64_ONLY,
        ),
        _claim(
            "interventions: projected drift1/drift2 < 1e-9",
            "design §13 (ours)",
            _extreme(projected, [f"drift_ratio_{c}_max" for c in CIRCUITS]),
            "<",
            DRIFT_RATIO_SGD_MAX,
            f"largest first- over second-order drift on any row, both circuits, over {len(projected)} "
            f"float64 {PROJECTED_CASE} run(s): orthogonal steps conserve the imbalance to first order",
            dtypes_of(projected),
            FLOAT64_ONLY,
        ),
    ]


def _with_baseline(arms: pd.DataFrame, names: set[str]) -> list[tuple[pd.Series, pd.Series]]:
    """Each finished run of the arms ``names`` with the run of its baseline (``adamw``, or ``adamw_best_lr``
    for an arm at its best lr: :func:`attnid.plan.interventions.arm_baseline`) that has its seed."""
    if arms.empty or "arm" not in arms:
        return []
    done = arms[arms["status"] != "diverged"]
    baselines = {(row["arm"], row["seed"]): row for _, row in done.iterrows()}
    pairs = []
    for _, row in done[done["arm"].isin(names)].iterrows():
        base = baselines.get((arm_baseline(str(row["arm"]), str(row["case"])), row["seed"]))
        if base is not None:
            pairs.append((row, base))
    return pairs


def _arms_named(runs: pd.DataFrame) -> str:
    return ", ".join(sorted(set(runs["arm"]))) if "arm" in runs else "none"


def _gauge_fixed_claims(arms: pd.DataFrame) -> list[dict]:
    """§14: each arm that fixes the blocks (the gauge arm and its at-init control, at the stage's lr or
    its best) trains ``2 L G D^2`` fewer attention entries than its baseline of the same seed; the gauge
    arm, which moves the initial weights into the gauge, starts from its baseline's function."""
    gauge_arms = {GAUGE_ARM + suffix for suffix in ("", CALIBRATED_SUFFIX)}
    at_init_arms = {AT_INIT_ARM + suffix for suffix in ("", CALIBRATED_SUFFIX)}
    fixed = _with_baseline(arms, gauge_arms | at_init_arms)
    moved = _with_baseline(arms, gauge_arms)
    count_errors = [
        abs(
            float(base["trained_attention_params"])
            - float(run["trained_attention_params"])
            - float(run["unidentified_qk_ov_params"])
        )
        for run, base in fixed
    ]
    start_changes = [
        abs(run["initial_val_loss"] - base["initial_val_loss"]) / abs(base["initial_val_loss"])
        for run, base in moved
    ]
    gauge = pd.DataFrame([run for run, _ in moved])
    fixed_runs = pd.DataFrame([run for run, _ in fixed])
    both_fixed = pd.DataFrame([run for run, _ in fixed] + [base for _, base in fixed])
    both_moved = pd.DataFrame([run for run, _ in moved] + [base for _, base in moved])
    return [
        _claim(
            "interventions: gauge-fixed trains 2 L G D^2 fewer attention entries",
            "design §14 (ours)",
            max(count_errors) if count_errors else math.nan,
            "in",
            (0, 0),
            f"largest |(baseline - arm) trained attention entries - L (unidentified_qk + unidentified_ov)| "
            f"over {len(fixed)} seed pairs of the arms that fix the blocks ({_arms_named(fixed_runs)})",
            dtypes_of(both_fixed),
        ),
        _claim(
            "interventions: gauge-fixed initial logits = adamw's (< 1e-5)",
            "design §14 (ours)",
            _extreme(gauge, ["gauge_logit_change"]) if len(gauge) else math.nan,
            "<",
            GAUGE_INITIAL_CHANGE_MAX,
            f"largest max-abs change of the probe logits over max-abs logit, moving the baseline's initial "
            f"weights into the gauge, over the {len(gauge)} runs that move there ({_arms_named(gauge)})",
            dtypes_of(gauge),
        ),
        _claim(
            "interventions: gauge-fixed step-0 val loss = adamw's (< 1e-5)",
            "design §14 (ours)",
            max(start_changes) if start_changes else math.nan,
            "<",
            GAUGE_INITIAL_CHANGE_MAX,
            f"largest relative difference of the step-0 val loss from the baseline's of the same seed, "
            f"over {len(moved)} seed pairs ({_arms_named(gauge)})",
            dtypes_of(both_moved),
        ),
    ]
