"""Figure 6, does identification change training? (beyond the paper), drawn from the interventions tables
(docs/design.md §11, §13-§15):

- every comparison of ``interventions.csv`` (whatever arms the build has), the primary on top and marked,
  then the secondary family, then the rest: the per-seed paired differences of ``interventions_seeds.csv``
  as dots, their mean with the Student-t interval, the equivalence margin, and the verdict the rule wrote
  (``n too small`` where the seeds cannot decide);
- the 2 x 2 of starting point and fixed blocks, when the build has it (at the stage's lr or each arm at
  its best lr): each cell's mean final loss, the effect of fixing in each row, the contrasts' estimates;
- the effect along training (``interventions_along.csv``, where the runs evaluated the whole val split
  along the way): each contrast's mean difference at every declared step, with its t-band;
- the calibration (``calibration.csv``, where the build has one): each calibrated arm's mean final loss
  against the lr, its chosen lr, one at the grid's edge flagged;
- ρ and the first-order drift of ``adamw``, of the projected arm and of its float64 identity run, those
  that logged them (a stage trained with metrics off has only the identity run's), a series at round-off on
  its floor.

The caption is filled with the tables' numbers: the primary's Δ, interval, p, verdict and power at the
margin, per comparison its row, the calibration's chosen lrs. Panels are drawn by
:mod:`.interventions_panels` from what :mod:`.interventions_rows` reads of the tables.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.plan.interventions import BASELINE_CASE, CALIBRATED_SUFFIX
from attnid.reports.calibration import CALIBRATION_COLUMNS
from attnid.reports.figures.inputs import RUN_FILES, Drawing, RunGroup, Sources
from attnid.reports.figures.interventions_panels import (
    PROJECTED_CASE,
    draw_along,
    draw_calibration,
    draw_differences,
    draw_orbit_panel,
    draw_two_by_two,
    has_orbit_data,
    orbit_series,
    place_edge_labels,
)
from attnid.reports.figures.interventions_rows import (
    AlongSeries,
    CalibrationCurve,
    Comparison,
    TwoByTwo,
    along_series,
    calibration_curves,
    compared_arms,
    comparisons_of,
    two_by_two,
)
from attnid.reports.figures.series import runs_dtype
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, figure_legend, keep_texts_inside, pyplot
from attnid.reports.interventions_curves import ALONG_COLUMNS
from attnid.reports.interventions_table import (
    DESCRIPTIVE,
    PRIMARY,
    SECONDARY,
    load_runs_by_arm,
)
from attnid.reports.latex import finite_or_none
from attnid.reports.statistics import N_TOO_SMALL, smallest_sign_flip_p_value
from attnid.training.rundir import find_run_dirs, load_run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ALONG_TABLE, CALIBRATION_TABLE = "interventions_along.csv", "calibration.csv"
INPUTS = {
    # the along-training table and the calibration where the build has them (no full_val_every, no
    # calibration: neither, e.g. the smoke config)
    "tables": ("interventions.csv", "interventions_seeds.csv", ALONG_TABLE, CALIBRATION_TABLE),
    "intervention_runs": RUN_FILES,
    "identity_runs": RUN_FILES,
}
STAGE = "interventions"
CAPTION = r"""**Figure 6 — does identification change training? (beyond the paper).** Each arm trains like
``adamw`` and is paired seed by seed with ``adamw``'s run (or another arm's: ``arm - baseline``){% if best_lr
%}, each at its own best learning rate, chosen on calibration seeds apart{% endif %}{% if grid %}; the
:math:`2 \times 2` of start and fixed blocks gives the main effects of fixing and of the start (each the mean
of its two simple effects) and their interaction{% endif %}. Top: :math:`\Delta`, the final loss on the whole
validation split minus the baseline's, per seed (dots; below 0 the arm is better), its mean and {{ confidence
}} % t-interval{% if margin %}, the equivalence margin :math:`\pm` {{ fmt(margin) }} (grey){% endif %}.
Right: the verdict of the rule fixed before the runs, at the last step only: the exact sign-flip test ({%
if primary %}the primary, top, bold, alone at level {{ fmt(alpha) }}, the {{ family_size }} secondary
comparisons with Holm{% else %}Holm over the {{ family_size }} comparisons of the family at level {{
fmt(alpha) }}{% endif %}) says whether :math:`\Delta` differs from 0{% if margin %}, two one-sided t-tests
(TOST p) whether it lies inside the margin (its {{ equivalence_confidence }} % t-interval inside it):
better or worse, *within the margin* where both hold, equivalent where only the margin does, inconclusive
where neither{% endif %}{% if short_of_seeds %}; at least {{ min_seeds }} seed pairs{% if primary and
primary.min_seeds != min_seeds %} ({{ primary.min_seeds }} for the primary){% endif %}{% endif %}.
{% if primary %}
Primary: {{ primary.label }}{% if primary.label != primary.comparison %} (``{{ primary.comparison }}``){%
endif %}, :math:`\Delta` {{ value(primary.delta_mean) }} [{{ value(primary.ci_low) }}, {{
value(primary.ci_high) }}], n = {{ primary.n_seeds }}, {% if primary.p_holm is not none %}exact p {{
fmt(primary.p_holm) }}, {% endif %}**{{ primary.verdict }}**{% if margin %}; the test's power at the margin
{{ fmt(primary.power) }}{% endif %}, 80 % power at {{ primary.detectable }}.
{% endif %}
{% if undecided %}
With {{ n_seeds }} seed pair{{ "" if n_seeds == 1 else "s" }} no comparison is decided: the smallest p the
exact test can give is {{ fmt(smallest_p) }}, so every row says n too small and its interval is shown, not
judged.
{% endif %}
{% if comparisons and comparisons|length > caption_rows %}
The {{ comparisons|length }} {{ "secondary " if primary else "" }}comparisons' numbers are in the
interventions table.
{% elif comparisons %}
{{ "Secondary" if primary else "Per comparison" }}, :math:`\Delta` [{{ confidence }} % CI], n, the verdict,
the effect detectable with 80 % power and the power at the margin:
{% for row in comparisons %}``{{ row.comparison }}`` {{ value(row.delta_mean) }} [{{ value(row.ci_low) }},
{{ value(row.ci_high) }}], n = {{ row.n_seeds }}, {{ row.verdict }}{% if row.p_holm is not none %} ({{
row.p_name }} {{ fmt(row.p_holm) }}){% endif %}, detectable {{ row.detectable }}{% if row.power is not none
%}, power {{ fmt(row.power) }}{% endif %}{{ "; " if not loop.last else "." }}
{% endfor %}
{% endif %}
{% if n_descriptive %}
The other {{ n_descriptive }} (below) are shown, not judged.
{% endif %}
{% if grid %}
*2 x 2*: each arm's mean final loss ({{ grid.n_seeds }} seed{{ "" if grid.n_seeds == 1 else "s" }}{{
", at best lrs" if grid.at_best_lr else "" }}), shaded by its difference from ``adamw``'s; fixing changes it
by {{ value(grid.fixing_at_init) }} from the initialisation, by {{ value(grid.fixing_at_gauge) }} from the
gauge point{% if grid.interaction is not none %}; their difference, the interaction, is {{
value(grid.interaction) }} [{{ value(grid.ci_low) }}, {{ value(grid.ci_high) }}], {{ grid.verdict }}{% endif
%}.
{% endif %}
{% if along %}
*Along training*: each contrast's mean :math:`\Delta` and {{ confidence }} % t-band ({{ along.n_seeds }}
seeds) at the {{ along.n_steps }} whole-split evaluations, steps {{ along.first_step }}–{{ along.last_step
}}; it ends at the verdict's value, the one step judged{% if along.primary %}; the primary's is {{
value(along.primary_mid) }} at step {{ along.mid_step }}{% endif %}.
{% endif %}
{% if calibration %}
*Calibration*: the mean final loss of {{ calibration.n_seeds }} calibration seeds per lr ({{
fmt(calibration.lr_low) }}–{{ fmt(calibration.lr_high) }}){% if calibration.refined_seeds %}; filled,
round 2: each arm's best lrs of round 1 over {{ calibration.refined_seeds }} seeds, the pick the lower
mean{% endif %}; ringed, the lr chosen: {% for arm in
calibration.arms %}``{{ arm.arm }}`` {{ fmt(arm.best_lr) }}{{ ", " if not loop.last else "" }}{% endfor %}{%
if calibration.at_edge %}; at the grid's edge (red), the best may lie beyond: {{ calibration.at_edge }}{%
else %}; none at the grid's edge{% endif %}.
{% endif %}
{% if orbit %}
*Unidentified share, first-order drift* (larger circuit), where measured: {% if adamw_measured %}``adamw``,
mean :math:`\rho_{QK}` {{ fmt(adamw_rho_mean) }}{% endif %}{% if projected_steps %}{{ "; " if adamw_measured
else "" }}the projected arm, :math:`\rho` at most {{ fmt(projected_rho_max) }} in {{ projected_dtype }}{%
endif %}{% if identity_steps %}{{ "; " if adamw_measured or projected_steps else "" }}{{ "its" if
projected_steps else "the projected arm's" }} float64 identity run ({{ identity_steps }} steps), :math:`\rho`
at most {{ fmt(identity_rho_max) }}, drift1/drift2 at most {{ fmt(identity_drift_ratio_max) }}{% endif %};
round-off on its grey band's floor (a triangle: at or below).
{% endif %}
"""

TABLE_COLUMNS = {
    "interventions.csv": {"comparison", "arm", "baseline", "n_seeds", "delta_mean", "ci_low", "ci_high"}
    | {"role", "p_holm", "alpha", "equivalence_margin", "min_seeds", "detectable_effect", "power_at_margin"}
    | {"in_family", "verdict"},
    "interventions_seeds.csv": {"comparison", "arm", "baseline", "seed", "arm_value", "baseline_value"}
    | {"difference"},
    ALONG_TABLE: set(ALONG_COLUMNS),
    CALIBRATION_TABLE: set(CALIBRATION_COLUMNS),
}
OPTIONAL_TABLES = (ALONG_TABLE, CALIBRATION_TABLE)
# A caption lists the family's comparisons up to this many (a longer family's are in the interventions table:
# a caption that long would not fit under the figure on a page)
CAPTION_ROWS = 8
ROW_HEIGHT = 0.93 * PANEL_HEIGHT  # a row of panels (inches)
COLUMNS = 3  # the panels below the comparisons, three to a row
PANEL_SPANS = {"along": 2}  # columns a panel takes (the others one)


def draw(sources: Sources) -> Drawing:
    """Figure 6 from interventions.csv, interventions_seeds.csv, interventions_along.csv and calibration.csv
    where the build has them, the interventions' runs and the float64 identity run(s)."""
    table, seeds = (
        _table_with_columns(sources, name) for name in ("interventions.csv", "interventions_seeds.csv")
    )
    along, calibration = (
        _table_with_columns(sources, name) if sources.has("tables", name) else None
        for name in OPTIONAL_TABLES
    )
    arm_runs = load_runs_by_arm(None, sources.intervention_runs) if sources.intervention_runs else {}
    identity = [load_run(run_dir) for run_dir in find_run_dirs(None, sources.identity_runs or [])]
    return draw_interventions(table, seeds, arm_runs, identity, along, calibration)


