"""Figure 6 drawn from the interventions tables (attnid.reports.figures.fig6_interventions): every comparison
the table has, the primary on top and marked, its seeds' differences as dots, the t-interval, the verdict the
rule wrote; the 2 x 2 when the table has its contrasts (at the stage's lr or at each arm's best lr); the
effect along training from interventions_along.csv; the calibration from calibration.csv; ρ and drift
where runs measured them; the caption from the numbers. Built on synthetic runs gathered by the real
interventions table, for the default config's protocol (each arm at its best lr, 8 seeds, the primary,
the calibration, metrics off), the 2 x 2 at the stage's lr (8 seeds), the smoke config's arms (2 seeds: n
too small) and a paper-sized family."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from figure_checks import (
    invisible_legend_entries,
    legend_entries,
    legends_over_other_panels,
    overlapping_labels,
    visible_labels,
)
from matplotlib.colors import to_hex
from synthetic_runs import (
    BEST_LR_EFFECTS,
    DEFAULT_EFFECTS,
    PAPER_EFFECTS,
    SMOKE_EFFECTS,
    calibration_infos,
    final_losses,
    write_best_lr_runs,
    write_intervention_runs,
)

from attnid.common.errors import UserError
from attnid.plan.interventions import (
    CALIBRATED_SUFFIX,
    FIXING_EFFECT,
    INTERACTION,
    START_EFFECT,
    comparison_name,
)
from attnid.reports import figures
from attnid.reports.calibration import calibration_table
from attnid.reports.figures import fig6_interventions, interventions_panels, style
from attnid.reports.figures.inputs import Sources
from attnid.reports.figures.interventions_rows import CONTRAST_LABELS, ROLE_ORDER
from attnid.reports.interventions_table import comparisons_table, run_arm_name, write_interventions_table
from attnid.reports.statistics import N_TOO_SMALL, NOT_IN_FAMILY, WORSE_WITHIN_MARGIN
from attnid.training.cases import CASES

MARGIN = 0.01
# The default family at the stage's lr: every arm and the interaction (the main effects are shown, not judged)
DEFAULT_FAMILY = [*DEFAULT_EFFECTS, INTERACTION]
# The default config's protocol: every arm at its best lr, the main effect of fixing the primary
PRIMARY = FIXING_EFFECT + CALIBRATED_SUFFIX
FROZEN_MLP = comparison_name("adamw_frozen_mlp" + CALIBRATED_SUFFIX, "adamw" + CALIBRATED_SUFFIX)
# the frozen-MLP control like for like: against fixing from the same start (FROZEN_MLP: descriptive)
LIKE_FOR_LIKE = comparison_name(
    "adamw_frozen_mlp" + CALIBRATED_SUFFIX, "adamw_gauge_fixed_at_init" + CALIBRATED_SUFFIX
)
BEST_LR_FAMILY = [START_EFFECT + CALIBRATED_SUFFIX, INTERACTION + CALIBRATED_SUFFIX, LIKE_FOR_LIKE]


def build(tmp_path, effects, n_seeds, family, identity=True) -> Sources:
    """The runs of ``effects``' arms and adamw, gathered by attnid interventions-table; Figure 6's sources."""
    arm_dirs, identity_dirs = write_intervention_runs(
        tmp_path / "runs", final_losses(effects, n_seeds), identity=identity
    )
    tables = tmp_path / "tables"
    write_interventions_table(None, tables, runs=arm_dirs, equivalence_margin=MARGIN, family=family)
    return Sources(tables=tables, intervention_runs=arm_dirs, identity_runs=identity_dirs)


def best_lr_sources(tmp_path, identity=True, diverged=None) -> Sources:
    """The default config's protocol on synthetic runs: the arms at their best lr with the metrics off and
    the whole val split every 10 of 40 steps, gathered with the primary and the secondary family; the
    calibration table of their calibration runs (adamw_frozen_mlp's best lr at the grid's edge); with
    ``identity``, the float64 identity run (which measures ρ and the drift)."""
    runs = write_best_lr_runs(tmp_path / "runs", final_losses(BEST_LR_EFFECTS, 8))
    identity_dirs = write_intervention_runs(tmp_path / "runs", {}, identity=identity)[1]
    tables = tmp_path / "tables"
    write_interventions_table(
        None, tables, runs=runs, equivalence_margin=MARGIN, family=BEST_LR_FAMILY, primary=PRIMARY
    )
    calibration_table(calibration_infos(diverged=diverged)).to_csv(tables / "calibration.csv", index=False)
    return Sources(tables=tables, intervention_runs=runs, identity_runs=identity_dirs)


def paper_sources(tmp_path) -> Sources:
    """A paper-sized family (16 seeds, 14 comparisons): every arm, the moments pair and a comparison of
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


