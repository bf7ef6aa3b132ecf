"""Experiment tables: per run, per case (mean ± sd over seeds), LR sweep, and claims.

Reads only what ``attnid train`` leaves in each run directory (``run.json`` and
``metrics.csv``), so it is testable on synthetic runs and never needs torch.

    attnid tables --runs-dir results/runs --sweep-dir results/sweep --out-dir results/tables

writes ``runs``, ``cases`` and ``sweep`` as CSV and LaTeX (jinja2 templates
``paper/templates/experiment_*.tex.j2``), ``sweep_slopes.csv`` (log-log slope of
the final β and the mean ρ against the learning rate) and ``claims.csv``: each
experimental claim of the paper (E1-E3, docs/design.md §1) with the measured number, the
threshold, the training precision of the runs it reads, and pass, fail, missing or
``not applicable (dtype)`` (the runs' precision cannot resolve the threshold). A
diverged run stays in every table with its status.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.reports.latex import render_table
from attnid.reports.round_off import UNIT_ROUND_OFF, run_dtype
from attnid.theory.circuits import CIRCUITS
from attnid.training.cases import CASES, rebalancing_cases
from attnid.training.rundir import find_run_dirs, load_run

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
PROJECTED_CASE, GAUGE_FIXED_CASE, TRANSPORT_MOMENTS = "adamw_projected", "adamw_gauge_fixed", "transport"

# The coarsest unit round-off at which a round-off claim above is decidable: float64 only
# (float32 puts SGD's drift1 / drift2 near 1e-5, its ρ near 1e-9 and β_QK of the sweep at its floor).
FLOAT64_ONLY = 1e-12
NOT_APPLICABLE = "not applicable (dtype)"

# Per-run summary columns whose mean ± sd over seeds make the per-case table.
SUMMARY_COLUMNS = [
    "final_train_loss",
    "final_val_loss",
    "rho_qk_mean",
    "rho_qk_max",
    "rho_ov_mean",
    "rho_ov_max",
    "beta_qk_final",
    "beta_ov_final",
    "tau_max",
    "mu_qk_final",
    "mu_ov_final",
    "drift1_qk_final",
    "drift1_ov_final",
    "drift2_qk_final",
    "drift2_ov_final",
    "closure_max",
]


# ---------------------------------------------------------------------------- summarising runs


def _last_finite(values: pd.Series) -> float:
    finite = pd.to_numeric(values, errors="coerce").replace([np.inf, -np.inf], np.nan).dropna()
    return float(finite.iloc[-1]) if len(finite) else math.nan


def _first_finite(values: pd.Series) -> float:
    finite = pd.to_numeric(values, errors="coerce").replace([np.inf, -np.inf], np.nan).dropna()
    return float(finite.iloc[0]) if len(finite) else math.nan


def _column(metrics: pd.DataFrame, name: str) -> pd.Series:
    if name not in metrics:
        return pd.Series(np.nan, index=metrics.index, dtype=float)
    return pd.to_numeric(metrics[name], errors="coerce").replace([np.inf, -np.inf], np.nan)


def rebalanced_rows(metrics: pd.DataFrame) -> pd.Series:
    """Boolean mask of the logged steps at which a rebalance was applied."""
    if "rebalanced" not in metrics:
        return pd.Series(False, index=metrics.index)
    flags = metrics["rebalanced"].astype(str).str.strip().str.lower()
    return flags.isin(["1", "1.0", "true", "yes"])


def summarize_run(info: dict, metrics: pd.DataFrame) -> dict:
    """One row of the per-run table: final losses, mean/max ρ, final β and μ, max τ.

    ρ is averaged over the logged optimizer steps (Lemma 5.1 predicts ~0 for SGD);
    β and μ are taken at the last logged step; ``beta_after_rebalance_max`` is the
    largest β logged right after a rebalance (~0 when rebalancing restores I_0).
    """
    status = str(info.get("status", "unknown"))
    row = {
        "case": info.get("case"),
        "seed": info.get("seed"),
        "lr": info.get("lr"),
        "status": status,
        "steps": int(metrics["step"].max()) if "step" in metrics and len(metrics) else 0,
        "diverged_step": info.get("diverged_step"),
        "wall_time_s": info.get("wall_time_s"),
        "dtype": run_dtype(info),
        "rebalance_moments": (info.get("config") or {}).get("rebalance_moments", "keep"),
        "trained_attention_params": info.get("trained_attention_params"),
        "gauge_logit_change": (info.get("gauge") or {}).get("logit_change"),
        "initial_val_loss": _first_finite(_column(metrics, "val_loss")),
        "unidentified_qk_ov_params": unidentified_qk_ov_params(info.get("config") or {}),
    }
    for split in ("train", "val"):
        from_json = info.get(f"final_{split}_loss")
        value = float(from_json) if isinstance(from_json, (int, float)) else math.nan
        row[f"final_{split}_loss"] = (
            value if math.isfinite(value) else _last_finite(_column(metrics, f"{split}_loss"))
        )
    if status == "diverged":  # a diverged run has no meaningful final loss
        row["final_train_loss"] = row["final_val_loss"] = math.nan
    for circuit in CIRCUITS:
        rho = _column(metrics, f"rho_{circuit}")
        row[f"rho_{circuit}_mean"] = float(rho.mean()) if rho.notna().any() else math.nan
        row[f"rho_{circuit}_max"] = float(rho.max()) if rho.notna().any() else math.nan
        row[f"beta_{circuit}_final"] = _last_finite(_column(metrics, f"beta_{circuit}"))
        row[f"mu_{circuit}_final"] = _last_finite(_column(metrics, f"mu_{circuit}"))
    row.update(summarize_drift(metrics))
    for name in ("tau", "tau_logits"):
        tau = _column(metrics, name).abs()
        row[f"{name}_max"] = float(tau.max()) if tau.notna().any() else math.nan
    after = rebalanced_rows(metrics)
    beta_both = pd.concat([_column(metrics, f"beta_{c}") for c in CIRCUITS], axis=1).max(axis=1)
    row["n_rebalances"] = int(after.sum())
    row["beta_after_rebalance_max"] = float(beta_both[after].max()) if after.any() else math.nan
    # β just after each rebalance over β at the logged step before it (skipped when that row is
    # itself a rebalance, or has no drift to undo)
    before = beta_both.shift(1)
    usable = after & ~after.shift(1, fill_value=False) & (before > 0)
    ratios = beta_both[usable] / before[usable]
    row["beta_rebalance_ratio_max"] = float(ratios.max()) if len(ratios) else math.nan
    return row


def unidentified_qk_ov_params(config: dict) -> float:
    """``L (unidentified_qk_params + unidentified_ov_params)`` of counts.py for a run's attention shape (its
    run.json ``config``): the query-key and output-value weights no output sees, ``2 L G D^2`` without
    RoPE, which are the entries the gauge-fixed arm fixes (docs/design.md §5, §14). NaN for a config
    without a shape."""
    from attnid.theory.counts import layer_shape, unidentified_ov_params, unidentified_qk_params

    try:
        shape = layer_shape(
            config["n_embd"],
            config["n_head"],
            config.get("n_kv_head"),
            config.get("head_dim"),
            None,
            bool(config.get("rope")),
            bool(config.get("bias")),
        )
    except (KeyError, TypeError, ValueError):
        return math.nan
    return float(config["n_layer"] * (unidentified_qk_params(shape) + unidentified_ov_params(shape)))


def summarize_drift(metrics: pd.DataFrame) -> dict:
    """The drift split (docs/design.md §7): drift1, drift2 and their ratio at the last logged row per
    circuit, the largest closure, and (SGD + coupled decay) the largest relative error of drift1 against
    its prediction.

    ``drift_ratio_{qk,ov}_final`` = drift1 / drift2 at the last row (NaN where drift2 is 0), and
    ``drift_ratio_{qk,ov}_max`` the largest over the rows where drift2 is not 0.
    """
    row = {}
    for circuit in CIRCUITS:
        first, second = (_column(metrics, f"drift{order}_{circuit}") for order in (1, 2))
        both = first.notna() & second.notna()
        last_first = float(first[both].iloc[-1]) if both.any() else math.nan
        last_second = float(second[both].iloc[-1]) if both.any() else math.nan
        row[f"drift1_{circuit}_final"], row[f"drift2_{circuit}_final"] = last_first, last_second
        row[f"drift_ratio_{circuit}_final"] = last_first / last_second if last_second > 0 else math.nan
        ratios = (first / second)[both & (second > 0)]
        row[f"drift_ratio_{circuit}_max"] = float(ratios.max()) if len(ratios) else math.nan
    closure = pd.concat([_column(metrics, f"closure_{c}") for c in CIRCUITS]).dropna()
    row["closure_max"] = float(closure.max()) if len(closure) else math.nan
    relerr = pd.concat([_column(metrics, f"drift1_pred_relerr_{c}") for c in CIRCUITS]).dropna()
    row["drift1_pred_relerr_max"] = float(relerr.max()) if len(relerr) else math.nan
    return row


def runs_table(run_dirs: list[Path]) -> pd.DataFrame:
    """Per-run summary rows, ordered by case, lr and seed."""
    rows = [summarize_run(*load_run(d)) | {"run_dir": str(d)} for d in run_dirs]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["case", "lr", "seed"], kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- aggregation


def cases_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample sd (ddof=1) over seeds of every summary column, per case.

    Diverged runs are counted (``n_diverged``) but left out of the statistics.
    """
    rows = []
    for case, group in runs.groupby("case", sort=False):
        done = group[group["status"] != "diverged"]
        row = {
            "case": case,
            "lr": group["lr"].iloc[0],
            "n_seeds": len(group),
            "n_diverged": int((group["status"] == "diverged").sum()),
        }
        row.update(mean_sd_over_seeds(done, SUMMARY_COLUMNS))
        rows.append(row)
    return pd.DataFrame(rows)


