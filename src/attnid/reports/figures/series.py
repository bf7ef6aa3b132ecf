"""A logged quantity across a case's seeds (mean line, min..max band), and a series at numerical round-off
(:mod:`attnid.reports.round_off`), which is never drawn as data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from attnid.reports.figures.style import BAND_ALPHA, FLOOR_COLOR
from attnid.reports.round_off import (
    ROUND_OFF_MARGIN,
    coarsest_dtype,
    round_off_ceiling,
    round_off_floor,
    run_dtype,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

FLOOR_MARKER = "v"  # a series on its round-off floor: its true values are at or below the line
FLOOR_GID = "round-off floor"  # the gid of every artist drawn on a floor (what the figure tests look for)


def seed_band(runs: list[tuple[dict, pd.DataFrame]], column: str, positive: bool = False) -> pd.DataFrame:
    """Mean, min and max of ``column`` over seeds at every logged step (NaN rows dropped).

    With ``positive`` (for log axes) non-positive values are dropped too.
    """
    parts = []
    for seed_index, (_, metrics) in enumerate(runs):
        if column not in metrics:
            continue
        values = pd.to_numeric(metrics[column], errors="coerce").replace([np.inf, -np.inf], np.nan)
        part = pd.DataFrame({"step": metrics["step"], "value": values, "seed": seed_index}).dropna()
        if positive:
            part = part[part["value"] > 0]
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["step", "mean", "min", "max"])
    stacked = pd.concat(parts)
    band = stacked.groupby("step")["value"].agg(["mean", "min", "max"]).reset_index()
    return band


def plot_band(ax: Axes, band: pd.DataFrame, color: str, label: str | None, **line_kwargs: Any) -> None:
    """The mean over seeds as a line, the seeds' min..max as a band around it."""
    if band.empty:
        return
    ax.plot(band["step"], band["mean"], color=color, label=label, **line_kwargs)
    ax.fill_between(band["step"], band["min"], band["max"], color=color, alpha=BAND_ALPHA, linewidth=0)


def runs_dtype(runs: list[tuple[dict, pd.DataFrame]]) -> str:
    """The coarsest training precision of a case's runs (run.json ``dtype``)."""
    return coarsest_dtype([run_dtype(info) for info, _ in runs])


def draw_floor_band(ax: Axes, dtype: str, text: str, steps: int = 1, order: int = 1) -> None:
    """The grey band of ``dtype``'s round-off, floor/10 .. :func:`round_off_ceiling`, with ``text`` on its top
    edge (on a log y axis, extended down to show the whole band); ``order``: see :func:`round_off_floor`."""
    # lazy: matplotlib, which reading the figure registry (the workflow, --help) does not load
    from matplotlib.transforms import blended_transform_factory

    floor, ceiling = round_off_floor(dtype, order), round_off_ceiling(dtype, steps, order)
    ax.set_yscale("log")
    bottom, top = ax.get_ylim()
    ax.set_ylim(min(bottom, floor / ROUND_OFF_MARGIN / 3), max(top, ceiling * 10))
    ax.axhspan(floor / ROUND_OFF_MARGIN, ceiling, color=FLOOR_COLOR, alpha=0.35, linewidth=0, zorder=0)
    ax.text(
        0.02,
        ceiling,
        text,
        transform=blended_transform_factory(ax.transAxes, ax.transData),
        fontsize=6,
        color="#555555",
        va="bottom",
        ha="left",
    )


def round_off_name(dtype: str, steps: int = 1, order: int = 1) -> str:
    """``float64 round-off``, ``, summed over N steps`` for a sum of per-step terms, `` to order 2``."""
    summed = f", summed over {steps:,} steps" if steps > 1 else ""
    squared = "" if order == 1 else f" to order {order}"
    return f"{dtype} round-off{squared}{summed}"


def draw_floor_bands(ax: Axes, floors: dict[str, list[str]], steps: int = 1, order: int = 1) -> None:
    """One labelled band per precision naming the series at its round-off (``floors``: {dtype: labels})."""
    for dtype, labels in floors.items():
        if labels:
            text = f"{round_off_name(dtype, steps, order)}: {', '.join(dict.fromkeys(labels))}"
            draw_floor_band(ax, dtype, text, steps, order)


class Floors:
    """The series of one panel that are numerical round-off (:func:`attnid.reports.round_off.at_round_off`),
    drawn on their floor: clipped from below at the bottom of the precision's band, with
    :data:`FLOOR_MARKER` (at or below) at the last point, and their true level written on the band, e.g.
    ``SGD: ρ ≤ 3e-24``. Never drawn as data, never fitted."""

    def __init__(self, ax: Axes, order: int = 1) -> None:
        self.ax, self.order = ax, order
        self.levels: dict[str, dict[str, float]] = {}  # dtype -> {name: largest |value|}
        self.steps: dict[str, int] = {}  # dtype -> steps summed (the band's width)

    def draw(self, x: ArrayLike, y: ArrayLike, dtype: str, name: str, steps: int = 1, **line: Any) -> None:
        """Draw ``y`` against ``x`` on ``dtype``'s floor in the style ``line`` (color, linestyle, label,
        marker: a marker at every point); ``name`` is how the band's text names the series."""
        values = pd.to_numeric(pd.Series(np.asarray(y, dtype=float)), errors="coerce").abs()
        values = values.replace([np.inf, -np.inf], np.nan)
        finite = values.notna().to_numpy()
        if not finite.any():
            return
        bottom = round_off_floor(dtype, self.order) / ROUND_OFF_MARGIN
        xs, clipped = np.asarray(x, dtype=float)[finite], np.maximum(values[finite].to_numpy(), bottom)
        every_point = line.pop("marker", None) is not None
        drawn = self.ax.plot(xs, clipped, marker=FLOOR_MARKER if every_point else None, **line)[0]
        drawn.set_gid(FLOOR_GID)
        if not every_point:
            self.ax.plot(xs[-1:], clipped[-1:], FLOOR_MARKER, color=drawn.get_color(), gid=FLOOR_GID)
        level = float(values.max())
        names = self.levels.setdefault(dtype, {})
        names[name] = max(level, names.get(name, 0.0))
        self.steps[dtype] = max(self.steps.get(dtype, 1), int(steps))

    def finish(self) -> None:
        """Each precision's band, its text naming every series on it with its true level."""
        for dtype, names in self.levels.items():
            steps = self.steps[dtype]
            lines = [f"{name} ≤ {level:.1g}" for name, level in names.items()]
            text = "\n".join([*lines, round_off_name(dtype, steps, self.order)])
            draw_floor_band(self.ax, dtype, text, steps, self.order)