def shown_order(table: pd.DataFrame) -> pd.DataFrame:
    """interventions.csv's rows in the order Figure 6 draws them: by role (primary, secondary, the rest),
    each in the table's order."""
    rank = table["role"].map({role: i for i, role in enumerate(ROLE_ORDER)})
    return table.assign(rank=rank).sort_values("rank", kind="stable").reset_index(drop=True)


def _panel(fig, title: str):
    (found,) = [ax for ax in fig.axes if ax.get_title().startswith(title)]
    return found


def _titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes]


def _verdict_axis(fig, differences):
    """The twin axis whose tick labels are the verdicts (it shares the differences panel's y)."""
    return next(ax for ax in fig.axes if ax is not differences and ax.bbox.bounds == differences.bbox.bounds)


def _tick_labels(axis) -> list[str]:
    return [tick.get_text() for tick in axis.get_ticklabels()]


def _check_drawn(fig) -> None:
    assert legend_entries(fig)
    assert not invisible_legend_entries(fig)
    assert not overlapping_labels(fig)
    assert not legends_over_other_panels(fig)


def _check_one_line_style_per_series(fig) -> None:
    """A line style means one thing in every panel: a series named after a case is drawn in its case style
    (as in Figures 2-4); lines without a label (the zero line, an interval's bar, a rule) are solid."""
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
        if case_label in by_label:
            assert found == {by_label[case_label]}, (label, found)


def _caption(drawing) -> str:
    return " ".join(
        figures.fill_caption(figures.registry()["fig6"].caption_template, drawing.numbers).split()
    )


@pytest.mark.slow  # the layout on the renderer, ~20 s on a loaded machine
def test_the_default_protocol_marks_the_primary_and_draws_every_panel(tmp_path):
    """Each arm at its best lr: the primary on top, bold and named so, with its own p; the rows without the
    arms' suffix (the title says it once); the 2 x 2 of the arms at their best lr."""
    sources = best_lr_sources(tmp_path)
    table = pd.read_csv(sources.tables / "interventions.csv")
    seeds = pd.read_csv(sources.tables / "interventions_seeds.csv")
    primary = table.set_index("comparison").loc[PRIMARY]
    # +0.006 on every seed: different from 0, and inside the margin of 0.01
    assert primary.role == "primary" and primary.verdict == WORSE_WITHIN_MARGIN
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    assert differences.get_title().endswith("every arm at its best lr")
    labels = _tick_labels(differences.yaxis)
    assert labels[0] == f"{CONTRAST_LABELS[FIXING_EFFECT]} (primary)"
    assert labels[1:4] == [
        "adamw_frozen_mlp - adamw_gauge_fixed_at_init",
        CONTRAST_LABELS[START_EFFECT],
        CONTRAST_LABELS[INTERACTION],
    ]  # the secondary family in the table's order, then the rest
    assert set(labels[4:]) == {f"{arm} - adamw" for arm in BEST_LR_EFFECTS}
    weights = [tick.get_fontweight() for tick in differences.get_yticklabels()]
    assert weights[0] == "bold" and "bold" not in weights[1:]
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    # tested alone: its own p, not Holm's; beside it the equivalence test's
    assert verdicts[0] == f"{WORSE_WITHIN_MARGIN}; p {primary.p_holm:.2g}, TOST p {primary.p_equivalence:.2g}"
    assert all("Holm p" in v for v in verdicts[1:4]) and verdicts[4:] == [NOT_IN_FAMILY] * 4
    # the dots are each comparison's seeds, in the figure's order
    shown = shown_order(table)
    (dots,) = [c for c in differences.collections if c.get_label() == "one seed's difference"]
    for position, row in enumerate(shown.itertuples()):
        rows = dots.get_offsets()[np.abs(dots.get_offsets()[:, 1] - position) < 0.5]
        expected = seeds.loc[seeds["comparison"] == row.comparison, "difference"]
        np.testing.assert_allclose(np.sort(rows[:, 0]), np.sort(expected), rtol=1e-12)
    # the 2 x 2 of the arms at their best lr
    grid = _panel(fig, "2 x 2")
    assert grid.get_title() == "2 x 2: start x fixing, 8 seeds, at best lrs"
    losses = final_losses(BEST_LR_EFFECTS, 8)
    cells = {" ".join(text.get_text().split()) for text in grid.texts}
    assert f"adamw {np.mean(losses['adamw']):.4f}" in cells
    assert f"fixing {primary.delta_mean:+.2g}" in grid.get_xlabel()
    style.pyplot().close(fig)


