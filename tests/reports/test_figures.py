"""attnid figures on synthetic runs: the registry finds one module per figure, figures 1-4 written with their
captions, the SGD + weight-decay prediction, seed bands, diverged sweep points marked."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from figure_checks import invisible_legend_entries, legend_entries, overlapping_labels, visible_labels
from synthetic_runs import write_run, write_study

from attnid.reports import figures, round_off, tables
from attnid.reports.figures import fig2_training, fig3_conservation, fig4_sweep, series, style
from attnid.reports.figures.inputs import SOURCE_FLAGS, Sources
from attnid.training import rundir
from attnid.training.cases import CASES


def write_theory(theory_dir):
    theory_dir.mkdir(parents=True)
    pd.DataFrame(
        {"architecture": ["toy A", "toy B"], "n_head": [4, 16], "identified_fraction": [0.875, 0.96875]}
    ).to_csv(theory_dir / "counts.csv", index=False)
    pd.DataFrame(
        {
            "case": ["h1", "h2", "pair"],
            "kind": ["attention", "attention", "pair"],
            "n_embd": [12, 12, 4],
            "n_head": [1, 2, 1],
            "n_params": [576, 576, 32],
            "measured": [288, 144, 16],
        }
    ).to_csv(theory_dir / "nullity.csv", index=False)


@pytest.mark.slow  # ~12 s idle, ~35 s on a loaded machine (matplotlib text layout)
def test_all_four_figures_are_written_as_png_and_pdf_with_their_captions(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")
    write_theory(tmp_path / "theory")
    import matplotlib

    switched = ("backend", "backend_fallback")  # the figures draw with Agg, headless
    before = {key: value for key, value in matplotlib.rcParams.items() if key not in switched}
    sources = Sources(theory=tmp_path / "theory", tables=tmp_path / "tables", runs_dir=runs_dir)
    names = figures.default_figures(sources)
    assert names == ["fig1", "fig2", "fig3", "fig4"]  # no study tables, no interventions: no fig5, fig6
    paths = [path for name in names for path in figures.make_figure(name, sources, tmp_path / "figs")]
    assert sorted(p.name for p in paths) == sorted(
        f"fig{i}.{ext}" for i in range(1, 5) for ext in ("png", "pdf", "rst")
    )
    # the figures' style stays with the figures: the caller's matplotlib settings are unchanged
    assert {key: value for key, value in matplotlib.rcParams.items() if key not in switched} == before
    for path in paths:
        head = path.read_bytes()[:8]
        expected = {".png": b"\x89PNG", ".pdf": b"%PDF", ".rst": f"**Figure {path.stem[3:]} ".encode()}
        assert head.startswith(expected[path.suffix][:8]), path
        assert path.stat().st_size > (5_000 if path.suffix != ".rst" else 200)


def test_the_registry_finds_one_module_per_figure():
    found = figures.registry()
    assert list(found) == [f"fig{i}" for i in range(1, 9)]
    for name, figure in found.items():
        assert figure.module.__name__ == f"attnid.reports.figures.{name}_{figure.topic}"
        assert figure.caption_template.startswith(f"**Figure {figure.number} — ")
        assert set(figure.inputs) <= set(SOURCE_FLAGS) and all(figure.inputs.values())
    assert [name for name, figure in found.items() if figure.stage] == ["fig5", "fig6", "fig7", "fig8"]


def test_sgd_wd_factor_with_constant_lr_is_a_power():
    steps = np.array([0, 1, 10, 100])
    factor = fig3_conservation.sgd_wd_imbalance_factor(steps, lambda s: 0.5, 0.1)
    np.testing.assert_allclose(factor, 0.95 ** (2 * steps), rtol=1e-12)
    beta = fig3_conservation.predicted_beta_sgd_wd(steps, lambda s: 0.5, 0.1, scale=0.4)
    np.testing.assert_allclose(beta, 0.4 * (1 - 0.95 ** (2 * steps)), rtol=1e-12)
    assert beta[0] == 0 and beta[-1] == pytest.approx(0.4, rel=1e-4)


def test_sgd_wd_factor_follows_the_schedule():
    # lr 0 for the first 5 steps (no decay), then 0.1: the product only counts the steps taken
    factor = fig3_conservation.sgd_wd_imbalance_factor(np.array([5, 7]), lambda s: 0.0 if s < 5 else 0.1, 1.0)
    np.testing.assert_allclose(factor, [1.0, 0.9**4])


def test_seed_band_is_mean_min_max_per_step(tmp_path):
    runs = [
        rundir.load_run(write_run(tmp_path / f"s{seed}", "sgd", seed, 0.5, rho_qk=10.0 ** -(seed + 8)))
        for seed in range(3)
    ]
    band = series.seed_band(runs, "rho_qk", positive=True).set_index("step")
    assert 0 not in band.index  # step 0 has no step to measure
    assert band.loc[10, "mean"] == pytest.approx((1e-8 + 1e-9 + 1e-10) / 3)
    assert band.loc[10, "min"] == pytest.approx(1e-10) and band.loc[10, "max"] == pytest.approx(1e-8)


def test_sweep_figure_marks_diverged_points_and_annotates_slopes(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    frames = tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")
    fig = fig4_sweep.draw_sweep(frames["sweep"], frames["sweep_slopes"])
    beta_axis = fig.axes[0]
    crosses = [line for line in beta_axis.get_lines() if line.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [1000.0]
    texts = [t.get_text() for t in beta_axis.texts]
    assert "slope 2.00" in texts and "slope 1.00" in texts
    assert beta_axis.get_xscale() == "log" and beta_axis.get_yscale() == "log"
    style.pyplot().close(fig)


def test_missing_inputs_are_a_user_error(tmp_path):
    from attnid.common.errors import UserError

    sources = Sources(theory=tmp_path / "th", tables=tmp_path / "t", runs_dir=tmp_path / "r")
    for name in ("fig1", "fig4"):
        with pytest.raises(UserError, match="not found"):
            figures.make_figure(name, sources, tmp_path / "out")
    with pytest.raises(UserError, match="no runs"):
        figures.make_figure("fig2", sources, tmp_path / "out")
    with pytest.raises(UserError, match="give --runs-dir"):
        figures.make_figure("fig3", Sources(), tmp_path / "out")


def test_one_style_for_every_case():
    colors = [style.case_style(case)["color"] for case in CASES]
    assert len(set(colors)) == len(colors) == len(CASES)
    assert not math.isnan(style.STYLE["font.size"])


def test_sgd_wd_prediction_scale_comes_from_run_json(tmp_path):
    from attnid.common.errors import UserError

    runs_dir, _ = write_study(tmp_path)
    sgd_wd = rundir.load_runs_by_case(runs_dir)["sgd_wd"]
    plt = style.pyplot()
    fig, ax = plt.subplots()
    fig3_conservation.overlay_sgd_wd_prediction(ax, sgd_wd, "ov")
    (line,) = ax.get_lines()
    info, frame = sgd_wd[0]
    steps = frame["step"].to_numpy()
    expected = fig3_conservation.predicted_beta_sgd_wd(
        steps, fig3_conservation.lr_schedule(info["config"]), 0.1, scale=info["initial_imbalance_scale"]["ov"]
    )
    np.testing.assert_allclose(line.get_ydata(), expected[expected > 0], rtol=1e-12)
    assert "fitted" not in line.get_label()

    ax.cla()
    no_metrics = [({**info, "initial_imbalance_scale": None}, frame) for info, frame in sgd_wd]
    # trained with --no-metrics: nothing to predict
    fig3_conservation.overlay_sgd_wd_prediction(ax, no_metrics, "qk")
    assert not ax.get_lines()
    older = [
        ({k: v for k, v in info.items() if k != "initial_imbalance_scale"}, frame) for info, frame in sgd_wd
    ]
    with pytest.raises(UserError, match="initial_imbalance_scale"):
        fig3_conservation.overlay_sgd_wd_prediction(ax, older, "qk")
    plt.close(fig)


def _texts(ax) -> list[str]:
    return [text.get_text() for text in ax.texts]


def _floor_lines(ax) -> list:
    """The lines of ``ax`` drawn on a round-off floor (their markers included)."""
    return [line for line in ax.get_lines() if line.get_gid() == series.FLOOR_GID]


def test_round_off_series_in_the_sweep_lie_on_their_floor_never_fitted():
    lrs = np.array([0.01, 0.1, 1.0])
    sweep = pd.DataFrame(
        {
            "optimizer": "sgd",
            "lr": lrs,
            "status": "ok",
            "dtype": "float32",
            "beta_qk_final": [1e-8, 3e-8, 2e-8],
            "beta_ov_final": lrs**2,
            "rho_qk_mean": [2e-9, 1e-9, 5e-10],
            "rho_ov_mean": 1e-9,
            "final_val_loss": 2.0,
        }
    )
    slopes = tables.sweep_slopes_table(sweep)
    fitted = slopes.set_index("quantity")
    for quantity in ("beta_qk_final", "rho_qk_mean", "rho_ov_mean"):  # the table says why it has no slope
        assert np.isnan(fitted.loc[quantity, "slope"]) and np.isnan(fitted.loc[quantity, "r2"])
        assert fitted.loc[quantity, "note"].startswith("not fitted: float32 round-off (largest ")
    assert (
        fitted.loc["beta_ov_final", "slope"] == pytest.approx(2.0)
        and fitted.loc["beta_ov_final", "note"] == ""
    )
    fig = fig4_sweep.draw_sweep(sweep, slopes)
    beta_qk, beta_ov, rho_qk = fig.axes[:3]
    floor = round_off.round_off_floor("float32") / round_off.ROUND_OFF_MARGIN
    # on the floor (values below it raised to it, inside the axes), no fitted line, no slope label
    for ax, column, level in ((beta_qk, "beta_qk_final", "3e-08"), (rho_qk, "rho_qk_mean", "2e-09")):
        (line,) = ax.get_lines()
        assert line.get_gid() == series.FLOOR_GID and line.get_marker() == series.FLOOR_MARKER
        np.testing.assert_allclose(line.get_ydata(), np.maximum(sweep[column], floor))
        assert ax.get_ylim()[0] < floor and line.get_label() == "SGD"
        (text,) = _texts(ax)
        assert text.endswith(f" ≤ {level}\nfloat32 round-off") and text.startswith("SGD: "), text
    assert "slope 2.00" in _texts(beta_ov) and len(beta_ov.get_lines()) == 2  # data and its fit
    style.pyplot().close(fig)


def test_the_float64_sgd_sweep_shows_the_slope_of_both_circuits(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    frames = tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")
    fig = fig4_sweep.draw_sweep(frames["sweep"], frames["sweep_slopes"])
    assert "slope 2.00" in _texts(fig.axes[0]) and "slope 2.00" in _texts(fig.axes[1])
    # mean rho of the float64 sweep, 1e-27: on the floor, with its level
    assert any(text.startswith("SGD: mean") and " ≤ 1e-27" in text for text in _texts(fig.axes[2]))
    assert _floor_lines(fig.axes[2])
    style.pyplot().close(fig)


def test_a_sum_of_rounded_steps_has_a_floor_that_grows_like_the_root_of_its_length():
    # float64 SGD's first-order drift after 1,500 steps (the default build: ~1.5e-15) is round-off,
    # though a single rounded quantity that large would not be
    unit = round_off.UNIT_ROUND_OFF
    assert round_off.round_off_ceiling("float64", 1500) == pytest.approx(10 * unit["float64"] * 1500**0.5)
    assert round_off.at_round_off([1e-16, 8e-16, 1.5e-15], "float64", steps=1500)
    assert not round_off.at_round_off([1e-16, 8e-16, 1.5e-15], "float64")
    assert not round_off.at_round_off([1e-3, 0.2], "float64", steps=1500)  # a real drift is never a floor
    float32_ceiling = 10 * unit["float32"] * 1500**0.5  # 2.3e-5
    assert not round_off.at_round_off([1.1 * float32_ceiling], "float32", steps=1500)
    assert round_off.at_round_off([0.9 * float32_ceiling], "float32", steps=1500)


def test_figure_2_draws_round_off_rho_on_its_floor(tmp_path):
    runs_dir, _ = write_study(tmp_path)
    drawing = fig2_training.draw(Sources(runs_dir=runs_dir))
    rho_qk, rho_ov = drawing.figure.axes[1:3]
    assert "SGD" in {line.get_label() for line in _floor_lines(rho_qk)}
    assert "AdamW" in [line.get_label() for line in rho_qk.get_lines() if line.get_gid() is None]
    assert _texts(rho_qk) == ["SGD: $\\rho_{QK}$ ≤ 3e-27\nfloat64 round-off"]
    # the synthetic float32 AdamW runs log rho_ov = 1e-9: float32 round-off, on a floor of its own
    assert _texts(rho_ov) == [
        "SGD: $\\rho_{OV}$ ≤ 1e-28\nfloat64 round-off",
        "AdamW: $\\rho_{OV}$ ≤ 1e-09\nAdamW + rebalancing: $\\rho_{OV}$ ≤ 1e-09\nfloat32 round-off",
    ]
    assert {"SGD", "AdamW", "AdamW + rebalancing"} <= {line.get_label() for line in _floor_lines(rho_ov)}
    assert drawing.numbers["rho_floors"]["SGD"] == pytest.approx(3e-27)
    caption = figures.fill_caption(figures.registry()["fig2"].caption_template, drawing.numbers)
    assert "SGD: :math:`\\rho` at most 3e-27" in " ".join(caption.split())


def test_figure_3_splits_beta_with_the_sgd_wd_prediction_on_its_first_order_part(tmp_path):
    runs_dir, _ = write_study(tmp_path)
    runs = rundir.load_runs_by_case(runs_dir)
    fig = fig3_conservation.draw(Sources(runs_dir=runs_dir)).figure
    grid = np.array(fig.axes).reshape(3, len(runs))
    columns = list(runs)
    sgd_qk, sgd_wd_qk = grid[0][columns.index("sgd")], grid[0][columns.index("sgd_wd")]
    assert sgd_qk.get_title() == "SGD" and sgd_qk.get_yscale() == "log"
    # SGD's first-order part lies on the floor of a sum of per-step round-off, its level written
    assert any(
        re.fullmatch(r"drift1 ≤ [\d.e-]+\nfloat64 round-off, summed over [\d,]+ steps", text)
        for text in _texts(sgd_qk)
    )
    assert [line.get_linestyle() for line in _floor_lines(sgd_qk)][0] == "--"
    for row in grid[:2]:  # one look per quantity: beta thick and pale under its dashed and dotted parts
        for ax in row:
            widths = {line.get_linestyle(): line.get_linewidth() for line in ax.get_lines()}
            assert widths["-"] == fig3_conservation.BETA_LINE["linewidth"] > widths["--"], widths
            assert widths[":"] < widths["-"]
    for ax in grid[2]:  # mu: plain lines, told apart by filled (QK) and hollow (OV) markers
        assert {line.get_linestyle() for line in ax.get_lines()} == {"-"}
        assert {line.get_markerfacecolor() for line in ax.get_lines()} >= {"white"}
    predicted = [line for line in sgd_wd_qk.get_lines() if line.get_color() == style.PREDICTION_COLOR]
    assert len(predicted) == 1 and predicted[0].get_linestyle() == "None"  # circles on drift1, no line
    drift1 = runs["sgd_wd"][0][1]["drift1_pred_qk"]
    np.testing.assert_allclose(predicted[0].get_ydata(), drift1[drift1 > 0].to_numpy(), rtol=1e-12)


@pytest.mark.slow  # each figure's layout on the renderer, ~20 s on a loaded machine
@pytest.mark.parametrize("name", ["fig1", "fig2", "fig3", "fig4"])
def test_every_legend_entry_is_visible_and_no_label_overlaps(tmp_path, name):
    runs_dir, sweep_dir = write_study(tmp_path)
    tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")
    write_theory(tmp_path / "theory")
    sources = Sources(theory=tmp_path / "theory", tables=tmp_path / "tables", runs_dir=runs_dir)
    fig = figures.registry()[name].draw(sources).figure
    assert legend_entries(fig)
    assert not invisible_legend_entries(fig)
    assert not overlapping_labels(fig)
    if name in ("fig2", "fig4"):  # every series in every panel: on the floor if it is round-off
        expected = {"SGD", "AdamW"}
        for ax in fig.axes:
            assert expected <= visible_labels(ax), (ax.get_title(), visible_labels(ax))
    style.pyplot().close(fig)


def test_the_checks_catch_a_hidden_series_and_a_label_on_a_title():
    """The figure checks can fail: a series below the axes and a label over the title are caught."""
    plt = style.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], label="shown")
    ax.plot([1, 2], [1e-30, 1e-30], label="hidden")
    ax.set_yscale("log")
    ax.set_ylim(0.5, 3)
    ax.set_title("a title")
    ax.legend()
    ax.annotate("on the title", (1.5, 3), xytext=(0, 12), textcoords="offset points", ha="center")
    assert invisible_legend_entries(fig) == ["hidden"]
    assert any("overlaps the title" in problem for problem in overlapping_labels(fig))
    plt.close(fig)


def test_pdfs_embed_truetype_not_type3_fonts(tmp_path):
    plt = style.pyplot()
    assert style.STYLE["pdf.fonttype"] == 42 and style.STYLE["ps.fonttype"] == 42
    fig, ax = plt.subplots()  # made outside the style: save_figure still writes TrueType
    ax.set_title(r"$\beta_{QK}$ and text")
    (pdf,) = [p for p in style.save_figure(fig, tmp_path, "fonts") if p.suffix == ".pdf"]
    plt.close(fig)
    content = pdf.read_bytes()
    assert b"/Type3" not in content and b"/CIDFontType2" in content  # embedded TrueType


def test_a_caption_s_signed_value_has_a_true_minus_and_a_power_of_ten():
    from attnid.reports.appendix import rst_to_tex

    value = figures.caption_value
    assert value(-0.0123) == "\u22120.012" and value(0.25) == "0.25" and value(0.0) == "0"
    assert value(-3.6e-5) == r":math:`-3.6 \times 10^{-5}`" and value(2.5e4) == r":math:`2.5 \times 10^{4}`"
    assert value(float("nan")) == "n/a" and value(None) == "n/a"
    shown = rst_to_tex(f"from {value(-0.0123)} to {value(-3.6e-5)}")
    assert shown == r"from $-$0.012 to $-3.6 \times 10^{-5}$"
