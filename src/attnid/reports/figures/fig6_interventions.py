"""Figure 6, does identification change training? (beyond the paper): each intervention arm's val loss against
``adamw``'s of the same seed with its CI, and the projected arm's ρ and first-order drift on their round-off
floors (docs/design.md §13-§15); its caption is filled with the build's numbers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.plan.interventions import BASELINE_CASE
from attnid.reports.figures.inputs import RUN_FILES, Drawing, RunGroup, Sources
from attnid.reports.figures.series import Floors, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import (
    BAND_ALPHA,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PREDICTION_COLOR,
    case_style,
    figure_legend,
    keep_texts_inside,
    pyplot,
)
from attnid.reports.interventions_table import PRIMARY_METRIC, eval_rows, interventions_table
from attnid.reports.round_off import at_round_off
from attnid.reports.statistics import MIN_PAIRED_SEEDS, mean_confidence_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INPUTS = {"intervention_runs": RUN_FILES, "identity_runs": RUN_FILES}
STAGE = "interventions"
CAPTION = r"""**Figure 6 — does identification change training? (beyond the paper).** Arms that change
only what AdamW does along the symmetry orbit, each against ``adamw``'s run of the same seed (same model,
initial function, batches and settings). Left: the validation loss minus ``adamw``'s, mean over
{{ n_seeds }} seeds with its 95 % percentile bootstrap band (with few seeds it covers less than 95 %). At
the last evaluation, mean [95 % CI]:
{% for row in final %}{{ row.label }} against ``{{ row.baseline }}`` {{ fmt(row.delta_mean, 2) }}
[{{ fmt(row.ci_low, 2) }}, {{ fmt(row.ci_high, 2) }}], {{ row.verdict }}{{ "; " if not loop.last else "." }}
{% endfor %}
Middle, right: :math:`\rho` and :math:`\|D_1\|/N_0` (query-key solid, output-value dashed) of ``adamw``
and of the projected arm, whose steps have their orbit component removed: its :math:`\rho` is at most
{{ fmt(projected_rho_max) }} in {{ projected_dtype }} training and {{ fmt(identity_rho_max) }} in the
float64 identity run ({{ identity_steps }} steps, drift1/drift2 at most
{{ fmt(identity_drift_ratio_max) }}): round-off, drawn on the floors of grey bands (a triangle: at or
below) with their largest values written there. ``adamw``'s mean
:math:`\rho_{QK}` is {{ fmt(adamw_rho_mean) }}.
"""

# The arms' style in Figure 6: the case's; an arm with transported or reset moments its case's colour,
# dotted (docs/design.md §15).
MOVED_MOMENTS_LINESTYLE = ":"


def draw(sources: Sources) -> Drawing:
    """Figure 6 from the interventions' arm and baseline runs and its float64 identity run(s)."""
    from attnid.reports.interventions_table import load_runs_by_arm
    from attnid.training.rundir import find_run_dirs, load_run

    identity = [load_run(run_dir) for run_dir in find_run_dirs(None, sources.identity_runs or [])]
    return draw_interventions(load_runs_by_arm(None, sources.intervention_runs), identity)