@pytest.mark.slow
def test_the_effect_along_training_is_the_along_table(tmp_path):
    """One line per contrast of the 2 x 2 and the frozen-MLP control, its points the table's mean at each
    step, its band the t-interval; the last step's mean is the verdict table's; the zero line, the margin
    and the note that the verdict is the last step's."""
    sources = best_lr_sources(tmp_path)
    table = pd.read_csv(sources.tables / "interventions.csv").set_index("comparison")
    along = pd.read_csv(sources.tables / "interventions_along.csv")
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    ax = _panel(fig, "the effect along training")
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    expected = {
        f"{CONTRAST_LABELS[FIXING_EFFECT]} (primary)": PRIMARY,
        CONTRAST_LABELS[START_EFFECT]: START_EFFECT + CALIBRATED_SUFFIX,
        CONTRAST_LABELS[INTERACTION]: INTERACTION + CALIBRATED_SUFFIX,
        "adamw_frozen_mlp - adamw_gauge_fixed_at_init": LIKE_FOR_LIKE,
        "adamw_frozen_mlp - adamw": FROZEN_MLP,  # both of the frozen-MLP arm's comparisons
    }
    assert set(lines) == set(expected)
    for label, comparison in expected.items():
        rows = along[along["comparison"] == comparison].sort_values("step")
        assert len(rows) == 5  # steps 0, 10, ..., 40
        np.testing.assert_array_equal(lines[label].get_xdata(), rows["step"])
        np.testing.assert_allclose(lines[label].get_ydata(), rows["delta_mean"], rtol=1e-12)
        assert lines[label].get_ydata()[-1] == pytest.approx(table.loc[comparison, "delta_mean"], rel=1e-9)
    assert lines[f"{CONTRAST_LABELS[FIXING_EFFECT]} (primary)"].get_linewidth() > max(
        line.get_linewidth() for label, line in lines.items() if "primary" not in label
    )
    # the bands: each comparison's t-interval at every step
    rows = along[along["comparison"] == PRIMARY].sort_values("step")
    primary_color = lines[f"{CONTRAST_LABELS[FIXING_EFFECT]} (primary)"].get_color()
    (band,) = [c for c in ax.collections if to_hex(c.get_facecolor()[0]) == to_hex(primary_color)]
    vertices = band.get_paths()[0].vertices
    for step, low, high in zip(rows["step"], rows["ci_low"], rows["ci_high"]):
        ys = vertices[np.isclose(vertices[:, 0], step), 1]
        assert min(ys) == pytest.approx(low) and max(ys) == pytest.approx(high)
    assert any(list(line.get_ydata()) == [0.0, 0.0] for line in ax.get_lines())  # the zero line
    (margin,) = [p for p in ax.patches if p.get_label().startswith("equivalence margin")]
    low, high = ax.transData.inverted().transform(margin.get_transform().transform([(0, 0), (0, 1)]))[:, 1]
    assert (low, high) == pytest.approx((-MARGIN, MARGIN))
    assert "verdict is taken at the last, 40" in ax.get_xlabel()
    caption = _caption(drawing)
    assert "at the 5 whole-split evaluations, steps 0–40; it ends at the verdict's value" in caption
    middle = along[(along["comparison"] == PRIMARY) & (along["step"] == 20)]["delta_mean"].iloc[0]
    assert f"the primary's is {figures.caption_value(middle)} at step 20" in caption
    style.pyplot().close(fig)


