"""The panels of Figure 6 (:mod:`.fig6_interventions`), each drawn from what
:mod:`.interventions_rows` reads of the tables: the comparisons with their verdicts, the 2 x 2, each
contrast's effect along training, the calibration curves, and ρ and the first-order drift on the orbit."""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.plan.interventions import BASELINE_CASE
from attnid.reports.figures.interventions_rows import (
    AT_BEST_LRS,
    AlongSeries,
    CalibrationCurve,
    Comparison,
    TwoByTwo,
    base_name,
)
from attnid.reports.figures.series import Floors, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import AROUND, PREDICTION_COLOR, PointLabel, case_style, place_labels
from attnid.reports.round_off import at_round_off
from attnid.reports.statistics import DIFFERENT_LABELS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from attnid.reports.figures.inputs import RunGroup

PROJECTED_CASE = "adamw_projected"
SEED_DOT_COLOR = "#555555"
DECIDED_COLOR = "#000000"  # a comparison with a verdict: its mean and interval
UNDECIDED_COLOR = "#999999"  # no verdict (n too small, not in the family): shown, not judged
ROW_SPREAD = 0.22  # the seeds' dots of one comparison spread over +-this around its row
MARGIN_ALPHA = 0.12  # the equivalence margin: a light band under the rows
ALONG_BAND_ALPHA = 0.12  # the contrasts' t-bands along training, which overlap
CELL_NAME_WIDTH = 14  # an arm's name in a cell of the 2 x 2, wrapped
CONFIDENCE = 95  # interventions.csv's ci_low, ci_high: the 1 - alpha t-interval of alpha = 0.05
# The series of the along-training and calibration panels (Okabe-Ito, apart from the cases' colours)
SERIES_COLORS = ("#D55E00", "#0072B2", "#CC79A7", "#56B4E9", "#E69F00", "#000000", "#999999")
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LR_PAD = 1.35  # the calibration panel's x axis beyond the grid's ends, a factor of the lr
EDGE_COLOR = "#B2182B"  # a chosen lr at its grid's edge
CHOSEN_LR, CHOSEN_AT_EDGE, DIVERGED, ROUND_TWO = (
    "chosen lr (lowest mean)",
    "chosen lr at the grid's edge",
    "a run diverged at this lr",
    "round 2: the best lrs, more seeds",
)
CALIBRATION_KEYS = (CHOSEN_LR, CHOSEN_AT_EDGE, DIVERGED, ROUND_TWO)
MARGIN_LABEL = "equivalence margin ±{margin:.2g}"


def draw_zero_and_margin(ax: Axes, margin: float | None, across: str) -> None:
    """The zero line and the equivalence margin's band, on the ``across`` axis ("x" or "y")."""
    line, band = (ax.axvline, ax.axvspan) if across == "x" else (ax.axhline, ax.axhspan)
    line(0.0, color=PREDICTION_COLOR, linewidth=0.8, zorder=1)
    if margin is not None:
        band(
            -margin,
            margin,
            color=PREDICTION_COLOR,
            alpha=MARGIN_ALPHA,
            linewidth=0,
            zorder=0,
            label=MARGIN_LABEL.format(margin=margin),
        )