def _table_with_columns(sources: Sources, name: str) -> pd.DataFrame:
    path = sources.file("tables", name)
    frame = pd.read_csv(path)
    missing = sorted(TABLE_COLUMNS[name] - set(frame.columns))
    if missing:
        writer = "calibration-table" if name == CALIBRATION_TABLE else "interventions-table"
        raise UserError(f"{path} has no column(s) {', '.join(missing)}: run attnid {writer} again")
    return frame


def baseline_runs(arm_runs: dict[str, RunGroup]) -> RunGroup:
    """``adamw``'s runs, at the stage's lr or else at its best lr (a stage that compares arms at their
    best lr only)."""
    return arm_runs.get(BASELINE_CASE) or arm_runs.get(BASELINE_CASE + CALIBRATED_SUFFIX) or []


def orbit_panels(arm_runs: dict[str, RunGroup], identity_runs: RunGroup) -> list[str]:
    """The orbit panels Figure 6 draws, ``rho`` and ``drift1``: those the projected arm or its identity run
    measured (``adamw``'s runs are drawn beside them, never alone; runs trained with metrics off measured
    nothing)."""
    projected = orbit_series([], arm_runs.get(PROJECTED_CASE, []), identity_runs)
    return [column for column in ("rho", "drift1") if has_orbit_data(projected, column)]