@pytest.mark.slow
def test_the_calibration_panel_shows_each_arm_s_curve_and_flags_an_edge(tmp_path):
    """Each calibrated arm's mean final loss against its lrs (log x), its chosen lr ringed, adamw_frozen_mlp's
    (at the grid's top) ringed in red and labelled; a diverged lr as a cross; the caption names the chosen lrs
    and the arm at the edge."""
    sources = best_lr_sources(tmp_path, diverged=("adamw_gauge_fixed", 0.0025))
    calibration = pd.read_csv(sources.tables / "calibration.csv")
    edge = calibration[calibration["at_edge"]]
    assert edge["arm"].tolist() == ["adamw_frozen_mlp"]
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    _check_drawn(fig)
    ax = _panel(fig, "calibration")
    assert ax.get_xscale() == "log"
    for arm, rows in calibration.groupby("arm", sort=False):
        (line,) = [line for line in ax.get_lines() if line.get_label() == arm]
        np.testing.assert_array_equal(line.get_xdata(), rows["lr"])
        np.testing.assert_allclose(line.get_ydata(), rows["mean"], rtol=1e-12)  # NaN where one diverged
    rings = [line for line in ax.get_lines() if line.get_marker() == "o" and line.get_linestyle() == "None"]
    best = calibration[calibration["best"]]
    assert sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in rings) == sorted(
        zip(best["lr"], best["mean"])
    )
    (red,) = [line for line in rings if line.get_label() == interventions_panels.CHOSEN_AT_EDGE]
    assert (red.get_xdata()[0], red.get_markeredgecolor()) == (0.04, interventions_panels.EDGE_COLOR)
    assert {text.get_text() for text in ax.texts} == {"at the grid's edge"}
    (cross,) = [line for line in ax.get_lines() if line.get_label() == interventions_panels.DIVERGED]
    assert list(cross.get_xdata()) == [0.0025]
    caption = _caption(drawing)
    for row in best.itertuples():
        assert f"``{row.arm}`` {figures.caption_number(row.lr)}" in caption
    assert "at the grid's edge (red), the best may lie beyond: ``adamw_frozen_mlp``." in caption
    style.pyplot().close(fig)


@pytest.mark.slow
def test_runs_with_metrics_off_leave_the_orbit_to_the_identity_run(tmp_path):
    """The stage's arms log no ρ: the orbit panels show the identity run alone, and without it there are
    none; the caption says so."""
    drawing = fig6_interventions.draw(best_lr_sources(tmp_path / "with"))
    for title in ("unidentified share", "first-order drift"):
        named = {label for label in visible_labels(_panel(drawing.figure, title)) if label}
        assert named == {"AdamW, projected (float64 identity run)"}
    caption = _caption(drawing)
    assert "where measured: the projected arm's float64 identity run (40 steps)" in caption
    assert "``adamw``, mean" not in caption
    style.pyplot().close(drawing.figure)
    drawing = fig6_interventions.draw(best_lr_sources(tmp_path / "without", identity=False))
    assert not any(t.startswith(("unidentified share", "first-order drift")) for t in _titles(drawing.figure))
    assert "Unidentified share" not in _caption(drawing)
    style.pyplot().close(drawing.figure)