def mean_sd_over_seeds(runs: pd.DataFrame, columns: Iterable[str]) -> dict[str, float]:
    """``<column>_mean`` and ``<column>_sd`` (sample sd, ddof=1; NaN below two finite values) of each
    column."""
    out = {}
    for column in columns:
        values = pd.to_numeric(runs[column], errors="coerce").dropna()
        out[f"{column}_mean"] = float(values.mean()) if len(values) else math.nan
        out[f"{column}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return out


def sweep_table(sweep_runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (optimizer, lr): means over the seeds that did not diverge."""
    rows = []
    if sweep_runs.empty:
        return pd.DataFrame(columns=["optimizer", "lr", "status", "n_seeds", "n_diverged"])
    for (optimizer, lr), group in sweep_runs.groupby(["case", "lr"], sort=True):
        diverged = group["status"] == "diverged"
        done = group[~diverged]
        status = "ok" if not diverged.any() else ("diverged" if diverged.all() else "partly diverged")
        row = {
            "optimizer": optimizer,
            "lr": float(cast(float, lr)),  # groupby's keys are typed Hashable
            "status": status,
            "dtype": _dtypes(group),
            "n_seeds": len(group),
            "n_diverged": int(diverged.sum()),
            "diverged_step": group["diverged_step"].dropna().min() if diverged.any() else math.nan,
        }
        for column in [
            "final_train_loss",
            "final_val_loss",
            "beta_qk_final",
            "beta_ov_final",
            "rho_qk_mean",
            "rho_ov_mean",
            "tau_max",
        ]:
            values = pd.to_numeric(done[column], errors="coerce").dropna()
            row[column] = float(values.mean()) if len(values) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def fit_loglog_slope(x: ArrayLike, y: ArrayLike) -> dict:
    """Least-squares line through (log10 x, log10 y) over the finite, positive points.

    Returns slope, intercept (log10 units), r2 and the number of points used; NaNs
    when fewer than two points qualify.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    n_points = int(keep.sum())
    if n_points < 2 or np.unique(x[keep]).size < 2:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan, "n_points": n_points}
    log_x, log_y = np.log10(x[keep]), np.log10(y[keep])
    slope, intercept = np.polyfit(log_x, log_y, 1)
    residual = log_y - (slope * log_x + intercept)
    total = ((log_y - log_y.mean()) ** 2).sum()
    r2 = 1.0 - (residual**2).sum() / total if total > 0 else 1.0
    return {"slope": float(slope), "intercept": float(intercept), "r2": float(r2), "n_points": n_points}


def sweep_slopes_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Fitted log-log slopes against lr of final β and mean ρ, per optimizer (diverged points left out)."""
    rows = []
    for optimizer, group in sweep.groupby("optimizer", sort=True):
        done = group[group["status"] != "diverged"]
        for quantity in ["beta_qk_final", "beta_ov_final", "rho_qk_mean", "rho_ov_mean"]:
            rows.append(
                {"optimizer": optimizer, "quantity": quantity}
                | fit_loglog_slope(done["lr"], done[quantity])
                | {"dtype": _dtypes(done)}
            )
    return pd.DataFrame(
        rows, columns=["optimizer", "quantity", "slope", "intercept", "r2", "n_points", "dtype"]
    )


# ---------------------------------------------------------------------------- claims


def _dtypes(frame: pd.DataFrame) -> str:
    """The training precisions of ``frame``'s runs, e.g. ``float64`` or ``float32+float64`` ('' for none)."""
    if frame.empty or "dtype" not in frame:
        return ""
    names = set()
    for value in frame["dtype"].dropna().astype(str):
        names.update(value.split("+"))
    return "+".join(sorted(names))


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
    if measured is None or not math.isfinite(measured):
        result = "missing"
    elif not resolves(dtypes, max_round_off):
        result = NOT_APPLICABLE
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
    closed forms = measured Jacobian nullity, gap >= 1e6; attnid.census), against how many there are."""
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


def claims_table(
    runs: pd.DataFrame,
    slopes: pd.DataFrame,
    sweep_runs: pd.DataFrame | None = None,
    census: pd.DataFrame | None = None,
    intervention_runs: pd.DataFrame | None = None,
    identity_runs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Each experimental claim with the number measured in this pipeline's own runs (and, given
    ``census.csv``, the whole-model census's row).

    With the interventions' runs (``intervention_runs``: the arms and their ``adamw`` baselines;
    ``identity_runs``: the float64 run of the projected arm) the identities of the interventions follow
    (:func:`intervention_claims`).

    ``result`` is pass, fail, missing (the runs the claim needs were not configured, or all
    diverged) or ``not applicable (dtype)``: the runs trained in a precision too coarse to
    resolve the claim's threshold. ``dtype`` lists the precisions of the runs each claim reads.
    """
    done = runs[runs["status"] != "diverged"] if not runs.empty else runs
    sweep_runs = pd.DataFrame() if sweep_runs is None else sweep_runs
    sweep_done = sweep_runs[sweep_runs["status"] != "diverged"] if not sweep_runs.empty else sweep_runs

    def of_cases(names: list[str]) -> pd.DataFrame:
        return done[done["case"].isin(names)] if not done.empty else done

    def slope_claim(circuit: str) -> dict:
        quantity = f"beta_{circuit}_final"
        hit = slopes[(slopes["optimizer"] == CLAIM_SGD_CASE) & (slopes["quantity"] == quantity)]
        measured = float(hit["slope"].iloc[0]) if len(hit) else math.nan
        dtypes = (
            str(hit["dtype"].iloc[0])
            if len(hit) and "dtype" in hit and pd.notna(hit["dtype"].iloc[0])
            else ""
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

    sgd, adamw = of_cases([CLAIM_SGD_CASE]), of_cases([CLAIM_ADAMW_CASE])
    coupled = of_cases([case.name for case in CASES.values() if case.coupled_weight_decay])
    rebalancing = rebalancing_cases()
    rebalanced = of_cases(rebalancing)
    every = pd.concat([frame for frame in (done, sweep_done) if not frame.empty]) if not done.empty else done
    ratio_columns = [f"drift_ratio_{c}_final" for c in CIRCUITS]
    census_rows = [] if census is None else [census_claim(census)]
    claims = [
        _claim(
            "E1 sgd drift1/drift2 < 1e-9",
            "E1, Lemma 5.1",
            _extreme(sgd, ratio_columns),
            "<",
            DRIFT_RATIO_SGD_MAX,
            f"largest first- over second-order drift at the last row, both circuits, "
            f"over {len(sgd)} sgd runs",
            _dtypes(sgd),
            FLOAT64_ONLY,
        ),
        _claim(
            "E1 sgd rho max < 1e-20",
            "E1, Lemma 5.1",
            _extreme(sgd, [f"rho_{c}_max" for c in CIRCUITS]),
            "<",
            RHO_SGD_MAX,
            f"largest per-step rho, both circuits, over {len(sgd)} sgd runs",
            _dtypes(sgd),
            FLOAT64_ONLY,
        ),
        slope_claim("qk"),
        slope_claim("ov"),
        _claim(
            "E2 sgd_wd drift1 = prediction (rel. error < 1e-6)",
            "E2, Section 5",
            _extreme(coupled, ["drift1_pred_relerr_max"]),
            "<",
            DRIFT_PRED_RELERR_MAX,
            f"largest ||D1 - sum_s -2 lr_s wd I_s|| / ||prediction||, both circuits, "
            f"over {len(coupled)} runs with coupled weight decay",
            _dtypes(coupled),
            FLOAT64_ONLY,
        ),
        _claim(
            "E2 adamw drift1/drift2 > 10",
            "E2, Section 5",
            _extreme(adamw, ratio_columns, largest=False),
            ">",
            DRIFT_RATIO_ADAMW_MIN,
            f"smallest first- over second-order drift at the last row, both circuits, "
            f"over {len(adamw)} adamw runs",
            _dtypes(adamw),
        ),
        _claim(
            "E2 rho_qk adamw mean > 1e-2",
            "E2, Section 5",
            _extreme(adamw, ["rho_qk_mean"], largest=False),
            ">",
            RHO_ADAMW_MIN,
            f"smallest per-run mean rho_qk over {len(adamw)} adamw runs",
            _dtypes(adamw),
        ),
        _claim(
            "drift split closes: closure < 1e-10",
            "drift split (ours)",
            _extreme(every, ["closure_max"]),
            "<",
            CLOSURE_MAX,
            f"largest ||I_t - I_ref - D1 - D2|| / N0 over {len(every)} runs and sweep runs",
            _dtypes(every),
        ),
        _claim(
            "E3 tau max < 1e-5",
            "E3, Lemma 4.1",
            _extreme(done, ["tau_max"]),
            "<",
            TAU_MAX,
            f"largest relative loss change of an orbit move (every rebalance, every probed row) over "
            f"{len(done)} runs",
            _dtypes(done),
        ),
        _claim(
            "E3 beta after rebalance ~ 0 (< 1e-2 x before)",
            "E3, Section 5",
            _extreme(rebalanced, ["beta_rebalance_ratio_max"]),
            "<",
            BETA_REBALANCE_RATIO_MAX,
            f"largest ratio of beta right after a rebalance to beta at the log step before it, "
            f"over {len(rebalanced)} {'/'.join(rebalancing)} runs",
            _dtypes(rebalanced),
        ),
    ] + census_rows
    if intervention_runs is not None or identity_runs is not None:
        claims += intervention_claims(
            pd.DataFrame() if intervention_runs is None else intervention_runs,
            pd.DataFrame() if identity_runs is None else identity_runs,
        )
    return pd.DataFrame(claims)


def _paired(runs: pd.DataFrame, other: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """Each run of ``runs`` with the run of ``other`` that has its seed (runs without one left out)."""
    by_seed = {row["seed"]: row for _, row in other.iterrows()}
    return [(row, by_seed[row["seed"]]) for _, row in runs.iterrows() if row["seed"] in by_seed]


def intervention_claims(arms: pd.DataFrame, identity: pd.DataFrame) -> list[dict]:
    """The identities of the interventions on the orbit (docs/design.md §13-§15), measured in their runs:

    - the projected step in float64 (``identity``): ρ and drift1/drift2 at round-off, as E1's for SGD;
    - the gauge-fixed arm: the trained attention entries drop (``adamw``'s run of the same seed minus
      the arm's) by exactly the closed form ``2 L G D^2``; its initial function equals ``adamw``'s (logits
      on the probe batch, and the step-0 val loss against ``adamw``'s run of the same seed);
    - the rebalancing arm with transported moments: its orbit moves keep the function (τ).
    """

    def of_case(frame: pd.DataFrame, case: str) -> pd.DataFrame:
        if frame.empty:
            return frame
        done = frame[(frame["status"] != "diverged") & (frame["case"] == case)]
        return done[done["rebalance_moments"].fillna("keep") == "keep"] if case == CLAIM_ADAMW_CASE else done

    projected = of_case(identity, PROJECTED_CASE)
    gauge, adamw = of_case(arms, GAUGE_FIXED_CASE), of_case(arms, CLAIM_ADAMW_CASE)
    rebalancing = (
        arms[arms["case"].isin(rebalancing_cases()) & (arms["status"] != "diverged")]
        if not arms.empty
        else arms
    )
    transported = (
        rebalancing[rebalancing["rebalance_moments"] == TRANSPORT_MOMENTS]
        if not rebalancing.empty
        else rebalancing
    )
    pairs = _paired(gauge, adamw) if not gauge.empty and not adamw.empty else []
    count_errors = [
        abs(
            float(base["trained_attention_params"])
            - float(run["trained_attention_params"])
            - float(run["unidentified_qk_ov_params"])
        )
        for run, base in pairs
    ]
    start_changes = [
        abs(run["initial_val_loss"] - base["initial_val_loss"]) / abs(base["initial_val_loss"])
        for run, base in pairs
    ]
    paired = pd.DataFrame([run for run, _ in pairs] + [base for _, base in pairs])
    return [
        _claim(
            "interventions: projected rho max < 1e-20",
            "design §13 (ours)",
            _extreme(projected, [f"rho_{c}_max" for c in CIRCUITS]),
            "<",
            RHO_SGD_MAX,
            f"largest per-step rho of {PROJECTED_CASE}, both circuits, over {len(projected)} float64 "
            f"run(s): a step with its orbit component removed is orthogonal to the orbit",
            _dtypes(projected),
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
            _dtypes(projected),
            FLOAT64_ONLY,
        ),
        _claim(
            "interventions: gauge-fixed trains 2 L G D^2 fewer attention entries",
            "design §14 (ours)",
            max(count_errors) if count_errors else math.nan,
            "in",
            (0, 0),
            f"largest |(adamw - {GAUGE_FIXED_CASE}) trained attention entries - L (unidentified_qk + "
            f"unidentified_ov)| over {len(pairs)} seed pairs",
            _dtypes(paired),
        ),
        _claim(
            "interventions: gauge-fixed initial logits = adamw's (< 1e-5)",
            "design §14 (ours)",
            _extreme(gauge, ["gauge_logit_change"]),
            "<",
            GAUGE_INITIAL_CHANGE_MAX,
            f"largest max-abs change of the probe logits over max-abs logit, moving adamw's initial "
            f"weights into the gauge, over {len(gauge)} {GAUGE_FIXED_CASE} runs",
            _dtypes(gauge),
        ),
        _claim(
            "interventions: gauge-fixed step-0 val loss = adamw's (< 1e-5)",
            "design §14 (ours)",
            max(start_changes) if start_changes else math.nan,
            "<",
            GAUGE_INITIAL_CHANGE_MAX,
            f"largest relative difference of the step-0 val loss from adamw's of the same seed, over "
            f"{len(pairs)} seed pairs",
            _dtypes(paired),
        ),
        _claim(
            "interventions: transported rebalance tau max < 1e-5",
            "design §15 (ours)",
            _extreme(transported, ["tau_max"]),
            "<",
            TAU_MAX,
            f"largest relative loss change of an orbit move over {len(transported)} rebalancing runs with "
            f"the moments transported",
            _dtypes(transported),
        ),
    ]


# ---------------------------------------------------------------------------- command line


def write_tables(
    runs_dir: str | Path | None,
    sweep_dir: str | Path | None,
    out_dir: str | Path,
    runs: list[str] | None = None,
    sweep_runs: list[str] | None = None,
    census_csv: str | Path | None = None,
    intervention_runs: list[str] | None = None,
    identity_runs: list[str] | None = None,
) -> dict[str, pd.DataFrame]:
    """Build every table from the run directories and write them under ``out_dir``.

    ``runs`` / ``sweep_runs`` list the run directories explicitly (what the pipeline does);
    otherwise every run under ``runs_dir`` / ``sweep_dir`` is gathered. ``intervention_runs`` (the
    interventions' arms and baselines) and ``identity_runs`` (its float64 projected run) add the
    interventions' identities to claims.csv.
    """
    run_dirs = find_run_dirs(runs_dir, runs)
    if not run_dirs:
        raise UserError(
            f"no runs (run.json) under {runs_dir}; run the training jobs first (snakemake --cores all)"
        )
    sweep_dirs = find_run_dirs(sweep_dir, sweep_runs)
    run_rows = runs_table(run_dirs)
    sweep_run_rows = runs_table(sweep_dirs) if sweep_dirs else pd.DataFrame()
    cases = cases_table(run_rows)
    sweep = sweep_table(sweep_run_rows)
    slopes = (
        sweep_slopes_table(sweep)
        if not sweep.empty
        else sweep_slopes_table(pd.DataFrame(columns=["optimizer", "lr", "status"]))
    )
    census = None
    if census_csv is not None:
        if not Path(census_csv).is_file():
            raise UserError(
                f"census CSV {census_csv} not found: run 'attnid census --grid --out {census_csv}' first"
            )
        census = pd.read_csv(census_csv)
        if not {"closes", "gap"} <= set(census.columns):
            raise UserError(f"census CSV {census_csv} lacks the columns closes and gap: regenerate it")
    interventions = None
    if intervention_runs or identity_runs:
        interventions = (
            runs_table(find_run_dirs(None, intervention_runs)) if intervention_runs else None,
            runs_table(find_run_dirs(None, identity_runs)) if identity_runs else None,
        )
    claims = claims_table(run_rows, slopes, sweep_run_rows, census, *(interventions or (None, None)))

    out = Path(out_dir)
    write_csv_atomic(out / "runs.csv", run_rows)
    write_csv_atomic(out / "cases.csv", cases)
    write_csv_atomic(out / "sweep.csv", sweep)
    write_csv_atomic(out / "sweep_slopes.csv", slopes)
    write_csv_atomic(out / "claims.csv", claims)
    write_text_atomic(out / "runs.tex", render_table("experiment_runs.tex.j2", runs=run_rows))
    write_text_atomic(out / "cases.tex", render_table("experiment_cases.tex.j2", cases=cases))
    write_text_atomic(
        out / "sweep.tex", render_table("experiment_sweep.tex.j2", sweep=sweep, slopes=slopes, claims=claims)
    )
    return {"runs": run_rows, "cases": cases, "sweep": sweep, "sweep_slopes": slopes, "claims": claims}