def panel_rows(panels: list[str]) -> list[list[tuple[str, int, int]]]:
    """The panels below the comparisons in their order, packed into rows of :data:`COLUMNS` columns: per
    row (panel, first column, columns it spans)."""
    rows: list[list[tuple[str, int, int]]] = []
    used = COLUMNS
    for panel in panels:
        span = PANEL_SPANS.get(panel, 1)
        if used + span > COLUMNS:
            rows.append([])
            used = 0
        rows[-1].append((panel, used, span))
        used += span
    return rows


def draw_interventions(
    table: pd.DataFrame,
    seeds: pd.DataFrame,
    arm_runs: dict[str, RunGroup],
    identity_runs: RunGroup,
    along: pd.DataFrame | None = None,
    calibration: pd.DataFrame | None = None,
) -> Drawing:
    """Figure 6 (see the module): the comparisons' paired differences across the top; below, those the
    build has of the effect along training, the 2 x 2, the calibration, and ρ and drift1 on the orbit."""
    if table.empty:
        raise UserError(
            "interventions.csv has no comparison: run attnid interventions-table on the arms' runs"
        )
    comparisons = comparisons_of(table, seeds, arm_runs)
    grid = two_by_two(seeds, comparisons)
    series = along_series(along, comparisons, grid) if along is not None else []
    curves = calibration_curves(calibration, compared_arms(seeds)) if calibration is not None else []
    orbit = orbit_series(baseline_runs(arm_runs), arm_runs.get(PROJECTED_CASE, []), identity_runs)
    orbit_columns = orbit_panels(arm_runs, identity_runs)
    present = {"along": bool(series), "grid": grid is not None, "calibration": bool(curves)}
    rows = panel_rows([name for name, there in present.items() if there] + orbit_columns)

    # the comparisons across the top, the other panels three to a row below. Each row is laid out on its own
    # (subfigures): the comparisons' long names widen the top panel's margin only. The heights keep the figure
    # and its caption on one page of the appendix.
    top_height = max(ROW_HEIGHT, 0.3 * len(comparisons) + 1.2)
    heights = [top_height] + [ROW_HEIGHT] * len(rows)
    fig = pyplot().figure(figsize=(3 * PANEL_WIDTH + 1.2, sum(heights)), layout="constrained")
    subfigures = fig.subfigures(len(heights), 1, height_ratios=heights) if rows else [fig]
    ax_differences = subfigures[0].add_subplot()
    margin = finite_or_none(table["equivalence_margin"].iloc[0])
    draw_differences(ax_differences, comparisons, margin)
    axes = {}
    for subfigure, row in zip(subfigures[1:], rows):
        slots = subfigure.add_gridspec(1, COLUMNS)
        for panel, first, span in row:
            axes[panel] = ax = subfigure.add_subplot(slots[0, first : first + span])
            if panel == "along":
                draw_along(ax, series, margin)
            elif panel == "grid" and grid is not None:
                draw_two_by_two(ax, grid)
            elif panel == "calibration":
                edge_labels = draw_calibration(ax, curves)
            else:
                _draw_orbit(ax, panel, orbit)
    own_legend = [axes[panel] for panel in ("along", "calibration") if panel in axes]
    figure_legend(fig, ax_differences, ncol=3, own_legend=own_legend)
    if "calibration" in axes:  # its flags, once the layout is final
        place_edge_labels(axes["calibration"], edge_labels)
    keep_texts_inside(fig)
    numbers = caption_numbers(table, comparisons, grid, arm_runs, identity_runs, series, curves)
    return Drawing(fig, numbers)


