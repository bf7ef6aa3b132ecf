"""The one style of every figure: matplotlib rc settings, colours, panel sizes, each case's look, the legend
below the panels, and writing a figure as PNG and PDF. Only the Agg backend is used (no display needed)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import numpy as np

from attnid.common.files import atomic_path
from attnid.training.cases import CASES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

P = ParamSpec("P")  # a styled drawing's parameters and result
R = TypeVar("R")

STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4,
    # TrueType (Type 42) fonts in PDF/PS: no Type 3 fonts in the appendix PDF
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}
PREDICTION_COLOR = "#777777"  # black is a case colour
BAND_ALPHA = 0.2
FLOOR_COLOR = "#BBBBBB"
PANEL_WIDTH = 3.6  # inches per panel
PANEL_HEIGHT = 2.9


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (imported on first use: the workflow reads the figure registry
    without matplotlib)."""
    # lazy: matplotlib, which reading the figure registry (the workflow, --help) does not load
    import matplotlib

    matplotlib.use("Agg", force=True)
    # lazy: pyplot, imported once the backend is Agg (a display's backend would need one)
    import matplotlib.pyplot as plt

    return plt


def styled(draw: Callable[P, R]) -> Callable[P, R]:
    """Run a drawing (or saving) function under :data:`STYLE` in matplotlib's ``rc_context``: every figure
    gets the one style, and the caller's own matplotlib settings are left as they were."""

    @functools.wraps(draw)
    def in_style(*args: P.args, **kwargs: P.kwargs) -> R:
        with pyplot().rc_context(STYLE):
            return draw(*args, **kwargs)

    return in_style


def case_style(case: str) -> dict:
    """color, label, linestyle and marker of a case (from :data:`attnid.training.cases.CASES`); gray
    for unknown ones."""
    if case in CASES:
        return CASES[case].style()
    return {"color": "gray", "label": str(case), "linestyle": "-", "marker": "o"}


