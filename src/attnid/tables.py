"""Experiment tables: per run, per case (mean ± sd over seeds), LR sweep, and claims.

Reads only what ``attnid train`` leaves in each run directory (``run.json`` and
``metrics.csv``), so it is testable on synthetic runs and never needs torch.

    attnid tables --runs-dir results/runs --sweep-dir results/sweep --out-dir results/tables

writes ``runs``, ``cases`` and ``sweep`` as CSV and LaTeX (jinja2 templates
``paper/templates/experiment_*.tex.j2``), ``sweep_slopes.csv`` (log-log slope of
the final β and the mean ρ against the learning rate) and ``claims.csv``: each
experimental claim of the paper (E1-E3, docs/design.md §1) with the measured number, the
threshold, and pass/fail. A diverged run stays in every table with its status.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.cases import rebalancing_cases
from attnid.errors import UserError
from attnid.files import write_csv_atomic, write_text_atomic
from attnid.rundir import find_run_dirs, load_run

CIRCUITS = ("qk", "ov")
# The cases E1 and E2 are claims about (E3 is about every case that rebalances, attnid.cases).
CLAIM_SGD_CASE, CLAIM_ADAMW_CASE = "sgd", "adamw"

# Thresholds of the claims checked in claims.csv. rho and beta are relative
# quantities, so float32 round-off sits around 1e-9..1e-7 (docs/design.md §3).
RHO_SGD_MAX = 1e-6            # E1: plain SGD has no component along unidentified directions
RHO_ADAMW_MIN = 1e-2          # E2: AdamW does
SGD_BETA_SLOPE = (1.6, 2.4)   # E1: the SGD drift of the conserved imbalance is O(lr^2)
# The O(lr^2) law holds while the trajectory barely depends on lr (short runs, small lr). There
# the query-key drift sits at float32 round-off (~1e-7: its gradients are small at init), so the
# output-value circuit carries the slope; both slopes are in sweep_slopes.csv.
SGD_SLOPE_CIRCUIT = "ov"
TAU_MAX = 1e-5                # E3: an orbit move does not change the function
# E3: rebalancing to I_0 restores the conservation law: β right after a rebalance is ~0, i.e.
# tiny next to the β the run had built up just before it (the sawtooth of Figure 3).
BETA_REBALANCE_RATIO_MAX = 1e-2

# Per-run summary columns whose mean ± sd over seeds make the per-case table.
SUMMARY_COLUMNS = [
    "final_train_loss", "final_val_loss",
    "rho_qk_mean", "rho_qk_max", "rho_ov_mean", "rho_ov_max",
    "beta_qk_final", "beta_ov_final", "tau_max", "mu_qk_final", "mu_ov_final",
]


# ---------------------------------------------------------------------------- summarising runs

def _last_finite(values: pd.Series) -> float:
    finite = pd.to_numeric(values, errors="coerce").replace([np.inf, -np.inf], np.nan).dropna()
    return float(finite.iloc[-1]) if len(finite) else math.nan


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
    }
    for split in ("train", "val"):
        from_json = info.get(f"final_{split}_loss")
        value = float(from_json) if isinstance(from_json, (int, float)) else math.nan
        row[f"final_{split}_loss"] = value if math.isfinite(value) else _last_finite(_column(metrics, f"{split}_loss"))
    if status == "diverged":  # a diverged run has no meaningful final loss
        row["final_train_loss"] = row["final_val_loss"] = math.nan
    for circuit in CIRCUITS:
        rho = _column(metrics, f"rho_{circuit}")
        row[f"rho_{circuit}_mean"] = float(rho.mean()) if rho.notna().any() else math.nan
        row[f"rho_{circuit}_max"] = float(rho.max()) if rho.notna().any() else math.nan
        row[f"beta_{circuit}_final"] = _last_finite(_column(metrics, f"beta_{circuit}"))
        row[f"mu_{circuit}_final"] = _last_finite(_column(metrics, f"mu_{circuit}"))
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
        row = {"case": case, "lr": group["lr"].iloc[0], "n_seeds": len(group),
               "n_diverged": int((group["status"] == "diverged").sum())}
        for column in SUMMARY_COLUMNS:
            values = pd.to_numeric(done[column], errors="coerce").dropna()
            row[f"{column}_mean"] = float(values.mean()) if len(values) else math.nan
            row[f"{column}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_table(sweep_runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (optimizer, lr): means over the seeds that did not diverge."""
    rows = []
    if sweep_runs.empty:
        return pd.DataFrame(columns=["optimizer", "lr", "status", "n_seeds", "n_diverged"])
    for (optimizer, lr), group in sweep_runs.groupby(["case", "lr"], sort=True):
        diverged = group["status"] == "diverged"
        done = group[~diverged]
        status = "ok" if not diverged.any() else ("diverged" if diverged.all() else "partly diverged")
        row = {"optimizer": optimizer, "lr": float(lr), "status": status,
               "n_seeds": len(group), "n_diverged": int(diverged.sum()),
               "diverged_step": group["diverged_step"].dropna().min() if diverged.any() else math.nan}
        for column in ["final_train_loss", "final_val_loss", "beta_qk_final", "beta_ov_final",
                       "rho_qk_mean", "rho_ov_mean", "tau_max"]:
            values = pd.to_numeric(done[column], errors="coerce").dropna()
            row[column] = float(values.mean()) if len(values) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def fit_loglog_slope(x, y) -> dict:
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
    r2 = 1.0 - (residual ** 2).sum() / total if total > 0 else 1.0
    return {"slope": float(slope), "intercept": float(intercept), "r2": float(r2), "n_points": n_points}


