"""A logged quantity across a case's seeds (mean line, min..max band), and a series at numerical round-off
(:mod:`attnid.reports.round_off`), which is never drawn as data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

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


def draw_floor_bands(ax: Axes, floors: dict[str, list[str]], steps: int = 1, order: int = 1) -> None:
    """One labelled band per precision, floor/10 .. :func:`round_off_ceiling`, naming the series at its
    round-off (on a log y axis, extended down to show the whole band); ``order``: see
    :func:`round_off_floor`."""
    from matplotlib.transforms import blended_transform_factory

    for dtype, labels in floors.items():
        if not labels:
            continue
        floor, ceiling = round_off_floor(dtype, order), round_off_ceiling(dtype, steps, order)
        ax.set_yscale("log")
        bottom, top = ax.get_ylim()
        ax.set_ylim(min(bottom, floor / ROUND_OFF_MARGIN / 3), max(top, ceiling * 10))
        ax.axhspan(floor / ROUND_OFF_MARGIN, ceiling, color=FLOOR_COLOR, alpha=0.35, linewidth=0, zorder=0)
        summed = f", summed over {steps:,} steps" if steps > 1 else ""
        squared = "" if order == 1 else f" to order {order}"
        ax.text(
            0.02,
            ceiling,
            f"{dtype} round-off{squared}{summed}: {', '.join(dict.fromkeys(labels))}",
            transform=blended_transform_factory(ax.transAxes, ax.transData),
            fontsize=6,
            color="#555555",
            va="bottom",
            ha="left",
        )
