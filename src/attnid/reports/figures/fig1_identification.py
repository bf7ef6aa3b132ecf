"""Figure 1, identification by design (claims T3, T5): the identified fraction of one attention layer
against its number of heads, as closed forms for MHA, GQA and RoPE (:mod:`attnid.theory.counts`), as the
measured Jacobian nullity of small random layers, and for real architectures, named on a log panel."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, pyplot
from attnid.theory.counts import identified_fraction

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INPUTS = {"theory": ("counts.csv", "nullity.csv")}
CAPTION = r"""**Figure 1 — identification by design (claims T3, T5).** Identified fraction of one
attention layer's parameters against the number of heads :math:`H`. Lines: closed forms
(``attnid.theory.counts.identified_fraction``) for multi-head attention (:math:`1 - 1/(2H)`), grouped-query
attention with 8 query heads per key/value head, RoPE, and both, at :math:`E = 8192`. Circles: the same
fraction measured as the numerical nullity of the Jacobian of small random layers (``attnid verify``).
Stars: real architectures (``architectures.yaml``, shipped with attnid); the right panel shows the
unidentified fraction on a log scale, with their names.
"""

N_EMBD = 8192  # wide enough that every power-of-two head count up to 128 divides it
HEADS = np.array([1, 2, 4, 8, 16, 32, 64, 128])
# label, the layer's kind, line style, colour
CLOSED_FORMS: list[tuple[str, dict[str, Any], str, str]] = [
    ("MHA: $1 - 1/(2H)$", {}, "-", "#0072B2"),
    ("GQA, 8 query heads per key/value head", {"gqa": 8}, "--", "#D55E00"),
    ("MHA + RoPE", {"rope": True}, ":", "#009E73"),
    ("GQA (8 per group) + RoPE", {"gqa": 8, "rope": True}, "-.", "#CC79A7"),
]
ARCHITECTURE_COLOR = "#E69F00"


def draw(sources: Sources) -> Drawing:
    """Figure 1 from counts.csv (``attnid counts``) and nullity.csv (``attnid verify``)."""
    counts = pd.read_csv(sources.file("theory", "counts.csv"))
    nullity = pd.read_csv(sources.file("theory", "nullity.csv"))
    fig, (ax, ax_log) = pyplot().subplots(1, 2, figsize=(3 * PANEL_WIDTH, 1.3 * PANEL_HEIGHT))
    _draw_closed_forms(ax, ax_log)
    _draw_measured(ax, ax_log, nullity)
    if "identified_fraction" in counts:
        _draw_architectures(ax, ax_log, counts)
    for axis in (ax, ax_log):
        axis.set_xscale("log", base=2)
        axis.set_xticks(HEADS, [str(h) for h in HEADS])
        axis.set_xlabel("number of heads $H$")
    ax.set_ylabel("identified fraction of attention parameters")
    ax.set_ylim(0.45, 1.01)
    ax.set_title("identified fraction vs heads")
    ax_log.set_yscale("log")
    ax_log.set_ylabel("unidentified fraction (log)")
    ax_log.set_title("unidentified fraction: real architectures")
    ax_log.set_xlim(0.8, 1400)  # room for the names
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    return Drawing(fig, {})


def _draw_closed_forms(ax: Axes, ax_log: Axes) -> None:
    for label, kind, linestyle, color in CLOSED_FORMS:
        values = np.array(
            [
                identified_fraction(
                    N_EMBD,
                    h,
                    n_kv_head=max(1, h // kind["gqa"]) if "gqa" in kind else None,
                    rope=kind.get("rope", False),
                )
                for h in HEADS
            ]
        )
        ax.plot(HEADS, values, linestyle=linestyle, color=color, label=f"closed form: {label}, E = {N_EMBD}")
        ax_log.plot(HEADS, 1.0 - values, linestyle=linestyle, color=color)


def _draw_measured(ax: Axes, ax_log: Axes, nullity: pd.DataFrame) -> None:
    """The identified fraction of random MHA layers measured as the nullity of their Jacobian."""
    attention = nullity[nullity["kind"] == "attention"].copy()
    if attention.empty:
        return
    attention["measured_fraction"] = 1.0 - attention["measured"] / attention["n_params"]
    for axis, points in (
        (ax, attention["measured_fraction"]),
        (ax_log, 1.0 - attention["measured_fraction"]),
    ):
        axis.scatter(
            attention["n_head"],
            points,
            marker="o",
            facecolors="none",
            edgecolors="black",
            s=30,
            zorder=3,
            label=f"measured: Jacobian nullity of random MHA layers, E = "
            f"{', '.join(str(e) for e in sorted(attention['n_embd'].unique()))}",
        )


def _draw_architectures(ax: Axes, ax_log: Axes, counts: pd.DataFrame) -> None:
    """The real architectures as stars, named in a column right of the curves on the log panel."""
    for axis, points in (
        (ax, counts["identified_fraction"]),
        (ax_log, 1.0 - counts["identified_fraction"]),
    ):
        axis.scatter(
            counts["n_head"],
            points,
            marker="*",
            color=ARCHITECTURE_COLOR,
            s=80,
            zorder=4,
            edgecolors="black",
            linewidths=0.4,
            label="real architectures (named on the right)",
        )
    # one label per distinct point: models with the same attention shape share it
    shared = counts.groupby(["n_head", "identified_fraction"], sort=True)["architecture"].apply(", ".join)
    # names in a column right of the curves, spread apart in log space, with leader lines
    # groupby's keys are typed Hashable: here each is (n_head, identified_fraction)
    by_shape = cast(list[tuple[tuple[int, float], str]], list(shared.items()))
    ordered = sorted(by_shape, key=lambda item: -(1.0 - item[0][1]))
    label_log_y: list[float] = []
    min_gap = 0.16
    for (_, fraction), _ in ordered:
        wanted = math.log10(1.0 - fraction)
        label_log_y.append(min(wanted, label_log_y[-1] - min_gap) if label_log_y else wanted)
    for ((n_head, fraction), names), log_y in zip(ordered, label_log_y):
        ax_log.annotate(
            names,
            xy=(n_head, 1.0 - fraction),
            xytext=(190, 10**log_y),
            textcoords="data",
            fontsize=6,
            color="#333333",
            va="center",
            arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.5},
        )