@pytest.mark.slow
def test_without_the_along_table_or_the_calibration_the_figure_leaves_their_panels_out(tmp_path):
    """A build without full_val_every (an along table with no rows) or without a calibration (no
    calibration.csv), and a calibration.csv of another build whose arms this table does not pair."""
    sources = best_lr_sources(tmp_path)
    along = sources.tables / "interventions_along.csv"
    pd.read_csv(along).head(0).to_csv(along, index=False)
    (sources.tables / "calibration.csv").unlink()
    drawing = fig6_interventions.draw(sources)
    titles = _titles(drawing.figure)
    assert not any(t.startswith(("the effect along training", "calibration")) for t in titles)
    assert any(t.startswith("2 x 2") for t in titles)
    caption = _caption(drawing)
    assert "Along training" not in caption and "Calibration" not in caption
    style.pyplot().close(drawing.figure)
    along.unlink()
    calibration_table(calibration_infos()).assign(arm=lambda t: t["arm"] + "_elsewhere").to_csv(
        sources.tables / "calibration.csv", index=False
    )
    drawing = fig6_interventions.draw(sources)
    assert not any(
        t.startswith(("the effect along training", "calibration")) for t in _titles(drawing.figure)
    )
    style.pyplot().close(drawing.figure)


@pytest.mark.slow
def test_the_default_family_each_comparison_its_seeds_interval_and_verdict(tmp_path):
    """The 2 x 2 at the stage's lr, without a primary: Holm over the family, the main effects shown without a
    verdict."""
    sources = build(tmp_path, DEFAULT_EFFECTS, 8, DEFAULT_FAMILY)
    table = pd.read_csv(sources.tables / "interventions.csv")
    seeds = pd.read_csv(sources.tables / "interventions_seeds.csv")
    assert dict(zip(table["comparison"], table["verdict"])) == {
        "adamw_from_gauge_point": "better",
        "adamw_gauge_fixed": "better",
        "adamw_gauge_fixed_at_init": "equivalent",
        "adamw_lr2x": "inconclusive",
        FIXING_EFFECT: NOT_IN_FAMILY,
        START_EFFECT: NOT_IN_FAMILY,
        INTERACTION: "equivalent",
    }
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    # one row per comparison, the family's first; the lr arm says its ratio
    assert _tick_labels(differences.yaxis) == [
        "adamw_from_gauge_point",
        "adamw_lr2x (lr x2)",
        "adamw_gauge_fixed",
        "adamw_gauge_fixed_at_init",
        CONTRAST_LABELS[INTERACTION],
        CONTRAST_LABELS[FIXING_EFFECT],
        CONTRAST_LABELS[START_EFFECT],
    ]
    shown = shown_order(table)
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    for row, label in zip(shown.itertuples(), verdicts):
        assert (
            label == NOT_IN_FAMILY
            if row.verdict == NOT_IN_FAMILY
            else label == f"{row.verdict}; Holm p {row.p_holm:.2g}, TOST p {row.p_equivalence:.2g}"
        )
    # the dots are the seeds table's differences, the bars the table's t-intervals
    (dots,) = [c for c in differences.collections if c.get_label() == "one seed's difference"]
    np.testing.assert_allclose(np.sort(dots.get_offsets()[:, 0]), np.sort(seeds["difference"]), rtol=1e-12)
    for position, row in enumerate(shown.itertuples()):
        rows = dots.get_offsets()[np.abs(dots.get_offsets()[:, 1] - position) < 0.5]
        expected = seeds.loc[seeds["comparison"] == row.comparison, "difference"]
        np.testing.assert_allclose(np.sort(rows[:, 0]), np.sort(expected), rtol=1e-12)
    bars = list(differences.containers)
    assert [bar.lines[0].get_xdata()[0] for bar in bars] == pytest.approx(shown["delta_mean"].tolist())
    for bar, row in zip(bars, shown.itertuples()):
        (segment,) = bar.lines[2][0].get_segments()
        assert segment[:, 0] == pytest.approx([row.ci_low, row.ci_high])
    assert {"one seed's difference", "mean, 95 % t-interval", "equivalence margin ±0.01"} <= visible_labels(
        differences
    )
    # the 2 x 2: each cell's mean over the seeds, the effect of fixing in each row, the contrasts
    grid = _panel(fig, "2 x 2")
    assert grid.get_title() == "2 x 2: start x fixing, 8 seeds"
    cells = [" ".join(text.get_text().split()) for text in grid.texts]
    losses = final_losses(DEFAULT_EFFECTS, 8)
    mean = {arm: np.mean(values) for arm, values in losses.items()}
    at_init = mean["adamw_gauge_fixed_at_init"] - mean["adamw"]  # the effect of fixing from each start
    at_gauge = mean["adamw_gauge_fixed"] - mean["adamw_from_gauge_point"]
    assert sorted(cells) == sorted(
        [
            f"adamw {mean['adamw']:.4f}",
            f"adamw from gauge point {mean['adamw_from_gauge_point']:.4f}",
            f"adamw gauge fixed at init {mean['adamw_gauge_fixed_at_init']:.4f} fixing {at_init:+.2g}",
            f"adamw gauge fixed {mean['adamw_gauge_fixed']:.4f} fixing {at_gauge:+.2g}",
        ]
    )
    by_name = table.set_index("comparison")
    interaction, fixing = by_name.loc[INTERACTION], by_name.loc[FIXING_EFFECT]
    assert f"interaction {interaction.delta_mean:+.2g}" in grid.get_xlabel()
    assert f"fixing {fixing.delta_mean:+.2g}" in grid.get_xlabel()
    assert "equivalent" in grid.get_xlabel()
    # the float64 identity run on its floor (the default has no float32 projected arm)
    for title in ("unidentified share", "first-order drift"):
        assert "AdamW" in visible_labels(_panel(fig, title))
        assert "AdamW, projected (float64 identity run)" in visible_labels(_panel(fig, title))
    flat = _caption(drawing)
    value, number = figures.caption_value, figures.caption_number
    for row in table.itertuples():
        if row.verdict == NOT_IN_FAMILY:
            continue
        shown_row = (
            f"``{row.comparison}`` {value(row.delta_mean)} [{value(row.ci_low)}, {value(row.ci_high)}], "
            f"n = 8, {row.verdict} (Holm p {number(row.p_holm)}), detectable {row.detectable_effect:.2g}, "
            f"power {number(row.power_at_margin)}"
        )
        assert shown_row in flat, shown_row
    assert "Holm over the 5 comparisons" in flat and "seed pairs" not in flat  # every row had enough
    assert "The primary comparison" not in flat and "each at its own best learning rate" not in flat
    assert "n too small" not in flat and "{{" not in flat
    assert f"their difference, the interaction, is {value(interaction.delta_mean)}" in flat
    style.pyplot().close(fig)


