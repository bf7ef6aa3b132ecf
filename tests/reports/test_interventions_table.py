"""attnid interventions-table (attnid.reports.interventions_table) on synthetic runs: every number of
interventions.csv recomputed here from the losses the runs were written with (exact sign-flip p by
enumeration, Holm by its step-down definition, the t-interval, the rule's labels and its minimum n), the
table recomputed from interventions_seeds.csv alone, the 2 x 2 interaction, the lr arm named apart, the
cost column, the family, the pairing errors, and the table in the appendix."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from by_hand import enumerated_sign_flip_p, holm_by_hand
from scipy import stats
from synthetic_runs import write_run, write_theory_tables
from system_packages import needs

from attnid.cli import main
from attnid.reports import appendix, arm_costs, interventions_curves, interventions_table, statistics

SEEDS = range(8)
ALPHA, MARGIN = 0.05, 0.01


def baseline_loss(seed: int) -> float:
    return 2.3 + 0.02 * seed


# Per arm: its final loss on the whole val split for a seed. The names are not cases the registry knows:
# the table takes whatever case names the runs carry.
NOISE = (0.011, -0.013, 0.008, -0.009, 0.003, -0.004, 0.012, -0.010)
ARMS = {
    "arm_lower": lambda s: baseline_loss(s) - 0.03 - 0.002 * s,  # lower on every seed
    "arm_higher": lambda s: baseline_loss(s) + 0.04 + 0.003 * s,  # higher on every seed
    "arm_same": lambda s: baseline_loss(s) + 0.05 * NOISE[s] / 10,  # +-0.0007 around 0
    "arm_noisy": lambda s: baseline_loss(s) + 0.004 + 3 * NOISE[s],  # +-0.04 around 0.004
}
FAMILY = list(ARMS)
EXPECTED = {
    "arm_lower": "better",
    "arm_higher": "worse",
    "arm_same": "equivalent",
    "arm_noisy": "inconclusive",
}


def write_arm_run(
    root,
    case: str,
    seed: int,
    value: float,
    *,
    status: str = "completed",
    steps: int = 40,
    folder: str | None = None,
    **config,
):
    """A synthetic run (synthetic_runs.write_run) whose final loss on the whole val split is ``value``; the
    keys of ``config`` go into run.json's config (--initial-point, --arm, ...)."""
    run_dir = write_run(
        root / (folder or case) / f"seed{seed}", case, seed, 1e-3, steps=steps, status=status, dtype="float32"
    )
    info = json.loads((run_dir / "run.json").read_text())
    info["final_val_loss_full"] = None if status == "diverged" else value
    info["max_iters"] = steps
    info["config"].update(config)
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


@pytest.fixture()
def intervention_runs(tmp_path):
    root = tmp_path / "runs"
    for seed in [*SEEDS, 9]:  # the baseline's seed 9 has no arm run: it is simply not used
        write_arm_run(root, "adamw", seed, baseline_loss(seed))
    for arm, loss in ARMS.items():
        for seed in SEEDS:
            write_arm_run(root, arm, seed, loss(seed))
    return root


def rule_flags(family=FAMILY) -> list[str]:
    return ["--alpha", str(ALPHA), "--equivalence-margin", str(MARGIN), "--family", *family]


def table_command(runs_root, out, *flags) -> list[str]:
    return ["interventions-table", "--runs-dir", str(runs_root), "--out-dir", str(out), *flags]