def _draw_orbit(ax: Axes, column: str, series: list) -> None:
    label, title = {
        "rho": (r"$\rho$ (larger circuit)", r"unidentified share $\rho$"),
        "drift1": (r"$\|D_1\|/N_0$ (larger circuit)", "first-order drift"),
    }[column]
    draw_orbit_panel(ax, column, series)
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.set_title(title)


# ---------------------------------------------------------------------------- the caption's numbers


def _max_of(runs: RunGroup, columns: list[str]) -> float:
    values = [
        pd.to_numeric(metrics[c], errors="coerce").abs().max()
        for _, metrics in runs
        for c in columns
        if c in metrics
    ]
    values = [v for v in values if pd.notna(v)]
    return float(max(values)) if values else math.nan


def _drift_ratio_max(runs: RunGroup) -> float:
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


def _comparison_numbers(row: Comparison, min_seeds: int) -> dict:
    return {
        "comparison": row.comparison,
        "label": row.name_label,
        "delta_mean": row.delta_mean,
        "ci_low": row.ci_low,
        "ci_high": row.ci_high,
        "n_seeds": row.n_seeds,
        "verdict": row.verdict,
        "p_holm": row.p_holm if row.decided else None,  # no test is reported where none decides
        "p_name": "p" if row.primary else "Holm p",
        "detectable": row.detectable,
        "power": row.power_at_margin,
        "min_seeds": min_seeds,
    }


