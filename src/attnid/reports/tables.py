"""Experiment tables: per run, per case (mean ± sd over seeds), LR sweep, and claims.

Reads only what ``attnid train`` leaves in each run directory (``run.json`` and
``metrics.csv``), so it is testable on synthetic runs and never needs torch.

    attnid tables --runs-dir results/runs --sweep-dir results/sweep --out-dir results/tables

writes ``runs``, ``cases`` and ``sweep`` as CSV and LaTeX (jinja2 templates
``attnid/reports/templates/experiment_*.tex.j2``), ``sweep_slopes.csv`` (log-log slope of
the final β and the mean ρ against the learning rate) and ``claims.csv``
(:mod:`attnid.reports.claims`). A diverged run stays in every table with its status.
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
from attnid.plan.interventions import arm_name
from attnid.reports.alignment_table import read_barrier_report
from attnid.reports.claim_kinds import VERDICT_COLUMNS
from attnid.reports.claims import claims_table
from attnid.reports.latex import render_table
from attnid.reports.round_off import at_round_off, coarsest_dtype, dtypes_of, round_off_ceiling, run_dtype
from attnid.reports.theory_claims import NULLITY_COLUMNS
from attnid.theory.circuits import CIRCUITS
from attnid.theory.counts import layer_shape, unidentified_ov_params, unidentified_qk_params
from attnid.training.rundir import find_run_dirs, load_run

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
        "arm": arm_name(str(info.get("case")), info.get("config") or {}),
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
            "dtype": dtypes_of(group),
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
    """Fitted log-log slopes against lr of final β and mean ρ, per optimizer (diverged points left out).

    A quantity at numerical round-off in the sweep's training precision
    (:func:`attnid.reports.round_off.at_round_off`) is never fitted: its row has no slope, and ``note`` says
    why (the precision, the quantity's largest value and the round-off ceiling it is below)."""
    rows = []
    for optimizer, group in sweep.groupby("optimizer", sort=True):
        done = group[group["status"] != "diverged"]
        dtypes = dtypes_of(done)
        dtype = coarsest_dtype(dtypes.split("+"))
        for quantity in ["beta_qk_final", "beta_ov_final", "rho_qk_mean", "rho_ov_mean"]:
            fit = fit_loglog_slope(done["lr"], done[quantity])
            note = ""
            if at_round_off(done[quantity], dtype):
                largest = float(pd.to_numeric(done[quantity], errors="coerce").abs().max())
                note = (
                    f"not fitted: {dtype} round-off (largest {largest:.1e} < {round_off_ceiling(dtype):.1e})"
                )
                fit |= {"slope": math.nan, "intercept": math.nan, "r2": math.nan}
            rows.append(
                {"optimizer": optimizer, "quantity": quantity} | fit | {"dtype": dtypes, "note": note}
            )
    return pd.DataFrame(
        rows, columns=["optimizer", "quantity", "slope", "intercept", "r2", "n_points", "dtype", "note"]
    )


# ---------------------------------------------------------------------------- command line


ALIGNMENT_COLUMNS = ("study", "group", "pair", "exact_max_abs_dlogp")  # what the alignment claim reads


def _read_table(path: str | Path, columns: Iterable[str]) -> pd.DataFrame:
    """A table another attnid command wrote, with the columns a claim reads; one line otherwise."""
    try:
        table = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(f"cannot read {path} ({type(err).__name__}: {err})") from None
    missing = [column for column in columns if column not in table]
    if missing:
        raise UserError(f"{path} has no column(s) {', '.join(missing)}: write it with this attnid")
    return table


def _quantization_tables(quantization_csv: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``attnid quantization-table``'s quantization.csv and the quantization_seeds.csv beside it."""
    seeds_csv = Path(quantization_csv).with_name("quantization_seeds.csv")
    for path in (Path(quantization_csv), seeds_csv):
        if not path.is_file():
            raise UserError(f"{path} not found: run 'attnid quantization-table' first")
    return pd.read_csv(quantization_csv), pd.read_csv(seeds_csv)


def _read_census(census_csv: str | Path) -> pd.DataFrame:
    if not Path(census_csv).is_file():
        raise UserError(
            f"census CSV {census_csv} not found: run 'attnid census --grid --out {census_csv}' first"
        )
    census = pd.read_csv(census_csv)
    if not {"closes", "gap"} <= set(census.columns):
        raise UserError(f"census CSV {census_csv} lacks the columns closes and gap: regenerate it")
    return census


def _read_optional(path: str | Path | None, columns: tuple[str, ...]) -> pd.DataFrame | None:
    """:func:`_read_table` of ``path``, or None without one (a stage the config leaves out)."""
    return None if path is None else _read_table(path, columns)


def write_tables(
    runs_dir: str | Path | None,
    sweep_dir: str | Path | None,
    out_dir: str | Path,
    runs: list[str] | None = None,
    sweep_runs: list[str] | None = None,
    census_csv: str | Path | None = None,
    intervention_runs: list[str] | None = None,
    identity_runs: list[str] | None = None,
    plateau_csv: str | Path | None = None,
    calibration_csv: str | Path | None = None,
    quantization_csv: str | Path | None = None,
    verdicts_csv: str | Path | None = None,
    nullity_csv: str | Path | None = None,
    alignment_csv: str | Path | None = None,
    planted_json: str | Path | None = None,
) -> dict[str, pd.DataFrame]:
    """Build every table from the run directories and write them under ``out_dir``.

    ``runs`` / ``sweep_runs`` list the run directories explicitly (what the pipeline does); otherwise every
    run under ``runs_dir`` / ``sweep_dir`` is gathered. ``intervention_runs`` (the interventions' arms and
    baselines) and ``identity_runs`` (its float64 projected run) add the interventions' identities to
    claims.csv; ``plateau_csv`` (interventions_plateau.csv) and ``calibration_csv`` (calibration.csv) the
    checks of its protocol; ``quantization_csv`` (``attnid quantization-table``'s, with
    ``quantization_seeds.csv`` beside it) the quantization stage's claims; ``verdicts_csv``
    (interventions.csv) its verdicts, as findings; ``nullity_csv`` (verify's) T1-T6; ``alignment_csv``
    (``attnid alignment-table``'s) the alignment stage's; ``planted_json`` (``attnid barrier --json`` of
    SmolLM2 and a planted element) its two checks.
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
    census = _read_census(census_csv) if census_csv is not None else None
    interventions = None
    if intervention_runs or identity_runs:
        interventions = (
            runs_table(find_run_dirs(None, intervention_runs)) if intervention_runs else None,
            runs_table(find_run_dirs(None, identity_runs)) if identity_runs else None,
        )
    claims = claims_table(
        run_rows,
        slopes,
        sweep_run_rows,
        census,
        *(interventions or (None, None)),
        plateau=_read_optional(plateau_csv, ("relative_improvement", "threshold", "step_from", "step_to")),
        calibration=_read_optional(calibration_csv, ("best", "at_edge")),
        quantization=None if quantization_csv is None else _quantization_tables(quantization_csv),
        verdicts=_read_optional(verdicts_csv, VERDICT_COLUMNS),
        alignment=_read_optional(alignment_csv, ALIGNMENT_COLUMNS),
        nullity=_read_optional(nullity_csv, NULLITY_COLUMNS),
        planted=None if planted_json is None else read_barrier_report(Path(planted_json)),
    )

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