def test_every_number_of_the_table_is_recomputed(intervention_runs, tmp_path, capsys):
    out = tmp_path / "tables"
    assert main(table_command(intervention_runs, out, *rule_flags())) == 0
    table = pd.read_csv(out / "interventions.csv")
    assert tuple(table.columns) == interventions_table.INTERVENTION_COLUMNS
    assert table["arm"].tolist() == sorted(ARMS) and set(table["baseline"]) == {
        "adamw"
    }  # unknown cases: by name
    assert (table["metric"] == "final_val_loss_full").all()  # one metric: no best-loss or wall-time rows
    p_values, differences = {}, {}
    for row in table.itertuples():
        differences[row.arm] = np.array([ARMS[row.arm](s) - baseline_loss(s) for s in SEEDS])
        d = differences[row.arm]
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(1 - ALPHA)
        tost = stats.ttest_1samp(d, 0.0).confidence_interval(1 - 2 * ALPHA)
        assert row.n_seeds == len(SEEDS) and row.min_seeds == 8  # 4 comparisons: 4 * 2 / 2^8 < 0.05
        assert row.delta_mean == pytest.approx(d.mean(), abs=1e-12)
        assert row.sd == pytest.approx(d.std(ddof=1), rel=1e-9)
        assert (row.ci_low, row.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-9)
        assert (row.tost_low, row.tost_high) == pytest.approx((tost.low, tost.high), abs=1e-9)
        # TOST: the larger of scipy's two one-sided t-tests against +-delta
        one_sided = [
            stats.ttest_1samp(d, MARGIN, alternative="less").pvalue,
            stats.ttest_1samp(d, -MARGIN, alternative="greater").pvalue,
        ]
        assert row.p_equivalence == pytest.approx(max(one_sided), rel=1e-9)
        assert math.isnan(row.boot_ci_low)  # 8 < 20 seeds: no bootstrap interval
        assert row.p_value == pytest.approx(enumerated_sign_flip_p(d))
        assert row.in_family and row.alpha == ALPHA and row.equivalence_margin == MARGIN
        assert math.isnan(row.cost_ratio)  # no costs given
        p_values[row.arm] = row.p_value
    holm = holm_by_hand(p_values)
    for row in table.itertuples():
        assert row.p_holm == pytest.approx(holm[row.arm])
        assert row.verdict == EXPECTED[row.arm], row.arm
        # the exact sign-flip test's power, Holm's first step over the family of 4 (no primary declared)
        level = ALPHA / len(FAMILY)
        assert row.role == interventions_table.SECONDARY
        power = statistics.sign_flip_power(row.detectable_effect / row.sd, row.n_seeds, level)
        assert power == pytest.approx(0.8, abs=0.005)
        assert row.power_at_margin == pytest.approx(statistics.sign_flip_power(MARGIN / row.sd, 8, level))
    # one sign on all eight seeds: the smallest p eight seeds can give, times 4 after Holm
    lower = table.set_index("arm").loc["arm_lower"]
    assert lower.p_value == pytest.approx(2 / 2**8) and lower.p_holm == pytest.approx(4 * 2 / 2**8)
    printed = capsys.readouterr().out
    assert "arm_higher: mean +0.0505, 95% t-CI" in printed and ": worse" in printed

    seeds = pd.read_csv(out / "interventions_seeds.csv")
    assert tuple(seeds.columns) == interventions_table.SEED_COLUMNS
    assert len(seeds) == len(ARMS) * len(SEEDS)  # one row per comparison and seed
    for row in seeds.itertuples():
        assert row.difference == pytest.approx(ARMS[row.arm](row.seed) - baseline_loss(row.seed))
        assert row.difference == pytest.approx(row.arm_value - row.baseline_value)

    tex = (out / "interventions.tex").read_text()
    assert r"\label{tab:interventions}" in tex and r"\texttt{arm\_noisy}" in tex
    assert "family of 4 declared comparisons" in tex and "no verdict below $n = 8$" in tex
    assert r"inside $\pm\num{0.01}$" in tex and "& inconclusive" in tex and "& equivalent" in tex


def test_the_table_is_recomputed_from_the_seeds_table_alone(intervention_runs, tmp_path):
    """interventions_seeds.csv holds everything a verdict needs: a reader recomputes interventions.csv
    from it and the rule (alpha, margin, family), digit for digit."""
    out = tmp_path / "tables"
    assert main(table_command(intervention_runs, out, *rule_flags(["arm_lower", "arm_same"]))) == 0
    kept = pd.read_csv(out / "interventions.csv")
    again = interventions_table.comparisons_table(
        pd.read_csv(out / "interventions_seeds.csv"), ALPHA, MARGIN, ["arm_lower", "arm_same"]
    )
    pd.testing.assert_frame_equal(again, kept, check_dtype=False, rtol=1e-12, atol=0)
    # outside the declared family: the numbers, no Holm p, no verdict
    outside = kept[~kept["in_family"]]
    assert set(outside["arm"]) == {"arm_higher", "arm_noisy"}
    assert outside["p_holm"].isna().all() and (outside["verdict"] == statistics.NOT_IN_FAMILY).all()
    assert (kept["min_seeds"] == statistics.minimum_seeds(ALPHA, 2)).all()