def draw_interventions(arm_runs: dict[str, RunGroup], identity_runs: RunGroup) -> Drawing:
    """Per arm, its val loss minus ``adamw``'s of the same seed against the step, mean over seeds with a
    95 % bootstrap CI band; ρ and the first-order drift of the projected arm (float32, and the float64
    identity run) on their round-off floors beside ``adamw``'s.

    ``arm_runs`` is :func:`attnid.reports.interventions_table.load_runs_by_arm`'s {arm: runs} (with the
    baseline). The caption's numbers: the interventions table's final-val-loss rows, the identities'
    residuals (:func:`caption_numbers`).
    """
    if BASELINE_CASE not in arm_runs:
        raise UserError(f"Figure 6 needs the {BASELINE_CASE} runs of the interventions")
    fig, axes = pyplot().subplots(1, 3, figsize=(3 * PANEL_WIDTH, PANEL_HEIGHT))
    _draw_loss_against_baseline(axes[0], arm_runs)
    projected = arm_runs.get("adamw_projected", [])
    adamw_style = case_style(BASELINE_CASE)
    projected_style = case_style("adamw_projected")
    series = [
        (adamw_style["label"], adamw_style, arm_runs[BASELINE_CASE]),
        (f"{projected_style['label']} ({runs_dtype(projected)})", projected_style, projected),
        (
            f"{projected_style['label']} ({runs_dtype(identity_runs)})",
            projected_style | {"linestyle": "-."},
            identity_runs,
        ),
    ]
    series = [entry for entry in series if entry[2]]
    for ax, column, label in ((axes[1], "rho", r"$\rho$"), (axes[2], "drift1", r"$\|D_1\|/N_0$")):
        _draw_orbit_panel(ax, column, series)
        ax.set_xlabel("step")
        ax.set_ylabel(label + " (QK solid, OV dashed)")
    axes[1].set_title(r"unidentified share $\rho$ of a step")
    axes[2].set_title("first-order drift of the imbalance")
    figure_legend(fig, axes[0], ncol=4)
    keep_texts_inside(fig)
    return Drawing(fig, caption_numbers(arm_runs, identity_runs))


def _draw_loss_against_baseline(ax: Axes, arm_runs: dict[str, RunGroup]) -> None:
    """Each arm's val loss minus the baseline's of the same seed, mean over seeds with its CI band."""
    baseline = arm_runs[BASELINE_CASE]
    ax.axhline(0.0, color=PREDICTION_COLOR, linewidth=0.8)
    for arm, runs in arm_runs.items():
        if arm == BASELINE_CASE:
            continue
        style = arm_style(arm, str(runs[0][0].get("case")))
        differences = paired_eval_differences(runs, baseline).dropna(subset=["mean"])
        if differences.empty:
            continue
        ax.plot(
            differences["step"],
            differences["mean"],
            color=style["color"],
            label=style["label"],
            linestyle=style["linestyle"],
            marker=style["marker"],
            markersize=3,
        )
        ax.fill_between(
            differences["step"],
            differences["low"],
            differences["high"],
            color=style["color"],
            alpha=BAND_ALPHA,
            linewidth=0,
        )
    ax.set_xlabel("step")
    ax.set_ylabel(f"val loss minus {BASELINE_CASE}'s (same seed)")
    ax.set_title("val loss against adamw (95 % CI)")


def arm_style(arm: str, case: str) -> dict:
    """color, label, linestyle and marker of an interventions arm: its case's (and
    :data:`MOVED_MOMENTS_LINESTYLE` for moved moments)."""
    style = dict(case_style(case))
    if arm != case:
        moments = arm.removeprefix(case + "_")
        style.update(linestyle=MOVED_MOMENTS_LINESTYLE, label=f"{style['label']}, {moments}")
    return style


def paired_eval_differences(arm_runs: list, baseline_runs: list) -> pd.DataFrame:
    """Per evaluated step logged by every seed pair: the mean over seeds of ``arm - baseline`` val loss with
    its 95 % bootstrap CI (:func:`attnid.reports.statistics.mean_confidence_interval`, docs/design.md §11.1);
    columns ``step, n_seeds, mean, low, high``. Diverged runs are left out, as in the interventions table."""

    def by_seed(runs):
        return {
            int(info["seed"]): eval_rows(metrics).set_index("step")["val_loss"]
            for info, metrics in runs
            if info.get("status") != "diverged" and info.get("seed") is not None
        }

    arm, baseline = by_seed(arm_runs), by_seed(baseline_runs)
    seeds = sorted(set(arm) & set(baseline))
    rows = []
    if not seeds:
        return pd.DataFrame(columns=["step", "n_seeds", "mean", "low", "high"])
    steps = sorted(set.intersection(*(set(arm[s].index) & set(baseline[s].index) for s in seeds)))
    for step in steps:
        differences = np.array([arm[s][step] - baseline[s][step] for s in seeds])
        enough = len(seeds) >= MIN_PAIRED_SEEDS
        low, high = mean_confidence_interval(differences) if enough else (math.nan, math.nan)
        rows.append(
            {"step": step, "n_seeds": len(seeds), "mean": float(differences.mean()), "low": low, "high": high}
        )
    return pd.DataFrame(rows)


