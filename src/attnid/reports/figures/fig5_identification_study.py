"""Figure 5, does identification buy anything? (beyond the paper): the identification studies' final val loss
and measured ρ against the closed-form identified fraction (``attnid studies``'s tables)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.plan.studies import STUDIES
from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.style import (
    BAND_ALPHA,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PREDICTION_COLOR,
    PointLabel,
    figure_legend,
    place_labels,
    pyplot,
    styled,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INPUTS = {"tables": tuple(f"{study}.csv" for study in STUDIES)}
STAGE = "studies"
CAPTION = r"""**Figure 5 — does identification buy anything? (beyond the paper).** AdamW runs of the
same model, data and token budget per point, differing only in the attention layer. Left: the
closed-form identified fraction :math:`f_{id}` of an attention layer's parameters; for multi-head
attention :math:`1 - 1/(2H)` (line), with every trained shape at its own closed form (GQA and RoPE are
more identified at the same :math:`H`; the matched single head of the paper's Section 4.10 is wider,
:math:`E_0 = E\sqrt{2 - 1/H_{ref}}`, but as identified as any single head). Middle: final validation
loss against :math:`f_{id}`; the head sweep is one series (band: :math:`\pm` the seeds' sample sd, a
spread, not an uncertainty), the matched single head and the variants are labelled points with such
bars. Right: the measured unidentified share :math:`\rho` of AdamW's steps on each architecture's own
orbit (filled: query-key, hollow: output-value), with :math:`1 - f_{id}`, the share of a step that is
isotropic in the attention parameters. The Spearman correlations between :math:`f_{id}` and loss, with
permutation p-values and bootstrap CIs, are in the correlation table.
"""

VARIANT_COLORS = ("#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999")
HEADS_COLOR, MATCHED_COLOR = "#0072B2", "#000000"


def draw(sources: Sources) -> Drawing:
    """Figure 5 from heads.csv and variants.csv (``attnid studies``), whichever the build has."""
    frames = {
        study: pd.read_csv(sources.file("tables", f"{study}.csv"))
        for study in STUDIES
        if sources.has("tables", f"{study}.csv")
    }
    if not frames:
        raise UserError(
            f"neither {' nor '.join(f'{study}.csv' for study in STUDIES)} in {sources.tables}; "
            f"run 'attnid studies' first"
        )
    return Drawing(draw_identification_study(frames.get("heads"), frames.get("variants")), {})


def _study_series(heads: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The head sweep (the points at the most common embedding, by identified fraction) and the
    labelled extra points (the matched single head, at its own embedding)."""

    # lazy: scipy (reports.studies' statistics), which reading the figure registry (each workflow parse) skips
    from attnid.reports.studies import head_sweep

    if heads is None or heads.empty:
        return pd.DataFrame(), pd.DataFrame()
    sweep = head_sweep(heads)
    return heads[sweep].sort_values("identified_fraction"), heads[~sweep]


@styled
def draw_identification_study(heads: pd.DataFrame | None, variants: pd.DataFrame | None) -> Figure:
    """Figure 5 from the study tables: (a) the closed-form identified fraction ``1 - 1/(2H)`` of MHA
    against ``H`` (T3) with every trained point at its own closed form; (b) final val loss and (c) mean ρ
    against the identified fraction: the head sweep as one series (band: ± the seeds' sample sd, a spread),
    the matched single head and the variants as labelled points with bars of the same spread. (c) also
    draws ``ρ = 1 - f``,
    the unidentified share of a step that is isotropic in the attention parameters."""
    series, extras = _study_series(heads)
    labelled = [(row, MATCHED_COLOR, "s") for _, row in extras.iterrows()]
    if variants is not None:
        labelled += [
            (row, VARIANT_COLORS[i % len(VARIANT_COLORS)], "D")
            for i, (_, row) in enumerate(variants.iterrows())
        ]
    fig, axes = pyplot().subplots(1, 3, figsize=(3 * PANEL_WIDTH, 1.1 * PANEL_HEIGHT))
    _draw_fraction_panel(axes[0], series, labelled)
    panels = [
        (axes[1], "final_val_loss", "final val loss", False),
        (axes[2], "rho_qk_mean", r"mean $\rho$", True),
    ]
    head_labels: dict[Axes, list[PointLabel]] = {}
    for ax, column, ylabel, log_y in panels:
        if not series.empty:
            head_labels[ax] = _draw_study_series(
                ax, series, column, HEADS_COLOR, "head sweep $H$ (at $E$, $D = E/H$)"
            )
            if log_y:
                _draw_study_series(
                    ax,
                    series,
                    "rho_ov_mean",
                    HEADS_COLOR,
                    r"head sweep, $\rho_{OV}$ (right)",
                    linestyle="--",
                    hollow=True,
                )
        for row, color, marker in labelled:
            _draw_point(ax, row, column, color, marker, label=_point_label(row))
            if log_y:
                _draw_point(ax, row, "rho_ov_mean", color, marker, hollow=True)
        ax.set_xlabel(r"identified fraction $f_\mathrm{id}$ (closed form)")
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
    fractions = np.linspace(0.45, 1.0, 50)
    axes[2].plot(
        fractions,
        1.0 - fractions,
        ":",
        color=PREDICTION_COLOR,
        linewidth=1.0,
        label=r"$1 - f_\mathrm{id}$ (isotropic step)",
    )
    axes[1].set_title("val loss vs identified fraction")
    axes[2].set_title(r"$\rho$ vs identified fraction (filled: QK, hollow: OV)")
    figure_legend(fig, axes[2], ncol=4)
    for ax, labels in head_labels.items():  # once the layout is final: the labels dodge what is drawn
        place_labels(ax, labels)
    return fig