def test_smoke_seeds_give_no_verdict(tmp_path, capsys):
    """Two seeds (the smoke config): below the rule's minimum, every row says n too small, however clear the
    difference; the power row says nothing is detectable."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        write_arm_run(root, "adamw", seed, baseline_loss(seed))
        write_arm_run(root, "arm_lower", seed, baseline_loss(seed) - 0.5)
    out = tmp_path / "tables"
    assert main(table_command(root, out, "--equivalence-margin", "0.01")) == 0
    row = pd.read_csv(out / "interventions.csv").iloc[0]
    assert row.verdict == statistics.N_TOO_SMALL and row.min_seeds == 6 and row.n_seeds == 2
    assert row.p_value == pytest.approx(0.5) and math.isinf(row.detectable_effect)
    assert r"{none} &" in (out / "interventions.tex").read_text()  # an S column's text cell


def test_the_two_by_two_interaction_per_seed(tmp_path):
    """adamw, the gauge arm, its blocks fixed at their initial values and adamw from the gauge point, told
    apart by run.json's options: their interaction per seed is (gauge - from gauge point) - (at init -
    adamw)."""
    root = tmp_path / "runs"
    loss = {
        "adamw": lambda s: 2.0 + 0.01 * s,
        "adamw_gauge_fixed": lambda s: 1.97 + 0.01 * s,
        "adamw_from_gauge_point": lambda s: 1.975 + 0.012 * s,
        "adamw_gauge_fixed_at_init": lambda s: 2.001 + 0.01 * s,
    }
    options = {
        "adamw": ("adamw", {}),
        "adamw_gauge_fixed": ("adamw_gauge_fixed", {"initial_point": "gauge"}),
        "adamw_from_gauge_point": ("adamw", {"initial_point": "gauge"}),
        "adamw_gauge_fixed_at_init": ("adamw_gauge_fixed", {"initial_point": "init"}),
    }
    for seed in SEEDS:
        for arm, (case, config) in options.items():
            write_arm_run(root, case, seed, loss[arm](seed), folder=arm, **config)
    by_arm = interventions_table.load_runs_by_arm(root)
    assert list(by_arm) == [
        "adamw",
        "adamw_from_gauge_point",
        "adamw_gauge_fixed",
        "adamw_gauge_fixed_at_init",
    ]
    seeds, notes = interventions_table.paired_seed_table(by_arm)
    assert not notes
    interaction = seeds[seeds["comparison"] == interventions_table.INTERACTION]
    assert interaction["seed"].tolist() == list(SEEDS)
    for row in interaction.itertuples():
        frozen_at_gauge = loss["adamw_gauge_fixed"](row.seed) - loss["adamw_from_gauge_point"](row.seed)
        frozen_at_init = loss["adamw_gauge_fixed_at_init"](row.seed) - loss["adamw"](row.seed)
        assert row.arm_value == pytest.approx(frozen_at_gauge) and row.baseline_value == pytest.approx(
            frozen_at_init
        )
        assert row.difference == pytest.approx(frozen_at_gauge - frozen_at_init)
    table = interventions_table.comparisons_table(seeds, ALPHA, MARGIN)
    row = table.set_index("comparison").loc[interventions_table.INTERACTION]
    assert (
        row.arm == "adamw_gauge_fixed-adamw_from_gauge_point"
        and row.baseline == "adamw_gauge_fixed_at_init-adamw"
    )
    assert row.delta_mean == pytest.approx(np.mean([-0.005 - 0.002 * s - 0.001 for s in SEEDS]))
    assert row.p_value == pytest.approx(2 / 2**8)  # negative on every seed
    # three arms against adamw, then the 2 x 2's contrasts: the main effects of fixing and of the start,
    # and the interaction, each per seed from the four cells
    assert table["comparison"].tolist()[3:] == [
        interventions_table.FIXING_EFFECT,
        interventions_table.START_EFFECT,
        interventions_table.INTERACTION,
    ]
    by_name = {name: seeds[seeds["comparison"] == name].set_index("seed") for name in table["comparison"]}
    for seed in SEEDS:
        cell = {arm: value(seed) for arm, value in loss.items()}
        fixing = by_name[interventions_table.FIXING_EFFECT].loc[seed]
        assert fixing.difference == pytest.approx(
            0.5 * (cell["adamw_gauge_fixed"] - cell["adamw_from_gauge_point"])
            + 0.5 * (cell["adamw_gauge_fixed_at_init"] - cell["adamw"])
        )
        assert fixing.arm_value == pytest.approx(
            (cell["adamw_gauge_fixed"] + cell["adamw_gauge_fixed_at_init"]) / 2
        )
        start = by_name[interventions_table.START_EFFECT].loc[seed]
        assert start.difference == pytest.approx(
            0.5 * (cell["adamw_from_gauge_point"] - cell["adamw"])
            + 0.5 * (cell["adamw_gauge_fixed"] - cell["adamw_gauge_fixed_at_init"])
        )
    assert by_name[interventions_table.FIXING_EFFECT]["arm"].iloc[0] == (
        "(adamw_gauge_fixed+adamw_gauge_fixed_at_init)/2"
    )
    tex = interventions_table.render_interventions_table(table)
    assert r"interaction: starting point $\times$ frozen" in tex
    assert "main effect of fixing the unidentified blocks" in tex


def test_the_contrasts_at_the_arms_best_lrs_with_a_primary(tmp_path):
    """Every arm at its own best lr (runs named ARM_best_lr, attnid train --arm) against adamw_best_lr: the
    2 x 2's contrasts carry the suffix; the primary is tested alone (its p is its Holm p, its minimum n that
    of a family of one) and Holm runs over the secondary family only; the rest get no verdict."""
    root = tmp_path / "runs"
    loss = {
        "adamw_best_lr": lambda s: 2.0 + 0.01 * s,
        "adamw_gauge_fixed_best_lr": lambda s: 2.02 + 0.01 * s + 0.001 * (s % 3),
        "adamw_from_gauge_point_best_lr": lambda s: 2.004 + 0.01 * s - 0.002 * (s % 2),
        "adamw_gauge_fixed_at_init_best_lr": lambda s: 2.018 + 0.011 * s,
        "adamw_frozen_mlp_best_lr": lambda s: 2.0 + 0.01 * s + NOISE[s] / 3,
    }
    case = {
        "adamw_gauge_fixed_best_lr": "adamw_gauge_fixed",
        "adamw_gauge_fixed_at_init_best_lr": "adamw_gauge_fixed",
    }
    for seed in SEEDS:
        for arm, value in loss.items():
            write_arm_run(root, case.get(arm, "adamw"), seed, value(seed), folder=arm, arm=arm)
    by_arm = interventions_table.load_runs_by_arm(root)
    seeds, _ = interventions_table.paired_seed_table(by_arm)
    primary = interventions_table.FIXING_EFFECT + "_best_lr"
    like_for_like = "adamw_frozen_mlp_best_lr-adamw_gauge_fixed_at_init_best_lr"
    family = ["start_main_effect_best_lr", "start_x_frozen_best_lr", like_for_like]
    table = interventions_table.comparisons_table(seeds, ALPHA, MARGIN, family, primary=primary).set_index(
        "comparison"
    )
    assert {primary, *family} <= set(table.index)
    # the like-for-like control: the frozen-MLP arm against fixing from the same start, seed by seed
    pairs = seeds[seeds["comparison"] == like_for_like].set_index("seed")
    for seed in SEEDS:
        expected = loss["adamw_frozen_mlp_best_lr"](seed) - loss["adamw_gauge_fixed_at_init_best_lr"](seed)
        assert pairs.loc[seed, "difference"] == pytest.approx(expected, abs=1e-12)
    # the frozen-MLP arm against adamw is computed and shown, outside Holm's family
    descriptive = table.loc["adamw_frozen_mlp_best_lr-adamw_best_lr"]
    assert descriptive["role"] == interventions_table.DESCRIPTIVE and math.isnan(descriptive["p_holm"])
    assert descriptive["n_seeds"] == len(SEEDS) and math.isfinite(descriptive["p_value"])
    assert table.loc[primary, "role"] == interventions_table.PRIMARY
    assert table.loc[primary, "p_holm"] == table.loc[primary, "p_value"] == pytest.approx(2 / 2**8)
    assert table.loc[primary, "min_seeds"] == statistics.minimum_seeds(ALPHA, 1) == 6
    assert table.loc[primary, "verdict"] == "worse"  # fixing costs on every seed
    holm = holm_by_hand({name: table.loc[name, "p_value"] for name in family})
    for name in family:
        assert table.loc[name, "role"] == interventions_table.SECONDARY
        assert table.loc[name, "p_holm"] == pytest.approx(holm[name])
        assert table.loc[name, "min_seeds"] == statistics.minimum_seeds(ALPHA, 3)
    others = table[~table.index.isin([primary, *family])]
    assert len(others) and (others["role"] == interventions_table.DESCRIPTIVE).all()
    assert (others["verdict"] == statistics.NOT_IN_FAMILY).all() and others["p_holm"].isna().all()
    with pytest.raises(interventions_table.UserError, match="primary comparison and in the family"):
        interventions_table.comparisons_table(seeds, ALPHA, MARGIN, [primary], primary=primary)
    with pytest.raises(interventions_table.UserError, match="not among the runs' comparisons"):
        interventions_table.comparisons_table(seeds, ALPHA, MARGIN, family, primary="fixing_main_effect")


def write_curve_run(root, arm: str, case: str, seed: int, curve: dict[int, float], steps: int = 40):
    """A run named ``arm`` whose whole-split val loss is ``curve`` ({step: loss}) in metrics.csv, the last
    one also run.json's final_val_loss_full, as attnid train --full-val-every writes them."""
    run_dir = write_arm_run(root, case, seed, curve[steps], steps=steps, folder=arm, arm=arm)
    metrics = pd.read_csv(run_dir / "metrics.csv")
    metrics["val_loss_full"] = metrics["step"].map(curve)
    metrics.to_csv(run_dir / "metrics.csv", index=False)
    return run_dir


