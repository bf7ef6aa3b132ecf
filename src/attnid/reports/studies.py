"""Does identification buy anything? The heads and variants studies, gathered.

The paper closes on a hypothesis it never tests: more heads, GQA and RoPE make attention "more
identified" (a larger closed-form identified fraction, ``attnid.theory.counts``), and that may be why they
improved transformers. Two studies train AdamW (the ``adamw`` case's settings) on the same data and
token budget per point, 3 seeds each (docs/experiments.md, "Does identification buy anything?"):

* ``heads``: ``H`` heads at the config's embedding ``E`` (``D = E/H``), plus the identification-matched
  single head of the paper's §4.10: ``H = 1`` at ``E_0 = E sqrt(2 - 1/H_ref)`` rounded to an even
  integer (:func:`attnid.plan.studies.matched_single_head_embd`, docs/design.md §10);
* ``variants``: at the config's ``H``, MHA, GQA (``n_kv_head``) and RoPE, alone and together.

The points and their runs are planned by :mod:`attnid.plan.studies` (one training job per point and seed
under ``<results_dir>/studies/<study>/<point>/seed<N>/``). Gathering reads only ``run.json`` and
``metrics.csv`` (torch-free, testable on synthetic runs):

    attnid studies --heads-runs RUN_DIR... --variants-runs RUN_DIR... --out-dir results/tables

writes ``heads.csv/.tex``, ``variants.csv/.tex`` (one row per point: mean ± sd over seeds) and
``identification_correlation.csv``: the Spearman rank correlation between the identified fraction and
the final val loss (and the measured ρ) across the points, per seed and over the seed means.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.plan.studies import STUDIES
from attnid.reports.latex import records, render_table
from attnid.reports.statistics import (
    BOOTSTRAP_RESAMPLES,
    EXACT_PERMUTATION_POINTS,
    PERMUTATION_RESAMPLES,
    rank_correlation,
    rank_correlation_ci_over_seeds,
    rank_correlation_p_value,
)
from attnid.reports.tables import mean_sd_over_seeds, summarize_run
from attnid.theory.counts import attention_params_per_layer, identified_fraction, layer_shape
from attnid.training.rundir import load_run

# Per-point quantities averaged over seeds (final = last logged value; rho = mean over the logged steps).
POINT_COLUMNS = ("final_val_loss", "rho_qk_mean", "rho_ov_mean", "mu_qk_final", "mu_ov_final", "tokens_per_s")
# What makes two points the same model (with the same step count, the same experiment).
ARCHITECTURE_COLUMNS = ("n_layer", "n_embd", "n_head", "n_kv_head", "head_dim", "rope", "bias")
# The quantities whose rank correlation with the identified fraction is reported.
CORRELATED = ("final_val_loss", "rho_qk_mean", "rho_ov_mean")


# ---------------------------------------------------------------------------- gathering


def run_architecture(info: dict) -> dict:
    """The attention shape a run trained, from its run.json config (older runs: plain MHA)."""
    config = info.get("config") or {}
    n_embd, n_head = int(config.get("n_embd", 128)), int(config.get("n_head", 4))
    n_kv_head = config.get("n_kv_head") or n_head
    head_dim = config.get("head_dim") or n_embd // n_head
    return {
        "n_layer": int(config.get("n_layer", 4)),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_kv_head": int(n_kv_head),
        "head_dim": int(head_dim),
        "rope": bool(config.get("rope", False)),
        "bias": bool(config.get("bias", False)),
    }


def architecture_label(arch: dict) -> str:
    """A short name of an attention shape for tables and figures: ``H=4``, ``GQA G=2``, ``RoPE``,
    ``H=1, E=170``."""
    parts = [f"H={arch['n_head']}"]
    if arch["n_kv_head"] != arch["n_head"]:
        parts.append("MQA" if arch["n_kv_head"] == 1 else f"GQA G={arch['n_kv_head']}")
    if arch["rope"]:
        parts.append("RoPE")
    if arch["head_dim"] * arch["n_head"] != arch["n_embd"]:
        parts.append(f"D={arch['head_dim']}")
    return ", ".join(parts)


def _median_positive(values: pd.Series) -> float:
    finite = pd.to_numeric(values, errors="coerce").replace([np.inf, -np.inf], np.nan).dropna()
    finite = finite[finite > 0]
    return float(finite.median()) if len(finite) else math.nan


def summarize_study_run(run_dir: Path) -> dict:
    """One run of a study: its point (the parent folder), architecture, closed-form identified fraction
    of one attention layer (counts.py for that shape), final val loss, mean ρ, final μ and tokens/s
    (median over the logged intervals)."""
    info, metrics = load_run(run_dir)
    summary = summarize_run(info, metrics)
    arch = run_architecture(info)
    shape = layer_shape(
        arch["n_embd"],
        arch["n_head"],
        arch["n_kv_head"],
        arch["head_dim"],
        rope=arch["rope"],
        bias=arch["bias"],
    )
    row = {
        "point": Path(run_dir).parent.name,
        "seed": summary["seed"],
        "status": summary["status"],
        **arch,
        "label": architecture_label(arch),
        "n_params": info.get("n_params"),
        "attn_params": arch["n_layer"] * attention_params_per_layer(shape),
        "identified_fraction": identified_fraction(
            arch["n_embd"], arch["n_head"], arch["n_kv_head"], arch["head_dim"], arch["rope"], arch["bias"]
        ),
        "steps": summary["steps"],
        "wall_time_s": summary["wall_time_s"],
        "tokens_per_s": _median_positive(metrics["tokens_per_s"]) if "tokens_per_s" in metrics else math.nan,
    }
    for column in POINT_COLUMNS:
        if column != "tokens_per_s":
            row[column] = summary[column]
    row["run_dir"] = str(run_dir)
    return row


def study_runs_table(run_dirs: list[Path]) -> pd.DataFrame:
    rows = [summarize_study_run(Path(d)) for d in run_dirs]
    return pd.DataFrame(rows)


def study_points_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per point (in the order of the runs): architecture, parameters, identified fraction, and
    mean / sample sd (ddof=1) over the seeds that did not diverge of every :data:`POINT_COLUMNS`."""
    rows = []
    for point, group in runs.groupby("point", sort=False):
        first = group.iloc[0]
        done = group[group["status"] != "diverged"]
        row = {"point": point, "label": first["label"]}
        row.update(
            {
                key: first[key]
                for key in (*ARCHITECTURE_COLUMNS, "n_params", "attn_params", "identified_fraction")
            }
        )
        row["unidentified_fraction"] = 1.0 - float(first["identified_fraction"])
        row.update(
            n_seeds=len(group),
            n_diverged=int((group["status"] == "diverged").sum()),
            steps=int(group["steps"].max()),
        )
        row.update(mean_sd_over_seeds(done, POINT_COLUMNS))
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- rank correlation