def spread_positions(values: list[float], min_gap: float) -> list[float]:
    """Positions for labels of sorted ``values``: in the same order, at least ``min_gap`` apart, as close to
    the values as that allows (pushed apart upwards, then the block re-centred on the values' mean)."""
    positions: list[float] = []
    for value in values:
        positions.append(value if not positions else max(value, positions[-1] + min_gap))
    shift = (sum(values) - sum(positions)) / len(values) if values else 0.0
    return [position + shift for position in positions]


def _point_label(row) -> str:
    return f"{row['point']}: {row['label']}" + (f", E={int(row['n_embd'])}" if "n_embd" in row else "")


def _draw_fraction_panel(ax: Axes, series: pd.DataFrame, labelled: list) -> None:
    trained = [int(h) for h in series.get("n_head", [])] + [int(row["n_head"]) for row, _, _ in labelled]
    heads = np.geomspace(1, max([2] + trained), 60)
    ax.plot(heads, 1.0 - 1.0 / (2.0 * heads), color=PREDICTION_COLOR, label=r"MHA: $1 - 1/(2H)$")
    if not series.empty:
        ax.plot(series["n_head"], series["identified_fraction"], "o", color=HEADS_COLOR)
    for row, color, marker in labelled:
        ax.plot(row["n_head"], row["identified_fraction"], marker, color=color, markerfacecolor="none")
    ax.set_xscale("log", base=2)
    ax.autoscale_view()
    low, high = ax.get_ylim()
    # the labels of points at one head count (the variants all sit at the model's H) stacked in a column
    # right of them, at least a label's height apart, each tied to its point by a thin line
    by_heads: dict[int, list] = {}
    for row, color, _ in labelled:
        by_heads.setdefault(int(row["n_head"]), []).append(
            (float(row["identified_fraction"]), row["point"], color)
        )
    for n_head, points in by_heads.items():
        points.sort()
        label_ys = spread_positions([y for y, _, _ in points], min_gap=0.045 * (high - low))
        for (y, name, color), label_y in zip(points, label_ys):
            ax.annotate(
                name,
                (n_head, y),
                xytext=(14, label_y),
                textcoords=("offset points", "data"),
                fontsize=6,
                color=color,
                va="center",
                arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.5, "shrinkA": 0, "shrinkB": 3},
            )
    ax.set_xlabel("query heads $H$")
    ax.set_ylabel(r"identified fraction $f_\mathrm{id}$")
    ax.set_title("closed form, every trained shape")


def _draw_study_series(
    ax: Axes,
    series: pd.DataFrame,
    column: str,
    color: str,
    label: str,
    linestyle: str = "-",
    hollow: bool = False,
) -> list[PointLabel]:
    """The head sweep's ``column`` against the identified fraction (band: ± the seeds' sd); the ``H=...``
    labels of its points (none for a hollow series: the filled one names them)."""
    x = series["identified_fraction"].to_numpy(dtype=float)
    mean = series[f"{column}_mean"].to_numpy(dtype=float)
    sd = np.nan_to_num(series[f"{column}_sd"].to_numpy(dtype=float))
    ax.plot(
        x,
        mean,
        marker="o",
        linestyle=linestyle,
        color=color,
        label=label,
        markerfacecolor="none" if hollow else color,
    )
    ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=BAND_ALPHA, linewidth=0)
    if hollow:
        return []
    return [
        PointLabel(f"H={int(name)}", (float(xi), float(yi)), color)
        for xi, yi, name in zip(x, mean, series["n_head"])
        if np.isfinite(yi)
    ]


def _draw_point(
    ax: Axes, row, column: str, color: str, marker: str, label: str | None = None, hollow: bool = False
) -> None:
    mean, sd = float(row[f"{column}_mean"]), float(row[f"{column}_sd"])
    if not np.isfinite(mean):
        return
    ax.errorbar(
        [row["identified_fraction"]],
        [mean],
        yerr=[[sd] if np.isfinite(sd) else [0.0]] * 2,
        fmt=marker,
        color=color,
        markerfacecolor="none" if hollow else color,
        capsize=2,
        label=label,
        elinewidth=0.8,
    )