def test_the_effect_along_training_and_the_plateau(tmp_path):
    """interventions_along.csv: each comparison's mean difference and t-interval at every declared step,
    the last step's equal to the verdict table's; interventions_plateau.csv: each arm's mean loss over the
    last quarter and whether it improved by less than the threshold."""
    root = tmp_path / "runs"
    steps = (0, 10, 20, 30, 40)

    def curve(final: float, shape: float) -> dict[int, float]:
        return {step: final + shape * (40 - step) / 40 for step in steps}

    for seed in SEEDS:
        write_curve_run(root, "adamw", "adamw", seed, curve(2.0 + 0.01 * seed, 0.4))
        write_curve_run(root, "arm_slow", "adamw", seed, curve(2.05 + 0.01 * seed + NOISE[seed], 0.01))
    by_arm = interventions_table.load_runs_by_arm(root)
    seeds, _ = interventions_table.paired_seed_table(by_arm)
    along = interventions_curves.along_table(seeds, by_arm).set_index("step")
    assert along.index.tolist() == list(steps) and (along["comparison"] == "arm_slow").all()
    for step in steps:
        d = np.array(
            [curve(2.05 + 0.01 * s + NOISE[s], 0.01)[step] - curve(2.0 + 0.01 * s, 0.4)[step] for s in SEEDS]
        )
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(1 - ALPHA)
        assert along.loc[step, "delta_mean"] == pytest.approx(d.mean(), abs=1e-12)
        assert (along.loc[step, "ci_low"], along.loc[step, "ci_high"]) == pytest.approx((ci.low, ci.high))
    final = interventions_table.comparisons_table(seeds, ALPHA, MARGIN).iloc[0]
    assert along.loc[40, "delta_mean"] == pytest.approx(final.delta_mean, abs=1e-15)

    rule = interventions_curves.PlateauRule(last_fraction=0.25, improvement=0.01)
    plateau = interventions_curves.plateau_table(by_arm, rule).set_index("arm")
    assert plateau.loc["adamw", "step_from"] == 30 and plateau.loc["adamw", "step_to"] == 40
    mean_from = np.mean([curve(2.0 + 0.01 * s, 0.4)[30] for s in SEEDS])
    mean_to = np.mean([2.0 + 0.01 * s for s in SEEDS])
    assert plateau.loc["adamw", "relative_improvement"] == pytest.approx((mean_from - mean_to) / mean_from)
    assert not plateau.loc["adamw", "plateau"]  # 0.1 of 2.1: about 5 % in the last quarter
    assert plateau.loc["arm_slow", "plateau"]  # 0.0025: about 0.1 %
    with pytest.raises(interventions_table.UserError, match="no whole-split val loss at step 28"):
        interventions_curves.plateau_table(by_arm, interventions_curves.PlateauRule(0.3, 0.01))