def _grid_numbers(grid: TwoByTwo | None) -> dict | None:
    if grid is None:
        return None
    interaction = grid.interaction
    return {
        "at_best_lr": grid.at_best_lr,
        "n_seeds": grid.n_seeds,
        "fixing_at_init": grid.fixing_effects[0],
        "fixing_at_gauge": grid.fixing_effects[1],
        "interaction": None if interaction is None else interaction.delta_mean,
        "ci_low": None if interaction is None else interaction.ci_low,
        "ci_high": None if interaction is None else interaction.ci_high,
        "verdict": None if interaction is None else interaction.verdict,
    }


def _along_numbers(series: list[AlongSeries]) -> dict | None:
    """The along-training panel's steps and seeds, and the primary's Δ half-way and at the end."""
    if not series:
        return None
    steps = np.unique(np.concatenate([item.steps for item in series]))
    numbers: dict = {
        "n_steps": len(steps),
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "n_seeds": max(item.n_seeds for item in series),
        "primary": False,
    }
    primary = next((item for item in series if item.row.primary), None)
    if primary is not None:
        middle = int(np.argmin(np.abs(primary.steps - primary.steps[-1] / 2)))
        numbers |= {
            "primary": True,
            "mid_step": int(primary.steps[middle]),
            "primary_mid": float(primary.delta_mean[middle]),
            "primary_last": float(primary.delta_mean[-1]),
        }
    return numbers


def _calibration_numbers(curves: list[CalibrationCurve]) -> dict | None:
    if not curves:
        return None
    lrs = np.concatenate([curve.lrs for curve in curves])
    return {
        "n_seeds": max(curve.n_seeds for curve in curves),
        "refined_seeds": max(curve.refined_seeds for curve in curves),
        "lr_low": float(lrs.min()),
        "lr_high": float(lrs.max()),
        "arms": [
            {"arm": curve.arm, "best_lr": math.nan if curve.best_lr is None else curve.best_lr}
            for curve in curves
        ],
        "at_edge": ", ".join(f"``{curve.arm}``" for curve in curves if curve.at_edge),
    }