def test_the_caption_states_the_primary_s_numbers(tmp_path):
    """The primary's Δ, interval, exact p, verdict and power at the margin, from the table (no drawing)."""
    sources = best_lr_sources(tmp_path)
    table = pd.read_csv(sources.tables / "interventions.csv")
    seeds = pd.read_csv(sources.tables / "interventions_seeds.csv")
    comparisons = fig6_interventions.comparisons_of(table, seeds, {})
    grid = fig6_interventions.two_by_two(seeds, comparisons)
    numbers = fig6_interventions.caption_numbers(table, comparisons, grid, {}, [])
    flat = " ".join(figures.fill_caption(fig6_interventions.CAPTION, numbers).split())
    row = table.set_index("comparison").loc[PRIMARY]
    value, number = figures.caption_value, figures.caption_number
    assert (
        f"Primary: {CONTRAST_LABELS[FIXING_EFFECT]} (``{PRIMARY}``), :math:`\\Delta` {value(row.delta_mean)} "
        f"[{value(row.ci_low)}, {value(row.ci_high)}], n = 8, exact p {number(row.p_holm)}, "
        f"**{WORSE_WITHIN_MARGIN}**; the "
        f"test's power at the margin {number(row.power_at_margin)}, "
        f"80 % power at {row.detectable_effect:.2g}."
    ) in flat
    assert flat.count(f"``{PRIMARY}``") == 1  # its own sentence, not among the secondary ones
    for name in BEST_LR_FAMILY:
        secondary = table.set_index("comparison").loc[name]
        assert f"``{name}`` {value(secondary.delta_mean)}" in flat
        assert f"(Holm p {number(secondary.p_holm)})" in flat
    assert "The other 4 (below) are shown, not judged." in flat
    assert "each at its own best learning rate, chosen on calibration seeds apart" in flat
    assert "the 3 secondary comparisons with Holm) says whether :math:`\\Delta` differs from 0" in flat