def draw_differences(ax: Axes, comparisons: list[Comparison], margin: float | None) -> None:
    """One row per comparison: its seeds' differences as dots, the mean with its t-interval (grey where the
    rule gives no verdict), the zero line and the equivalence margin; the verdicts on the right, the
    primary's row in bold, a rule between the primary, the secondary family and the rest."""
    draw_zero_and_margin(ax, margin, across="x")
    xs, ys = [], []
    for position, row in enumerate(comparisons):
        spread = (
            np.linspace(-ROW_SPREAD, ROW_SPREAD, row.differences.size) if row.differences.size > 1 else 0.0
        )
        xs.append(row.differences)
        ys.append(position + np.zeros(row.differences.size) + spread)
    if any(x.size for x in xs):
        ax.scatter(
            np.concatenate(xs),
            np.concatenate(ys),
            s=11,
            color=SEED_DOT_COLOR,
            alpha=0.75,
            linewidths=0,
            zorder=3,
            label="one seed's difference",
        )
    _draw_means(ax, comparisons)
    _set_difference_limits(ax, comparisons, margin)
    positions = list(range(len(comparisons)))
    ax.set_ylim(len(comparisons) - 0.5, -0.5)  # the first comparison on top
    all_at_best_lr = all(row.at_best_lr for row in comparisons)
    ax.set_yticks(positions, [row.short_label(at_lrs=not all_at_best_lr) for row in comparisons])
    ax.grid(False, axis="y")
    for position in range(1, len(comparisons)):  # between the roles: the primary, the family, the rest
        if comparisons[position].role != comparisons[position - 1].role:
            ax.axhline(position - 0.5, color=UNDECIDED_COLOR, linewidth=0.5, zorder=0)
    verdicts = ax.twinx()
    verdicts.set_ylim(ax.get_ylim())
    verdicts.set_yticks(positions, [row.verdict_label for row in comparisons])
    verdicts.grid(False)
    for axis in (ax, verdicts):
        for tick, row in zip(axis.get_yticklabels(), comparisons):
            if axis is verdicts:
                tick.set_color(DECIDED_COLOR if row.decided else UNDECIDED_COLOR)
            tick.set_fontweight(
                "bold" if row.primary or (axis is verdicts and row.verdict in DIFFERENT_LABELS) else "normal"
            )
    ax.set_xlabel("final val loss (whole split), arm minus baseline, same seed")
    ax.set_title(
        "paired differences per seed, and the verdicts"
        + (", every arm at its best lr" if all_at_best_lr else "")
    )


def _draw_means(ax: Axes, comparisons: list[Comparison]) -> None:
    shown = set()
    for position, row in enumerate(comparisons):
        if not (math.isfinite(row.delta_mean) and math.isfinite(row.ci_low) and math.isfinite(row.ci_high)):
            continue
        decided = row.decided
        label = f"mean, {CONFIDENCE} % t-interval" + ("" if decided else " (no verdict)")
        ax.errorbar(
            row.delta_mean,
            position,
            xerr=[[row.delta_mean - row.ci_low], [row.ci_high - row.delta_mean]],
            fmt="o",
            color=DECIDED_COLOR if decided else UNDECIDED_COLOR,
            markerfacecolor=DECIDED_COLOR if decided else "white",
            markersize=6 if row.primary else 5,
            capsize=3,
            linewidth=1.8 if row.primary else 1.2,
            zorder=4,
            label=None if label in shown else label,
        )
        shown.add(label)


def _set_difference_limits(ax: Axes, comparisons: list[Comparison], margin: float | None) -> None:
    """x limits that hold every dot, mean and margin, and the intervals of the rows with a verdict: a wider
    interval (a handful of seeds, no verdict) runs off the side, with an arrow there."""
    values = [0.0] + ([-margin, margin] if margin is not None else [])
    for row in comparisons:
        values += row.differences.tolist() + [row.delta_mean]
        if row.decided:
            values += [row.ci_low, row.ci_high]
    finite = np.array([v for v in values if math.isfinite(v)])
    low, high = float(finite.min()), float(finite.max())
    pad = 0.08 * (high - low) or 1e-3
    low, high = low - pad, high + pad
    ax.set_xlim(low, high)
    for position, row in enumerate(comparisons):
        for end, edge, marker in ((row.ci_low, low, "<"), (row.ci_high, high, ">")):
            if math.isfinite(end) and (end < low if marker == "<" else end > high):
                ax.plot(
                    [edge],
                    [position],
                    marker=marker,
                    color=UNDECIDED_COLOR,
                    markersize=4,
                    clip_on=False,
                    zorder=4,
                )