def sweep_slopes_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Fitted log-log slopes against lr of final β and mean ρ, per optimizer (diverged points left out)."""
    rows = []
    for optimizer, group in sweep.groupby("optimizer", sort=True):
        done = group[group["status"] != "diverged"]
        for quantity in ["beta_qk_final", "beta_ov_final", "rho_qk_mean", "rho_ov_mean"]:
            rows.append({"optimizer": optimizer, "quantity": quantity} | fit_loglog_slope(done["lr"], done[quantity]))
    return pd.DataFrame(rows, columns=["optimizer", "quantity", "slope", "intercept", "r2", "n_points"])


# ---------------------------------------------------------------------------- claims

def _claim(claim: str, paper: str, measured: float, relation: str, threshold, detail: str) -> dict:
    if measured is None or not math.isfinite(measured):
        result = "missing"
    elif relation == "<":
        result = "pass" if measured < threshold else "fail"
    elif relation == ">":
        result = "pass" if measured > threshold else "fail"
    else:  # "in": threshold is (low, high)
        result = "pass" if threshold[0] <= measured <= threshold[1] else "fail"
    shown = f"[{threshold[0]:g}, {threshold[1]:g}]" if relation == "in" else f"{threshold:g}"
    return {"claim": claim, "paper": paper, "measured": measured, "relation": relation, "threshold": shown,
            "result": result, "detail": detail}


def claims_table(runs: pd.DataFrame, slopes: pd.DataFrame) -> pd.DataFrame:
    """Each experimental claim with the number measured in this pipeline's own runs.

    ``result`` is pass, fail, or missing (the runs the claim needs were not configured,
    or all diverged).
    """
    done = runs[runs["status"] != "diverged"] if not runs.empty else runs

    def of_cases(names: list[str], column: str) -> pd.Series:
        if done.empty:
            return pd.Series(dtype=float)
        return pd.to_numeric(done.loc[done["case"].isin(names), column], errors="coerce").dropna()

    def slope_of(optimizer: str, quantity: str) -> float:
        hit = slopes[(slopes["optimizer"] == optimizer) & (slopes["quantity"] == quantity)]
        return float(hit["slope"].iloc[0]) if len(hit) else math.nan

    rho_sgd = of_cases([CLAIM_SGD_CASE], "rho_qk_max")
    rho_adamw = of_cases([CLAIM_ADAMW_CASE], "rho_qk_mean")
    tau = pd.to_numeric(done["tau_max"], errors="coerce").dropna() if not done.empty else pd.Series(dtype=float)
    rebalancing = rebalancing_cases()
    after = of_cases(rebalancing, "beta_rebalance_ratio_max")
    rows = [
        _claim("rho_qk sgd max < 1e-6", "E1, Lemma 5.1",
               rho_sgd.max() if len(rho_sgd) else math.nan, "<", RHO_SGD_MAX,
               f"largest per-step rho_qk over {len(rho_sgd)} sgd runs"),
        _claim("rho_qk adamw mean > 1e-2", "E2, Section 5",
               rho_adamw.min() if len(rho_adamw) else math.nan, ">", RHO_ADAMW_MIN,
               f"smallest per-run mean rho_qk over {len(rho_adamw)} adamw runs"),
        _claim("sgd beta slope in [1.6, 2.4]", "E1, Section 5",
               slope_of(CLAIM_SGD_CASE, f"beta_{SGD_SLOPE_CIRCUIT}_final"), "in", SGD_BETA_SLOPE,
               f"log-log slope of final beta_{SGD_SLOPE_CIRCUIT} against lr over the sgd sweep"),
        _claim("tau max < 1e-5", "E3, Lemma 4.1",
               tau.max() if len(tau) else math.nan, "<", TAU_MAX,
               f"largest relative loss change of an orbit move over {len(tau)} runs"),
        _claim("beta after rebalance ~ 0 (< 1e-2 x before)", "E3, Section 5",
               after.max() if len(after) else math.nan, "<", BETA_REBALANCE_RATIO_MAX,
               f"largest ratio of beta right after a rebalance to beta at the log step before it, "
               f"over {len(after)} {'/'.join(rebalancing)} runs"),
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- LaTeX

def tex_number(value, digits: int = 3) -> str:
    """A number for a table cell: plain for moderate magnitudes, a×10^b otherwise, -- for missing."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "--"
    if not math.isfinite(value):
        return "--"
    if value == 0:
        return "0"
    if 1e-2 <= abs(value) < 1e4:
        return f"{value:.{digits}g}"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"${mantissa}\\times10^{{{int(exponent)}}}$"


