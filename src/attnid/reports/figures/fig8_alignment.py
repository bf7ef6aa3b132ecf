"""Figure 8, two runs that differ only in their seed, aligned along the symmetry orbit (docs/design.md §18):
(a) the held-out loss above the chord along ``(1 - t) A + t B`` for the ``adamw`` pairs at the three
alignment levels; (b) the share of the attention factors' squared distance that the continuous classes
remove, against the number of heads, beside the paper's unidentified share per attention weight
``1/(2H)`` (T3, §4.5; :func:`attnid.theory.counts.multi_head_identified_share`); (c) per case, the
distance left after every class against the identified products' distance."""

from __future__ import annotations

import math

import pandas as pd

from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.style import (
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PREDICTION_COLOR,
    case_style,
    figure_legend,
    keep_texts_inside,
    pyplot,
)
from attnid.theory.counts import multi_head_identified_share

INPUTS = {"tables": ("alignment.csv", "alignment_line.csv")}
STAGE = "alignment"
CAPTION = r"""**Figure 8 — identified up to the orbit: two seeds aligned.** Pairs of runs that differ only in
their seed, B moved along its own symmetry orbit to the point nearest A (Frobenius distance, float64; every
move checked to keep B's log-probabilities within :math:`10^{-10}`, largest change
{{ value(exact) }}). (a) The held-out loss (nats per token) above the chord joining the end points along
:math:`(1-t)A + tB`, for the pairs of the ``{{ line_group }}`` runs: before alignment, after the head and MLP
permutations alone (the Git Re-Basin anchor) and after every class (largest barrier {{ value(barrier_none) }},
{{ value(barrier_discrete) }} and {{ value(barrier_all) }}). (b) The share of the attention factors' squared
distance that the per-head orthogonal moves on the output-value and query-key pairs remove, per pair of the
heads study against the number of heads :math:`H`, beside the share of each attention weight the function
leaves unidentified, :math:`1/(2H)` (T3, the paper's section 4.5). (c) The distance left after every class
against the distance between the identified products :math:`W_Q^\top W_K` and :math:`W_O W_V` over every
head, which no per-head move changes, one point per pair.
"""
LEVEL_LABELS = {"none": "before alignment", "discrete": "permutations (Re-Basin)", "all": "every class"}
LEVEL_COLORS = {"none": "#B91C1C", "discrete": "#D97706", "all": "#1D4ED8"}
LINE_GROUP = "adamw"


def _line_panel(ax, line: pd.DataFrame) -> tuple[str, dict[str, float]]:
    cases = line[line["study"] == "cases"]
    groups = list(dict.fromkeys(cases["group"])) or list(dict.fromkeys(line["group"]))
    group = LINE_GROUP if LINE_GROUP in groups else groups[0]
    mine = line[line["group"] == group]
    barriers = {}
    for level, label in LEVEL_LABELS.items():
        rows = mine[mine["level"] == level]
        for index, (_, pair) in enumerate(rows.groupby("pair", sort=False)):
            ax.plot(
                pair["t"],
                pair["above_chord"],
                color=LEVEL_COLORS[level],
                marker="o",
                markersize=3,
                label=label if index == 0 else None,
            )
        barriers[level] = float(rows["above_chord"].max()) if len(rows) else math.nan
    ax.axhline(0.0, color=PREDICTION_COLOR, linewidth=0.8)
    ax.set_xlabel("t")
    ax.set_ylabel("loss above the chord (nats)")
    ax.set_title(f"(a) {group}: loss along (1-t)A + tB")
    return group, barriers


def _share_panel(ax, rows: pd.DataFrame) -> None:
    continuous = rows[(rows["study"] == "heads") & rows["class"].isin(("ov", "qk", "ov_gl", "qk_gl"))]
    shares = continuous.groupby(["n_head", "pair"])["attention_share_removed"].sum().reset_index()
    ax.set_title("(b) continuous classes, heads study")
    ax.set_xlabel("heads H")
    ax.set_ylabel("share of the attention distance")
    if shares.empty:
        ax.text(0.5, 0.5, "no heads-study pairs", ha="center", va="center", transform=ax.transAxes)
        return
    removed = shares["attention_share_removed"]
    ax.scatter(shares["n_head"], removed, color="#1D4ED8", label="removed by ov, qk")
    heads = sorted(shares["n_head"].unique())
    unidentified = [1 - float(multi_head_identified_share(int(h))) / 4 for h in heads]
    ax.plot(heads, unidentified, color=PREDICTION_COLOR, linestyle="--", marker="s", label="1/(2H), T3")
    ax.set_xscale("log", base=2)
    ax.set_xticks(heads)
    ax.set_xticklabels([str(int(h)) for h in heads])


def _products_panel(ax, rows: pd.DataFrame) -> None:
    last = rows[(rows["study"] == "cases") & (rows["level"] == "all")]
    ax.set_title("(c) per case: what is left")
    ax.set_xlabel("identified products' distance")
    ax.set_ylabel("distance after every class")
    if last.empty:
        ax.text(0.5, 0.5, "no case pairs", ha="center", va="center", transform=ax.transAxes)
        return
    for case, mine in last.groupby("group", sort=False):
        style = case_style(str(case))
        ax.scatter(
            mine["product_distance"], mine["distance"], color=style["color"], marker=style["marker"],
            label=style["label"],
        )  # fmt: skip


def draw(sources: Sources) -> Drawing:
    """Figure 8 from alignment.csv and alignment_line.csv."""
    rows = pd.read_csv(sources.file("tables", "alignment.csv"))
    line = pd.read_csv(sources.file("tables", "alignment_line.csv"))
    fig, axes = pyplot().subplots(1, 3, figsize=(3 * PANEL_WIDTH, PANEL_HEIGHT))
    group, barriers = _line_panel(axes[0], line)
    _share_panel(axes[1], rows)
    _products_panel(axes[2], rows)
    figure_legend(fig, axes[0], ncol=4)
    keep_texts_inside(fig)
    pairs = rows.drop_duplicates(["study", "group", "pair"])
    return Drawing(
        fig,
        {
            "line_group": group,
            "barrier_none": barriers["none"],
            "barrier_discrete": barriers["discrete"],
            "barrier_all": barriers["all"],
            "exact": float(pairs["exact_max_abs_dlogp"].max()),
        },
    )