@pytest.mark.slow
@pytest.mark.parametrize("arms", ["smoke", "default"])
def test_two_seeds_say_n_too_small_and_decide_nothing(tmp_path, arms):
    """The smoke config's 2 seeds: every row is drawn, grey, its verdict "n too small" (or "not in family"),
    the caption says that nothing is decided; the t-interval of 2 seeds (t = 12.7) runs off the side, with
    an arrow."""
    effects = SMOKE_EFFECTS if arms == "smoke" else DEFAULT_EFFECTS
    family = (
        [*SMOKE_EFFECTS, "adamw_rebalance_first_moment-adamw_rebalance"]
        if arms == "smoke"
        else DEFAULT_FAMILY
    )
    sources = build(tmp_path, effects, 2, family, identity=arms == "smoke")
    table = pd.read_csv(sources.tables / "interventions.csv")
    judged = table[table["verdict"] != NOT_IN_FAMILY]
    assert (judged["verdict"] == N_TOO_SMALL).all() and len(judged) == len(family)
    drawing = fig6_interventions.draw(sources)
    fig = drawing.figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    minimum = int(judged["min_seeds"].iloc[0])
    assert verdicts == [f"n too small (2 < {minimum})"] * len(judged) + [NOT_IN_FAMILY] * (
        len(table) - len(judged)
    )
    assert "mean, 95 % t-interval (no verdict)" in visible_labels(differences)
    assert "mean, 95 % t-interval" not in visible_labels(differences)
    assert all(
        bar.lines[0].get_color() == interventions_panels.UNDECIDED_COLOR for bar in differences.containers
    )
    low, high = differences.get_xlim()
    shown = shown_order(table)
    arrows = {
        (line.get_marker(), int(line.get_ydata()[0]))
        for line in differences.get_lines()
        if line.get_marker() in ("<", ">")
    }
    beyond = {("<", i) for i, ci in enumerate(shown["ci_low"]) if ci < low}
    beyond |= {(">", i) for i, ci in enumerate(shown["ci_high"]) if ci > high}
    assert arrows == beyond and (arrows or arms == "smoke")  # the default's 2-seed lr arm runs off
    caption = _caption(drawing)
    assert "With 2 seed pairs no comparison is decided" in caption
    assert f"at least {minimum} seed pairs" in caption
    assert caption.count("n = 2, n too small, detectable none at this n") == len(judged)  # no Holm p
    assert not re.search(r"\b(better|worse|equivalent|inconclusive)\b", caption.split("Per comparison")[1])
    titles = _titles(fig)
    assert any(t.startswith("2 x 2") for t in titles) == (arms == "default")
    assert any(t.startswith("unidentified share") for t in titles) == (arms == "smoke")
    assert not any(t.startswith(("the effect along training", "calibration")) for t in titles)
    style.pyplot().close(fig)


@pytest.mark.slow
def test_a_paper_sized_family_is_drawn_from_whatever_the_table_has(tmp_path):
    """Fourteen comparisons, one of them against another baseline that the figure knows nothing of: every
    one is a row, with its verdict; the projected arm in float32 and its identity run on their floors."""
    sources = paper_sources(tmp_path)
    table = pd.read_csv(sources.tables / "interventions.csv")
    assert len(table) == 14 and "worse" in set(table["verdict"])
    fig = fig6_interventions.draw(sources).figure
    _check_drawn(fig)
    _check_one_line_style_per_series(fig)
    differences = _panel(fig, "paired differences")
    labels = _tick_labels(differences.yaxis)
    assert len(labels) == 14 and "sgd_gauge_fixed - sgd" in labels
    assert "adamw_frozen_mlp - adamw_gauge_fixed_at_init" in labels  # the like-for-like control
    assert "adamw_rebalance_first_moment - adamw_rebalance" in labels
    verdicts = _tick_labels(_verdict_axis(fig, differences).yaxis)
    assert [v.split(";")[0] for v in verdicts] == shown_order(table)["verdict"].tolist()
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


