"""Figure 6 drawn from the interventions tables (attnid.reports.figures.fig6_interventions): every comparison
the table has, its seeds' differences as dots, the t-interval, the verdict the rule wrote; the 2 x 2 when
the table has its interaction; the caption from the numbers. Built on synthetic runs gathered by the real
interventions table, for the default config's arms (8 seeds), the smoke config's (2 seeds: n too small)
and a paper-sized family."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from figure_checks import invisible_legend_entries, legend_entries, overlapping_labels, visible_labels
from synthetic_runs import (
    DEFAULT_EFFECTS,
    PAPER_EFFECTS,
    SMOKE_EFFECTS,
    final_losses,
    write_intervention_runs,
)

from attnid.common.errors import UserError
from attnid.plan.interventions import INTERACTION
from attnid.reports import figures
from attnid.reports.figures import fig6_interventions, style
from attnid.reports.figures.inputs import Sources
from attnid.reports.interventions_table import comparisons_table, write_interventions_table
from attnid.reports.statistics import N_TOO_SMALL
from attnid.training.cases import CASES

MARGIN = 0.01
# Per arm, its final loss minus adamw's on each seed (adamw's own: 2.3 + 0.02 seed): effects that the
# default's 8 seeds decide one way or the other.
DEFAULT_FAMILY = [*DEFAULT_EFFECTS, INTERACTION]


def build(tmp_path, effects, n_seeds, family, identity=True) -> Sources:
    """The runs of ``effects``' arms and adamw, gathered by attnid interventions-table; Figure 6's sources."""
    arm_dirs, identity_dirs = write_intervention_runs(
        tmp_path / "runs", final_losses(effects, n_seeds), identity=identity
    )
    tables = tmp_path / "tables"
    write_interventions_table(None, tables, runs=arm_dirs, equivalence_margin=MARGIN, family=family)
    return Sources(tables=tables, intervention_runs=arm_dirs, identity_runs=identity_dirs)


def paper_sources(tmp_path) -> Sources:
    """A paper-sized family (16 seeds, 11 comparisons): every arm, the moments pair and a comparison of
    another baseline added to the seeds table as a later build may add one (SGD with and without the gauge),
    the table recomputed from the seeds table alone."""
    family = [*PAPER_EFFECTS, "adamw_rebalance_first_moment-adamw_rebalance", INTERACTION]
    sources = build(tmp_path, PAPER_EFFECTS, 16, family)
    seeds = pd.read_csv(sources.tables / "interventions_seeds.csv")
    sgd = [3.1 + 0.03 * seed for seed in range(16)]
    extra = pd.DataFrame(
        {
            "comparison": "sgd_gauge_fixed-sgd",
            "arm": "sgd_gauge_fixed",
            "baseline": "sgd",
            "seed": range(16),
            "arm_value": [v - 0.05 + 0.01 * math.sin(s) for s, v in enumerate(sgd)],
            "baseline_value": sgd,
        }
    )
    extra["difference"] = extra["arm_value"] - extra["baseline_value"]
    seeds = pd.concat([seeds, extra], ignore_index=True)
    seeds.to_csv(sources.tables / "interventions_seeds.csv", index=False)
    comparisons_table(seeds, 0.05, MARGIN, [*family, "sgd_gauge_fixed-sgd"]).to_csv(
        sources.tables / "interventions.csv", index=False
    )
    return sources


def _panel(fig, title: str):
    return next(ax for ax in fig.axes if ax.get_title().startswith(title))


def _verdict_axis(fig, differences):
    """The twin axis whose tick labels are the verdicts (it shares the differences panel's y)."""
    return next(ax for ax in fig.axes if ax is not differences and ax.bbox.bounds == differences.bbox.bounds)


def _tick_labels(axis) -> list[str]:
    return [tick.get_text() for tick in axis.get_ticklabels()]


def _check_drawn(fig) -> None:
    assert legend_entries(fig)
    assert not invisible_legend_entries(fig)
    assert not overlapping_labels(fig)


def _check_one_line_style_per_series(fig) -> None:
    """A line style means one thing in every panel: a labelled series' case style (as in Figures 2-4); lines
    without a label (the zero line, an interval's bar) are solid."""
    styles: dict[str, set[str]] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            label = line.get_label()
            if label.startswith("_"):
                assert line.get_linestyle() in ("-", "None"), (ax.get_title(), line.get_linestyle())
            else:
                styles.setdefault(label, set()).add(line.get_linestyle())
    by_label = {case.label: case.linestyle for case in CASES.values()}
    for label, found in styles.items():
        case_label = label.split(" (")[0]
        assert found == {by_label[case_label]}, (label, found)


@pytest.mark.slow  # the layout on the renderer, ~20 s on a loaded machine
def test_the_default_family_each_comparison_its_seeds_interval_and_verdict(tmp_path):
    sources = build(tmp_path, DEFAULT_EFFECTS, 8, DEFAULT_FAMILY)
    table = pd.read_csv(sources.tables / "interventions.csv")
    seeds = pd.read_csv(sources.tables / "interventions_seeds.csv")
    assert dict(zip(table["comparison"], table["verdict"])) == {
        "adamw_from_gauge_point": "better",
        "adamw_gauge_fixed": "better",
        "adamw_gauge_fixed_at_init": "equivalent",
        "adamw_lr2x": "inconclusive",
        INTERACTION: "equivalent",
    }
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    # one row per comparison, in the table's order; the lr arm says its ratio
    assert _tick_labels(differences.yaxis) == [
        "adamw_from_gauge_point",
        "adamw_lr2x (lr x2)",
        "adamw_gauge_fixed",
        "adamw_gauge_fixed_at_init",
        fig6_interventions.INTERACTION_LABEL,
    ]
    assert table["comparison"].tolist() == [
        "adamw_from_gauge_point",
        "adamw_lr2x",
        "adamw_gauge_fixed",
        "adamw_gauge_fixed_at_init",
        INTERACTION,
    ]
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    for row, shown in zip(table.itertuples(), verdicts):
        assert shown.startswith(row.verdict) and f"Holm p {row.p_holm:.2g}" in shown
    # the dots are the seeds table's differences, the bars the table's t-intervals
    (dots,) = [c for c in differences.collections if c.get_label() == "one seed's difference"]
    np.testing.assert_allclose(np.sort(dots.get_offsets()[:, 0]), np.sort(seeds["difference"]), rtol=1e-12)
    for position, row in enumerate(table.itertuples()):
        rows = dots.get_offsets()[np.abs(dots.get_offsets()[:, 1] - position) < 0.5]
        expected = seeds.loc[seeds["comparison"] == row.comparison, "difference"]
        np.testing.assert_allclose(np.sort(rows[:, 0]), np.sort(expected), rtol=1e-12)
    bars = [c for c in differences.containers]
    assert [bar.lines[0].get_xdata()[0] for bar in bars] == pytest.approx(table["delta_mean"].tolist())
    for bar, row in zip(bars, table.itertuples()):
        (segment,) = bar.lines[2][0].get_segments()
        assert segment[:, 0] == pytest.approx([row.ci_low, row.ci_high])
    assert {"one seed's difference", "mean, 95 % t-interval", "equivalence margin ±0.01"} <= visible_labels(
        differences
    )
    # the 2 x 2: each cell's mean over the seeds, the effect of freezing in each row, the interaction
    grid = _panel(fig, "2 x 2")
    cells = [" ".join(text.get_text().split()) for text in grid.texts]
    losses = final_losses(DEFAULT_EFFECTS, 8)
    mean = {arm: np.mean(values) for arm, values in losses.items()}
    at_init = mean["adamw_gauge_fixed_at_init"] - mean["adamw"]  # the effect of freezing from each start
    at_gauge = mean["adamw_gauge_fixed"] - mean["adamw_from_gauge_point"]
    assert sorted(cells) == sorted(
        [
            f"adamw {mean['adamw']:.4f}",
            f"adamw from gauge point {mean['adamw_from_gauge_point']:.4f}",
            f"adamw gauge fixed at init {mean['adamw_gauge_fixed_at_init']:.4f} freezing {at_init:+.2g}",
            f"adamw gauge fixed {mean['adamw_gauge_fixed']:.4f} freezing {at_gauge:+.2g}",
        ]
    )
    interaction = table.set_index("comparison").loc[INTERACTION]
    assert f"interaction {interaction.delta_mean:+.2g}" in grid.get_xlabel()
    assert "equivalent" in grid.get_xlabel()
    # the float64 identity run on its floor (the default has no float32 projected arm)
    for title in ("unidentified share", "first-order drift"):
        assert "AdamW" in visible_labels(_panel(fig, title))
        assert "AdamW, projected (float64 identity run)" in visible_labels(_panel(fig, title))
    caption = figures.fill_caption(figures.registry()["fig6"].caption_template, drawing.numbers)
    flat = " ".join(caption.split())
    value, number = figures.caption_value, figures.caption_number
    for row in table.itertuples():
        shown = (
            f"``{row.comparison}`` {value(row.delta_mean)} [{value(row.ci_low)}, {value(row.ci_high)}], "
            f"n = 8, {row.verdict} (Holm p {number(row.p_holm)}), detectable {row.detectable_effect:.2g}"
        )
        assert shown in flat, shown
    assert "Holm over the 5 comparisons" in flat and "at least 8 seed pairs" in flat
    assert "n too small" not in flat and "{{" not in caption
    assert f"the interaction, their difference, is {value(interaction.delta_mean)}" in flat
    style.pyplot().close(fig)


@pytest.mark.slow
@pytest.mark.parametrize("arms", ["smoke", "default"])
def test_two_seeds_say_n_too_small_and_decide_nothing(tmp_path, arms):
    """The smoke config's 2 seeds: every row is drawn, grey, its verdict "n too small", the caption says
    that nothing is decided; the t-interval of 2 seeds (t = 12.7) runs off the side, with an arrow."""
    effects = SMOKE_EFFECTS if arms == "smoke" else DEFAULT_EFFECTS
    family = (
        [*SMOKE_EFFECTS, "adamw_rebalance_first_moment-adamw_rebalance"]
        if arms == "smoke"
        else DEFAULT_FAMILY
    )
    sources = build(tmp_path, effects, 2, family, identity=arms == "smoke")
    table = pd.read_csv(sources.tables / "interventions.csv")
    assert (table["verdict"] == N_TOO_SMALL).all()
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    assert verdicts == [f"n too small (2 < {int(table['min_seeds'].iloc[0])})"] * len(table)
    assert "mean, 95 % t-interval (no verdict)" in visible_labels(differences)
    assert "mean, 95 % t-interval" not in visible_labels(differences)
    assert all(
        bar.lines[0].get_color() == fig6_interventions.UNDECIDED_COLOR for bar in differences.containers
    )
    low, high = differences.get_xlim()
    arrows = {
        (line.get_marker(), int(line.get_ydata()[0]))
        for line in differences.get_lines()
        if line.get_marker() in ("<", ">")
    }
    beyond = {("<", i) for i, ci in enumerate(table["ci_low"]) if ci < low}
    beyond |= {(">", i) for i, ci in enumerate(table["ci_high"]) if ci > high}
    assert arrows == beyond and (arrows or arms == "smoke")  # the default's 2-seed lr arm runs off
    caption = " ".join(
        figures.fill_caption(figures.registry()["fig6"].caption_template, drawing.numbers).split()
    )
    assert "With 2 seed pairs no comparison is decided" in caption
    assert caption.count("n = 2, n too small, detectable none at this n") == len(table)  # no Holm p
    assert not re.search(r"\b(better|worse|equivalent|inconclusive)\b", caption.split("Per comparison")[1])
    titles = [ax.get_title() for ax in fig.axes]
    assert any(t.startswith("2 x 2") for t in titles) == (arms == "default")
    assert any(t.startswith("unidentified share") for t in titles) == (arms == "smoke")
    style.pyplot().close(fig)


@pytest.mark.slow
def test_a_paper_sized_family_is_drawn_from_whatever_the_table_has(tmp_path):
    """Eleven comparisons, one of them against another baseline that the figure knows nothing of: every one
    is a row, with its verdict; the projected arm in float32 and its identity run on their floors."""
    sources = paper_sources(tmp_path)
    table = pd.read_csv(sources.tables / "interventions.csv")
    assert len(table) == 11 and "worse" in set(table["verdict"])
    fig = fig6_interventions.draw(sources).figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    labels = _tick_labels(differences.yaxis)
    assert len(labels) == 11 and labels[-1] == "sgd_gauge_fixed - sgd"
    assert "adamw_rebalance_first_moment - adamw_rebalance" in labels
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    assert [v.split(",")[0] for v in verdicts] == table["verdict"].tolist()
    for title in ("unidentified share", "first-order drift"):
        shown = visible_labels(_panel(fig, title))
        assert {"AdamW", "AdamW, projected (float32)", "AdamW, projected (float64 identity run)"} <= shown
    style.pyplot().close(fig)


def test_the_figure_reads_the_tables_and_names_what_is_missing(tmp_path):
    with pytest.raises(UserError, match="interventions.csv not found"):
        fig6_interventions.draw(Sources(tables=tmp_path))
    (tmp_path / "interventions.csv").write_text(
        "arm,baseline,metric,delta_mean\nx,adamw,final_val_loss,0.1\n"
    )
    (tmp_path / "interventions_seeds.csv").write_text("comparison,arm\nx,x\n")
    with pytest.raises(UserError, match="no column.*run attnid interventions-table again"):
        fig6_interventions.draw(Sources(tables=tmp_path))


def test_the_figure_is_made_by_its_rule_from_the_tables_and_the_runs():
    figure = figures.registry()["fig6"]
    assert figure.stage == "interventions"
    assert set(figure.inputs["tables"]) == {"interventions.csv", "interventions_seeds.csv"}
    files = figure.input_files(
        {"tables": ["t/interventions.csv", "t/interventions_seeds.csv", "t/runs.csv"]},
        {"intervention_runs": ["r/adamw/seed0"], "identity_runs": ["r/identity/seed0"]},
    )
    assert "t/interventions_seeds.csv" in files and "t/runs.csv" not in files
    assert "r/adamw/seed0/run.json" in files and "r/identity/seed0/metrics.csv" in files