def two_by_two_title(grid: TwoByTwo) -> str:
    return f"2 x 2: start x fixing, {seeds(grid.n_seeds)}" + (f", {AT_BEST_LRS}" if grid.at_best_lr else "")


def draw_two_by_two(ax: Axes, grid: TwoByTwo) -> None:
    """The four cells' mean final loss, shaded by their difference from ``adamw``'s; each fixed cell says
    the effect of fixing from its start, the panel's foot the main effect of fixing and the interaction."""
    shift = grid.means - grid.means[0, 0]
    limit = float(np.abs(shift).max()) or 1.0
    ax.imshow(shift, cmap="RdBu_r", vmin=-2 * limit, vmax=2 * limit, aspect="auto")  # pale: the text reads
    effects = grid.fixing_effects
    for start in range(2):
        for fixed in range(2):
            name = textwrap.fill(base_name(grid.arms[start][fixed]).replace("_", " "), CELL_NAME_WIDTH)
            lines = [name, f"{grid.means[start, fixed]:.4f}"]
            if fixed:
                lines.append(f"fixing {effects[start]:+.2g}")
            ax.text(fixed, start, "\n".join(lines), ha="center", va="center", fontsize=6.5)
    ax.set_xticks([0, 1], ["nothing\nfixed", "D x D blocks\nfixed"])
    ax.set_yticks([0, 1], ["from the\ninitialisation", "from the\ngauge point"])
    ax.tick_params(length=0)
    ax.grid(False)
    ax.set_xlabel("\n".join(_contrast_line(row) for row in grid.contrasts.values()))
    ax.set_title(two_by_two_title(grid))


def _contrast_line(row: Comparison) -> str:
    """A contrast's estimate under the 2 x 2: its mean and interval and its verdict, or why it has none."""
    label = row.name_label.split(",")[0].removeprefix("main effect of ")
    if not math.isfinite(row.delta_mean):  # fewer than two seed pairs
        return f"{label}: no estimate, {row.verdict_label}"
    interval = f" [{row.ci_low:+.2g}, {row.ci_high:+.2g}]" if math.isfinite(row.ci_low) else ""
    return f"{label} {row.delta_mean:+.2g}{interval}: {row.verdict}"


def seeds(count: int) -> str:
    """``1 seed``, ``8 seeds``."""
    return f"{count} seed" + ("" if count == 1 else "s")


def draw_along(ax: Axes, series: list[AlongSeries], margin: float | None) -> None:
    """Each comparison's mean difference at each declared step with its t-interval as a band, the zero line
    and the equivalence margin; the primary's line the thickest. The verdict is the last step's."""
    draw_zero_and_margin(ax, margin, across="y")
    all_at_best_lr = all(item.row.at_best_lr for item in series)
    for index, item in enumerate(series):
        color = SERIES_COLORS[index % len(SERIES_COLORS)]
        ax.fill_between(
            item.steps, item.ci_low, item.ci_high, color=color, alpha=ALONG_BAND_ALPHA, linewidth=0
        )
        ax.plot(
            item.steps,
            item.delta_mean,
            color=color,
            marker=SERIES_MARKERS[index % len(SERIES_MARKERS)],
            markersize=3.5,
            linewidth=2.0 if item.row.primary else 1.2,
            label=item.row.short_label(at_lrs=not all_at_best_lr),
        )
    last = max(float(item.steps[-1]) for item in series)
    ax.axvline(last, color=PREDICTION_COLOR, linewidth=0.6, zorder=1)
    ax.set_xlabel(f"step (the verdict is taken at the last, {last:g}, only)")
    ax.set_ylabel(r"mean $\Delta$ val loss (whole split)")
    n_seeds = max(item.n_seeds for item in series)
    at_lrs = f", {AT_BEST_LRS}" if all_at_best_lr else ""
    ax.set_title(f"the effect along training{at_lrs}, {seeds(n_seeds)}, {CONFIDENCE} % t-bands")
    lines = [line for line in ax.get_lines() if not str(line.get_label()).startswith("_")]
    side_legend(ax, lines, [str(line.get_label()) for line in lines])