@styled
def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.pdf`` atomically; returns both paths."""
    paths = []
    for suffix in ("png", "pdf"):
        path = Path(out_dir) / f"{name}.{suffix}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=suffix)
        paths.append(path)
    return paths


def figure_legend(fig: Figure, ax: Axes, ncol: int = 6, own_legend: Sequence[Axes] = ()) -> None:
    """One legend for the whole figure, below the panels, without repeated labels (``ax``'s first,
    then any other panel's: a series drawn as a round-off band is absent from its panel), but for the panels
    of ``own_legend``, which have a legend of their own. A figure laid out by a layout engine of its own
    (constrained, for panels of different widths) keeps it."""
    unique: dict[str, Any] = {}  # label -> handle
    for axis in [ax] + [other for other in fig.axes if other is not ax and other not in own_legend]:
        handles, labels = axis.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            unique.setdefault(label, handle)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    else:
        fig.draw_without_rendering()  # the engine lays the panels out at a draw
    if not unique:
        return
    # the panels laid out first, then the legend hung below the figure: its top edge at the figure's
    # bottom, so a legend of several rows never covers the x labels (savefig's tight box takes it in)
    fig.legend(
        unique.values(),
        unique.keys(),
        loc="upper center",
        ncol=min(len(unique), ncol),
        bbox_to_anchor=(0.5, 0.0),
    )


# Where a label may sit around its point, in order of preference: (offset in points, ha, va).
AROUND = (
    ((0, 5), "center", "bottom"),
    ((0, -5), "center", "top"),
    ((6, 0), "left", "center"),
    ((-6, 0), "right", "center"),
    ((5, 5), "left", "bottom"),
    ((-5, 5), "right", "bottom"),
    ((5, -5), "left", "top"),
    ((-5, -5), "right", "top"),
    ((0, 12), "center", "bottom"),
    ((0, -12), "center", "top"),
)


@dataclass(frozen=True)
class PointLabel:
    """A short label of one data point, e.g. ``H=8`` or ``slope 2.00``."""

    text: str
    xy: tuple[float, float]
    color: str
    fontsize: float = 6


def marker_boxes(ax: Axes, renderer: Any) -> list[Bbox]:
    """The display box of every marker drawn in ``ax`` (lines with a marker, scatter points)."""
    boxes: list[Bbox] = []
    to_pixels = ax.figure.dpi / 72.0
    for line in ax.get_lines():
        if line.get_marker() in (None, "None", "", " ") or not line.get_visible():
            continue
        half = line.get_markersize() * to_pixels / 2 + 1
        points = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        boxes += _boxes_around(points, half)
    for collection in ax.collections:
        offsets = np.asarray(collection.get_offsets(), dtype=float)
        sizes = collection.get_sizes() if hasattr(collection, "get_sizes") else []
        if len(offsets) == 0 or len(sizes) == 0:
            continue
        half = float(np.sqrt(max(sizes))) * to_pixels / 2 + 1
        points = collection.get_offset_transform().transform(offsets)
        boxes += _boxes_around(points, half)
    return boxes


def _boxes_around(points: np.ndarray, half: float) -> list[Bbox]:
    # lazy: matplotlib, which reading the figure registry (the workflow, --help) does not load
    from matplotlib.transforms import Bbox

    finite = points[np.isfinite(points).all(axis=1)]
    return [Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in finite]


def line_points(ax: Axes, step: float = 2.0) -> np.ndarray:
    """Points every ``step`` pixels along every drawn line of ``ax`` (lines and error bars), on the canvas."""
    # lazy: matplotlib, which reading the figure registry (the workflow, --help) does not load
    from matplotlib.collections import LineCollection

    paths = [
        line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        for line in ax.get_lines()
        if line.get_visible() and line.get_linestyle() not in ("None", "", " ")
    ]
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            paths += [collection.get_transform().transform(segment) for segment in collection.get_segments()]
    points = [np.zeros((0, 2))]
    for path in paths:
        path = path[np.isfinite(path).all(axis=1)]
        for start, end in zip(path[:-1], path[1:]):
            count = max(2, int(np.hypot(*(end - start)) / step) + 1)
            points.append(start + np.linspace(0.0, 1.0, count)[:, None] * (end - start))
    return np.concatenate(points)


def place_labels(ax: Axes, labels: list[PointLabel], around: tuple = AROUND) -> None:
    """Annotate each point with its label at the first place of ``around`` where the label stays inside the
    axes and overlaps no marker, no other label, not the panel's legend and not the title, preferring a
    place that crosses no line either (the first place when none is free). Call it once the axes' limits and
    the figure's layout are final."""
    renderer = cast(Any, ax.figure).canvas.get_renderer()  # Agg, the only backend used
    inside = ax.get_window_extent(renderer)
    taken = marker_boxes(ax, renderer) + [text.get_window_extent(renderer) for text in ax.texts]
    legend = ax.get_legend()
    if legend is not None:  # a panel's own legend, inside it
        taken.append(legend.get_window_extent(renderer))
    if ax.get_title():
        taken.append(ax.title.get_window_extent(renderer))
    lines = line_points(ax)
    for label in labels:
        places = []  # (crosses a line, order) of every free place
        for order, (offset, ha, va) in enumerate(around):
            note = _annotate(ax, label, offset, ha, va)
            box = note.get_window_extent(renderer)
            note.remove()
            within = inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)
            if within and not any(box.overlaps(other) for other in taken):
                crossed = bool(
                    (
                        (lines[:, 0] >= box.x0)
                        & (lines[:, 0] <= box.x1)
                        & (lines[:, 1] >= box.y0)
                        & (lines[:, 1] <= box.y1)
                    ).any()
                )
                places.append((crossed, order))
        _, best = min(places, default=(False, 0))
        offset, ha, va = around[best]
        taken.append(_annotate(ax, label, offset, ha, va).get_window_extent(renderer))


def _annotate(ax: Axes, label: PointLabel, offset: tuple[float, float], ha: str, va: str) -> Any:
    return ax.annotate(
        label.text,
        label.xy,
        xytext=offset,
        textcoords="offset points",
        ha=ha,
        va=va,
        fontsize=label.fontsize,
        color=label.color,
    )


def keep_texts_inside(fig: Figure, tries: int = 12) -> None:
    """Raise the top of every panel whose texts (e.g. a round-off floor's, written above its band) reach
    past the top of the axes, until they fit: a text never runs into the title. Call it once the figure's
    layout is final."""
    renderer = cast(Any, fig).canvas.get_renderer()
    for ax in fig.axes:
        for _ in range(tries):
            top = ax.get_window_extent(renderer).y1
            if all(text.get_window_extent(renderer).y1 <= top for text in ax.texts):
                break
            low, high = ax.get_ylim()
            ax.set_ylim(low, high * 10 if ax.get_yscale() == "log" else high + 0.1 * (high - low))