def test_the_margin_is_a_fraction_of_the_calibrated_baseline_loss(intervention_runs, tmp_path, capsys):
    calibration = tmp_path / "calibration.csv"
    pd.DataFrame(
        {"arm": ["adamw", "adamw", "other"], "best": [False, True, True], "mean": [2.5, 2.0, 1.0]}
    ).to_csv(calibration, index=False)
    assert interventions_table.calibrated_margin(calibration, 0.005) == pytest.approx(0.01)
    out = tmp_path / "tables"
    flags = ["--margin-fraction", "0.005", "--calibration", str(calibration), "--family", *FAMILY]
    assert main(table_command(intervention_runs, out, *flags)) == 0
    table = pd.read_csv(out / "interventions.csv")
    assert np.allclose(table["equivalence_margin"], 0.01)
    assert "equivalence margin 0.01: 0.005 x adamw's calibrated loss" in capsys.readouterr().out
    assert main(table_command(intervention_runs, out, "--margin-fraction", "0.005")) == 2
    assert "--margin-fraction needs --calibration" in capsys.readouterr().err


def test_an_lr_arm_is_named_apart_or_refused(tmp_path, capsys):
    """adamw at another lr is adamw's case with another setting: two runs of one seed that the table cannot
    tell apart are a one-line error; named with attnid train --arm, they are an arm."""
    root = tmp_path / "runs"
    for seed in SEEDS:
        write_arm_run(root, "adamw", seed, baseline_loss(seed))
        write_arm_run(root, "adamw", seed, baseline_loss(seed) - 0.01, folder="adamw_lr2x")
    assert main(table_command(root, tmp_path / "out")) == 2
    error = capsys.readouterr().err.strip()
    assert "two runs of arm adamw with seed 0" in error and "attnid train --arm" in error
    for seed in SEEDS:
        write_arm_run(root, "adamw", seed, baseline_loss(seed) - 0.03, folder="adamw_lr2x", arm="adamw_lr2x")
    assert main(table_command(root, tmp_path / "out", *rule_flags(["adamw_lr2x"]))) == 0
    row = pd.read_csv(tmp_path / "out" / "interventions.csv").iloc[0]
    assert row.arm == "adamw_lr2x" and row.verdict == statistics.BETTER  # -0.03 on every seed: beyond ±0.01