def tex_mean_sd(mean, sd, digits: int = 3) -> str:
    if sd is None or not math.isfinite(float(sd)):
        return tex_number(mean, digits)
    return f"{tex_number(mean, digits)} $\\pm$ {tex_number(sd, 2)}"


def render_table(template_name: str, **context) -> str:
    """Render one experiment template with the project's TeX-safe jinja2 environment
    (``attnid.latex``: ``\\VAR{..}``, ``\\BLOCK{..}``, filter ``tex``) plus ``num`` and ``mean_sd``."""
    from attnid.latex import find_template_dir, latex_environment

    env = latex_environment(find_template_dir())
    env.filters["num"] = tex_number
    env.globals["mean_sd"] = tex_mean_sd
    return env.get_template(template_name).render(**context)


def _records(frame: pd.DataFrame) -> list[dict]:
    return frame.replace({np.nan: None}).to_dict("records")


# ---------------------------------------------------------------------------- command line

def write_tables(runs_dir: str | Path | None, sweep_dir: str | Path | None, out_dir: str | Path,
                 runs: list[str] | None = None, sweep_runs: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """Build every table from the run directories and write them under ``out_dir``.

    ``runs`` / ``sweep_runs`` list the run directories explicitly (what the pipeline does);
    otherwise every run under ``runs_dir`` / ``sweep_dir`` is gathered.
    """
    run_dirs = find_run_dirs(runs_dir, runs)
    if not run_dirs:
        raise UserError(f"no runs (run.json) under {runs_dir}; run the training jobs first (snakemake --cores all)")
    sweep_dirs = find_run_dirs(sweep_dir, sweep_runs)
    runs = runs_table(run_dirs)
    sweep_runs = runs_table(sweep_dirs) if sweep_dirs else pd.DataFrame()
    cases = cases_table(runs)
    sweep = sweep_table(sweep_runs)
    slopes = sweep_slopes_table(sweep) if not sweep.empty else sweep_slopes_table(
        pd.DataFrame(columns=["optimizer", "lr", "status"]))
    claims = claims_table(runs, slopes)

    out = Path(out_dir)
    write_csv_atomic(out / "runs.csv", runs)
    write_csv_atomic(out / "cases.csv", cases)
    write_csv_atomic(out / "sweep.csv", sweep)
    write_csv_atomic(out / "sweep_slopes.csv", slopes)
    write_csv_atomic(out / "claims.csv", claims)
    write_text_atomic(out / "runs.tex", render_table("experiment_runs.tex.j2", runs=_records(runs)))
    write_text_atomic(out / "cases.tex", render_table("experiment_cases.tex.j2", cases=_records(cases)))
    write_text_atomic(out / "sweep.tex", render_table("experiment_sweep.tex.j2", sweep=_records(sweep),
                                                      slopes=_records(slopes), claims=_records(claims)))
    return {"runs": runs, "cases": cases, "sweep": sweep, "sweep_slopes": slopes, "claims": claims}


def add_run_selection_arguments(parser, sweep: bool = True) -> None:
    """--runs-dir (gather everything below) or --runs (exactly these); the same for the sweep if ``sweep``."""
    parser.add_argument("--runs-dir", default=None, help="results/runs: <case>/seed<S>/{run.json,metrics.csv}")
    parser.add_argument("--runs", nargs="+", default=None, metavar="RUN_DIR",
                        help="exactly these run directories (instead of everything under --runs-dir)")
    if sweep:
        parser.add_argument("--sweep-dir", default=None, help="results/sweep: <optimizer>/lr<lr>/seed<S>/...")
        parser.add_argument("--sweep-runs", nargs="+", default=None, metavar="RUN_DIR",
                            help="exactly these sweep run directories (instead of everything under --sweep-dir)")


def check_run_selection(args) -> None:
    if args.runs_dir is None and not args.runs:
        raise UserError("say which runs to gather: --runs-dir DIR or --runs RUN_DIR [RUN_DIR ...]")


def add_tables_arguments(parser) -> None:
    add_run_selection_arguments(parser)
    parser.add_argument("--out-dir", required=True, help="where runs/cases/sweep .csv/.tex and claims.csv go")


def run_tables(args) -> int:
    check_run_selection(args)
    tables = write_tables(args.runs_dir, args.sweep_dir, args.out_dir, args.runs, args.sweep_runs)
    for row in tables["claims"].itertuples():
        print(f"{row.result:>7}  {row.claim}: measured {row.measured:.3g} ({row.detail})")
    print(f"wrote {len(tables)} tables to {args.out_dir}")
    return 0
