"""Figure 4, the learning-rate sweep (claims E1, E2): final β (both circuits) and mean ρ against the peak
learning rate (log-log, fitted slopes annotated), and the final val loss; a diverged point is a cross at the
top of its panel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.series import draw_floor_bands
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, case_style, figure_legend, pyplot, styled
from attnid.reports.round_off import UNIT_ROUND_OFF, at_round_off, coarsest_dtype

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INPUTS = {"tables": ("sweep.csv", "sweep_slopes.csv")}
CAPTION = r"""**Figure 4 — learning-rate sweep (claims E1, E2).** Final :math:`\beta` of the query-key
and of the output-value pairs, and mean :math:`\rho` of the query-key pairs, against the peak learning
rate (log-log; dotted lines are least-squares fits, slopes annotated: plain SGD predicts 2 for
:math:`\beta` of both circuits, measured in float64 over a short, small-lr sweep where the trajectory
does not depend on the learning rate), and the final validation loss. A series at numerical round-off is
never fitted: a grey band labelled with the training precision marks it instead. A cross at the top of a
panel marks a sweep point that diverged (its job finished with status ``diverged``).
"""


def draw(sources: Sources) -> Drawing:
    """Figure 4 from sweep.csv and sweep_slopes.csv (``attnid tables``)."""
    sweep = pd.read_csv(sources.file("tables", "sweep.csv"))
    slopes = pd.read_csv(sources.file("tables", "sweep_slopes.csv"))
    return Drawing(draw_sweep(sweep, slopes), {})


@styled
def draw_sweep(sweep: pd.DataFrame, slopes: pd.DataFrame) -> Figure:
    """Figure 4 from the sweep and slope tables; returns the matplotlib figure."""
    fig, axes = pyplot().subplots(2, 2, figsize=(2 * PANEL_WIDTH + 0.6, 2 * PANEL_HEIGHT))
    axes = axes.ravel()
    # both circuits' beta carry the O(lr^2) claim (the SGD sweep trains in float64, where beta_QK is data)
    panels = [
        ("beta_qk_final", r"final $\beta_{QK}$", True),
        ("beta_ov_final", r"final $\beta_{OV}$", True),
        ("rho_qk_mean", r"mean $\rho_{QK}$", True),
        ("final_val_loss", "final val loss", False),
    ]
    floors: list[dict[str, list[str]]] = [{dtype: [] for dtype in UNIT_ROUND_OFF} for _ in panels]
    for optimizer, group in sweep.groupby("optimizer", sort=False):
        style = case_style(str(optimizer))
        group = group.sort_values("lr")
        done = group[group["status"] != "diverged"]
        diverged = group[group["status"] == "diverged"]
        listed: pd.Series | list[str] = done["dtype"].dropna().astype(str) if "dtype" in done else []
        dtype = coarsest_dtype([name for value in listed for name in value.split("+")])
        for ax, floor, (column, _, log_y) in zip(axes, floors, panels):
            rounded = log_y and at_round_off(done[column], dtype)
            if rounded:  # round-off: a floor band, no points, no fit
                floor[dtype].append(style["label"])
            else:
                ax.plot(
                    done["lr"],
                    done[column],
                    marker=style["marker"],
                    linestyle=style["linestyle"],
                    color=style["color"],
                    label=style["label"],
                )
            if log_y and not rounded:
                fit = slopes[(slopes["optimizer"] == optimizer) & (slopes["quantity"] == column)]
                if len(fit) and np.isfinite(fit["slope"].iloc[0]):
                    slope, intercept = float(fit["slope"].iloc[0]), float(fit["intercept"].iloc[0])
                    xs = np.array([done["lr"].min(), done["lr"].max()])
                    ax.plot(
                        xs, 10 ** (intercept + slope * np.log10(xs)), ":", color=style["color"], linewidth=1
                    )
                    ax.annotate(
                        f"slope {slope:.2f}",
                        (xs[-1], 10 ** (intercept + slope * np.log10(xs[-1]))),
                        xytext=(-4, 6),
                        textcoords="offset points",
                        ha="right",
                        fontsize=7,
                        color=style["color"],
                    )
            if len(diverged):
                # diverged points have no value: a cross at the top edge, at their lr
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
    for ax, floor, (_, label, log_y) in zip(axes, floors, panels):
        draw_floor_bands(ax, floor)
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(label)
        ax.set_title(label + " vs learning rate")
    figure_legend(fig, axes[0])
    return fig