def test_each_arm_meets_the_baseline_of_its_optimizer_and_at_its_best_lr_its_baseline_s(tmp_path, capsys):
    """sgd_gauge_fixed against sgd; an arm at its best lr (attnid train --arm <arm>_best_lr) against its
    baseline at the baseline's, and with moved moments also against its case's kept-moments arm at its
    best lr; the baselines themselves against nothing. The comparisons are those the plan declares for the
    same arms (attnid.plan.interventions.planned_comparisons), and a missing baseline is one line."""
    root = tmp_path / "runs"
    offsets = {
        "adamw": ("adamw", {}, 0.0),
        "adamw_gauge_fixed": ("adamw_gauge_fixed", {}, -0.01),
        "sgd": ("sgd", {}, 0.3),
        "sgd_gauge_fixed": ("sgd_gauge_fixed", {}, 0.25),
        "adamw_best_lr": ("adamw", {"arm": "adamw_best_lr"}, -0.02),
        "adamw_gauge_fixed_best_lr": ("adamw_gauge_fixed", {"arm": "adamw_gauge_fixed_best_lr"}, -0.025),
        "adamw_rebalance_best_lr": ("adamw_rebalance", {"arm": "adamw_rebalance_best_lr"}, -0.015),
        "adamw_rebalance_first_moment_best_lr": (
            "adamw_rebalance",
            {"arm": "adamw_rebalance_first_moment_best_lr", "rebalance_moments": "first-moment"},
            -0.018,
        ),
    }
    for folder, (case, config, offset) in offsets.items():
        for seed in SEEDS:
            write_arm_run(root, case, seed, baseline_loss(seed) + offset, folder=folder, **config)
    assert main(table_command(root, tmp_path / "out")) == 0
    table = pd.read_csv(tmp_path / "out" / "interventions.csv").set_index("comparison")
    expected = {
        "adamw_gauge_fixed": ("adamw_gauge_fixed", "adamw", -0.01),
        "adamw_rebalance_best_lr-adamw_best_lr": ("adamw_rebalance_best_lr", "adamw_best_lr", 0.005),
        "adamw_rebalance_first_moment_best_lr-adamw_best_lr": (
            "adamw_rebalance_first_moment_best_lr",
            "adamw_best_lr",
            0.002,
        ),
        "adamw_rebalance_first_moment_best_lr-adamw_rebalance_best_lr": (
            "adamw_rebalance_first_moment_best_lr",
            "adamw_rebalance_best_lr",
            -0.003,
        ),
        "adamw_gauge_fixed_best_lr-adamw_best_lr": ("adamw_gauge_fixed_best_lr", "adamw_best_lr", -0.005),
        "sgd_gauge_fixed-sgd": ("sgd_gauge_fixed", "sgd", -0.05),
    }
    assert set(table.index) == set(expected)
    for name, (arm, baseline, delta) in expected.items():
        row = table.loc[name]
        assert (row.arm, row.baseline) == (arm, baseline) and row.delta_mean == pytest.approx(delta), name
    from attnid.plan.interventions import planned_comparisons

    config = {
        "cases": {"adamw": {"lr": 1e-3}, "sgd": {"lr": 0.1}},
        "interventions": {
            "arms": [
                {"case": "adamw_gauge_fixed"},
                {"case": "adamw_rebalance"},
                {"case": "adamw_rebalance", "rebalance_moments": "first-moment"},
                {"case": "sgd_gauge_fixed"},
            ],
            "calibration": {"arms": ["adamw_gauge_fixed", "adamw_rebalance", "adamw_rebalance_first_moment"]},
        },
    }
    uncalibrated = {
        "adamw_rebalance",
        "adamw_rebalance_first_moment",
        "adamw_rebalance_first_moment-adamw_rebalance",
    }
    assert set(planned_comparisons(config)) == set(expected) | uncalibrated  # runs the table was not given
    capsys.readouterr()
    shutil.rmtree(root / "sgd")
    assert main(table_command(root, tmp_path / "out")) == 2
    assert capsys.readouterr().err.strip() == (
        "attnid interventions-table: error: arm sgd_gauge_fixed is compared with sgd (the baseline of its "
        "optimizer), and no sgd runs are among the runs given: pass them too"
    )


def test_the_cost_ratio_comes_from_the_kept_benchmark(intervention_runs, tmp_path, capsys):
    costs = tmp_path / "arms_cost.csv"
    pd.DataFrame(
        {
            "arm": ["adamw", "arm_lower", "arm_higher"],
            "ms_per_step": [70.0, 77.0, 63.0],
            "ratio_to_adamw": [1.0, 1.1, 0.9],
            "platform": "Linux",
            "cpu": "Some CPU",
            "torch": "2.1",
            "date": "2026-01-02",
        }
    ).to_csv(costs, index=False)
    out = tmp_path / "tables"
    assert main(table_command(intervention_runs, out, *rule_flags(), "--arm-costs", str(costs))) == 0
    table = pd.read_csv(out / "interventions.csv").set_index("arm")
    assert table.loc["arm_lower", "cost_ratio"] == pytest.approx(1.1)
    assert table.loc["arm_higher", "cost_ratio"] == pytest.approx(0.9)
    assert math.isnan(table.loc["arm_same", "cost_ratio"])  # not measured
    assert r"arms\_cost.csv: Some CPU, torch 2.1, 2026-01-02" in (out / "interventions.tex").read_text()
    assert "note: cost ratios from arms_cost.csv: Some CPU" in capsys.readouterr().out
    kept = arm_costs.ArmCosts({"adamw": 1.0, "a": 1.2, "b": 0.96}, "")
    assert kept.of("a", "b") == pytest.approx(1.25) and math.isnan(kept.of("a", "c"))


