"""attnid figures on synthetic runs: all four figures written, the SGD + weight-decay
prediction, seed bands, diverged sweep points marked."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnid import figures, rundir, tables
from attnid.cases import CASES
from synthetic_runs import write_run, write_study


def write_theory(theory_dir):
    theory_dir.mkdir(parents=True)
    pd.DataFrame({"architecture": ["toy A", "toy B"], "n_head": [4, 16], "identified_fraction": [0.875, 0.96875]}
                 ).to_csv(theory_dir / "counts.csv", index=False)
    pd.DataFrame({"case": ["h1", "h2", "pair"], "kind": ["attention", "attention", "pair"], "n_embd": [12, 12, 4],
                  "n_head": [1, 2, 1], "n_params": [576, 576, 32], "measured": [288, 144, 16]}
                 ).to_csv(theory_dir / "nullity.csv", index=False)


@pytest.mark.slow  # ~12 s idle, ~35 s on a loaded machine (matplotlib text layout)
def test_all_four_figures_are_written_as_png_and_pdf(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")
    write_theory(tmp_path / "theory")
    paths = figures.make_figures(tmp_path / "tables", runs_dir, tmp_path / "theory", tmp_path / "figs")
    assert sorted(p.name for p in paths) == sorted(f"fig{i}.{ext}" for i in range(1, 5) for ext in ("png", "pdf"))
    for path in paths:
        head = path.read_bytes()[:8]
        assert head.startswith(b"\x89PNG" if path.suffix == ".png" else b"%PDF"), path
        assert path.stat().st_size > 5_000


def test_sgd_wd_factor_with_constant_lr_is_a_power():
    steps = np.array([0, 1, 10, 100])
    factor = figures.sgd_wd_imbalance_factor(steps, lambda s: 0.5, 0.1)
    np.testing.assert_allclose(factor, 0.95 ** (2 * steps), rtol=1e-12)
    beta = figures.predicted_beta_sgd_wd(steps, lambda s: 0.5, 0.1, scale=0.4)
    np.testing.assert_allclose(beta, 0.4 * (1 - 0.95 ** (2 * steps)), rtol=1e-12)
    assert beta[0] == 0 and beta[-1] == pytest.approx(0.4, rel=1e-4)


def test_sgd_wd_factor_follows_the_schedule():
    # lr 0 for the first 5 steps (no decay), then 0.1: the product only counts the steps taken
    factor = figures.sgd_wd_imbalance_factor(np.array([5, 7]), lambda s: 0.0 if s < 5 else 0.1, 1.0)
    np.testing.assert_allclose(factor, [1.0, 0.9 ** 4])


def test_seed_band_is_mean_min_max_per_step(tmp_path):
    runs = [rundir.load_run(write_run(tmp_path / f"s{seed}", "sgd", seed, 0.5, rho_qk=10.0 ** -(seed + 8)))
            for seed in range(3)]
    band = figures.seed_band(runs, "rho_qk", positive=True).set_index("step")
    assert 0 not in band.index  # step 0 has no step to measure
    assert band.loc[10, "mean"] == pytest.approx((1e-8 + 1e-9 + 1e-10) / 3)
    assert band.loc[10, "min"] == pytest.approx(1e-10) and band.loc[10, "max"] == pytest.approx(1e-8)


def test_sweep_figure_marks_diverged_points_and_annotates_slopes(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    frames = tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")
    fig = figures.draw_sweep(frames["sweep"], frames["sweep_slopes"])
    beta_axis = fig.axes[0]
    crosses = [line for line in beta_axis.get_lines() if line.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [1000.0]
    texts = [t.get_text() for t in beta_axis.texts]
    assert "slope 2.00" in texts and "slope 1.00" in texts
    assert beta_axis.get_xscale() == "log" and beta_axis.get_yscale() == "log"
    figures._pyplot().close(fig)


def test_missing_inputs_are_a_user_error(tmp_path):
    from attnid.errors import UserError

    with pytest.raises(UserError, match="not found"):
        figures.make_figures(tmp_path / "t", tmp_path / "r", tmp_path / "th", tmp_path / "out")


def test_one_style_for_every_case():
    colors = [figures.case_style(case)["color"] for case in CASES]
    assert len(set(colors)) == len(colors) == 5
    assert not math.isnan(figures.STYLE["font.size"])


def test_sgd_wd_prediction_scale_comes_from_run_json(tmp_path):
    from attnid.errors import UserError

    runs_dir, _ = write_study(tmp_path)
    sgd_wd = rundir.load_runs_by_case(runs_dir)["sgd_wd"]
    plt = figures._pyplot()
    fig, ax = plt.subplots()
    figures._overlay_sgd_wd_prediction(ax, sgd_wd, "ov")
    (line,) = ax.get_lines()
    info, frame = sgd_wd[0]
    steps = frame["step"].to_numpy()
    expected = figures.predicted_beta_sgd_wd(steps, figures.lr_schedule(info["config"]), 0.1,
                                             scale=info["initial_imbalance_scale"]["ov"])
    np.testing.assert_allclose(line.get_ydata(), expected[expected > 0], rtol=1e-12)
    assert "fitted" not in line.get_label()

    ax.cla()
    no_metrics = [({**info, "initial_imbalance_scale": None}, frame) for info, frame in sgd_wd]
    figures._overlay_sgd_wd_prediction(ax, no_metrics, "qk")  # trained with --no-metrics: nothing to predict
    assert not ax.get_lines()
    older = [({k: v for k, v in info.items() if k != "initial_imbalance_scale"}, frame) for info, frame in sgd_wd]
    with pytest.raises(UserError, match="initial_imbalance_scale"):
        figures._overlay_sgd_wd_prediction(ax, older, "qk")
    plt.close(fig)