def _max_of(runs: list, columns: list[str]) -> float:
    values = [
        pd.to_numeric(metrics[c], errors="coerce").abs().max()
        for _, metrics in runs
        for c in columns
        if c in metrics
    ]
    values = [v for v in values if pd.notna(v)]
    return float(max(values)) if values else math.nan


def _drift_ratio_max(runs: list) -> float:
    """The largest drift1 / drift2 on any logged row, both circuits (docs/design.md §7, §13)."""
    ratios = []
    for _, metrics in runs:
        for circuit in ("qk", "ov"):
            if f"drift1_{circuit}" in metrics and f"drift2_{circuit}" in metrics:
                first = pd.to_numeric(metrics[f"drift1_{circuit}"], errors="coerce")
                second = pd.to_numeric(metrics[f"drift2_{circuit}"], errors="coerce")
                ratio = (first / second)[second > 0].dropna()
                if len(ratio):
                    ratios.append(float(ratio.max()))
    return max(ratios) if ratios else math.nan


def _draw_orbit_panel(ax: Axes, column: str, series: list[tuple[str, dict, list]]) -> None:
    """One circuit-pair quantity (ρ or drift1) of each run group, both circuits (QK solid, OV dashed), on
    a log axis; a group at its precision's round-off lies on its floor, never as data (design §13)."""
    floors = Floors(ax)
    symbol = r"$\rho$" if column == "rho" else "drift1"
    for label, style, runs in series:
        dtype = runs_dtype(runs)
        for circuit, linestyle in (("qk", "-"), ("ov", "--")):
            band = seed_band(runs, f"{column}_{circuit}", positive=True)
            if band.empty:
                continue
            line = {
                "color": style["color"],
                "label": label if circuit == "qk" else None,
                "linestyle": linestyle,
            }
            # a drift sums one rounded term per step: its round-off grows like sqrt(steps) (Figure 3)
            band_steps = int(band["step"].max()) if column.startswith("drift") else 1
            every = seed_band(runs, f"{column}_{circuit}")
            if at_round_off(every["max"], dtype, steps=band_steps):
                floors.draw(every["step"], every["max"], dtype, f"{label}: {symbol}", band_steps, **line)
                continue
            plot_band(ax, band, **line)
    floors.finish()
    ax.set_yscale("log")


def caption_numbers(arm_runs: dict[str, RunGroup], identity_runs: RunGroup) -> dict:
    """The numbers Figure 6's caption is filled with: ``n_seeds``; ``final``, the interventions table's
    rows with a ``label``; the identity run's ``identity_steps``, ``identity_rho_max``,
    ``identity_drift_ratio_max``; ``projected_rho_max``, ``projected_dtype`` and ``adamw_rho_mean``."""
    projected = arm_runs.get("adamw_projected", [])
    table, _ = interventions_table(arm_runs)
    final = [
        row | {"label": arm_style(row["arm"], str(arm_runs[row["arm"]][0][0].get("case")))["label"]}
        for row in table[table["metric"] == PRIMARY_METRIC].to_dict("records")
    ]
    return {
        "n_seeds": int(table["n_seeds"].max()) if len(table) else 0,
        "final": final,
        "identity_steps": max((int(m["step"].max()) for _, m in identity_runs), default=0),
        "identity_rho_max": _max_of(identity_runs, ["rho_qk", "rho_ov"]),
        "identity_drift_ratio_max": _drift_ratio_max(identity_runs),
        "projected_rho_max": _max_of(projected, ["rho_qk", "rho_ov"]),
        "projected_dtype": runs_dtype(projected) if projected else "float32",
        "adamw_rho_mean": float(
            np.nanmean(
                [
                    pd.to_numeric(m["rho_qk"], errors="coerce").mean()
                    for _, m in arm_runs[BASELINE_CASE]
                    if "rho_qk" in m
                ]
                or [math.nan]
            )
        ),
    }