def test_the_cost_benchmark_writes_what_the_table_reads(tmp_path):
    """benchmarks/arms_cost.py's table (its timing is a benchmark, never a test): medians of per-round ratios
    to adamw, the machine and date on every row, read back by the table; its arms carry the table's names
    (those of attnid train's options; the lr arm is named with --arm)."""
    import importlib.util

    from pipeline_helpers import REPO

    spec = importlib.util.spec_from_file_location("arms_cost", REPO / "benchmarks" / "arms_cost.py")
    assert spec is not None and spec.loader is not None
    arms_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arms_cost)
    for arm, (case, extra) in arms_cost.ARMS.items():
        named = interventions_table.arm_name(case, extra)
        assert named == arm or (arm == "adamw_lr2x" and extra == {"lr": 2 * arms_cost.ADAMW_LR}), arm
    seconds = {"adamw": [2.0, 2.2, 2.0], "adamw_gauge_fixed": [2.2, 2.2, 2.4], "adamw_lr2x": [2.1, 2.31, 2.0]}
    machine = {"platform": "Linux-x", "cpu": "Some CPU", "torch": "2.1", "date": "2026-01-02"}
    table = arms_cost.cost_table(seconds, 40, machine)
    assert table.set_index("arm").loc["adamw_gauge_fixed", "ratio_to_adamw"] == pytest.approx(1.1)
    assert table.set_index("arm").loc["adamw_gauge_fixed", "ms_per_step"] == pytest.approx(55.0)
    table.to_csv(tmp_path / "arms_cost.csv", index=False)
    costs = arm_costs.read_arm_costs(tmp_path / "arms_cost.csv")
    assert costs.ratio["adamw"] == 1.0 and costs.ratio["adamw_lr2x"] == pytest.approx(1.05)
    assert costs.source == "arms_cost.csv: Some CPU, torch 2.1, 2026-01-02"


def test_a_seed_without_a_baseline_run_is_a_one_line_error(intervention_runs, tmp_path, capsys):
    write_arm_run(intervention_runs, "arm_lower", 11, 2.0)
    assert main(table_command(intervention_runs, tmp_path)) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        "attnid interventions-table: error: arm arm_lower: seed(s) 11 have no adamw run to pair "
        "with; pass the adamw runs of the same seeds (or leave those arm_lower runs out)"
    ]
    assert not (tmp_path / "interventions.csv").exists()


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("twice", "two runs of arm arm_lower with seed 0"),
        ("longer", "arm arm_lower seed 0 trains 60 steps, adamw seed 0 40"),
        ("no baseline", "is compared with adamw (the baseline of its optimizer), and no adamw runs"),
        ("only baseline", "only adamw runs given: nothing to compare"),
        ("family", "the family names arm_elsewhere, not among the runs' comparisons"),
        ("family twice", "the family names arm_lower twice"),
        ("no full loss", "has no final_val_loss_full"),
    ],
)
def test_other_selection_mistakes_are_one_line_errors(intervention_runs, tmp_path, capsys, mistake, message):
    runs = sorted(str(path.parent) for path in intervention_runs.rglob("run.json"))
    flags = []
    if mistake == "twice":
        runs.append(str(write_arm_run(tmp_path / "copy", "arm_lower", 0, 2.0)))
    elif mistake == "longer":
        runs = [r for r in runs if not r.endswith("arm_lower/seed0")]
        runs.append(str(write_arm_run(tmp_path / "long", "arm_lower", 0, 2.0, steps=60)))
    elif mistake == "no baseline":
        runs = [r for r in runs if "/adamw/" not in r]
    elif mistake == "only baseline":
        runs = [r for r in runs if "/adamw/" in r]
    elif mistake == "family":
        flags = ["--family", "arm_lower", "arm_elsewhere"]
    elif mistake == "family twice":
        flags = ["--family", "arm_lower", "arm_same", "arm_lower"]
    else:  # a run from before the whole-split evaluation
        run_json = intervention_runs / "arm_same" / "seed3" / "run.json"
        info = json.loads(run_json.read_text())
        del info["final_val_loss_full"]
        run_json.write_text(json.dumps(info))
    command = ["interventions-table", "--runs", *runs, "--out-dir", str(tmp_path / "out"), *flags]
    assert main(command) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and message in errors[0], errors


