"""The one style of every figure: matplotlib rc settings, colours, panel sizes, each case's look, the legend
below the panels, and writing a figure as PNG and PDF. Only the Agg backend is used (no display needed)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from attnid.common.files import atomic_path
from attnid.training.cases import CASES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
    import matplotlib

    matplotlib.use("Agg", force=True)
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


def figure_legend(fig: Figure, ax: Axes, ncol: int = 6) -> None:
    """One legend for the whole figure, below the panels, without repeated labels (``ax``'s first,
    then any other panel's: a series drawn as a round-off band is absent from its panel)."""
    unique: dict[str, Any] = {}  # label -> handle
    for axis in [ax] + [other for other in fig.axes if other is not ax]:
        handles, labels = axis.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            unique.setdefault(label, handle)
    if not unique:
        fig.tight_layout()
        return
    # lay the panels out first, then hang the legend below the figure: its top edge at the figure's
    # bottom, so a legend of several rows never covers the x labels (savefig's tight box takes it in)
    fig.tight_layout()
    fig.legend(
        unique.values(),
        unique.keys(),
        loc="upper center",
        ncol=min(len(unique), ncol),
        bbox_to_anchor=(0.5, 0.0),
    )