def head_sweep(points: pd.DataFrame) -> pd.Series:
    """Boolean mask of the head sweep among a heads study's points: those at the sweep's embedding (the most
    common one); the others are the matched single head of §4.10 at its own width ``E_0``."""
    if points.empty:
        return pd.Series(False, index=points.index)
    return points["n_embd"] == points["n_embd"].mode().iloc[0]


def pooled_points(runs: pd.DataFrame, points: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The points of several studies as one set for the pooled correlation: a point whose architecture
    and step count repeat an earlier point's (the variants' MHA is the heads sweep's point at the default
    ``H``, see :mod:`attnid.plan.runs`) is the same experiment and counts once, or it would count twice."""
    kept = points.drop_duplicates(subset=[*ARCHITECTURE_COLUMNS, "steps"], keep="first")
    return runs[runs["point"].isin(kept["point"])], kept


def seed_matrix(runs: pd.DataFrame, points: pd.DataFrame, quantity: str) -> np.ndarray:
    """``(points, seeds)``: each point's ``quantity`` per seed, over the seeds every point finished (a seed
    on which some point diverged or did not run is left out), rows in the order of ``points``."""
    done = runs[runs["status"] != "diverged"]
    table = done.pivot_table(index="point", columns="seed", values=quantity, aggfunc="first")
    table = table.reindex(points["point"]).dropna(axis=1, how="any")
    return table.to_numpy(dtype=float)


def correlation_rows(
    study: str, runs: pd.DataFrame, points: pd.DataFrame, subset: str = "all points"
) -> list[dict]:
    """Spearman's ``r_s`` between the identified fraction and each :data:`CORRELATED` quantity across the
    points (docs/design.md §11.4): over the points' seed means, with the permutation p-value over those
    means and the bootstrap CI over seeds (:mod:`attnid.reports.statistics`); and per seed (the points'
    runs with that seed), whose mean and sample sd over the seeds are the seeds' spread, not an
    uncertainty."""
    rows = []
    done = runs[runs["status"] != "diverged"] if not runs.empty else runs
    for quantity in CORRELATED:
        per_seed = []
        for _, group in done.groupby("seed", sort=True):
            value = rank_correlation(group["identified_fraction"], group[quantity])
            if math.isfinite(value):
                per_seed.append(value)
        ranked = points[np.isfinite(pd.to_numeric(points[f"{quantity}_mean"], errors="coerce"))]
        fractions = ranked["identified_fraction"].to_numpy(float)
        means = ranked[f"{quantity}_mean"].to_numpy(float)
        matrix = seed_matrix(runs, ranked, quantity)
        ci_low, ci_high = rank_correlation_ci_over_seeds(fractions, matrix)
        rows.append(
            {
                "study": study,
                "subset": subset,
                "quantity": quantity,
                "n_points": len(ranked),
                "spearman_of_means": rank_correlation(fractions, means),
                "p_value": rank_correlation_p_value(fractions, means),
                "ci_low": ci_low,
                "ci_high": ci_high,
                "n_ci_seeds": matrix.shape[1],
                "spearman_per_seed_mean": float(np.mean(per_seed)) if per_seed else math.nan,
                "spearman_per_seed_sd": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else math.nan,
                "n_seed_correlations": len(per_seed),
            }
        )
    return rows


def confound_rows(study: str, runs: pd.DataFrame, points: pd.DataFrame, matched: pd.Series) -> list[dict]:
    """The confound splits of a set of points (RoPE also adds position information, the matched
    single head is wider): the set without its RoPE points and without the matched single head
    (``matched``: a mask of ``points``), each only where it leaves out something and keeps the rest."""
    rows = []
    rope = points["rope"].astype(str).str.lower().isin(["true", "1"])
    for subset, left_out in (("without RoPE", rope), ("without matched single head", matched)):
        if left_out.any() and not left_out.all():
            kept = points[~left_out]
            rows += correlation_rows(study, runs[runs["point"].isin(kept["point"])], kept, subset)
    return rows


# ---------------------------------------------------------------------------- writing

STUDY_CAPTIONS = {
    "heads": "Head sweep at fixed embedding $E$ ($D = E/H$) and the identification-matched single head "
    "($H = 1$ at $E_0 = E\\sqrt{2 - 1/H_\\mathrm{ref}}$, even), trained with AdamW",
    "variants": "Attention variants at the default number of heads, trained with AdamW",
}


QUANTITY_TEX = {
    "final_val_loss": "val loss",
    "rho_qk_mean": r"$\bar\rho_{QK}$",
    "rho_ov_mean": r"$\bar\rho_{OV}$",
}


def render_study_table(study: str, points: pd.DataFrame) -> str:
    """``<study>.tex`` from templates/identification_study.tex.j2
    (:func:`attnid.reports.latex.render_table`)."""
    return render_table(
        "identification_study.tex.j2",
        study=study,
        caption=STUDY_CAPTIONS[study],
        points=points,
        steps=int(points["steps"].max()),
    )


def render_correlation_table(correlations: pd.DataFrame) -> str:
    """``identification_correlation.tex`` (every row of identification_correlation.csv) from
    templates/identification_correlation.tex.j2."""
    rows = [row | {"quantity_tex": QUANTITY_TEX[row["quantity"]]} for row in records(correlations)]
    return render_table(
        "identification_correlation.tex.j2",
        rows,
        exact_points=EXACT_PERMUTATION_POINTS,
        permutation_resamples=PERMUTATION_RESAMPLES,
        bootstrap_resamples=BOOTSTRAP_RESAMPLES,
    )


def write_study_tables(run_dirs: dict[str, list[Path]], out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Gather every study that has runs and write ``<study>.csv/.tex`` and
    ``identification_correlation.csv/.tex``: rows per set of points and quantity, for each study (the
    heads study also as the head sweep alone), ``all`` pooling the points of both studies, and the widest
    set without its RoPE points and without the matched single head (:func:`confound_rows`)."""
    out = Path(out_dir)
    tables, correlations, all_runs, all_points, matched_points = {}, [], [], [], []
    for study in STUDIES:
        dirs = run_dirs.get(study) or []
        if not dirs:
            continue
        runs = study_runs_table(dirs)
        points = study_points_table(runs)
        correlations += correlation_rows(study, runs, points)
        matched = ~head_sweep(points) if study == "heads" else pd.Series(False, index=points.index)
        if study == "heads" and matched.any() and not matched.all():
            sweep = points[~matched]
            correlations += correlation_rows(
                study, runs[runs["point"].isin(sweep["point"])], sweep, "head sweep alone"
            )
        matched_points += [f"{study}/{point}" for point in points.loc[matched, "point"]]
        all_runs.append(runs.assign(point=study + "/" + runs["point"]))
        all_points.append(points.assign(point=study + "/" + points["point"]))
        tables[study] = points
        write_csv_atomic(out / f"{study}.csv", points)
        write_text_atomic(out / f"{study}.tex", render_study_table(study, points))
    if not tables:
        raise UserError("no study runs given: pass --heads-runs and/or --variants-runs (or --studies-dir)")
    widest = "all" if len(all_runs) > 1 else next(iter(tables))
    pooled_runs, pooled = pooled_points(pd.concat(all_runs), pd.concat(all_points, ignore_index=True))
    if widest == "all":
        correlations += correlation_rows("all", pooled_runs, pooled)
    # the heads study's own split without the matched head is the head sweep row above
    matched = pooled["point"].isin(matched_points) & (widest != "heads")
    correlations += confound_rows(widest, pooled_runs, pooled, matched)
    tables["correlation"] = pd.DataFrame(correlations)
    write_csv_atomic(out / "identification_correlation.csv", tables["correlation"])
    write_text_atomic(out / "identification_correlation.tex", render_correlation_table(tables["correlation"]))
    return tables