def test_a_diverged_run_leaves_its_pair_out_and_says_so(intervention_runs, tmp_path, capsys):
    write_arm_run(intervention_runs, "arm_lower", 2, 0.0, status="diverged")
    for seed in SEEDS[:-1]:  # arm_higher: only seed 7 left, too few for anything
        write_arm_run(intervention_runs, "arm_higher", seed, 0.0, status="diverged")
    out = tmp_path / "tables"
    assert main(table_command(intervention_runs, out, *rule_flags())) == 0
    table = pd.read_csv(out / "interventions.csv").set_index("arm")
    lower = table.loc["arm_lower"]
    kept = np.array([ARMS["arm_lower"](s) - baseline_loss(s) for s in SEEDS if s != 2])
    assert lower.n_seeds == 7 and lower.delta_mean == pytest.approx(kept.mean())
    assert lower.p_value == pytest.approx(2 / 2**7) and lower.verdict == statistics.N_TOO_SMALL  # 7 < 8
    higher = table.loc["arm_higher"]
    assert higher.n_seeds == 1 and higher.verdict == statistics.N_TOO_SMALL
    assert math.isnan(higher.ci_low) and math.isnan(higher.p_value) and math.isnan(higher.p_holm)
    # a member without a p-value enters Holm as 1: the others' adjustment still counts four comparisons
    assert table.loc["arm_same", "p_holm"] >= table.loc["arm_same", "p_value"]
    seeds = pd.read_csv(out / "interventions_seeds.csv")
    assert seeds["difference"].isna().sum() == 1 + 7  # the pairs stay in the seeds table, without a value
    printed = capsys.readouterr().out
    assert "note: arm_lower: seed 2 left out (arm_lower diverged)" in printed
    assert printed.count("note: arm_higher: seed") == 7


def test_the_appendix_includes_the_table_when_present_and_omits_it_on_request(intervention_runs, tmp_path):
    tables = tmp_path / "tables"
    interventions_table.write_interventions_table(intervention_runs, tables)
    out = tmp_path / "paper" / "appendix.tex"
    text = appendix.render_appendix(*write_theory_tables(tmp_path), out, experiment_tables=tables)
    assert r"\section{Does identification buy anything?}" in text and r"\label{tab:interventions}" in text
    assert "Table~\\ref{tab:interventions} compares arms" in text
    assert "tab:study-correlation" not in text  # no study tables in this folder: no paragraph about them
    lean = appendix.render_appendix(
        *write_theory_tables(tmp_path), out, experiment_tables=tables, omit=("interventions",)
    )
    assert "tab:interventions" not in lean and "Does identification buy anything" not in lean


@pytest.mark.slow
@needs("latexmk", "siunitx.sty")
def test_the_table_fits_the_page(tmp_path, repo_root):
    """The widest table the builds make: paper.yaml's arms, thirteen comparisons (long arm names, another
    baseline, the 2 x 2's three contrasts, differences in scientific notation) compiles with no box too
    wide, its numbers in aligned siunitx columns."""
    root = tmp_path / "runs"
    arms = {
        "adamw_projected": ("adamw_projected", {}),
        "adamw_gauge_fixed": ("adamw_gauge_fixed", {}),
        "adamw_gauge_fixed_at_init": ("adamw_gauge_fixed", {"initial_point": "init"}),
        "adamw_from_gauge_point": ("adamw", {"initial_point": "gauge"}),
        "adamw_lr2x": ("adamw", {"lr": 2e-3, "arm": "adamw_lr2x"}),
        "adamw_frozen_mlp": ("adamw", {"freeze_mlp": True}),
        "adamw_rebalance": ("adamw_rebalance", {}),
        "adamw_rebalance_first_moment": ("adamw_rebalance", {"rebalance_moments": "first-moment"}),
    }
    for seed in SEEDS:
        write_arm_run(root, "adamw", seed, baseline_loss(seed))
        for i, (arm, (case, config)) in enumerate(arms.items()):
            write_arm_run(
                root, case, seed, baseline_loss(seed) + 1.234e-4 * (i - 2) * (1 + seed), folder=arm, **config
            )
    tables, paper = tmp_path / "tables", tmp_path / "paper"
    family = ["adamw_gauge_fixed", "adamw_gauge_fixed_at_init", "adamw_from_gauge_point", "start_x_frozen"]
    interventions_table.write_interventions_table(root, tables, equivalence_margin=0.01, family=family)
    paper.mkdir()
    shutil.copy(repo_root / "paper" / "main.tex", paper / "main.tex")
    (paper / "appendix.tex").write_text(
        appendix.render_appendix(
            *write_theory_tables(tmp_path), paper / "appendix.tex", experiment_tables=tables
        )
    )
    appendix.compile_pdf(paper / "main.tex")
    log = (paper / "main.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull.*", log)
    assert "Float too large" not in log
    tex = (tables / "interventions.tex").read_text()
    assert tex.count(r"\multicolumn{9}{l}") == 13 and r"interaction: starting point $\times$ frozen" in tex
    assert re.search(r"\{rS\[table-format=-1\.1e-1\]", tex)  # mean differences aligned, true minus signs
    assert "& not in family" in tex and "& n too small" not in tex
    assert re.search(r"\[\\num\{-?\d\.\de-\d\}, \\num\{-?\d\.\de-\d\}\]", tex)  # the interval as the mean