def side_legend(ax: Axes, handles: list, labels: list[str]) -> None:
    """A panel's own legend, beside it on the right (the layout makes room for it): its series are this
    panel's alone (the figure's legend leaves them out)."""
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=6.5, borderaxespad=0)


def _draw_round_two(ax: Axes, curve: CalibrationCurve, color: str) -> None:
    """Round 2's means (both rounds' seeds) at the lrs it refined: filled, over round 1's curve."""
    if curve.refined_lrs.size:
        ax.plot(
            curve.refined_lrs,
            curve.refined_means,
            linestyle="None",
            marker="D",
            markersize=4.5,
            color=color,
            markeredgecolor="black",
            markeredgewidth=0.5,
            label=ROUND_TWO,
            zorder=4,
        )


def draw_calibration(ax: Axes, curves: list[CalibrationCurve]) -> list[PointLabel]:
    """Each arm's mean final loss against the lr of its grid (log x), round 2's means (over both rounds'
    seeds) at the lrs it refined as filled diamonds, its chosen lr ringed, one at the grid's edge ringed
    in red; a diverged lr as a cross at the panel's top. Returns the labels of the
    chosen lrs at the edge, to place once the layout is final (:func:`place_edge_labels`)."""
    edge_labels = []
    for index, curve in enumerate(curves):
        color = SERIES_COLORS[index % len(SERIES_COLORS)]
        ax.plot(
            curve.lrs,
            curve.means,
            color=color,
            marker=SERIES_MARKERS[index % len(SERIES_MARKERS)],
            markersize=3.5,
            label=curve.arm,
        )
        _draw_round_two(ax, curve, color)
        if curve.best_lr is not None:
            edge = curve.at_edge
            ax.plot(
                [curve.best_lr],
                [curve.best_mean],
                linestyle="None",
                marker="o",
                markersize=9,
                markerfacecolor="none",
                markeredgecolor=EDGE_COLOR if edge else DECIDED_COLOR,
                markeredgewidth=1.4 if edge else 0.9,
                label=CHOSEN_AT_EDGE if edge else CHOSEN_LR,
                zorder=5,
            )
            if edge:
                edge_labels.append(
                    PointLabel("at the grid's edge", (curve.best_lr, curve.best_mean), EDGE_COLOR, 6.5)
                )
        if curve.diverged_lrs.size:  # on the panel's top edge, where its loss has no value
            ax.plot(
                curve.diverged_lrs,
                np.ones(curve.diverged_lrs.size),
                linestyle="None",
                marker="x",
                color=color,
                transform=ax.get_xaxis_transform(),
                clip_on=False,
                label=DIVERGED,
            )
    ax.set_xscale("log")
    lrs = np.unique(np.concatenate([curve.lrs for curve in curves]))
    # room beside the grid's ends and below the lowest mean, where a flag of a chosen lr at an edge goes
    ax.set_xlim(lrs.min() / LR_PAD, lrs.max() * LR_PAD)
    means = np.concatenate([curve.means for curve in curves] + [curve.refined_means for curve in curves])
    low, high = np.nanmin(means), np.nanmax(means)
    span = high - low or 1.0
    ax.set_ylim(low - 0.2 * span, high + 0.05 * span)
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.set_xlabel("learning rate")
    ax.set_ylabel("mean final val loss (whole split)")
    n_seeds = max(curve.n_seeds for curve in curves)
    refined = max(curve.refined_seeds for curve in curves)
    ax.set_title(
        f"calibration, {seeds(n_seeds)} of its own"
        + (f"; round 2, {seeds(refined)} in all" if refined else "")
    )
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # the arms, then each key once (a ring, a cross)
    ordered = sorted(unique, key=lambda label: label in CALIBRATION_KEYS)
    side_legend(ax, [unique[label] for label in ordered], ordered)
    return edge_labels