def caption_numbers(
    table: pd.DataFrame,
    comparisons: list[Comparison],
    grid: TwoByTwo | None,
    arm_runs: dict[str, RunGroup],
    identity_runs: RunGroup,
    along: list[AlongSeries] | None = None,
    calibration: list[CalibrationCurve] | None = None,
) -> dict:
    """The numbers Figure 6's caption is filled with: the rule's (``alpha``, ``margin``, ``family_size``,
    ``min_seeds``), ``n_seeds`` and whether nothing is ``undecided``; the ``primary`` comparison's row and
    every comparison's (``comparisons``); the 2 x 2 (``grid``); the effect along training (``along``); the
    calibration's chosen lrs (``calibration``); the orbit panels' (``orbit``, the projected arm's and the
    identity run's largest ρ and drift ratio, ``adamw``'s mean ρ_QK where its runs measured it)."""
    first = table.iloc[0]
    alpha = float(first["alpha"])
    n_seeds = int(table["n_seeds"].max())
    projected = arm_runs.get(PROJECTED_CASE, [])
    baseline = baseline_runs(arm_runs)
    rho_means = [
        float(pd.to_numeric(m["rho_qk"], errors="coerce").mean()) for _, m in baseline if "rho_qk" in m
    ]
    rho_means = [value for value in rho_means if math.isfinite(value)]
    min_seeds = dict(zip(table["comparison"].astype(str), table["min_seeds"].astype(int)))
    rows = [_comparison_numbers(row, min_seeds[row.comparison]) for row in comparisons]
    primary = next((numbers for numbers, row in zip(rows, comparisons) if row.primary), None)
    # listed: the family's (the primary has its own sentence); the rest are shown without a verdict
    listed = [numbers for numbers, row in zip(rows, comparisons) if row.role == SECONDARY]
    secondary = [row for row in comparisons if row.role == SECONDARY]
    judged = [numbers["min_seeds"] for numbers, row in zip(rows, comparisons) if row.role != PRIMARY]
    return {
        "alpha": alpha,
        "confidence": round(100 * (1 - alpha)),
        "equivalence_confidence": round(100 * (1 - 2 * alpha)),
        "margin": finite_or_none(first["equivalence_margin"]),
        "best_lr": any(row.arm.endswith(CALIBRATED_SUFFIX) for row in comparisons),
        "primary": primary,
        "family_size": len(secondary)
        if primary is not None
        else int(table["in_family"].astype(str).str.lower().eq("true").sum()),
        "min_seeds": max(judged) if judged else int(first["min_seeds"]),
        "n_seeds": n_seeds,
        "smallest_p": smallest_sign_flip_p_value(n_seeds),
        "undecided": not any(row.decided for row in comparisons),
        "short_of_seeds": any(row.verdict == N_TOO_SMALL for row in comparisons),
        "comparisons": listed,
        "n_descriptive": sum(row.role == DESCRIPTIVE for row in comparisons),
        "caption_rows": CAPTION_ROWS,
        "grid": _grid_numbers(grid),
        "along": _along_numbers(along or []),
        "calibration": _calibration_numbers(calibration or []),
        "orbit": bool(orbit_panels(arm_runs, identity_runs)),
        "adamw_measured": bool(rho_means),
        "projected_steps": max((int(m["step"].max()) for _, m in projected), default=0),
        "projected_rho_max": _max_of(projected, ["rho_qk", "rho_ov"]),
        "projected_dtype": runs_dtype(projected) if projected else "",
        "identity_steps": max((int(m["step"].max()) for _, m in identity_runs), default=0),
        "identity_rho_max": _max_of(identity_runs, ["rho_qk", "rho_ov"]),
        "identity_drift_ratio_max": _drift_ratio_max(identity_runs),
        "adamw_rho_mean": float(np.mean(rho_means)) if rho_means else math.nan,
    }