def test_an_optional_table_of_an_older_format_is_a_one_line_error(tmp_path):
    sources = best_lr_sources(tmp_path)
    (sources.tables / "calibration.csv").write_text("arm,lr\nadamw,0.01\n")
    with pytest.raises(UserError, match=r"calibration.csv has no column\(s\) .*run attnid calibration-table"):
        fig6_interventions.draw(sources)
    (sources.tables / "calibration.csv").unlink()
    (sources.tables / "interventions_along.csv").write_text("comparison,step\nx,0\n")
    with pytest.raises(UserError, match="interventions_along.csv has no column.*interventions-table again"):
        fig6_interventions.draw(sources)


def test_the_figure_is_made_by_its_rule_from_the_tables_and_the_runs():
    """The rule's inputs: the tables this build makes of those Figure 6 reads (the along table and the
    calibration only where the build has them), and every run's files."""
    figure = figures.registry()["fig6"]
    assert figure.stage == "interventions"
    assert set(figure.inputs["tables"]) == {
        "interventions.csv",
        "interventions_seeds.csv",
        "interventions_along.csv",
        "calibration.csv",
    }
    runs = {"intervention_runs": ["r/adamw/seed0"], "identity_runs": ["r/identity/seed0"]}
    made = ["t/interventions.csv", "t/interventions_seeds.csv", "t/interventions_along.csv", "t/runs.csv"]
    files = figure.input_files({"tables": made}, runs)
    assert "t/interventions_along.csv" in files and "t/calibration.csv" not in files  # no calibration
    assert "t/interventions_seeds.csv" in files and "t/runs.csv" not in files
    assert "r/adamw/seed0/run.json" in files and "r/identity/seed0/metrics.csv" in files
    files = figure.input_files({"tables": [*made, "t/calibration.csv"]}, runs)
    assert "t/calibration.csv" in files


@pytest.mark.slow
def test_the_calibration_panel_draws_round_two_over_round_one(tmp_path):
    """A calibration of two rounds: round 1's curve over the whole grid (its own seeds), round 2's means
    (both rounds' seeds) at each arm's two best lrs as filled diamonds, the ring on the final pick (here
    round 2 moves adamw_gauge_fixed's); the title and the caption say round 2's seeds."""
    sources = best_lr_sources(tmp_path)
    first = calibration_infos()
    one = calibration_table(first)
    refine = []
    for arm, rows in one.groupby("arm", sort=False):
        top = rows.sort_values(["mean", "lr"])["lr"].tolist()[:2]
        for infos in calibration_infos(seeds=tuple(range(102, 108))):
            if infos["lr"] in top and run_arm_name(infos) == arm:
                if arm == "adamw_gauge_fixed" and infos["lr"] == top[1]:
                    infos = infos | {"final_val_loss_full": infos["final_val_loss_full"] - 0.5}
                refine.append(infos)
    table = calibration_table(first, refine)
    table.to_csv(sources.tables / "calibration.csv", index=False)
    second = table[table["round"] == 2]
    assert set(second["n_seeds"]) == {8}
    drawing = fig6_interventions.draw(sources)
    ax = _panel(drawing.figure, "calibration")
    diamonds = [line for line in ax.get_lines() if line.get_label() == interventions_panels.ROUND_TWO]
    drawn = sorted(
        (x, y) for line in diamonds for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)
    )
    np.testing.assert_allclose(drawn, sorted(zip(second["lr"], second["mean"], strict=True)), rtol=1e-12)
    for arm, rows in table[table["round"] == 1].groupby("arm", sort=False):
        (line,) = [line for line in ax.get_lines() if line.get_label() == arm]
        np.testing.assert_array_equal(line.get_xdata(), rows["lr"])
    rings = [line for line in ax.get_lines() if line.get_marker() == "o" and line.get_linestyle() == "None"]
    best = table[table["best"]]
    assert (best["round"] == 2).all()
    np.testing.assert_allclose(
        sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in rings),
        sorted(zip(best["lr"], best["mean"], strict=True)),
        rtol=1e-12,
    )
    assert ax.get_title().endswith("; round 2, 8 seeds in all")
    assert "round 2: each arm's best lrs of round 1 over 8 seeds" in " ".join(_caption(drawing).split())
    style.pyplot().close(drawing.figure)