# ---------------------------------------------------------------------------- ρ and drift on the orbit


def _larger_circuit(runs: RunGroup, column: str) -> RunGroup:
    """Each run with ``column`` = the larger of its query-key and output-value values at every step."""
    out = []
    for info, metrics in runs:
        parts = [
            pd.to_numeric(metrics[f"{column}_{c}"], errors="coerce").abs()
            for c in ("qk", "ov")
            if f"{column}_{c}" in metrics
        ]
        frame = metrics.copy()
        frame[column] = pd.concat(parts, axis=1).max(axis=1, skipna=False) if parts else np.nan
        out.append((info, frame))
    return out


def orbit_series(
    baseline: RunGroup, projected: RunGroup, identity: RunGroup
) -> list[tuple[str, dict, RunGroup]]:
    """(label, look, runs) of each run group of the orbit panels that has runs, in its case's style (as
    everywhere in the figures) with a ``short`` name for its floor's text; the float64 identity run of the
    projected arm with a marker at every point."""
    adamw, projected_style = case_style(BASELINE_CASE), case_style(PROJECTED_CASE)
    series = [(adamw["label"], adamw | {"short": adamw["label"]}, baseline)] if baseline else []
    if projected:
        dtype = runs_dtype(projected)
        look = projected_style | {"short": f"projected ({dtype})"}
        series.append((f"{projected_style['label']} ({dtype})", look, projected))
    if identity:
        dtype = runs_dtype(identity)
        look = projected_style | {"short": f"identity run ({dtype})", "every_point": True}
        series.append((f"{projected_style['label']} ({dtype} identity run)", look, identity))
    return series


def has_orbit_data(series: list[tuple[str, dict, RunGroup]], column: str) -> bool:
    """Whether any run group logged ``column`` (ρ or drift1: runs trained with metrics off have neither)."""
    return any(not seed_band(_larger_circuit(runs, column), column).empty for _, _, runs in series)


def draw_orbit_panel(ax: Axes, column: str, series: list[tuple[str, dict, RunGroup]]) -> None:
    """The larger circuit's ρ or drift1 of each run group on a log axis; a group at its precision's round-off
    lies on its floor, never as data (docs/design.md §13); a group that did not log it is left out."""
    floors = Floors(ax)
    symbol = r"$\rho$" if column == "rho" else "drift1"
    for label, style, runs in series:
        dtype = runs_dtype(runs)
        larger = _larger_circuit(runs, column)
        band = seed_band(larger, column, positive=True)
        every = seed_band(larger, column)
        if every.empty:
            continue
        line = {"color": style["color"], "label": label, "linestyle": style["linestyle"]}
        # a drift sums one rounded term per step: its round-off grows like sqrt(steps) (Figure 3)
        band_steps = int(every["step"].max()) if column.startswith("drift") else 1
        if at_round_off(every["max"], dtype, steps=band_steps):
            marker = {"marker": style["marker"]} if style.get("every_point") else {}
            floors.draw(
                every["step"],
                every["max"],
                dtype,
                f"{style['short']}: {symbol}",
                band_steps,
                **line,
                **marker,
            )
            continue
        plot_band(ax, band, **line)
    floors.finish()
    ax.set_yscale("log")


# Where an edge flag may sit around its ring (a chosen lr at the grid's edge: at the panel's side, often
# level with other arms' rings): the usual places, then further below and above it, towards the grid.
EDGE_LABEL_PLACES = (
    *AROUND,
    ((-6, -10), "right", "top"),
    ((6, -10), "left", "top"),
    ((-6, 10), "right", "bottom"),
    ((6, 10), "left", "bottom"),
    ((0, -16), "center", "top"),
    ((0, 16), "center", "bottom"),
)


def place_edge_labels(ax: Axes, labels: list[PointLabel]) -> None:
    """The calibration's edge flags, placed once the figure's layout is final."""
    if labels:
        place_labels(ax, labels, EDGE_LABEL_PLACES)
