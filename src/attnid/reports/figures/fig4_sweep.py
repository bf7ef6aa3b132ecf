"""Figure 4, the learning-rate sweep (claims E1, E2): final β (both circuits) and mean ρ against the peak
learning rate (log-log, fitted slopes annotated), and the final val loss; a diverged point is a cross at the
top of its panel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.series import Floors
from attnid.reports.figures.style import (
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PointLabel,
    case_style,
    figure_legend,
    keep_texts_inside,
    place_labels,
    pyplot,
    styled,
)
from attnid.reports.round_off import at_round_off, coarsest_dtype

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INPUTS = {"tables": ("sweep.csv", "sweep_slopes.csv")}
CAPTION = r"""**Figure 4 — learning-rate sweep (claims E1, E2).** Final :math:`\beta` of the query-key
and of the output-value pairs, and mean :math:`\rho` of the query-key pairs, against the peak learning
rate (log-log; dotted lines are least-squares fits, slopes annotated: plain SGD predicts 2 for
:math:`\beta` of both circuits, measured in float64 over a short, small-lr sweep where the trajectory
does not depend on the learning rate), and the final validation loss. A series at numerical round-off is
never fitted (``sweep_slopes.csv`` says so in its row): its points lie on the floor of a grey band
labelled with the training precision (triangles: at or below), its largest value written there. A cross
at the top of a panel marks a sweep point that diverged (its job finished with status ``diverged``).
"""


def draw(sources: Sources) -> Drawing:
    """Figure 4 from sweep.csv and sweep_slopes.csv (``attnid tables``)."""
    sweep = pd.read_csv(sources.file("tables", "sweep.csv"))
    slopes = pd.read_csv(sources.file("tables", "sweep_slopes.csv"))
    return Drawing(draw_sweep(sweep, slopes), {})


# Each panel: the sweep table's column, its label, and whether it is a log-log panel (fitted, with a floor).
# Both circuits' β carry the O(lr²) claim (the SGD sweep trains in float64, where β_QK is data).
PANELS = (
    ("beta_qk_final", r"final $\beta_{QK}$", True),
    ("beta_ov_final", r"final $\beta_{OV}$", True),
    ("rho_qk_mean", r"mean $\rho_{QK}$", True),
    ("final_val_loss", "final val loss", False),
)


@styled
def draw_sweep(sweep: pd.DataFrame, slopes: pd.DataFrame) -> Figure:
    """Figure 4 from the sweep and slope tables; returns the matplotlib figure."""
    fig, axes = pyplot().subplots(2, 2, figsize=(2 * PANEL_WIDTH + 0.6, 2 * PANEL_HEIGHT))
    axes = axes.ravel()
    floors = [Floors(ax) for ax in axes]
    slope_labels: list[list[PointLabel]] = [[] for _ in axes]
    for optimizer, group in sweep.groupby("optimizer", sort=False):
        style = case_style(str(optimizer))
        group = group.sort_values("lr")
        done = group[group["status"] != "diverged"]
        listed: pd.Series | list[str] = done["dtype"].dropna().astype(str) if "dtype" in done else []
        dtype = coarsest_dtype([name for value in listed for name in value.split("+")])
        for ax, floor, labels, (column, label, log_y) in zip(axes, floors, slope_labels, PANELS):
            line = {"color": style["color"], "label": style["label"], "linestyle": style["linestyle"]}
            if log_y and at_round_off(done[column], dtype):  # round-off: on its floor, no fit
                floor.draw(done["lr"], done[column], dtype, f"{style['label']}: {label}", marker="v", **line)
            else:
                ax.plot(done["lr"], done[column], marker=style["marker"], **line)
                if log_y:
                    labels += _draw_fit(ax, slopes, str(optimizer), column, done["lr"], style["color"])
            _mark_diverged(ax, group[group["status"] == "diverged"], style)
    for ax, floor, (_, label, log_y) in zip(axes, floors, PANELS):
        floor.finish()
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(label)
        ax.set_title(label + " vs learning rate")
    figure_legend(fig, axes[0])
    keep_texts_inside(fig)
    for ax, labels in zip(axes, slope_labels):  # once the layout is final: the labels dodge what is drawn
        place_labels(ax, labels, around=SLOPE_LABEL_PLACES)
    return fig


# A slope's label sits left of the fit's upper end, above the line if there is room, else below it.
SLOPE_LABEL_PLACES = (
    ((-4, 6), "right", "bottom"),
    ((-4, -6), "right", "top"),
    ((6, 0), "left", "center"),
    ((-6, 0), "right", "center"),
    ((-4, 14), "right", "bottom"),
    ((-4, -14), "right", "top"),
)


def _draw_fit(
    ax: Axes, slopes: pd.DataFrame, optimizer: str, column: str, lrs: pd.Series, color: str
) -> list[PointLabel]:
    """The fitted log-log line of ``column`` (dotted) over the sweep's lrs; its slope's label."""
    fit = slopes[(slopes["optimizer"] == optimizer) & (slopes["quantity"] == column)]
    if not len(fit) or not np.isfinite(fit["slope"].iloc[0]):
        return []
    slope, intercept = float(fit["slope"].iloc[0]), float(fit["intercept"].iloc[0])
    xs = np.array([lrs.min(), lrs.max()])
    ax.plot(xs, 10 ** (intercept + slope * np.log10(xs)), ":", color=color, linewidth=1)
    end = (float(xs[-1]), float(10 ** (intercept + slope * np.log10(xs[-1]))))
    return [PointLabel(f"slope {slope:.2f}", end, color, fontsize=7)]


def _mark_diverged(ax: Axes, diverged: pd.DataFrame, style: dict) -> None:
    """Diverged points have no value: a cross at the top edge, at their lr."""
    if not len(diverged):
        return
    ax.plot(
        diverged["lr"],
        np.full(len(diverged), 0.97),
        "x",
        color=style["color"],
        markersize=7,
        markeredgewidth=1.8,
        transform=ax.get_xaxis_transform(),
        clip_on=False,
        label=f"{style['label']}: diverged",
    )
