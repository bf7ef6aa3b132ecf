"""The robustness variants (attnid.reports.robustness, `attnid interventions-robustness`, and the plan's
choice of each variant's runs): every row of interventions_robustness.csv is recomputed from the per-seed
losses of the runs it was made from; a variant whose pick is the final one reuses the final runs."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
from by_hand import enumerated_sign_flip_p, holm_by_hand
from pipeline_helpers import smoke_config
from scipy import stats
from synthetic_runs import write_run

from attnid.cli import main
from attnid.plan import plan
from attnid.plan.interventions import CALIBRATED_SUFFIX, CONTRASTS, FIXING_EFFECT
from attnid.plan.runs import lr_label

SEEDS = range(8)
ALPHA, MARGIN = 0.05, 0.01
CASES = {
    "adamw": "adamw",
    "adamw_gauge_fixed": "adamw_gauge_fixed",
    "adamw_gauge_fixed_at_init": "adamw_gauge_fixed",
    "adamw_from_gauge_point": "adamw",
    "adamw_frozen_mlp": "adamw",
}
OPTIONS = {
    "adamw_gauge_fixed_at_init": {"initial_point": "init"},
    "adamw_from_gauge_point": {"initial_point": "gauge"},
    "adamw_frozen_mlp": {"freeze_mlp": True},
}
NOISE = tuple(0.012 * np.sin(2.3 * s + 0.4) for s in range(8))  # no two sums of its subsets tie
# per variant, each arm's final loss per seed: at the final picks fixing costs a little on most seeds; at
# the stage's lr the gauge arms lose more
LOSSES = {
    "final": {
        "adamw": lambda s: 2.0 + 0.01 * s,
        "adamw_gauge_fixed": lambda s: 2.004 + 0.01 * s + NOISE[s] / 4,
        "adamw_gauge_fixed_at_init": lambda s: 2.003 + 0.01 * s - NOISE[s] / 5,
        "adamw_from_gauge_point": lambda s: 2.001 + 0.01 * s + NOISE[(s + 3) % 8] / 6,
        "adamw_frozen_mlp": lambda s: 2.01 + 0.01 * s + NOISE[s] / 2,
    },
    "stage_lr": {
        "adamw": lambda s: 2.0 + 0.01 * s,
        "adamw_gauge_fixed": lambda s: 2.02 + 0.01 * s + NOISE[s] / 3,
        "adamw_gauge_fixed_at_init": lambda s: 2.015 + 0.01 * s + NOISE[(s + 1) % 8] / 3,
        "adamw_from_gauge_point": lambda s: 2.002 + 0.01 * s,
        "adamw_frozen_mlp": lambda s: 2.0 + 0.01 * s - NOISE[s],
    },
}
PRIMARY = FIXING_EFFECT + CALIBRATED_SUFFIX
FAMILY = ["start_main_effect_best_lr", "start_x_frozen_best_lr", "adamw_frozen_mlp_best_lr-adamw_best_lr"]


def write_variant_runs(root, variant: str) -> list[str]:
    """The variant's runs: the final ones named ARM_best_lr (attnid train --arm), the stage's named by their
    arm's case and options, as the stage trains them at its lr."""
    runs = []
    for arm, loss in LOSSES[variant].items():
        for seed in SEEDS:
            named = {"arm": arm + CALIBRATED_SUFFIX} if variant == "final" else OPTIONS.get(arm, {})
            run_dir = write_run(root / variant / arm / f"seed{seed}", CASES[arm], seed, 1e-3, dtype="float32")
            info = json.loads((run_dir / "run.json").read_text())
            info["final_val_loss_full"] = loss(seed)
            info["config"].update(named)
            (run_dir / "run.json").write_text(json.dumps(info))
            runs.append(str(run_dir))
    return runs


def per_seed(variant: str, comparison: str) -> np.ndarray:
    """The comparison's per-seed differences, from the losses above (the contrasts' definitions)."""
    loss = LOSSES[variant]
    contrast = next((c for c in CONTRASTS if c.name + CALIBRATED_SUFFIX == comparison), None)
    if contrast is None:
        arm = comparison.split("-")[0].removesuffix(CALIBRATED_SUFFIX)
        return np.array([loss[arm](s) - loss["adamw"](s) for s in SEEDS])
    return np.array(
        [
            sum(w * loss[arm](s) for w, arm in contrast.arm_terms)
            - sum(w * loss[arm](s) for w, arm in contrast.baseline_terms)
            for s in SEEDS
        ]
    )


RULE = ["--alpha", str(ALPHA), "--equivalence-margin", str(MARGIN), "--primary", PRIMARY, "--family", *FAMILY]


def test_every_row_of_the_robustness_table_is_recomputed_from_its_seeds(tmp_path):
    runs = {variant: write_variant_runs(tmp_path / "runs", variant) for variant in LOSSES}
    out = tmp_path / "tables"
    variants = [word for variant, dirs in runs.items() for word in ("--variant", variant, *dirs)]
    assert main(["interventions-robustness", *variants, "--out-dir", str(out), *RULE]) == 0
    table = pd.read_csv(out / "interventions_robustness.csv")
    assert list(table.columns) == [
        "variant", "comparison", "role", "n", "delta", "ci_low", "ci_high", "p", "outcome", "seeds_positive"
    ]  # fmt: skip
    assert table[["variant", "comparison"]].values.tolist() == [
        [variant, name] for variant in LOSSES for name in (PRIMARY, *FAMILY)
    ]
    for variant in LOSSES:
        rows = table[table["variant"] == variant].set_index("comparison")
        raw = {name: enumerated_sign_flip_p(per_seed(variant, name)) for name in (PRIMARY, *FAMILY)}
        adjusted = holm_by_hand({name: raw[name] for name in FAMILY}) | {PRIMARY: raw[PRIMARY]}
        for name, row in rows.iterrows():
            values = per_seed(variant, name)
            low, high = stats.t.interval(1 - ALPHA, len(values) - 1, values.mean(), stats.sem(values))
            assert row["n"] == len(values) and row["seeds_positive"] == int((values > 0).sum())
            assert row["delta"] == pytest.approx(values.mean(), abs=1e-12)
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high), abs=1e-12)
            assert row["p"] == pytest.approx(adjusted[name])
    # the per-seed table holds each row's pairs: its differences give the row's numbers again
    seeds = pd.read_csv(out / "interventions_robustness_seeds.csv")
    assert set(zip(seeds["variant"], seeds["comparison"])) == set(zip(table["variant"], table["comparison"]))
    for row in table.itertuples():
        kept = seeds[(seeds["variant"] == row.variant) & (seeds["comparison"] == row.comparison)]
        assert kept["difference"].to_numpy() == pytest.approx(per_seed(row.variant, row.comparison))
        assert kept["difference"].mean() == pytest.approx(row.delta, abs=1e-12)
        assert int((kept["difference"] > 0).sum()) == row.seeds_positive
    # the final variant's outcomes are interventions.csv's verdicts for the same runs and rule
    assert (
        main(["interventions-table", "--runs", *runs["final"], "--out-dir", str(tmp_path / "t"), *RULE]) == 0
    )
    verdicts = pd.read_csv(tmp_path / "t" / "interventions.csv").set_index("comparison")["verdict"]
    final = table[table["variant"] == "final"].set_index("comparison")["outcome"]
    assert final.to_dict() == {name: verdicts[name] for name in final.index}


def test_a_variant_without_runs_or_named_twice_is_one_line(tmp_path, capsys):
    runs = write_variant_runs(tmp_path / "runs", "final")
    out = str(tmp_path / "tables")
    for variants, message in [
        (["--variant", "final"], "variant final lists no runs"),
        (["--variant", "final", *runs, "--variant", "final", *runs], "variant final given twice"),
    ]:
        assert main(["interventions-robustness", *variants, "--out-dir", out, *RULE]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines


def robust_config(tmp_path, at_stage_lr: bool) -> dict:
    config = smoke_config()
    config["results_dir"] = str(tmp_path / "results")
    section = config["interventions"]
    section["arms"] = [arm for arm in section["arms"] if arm["case"] != "adamw_rebalance"]
    section["verdict"]["family"] = [name for name in section["verdict"]["family"] if "rebalance" not in name]
    section["calibration"] = {
        "arms": ["adamw_gauge_fixed", "adamw_frozen_mlp"],
        "lr_factors": [0.5, 1, 2],
        "seeds": [100, 101],
        "refine": {"top": 2, "seeds": [102, 103]},
        "at_stage_lr": at_stage_lr,
    }
    section["robustness"] = {"variants": ["stage_lr", "one_seed", "round1"]}
    if not at_stage_lr:  # the arms are compared at their best lrs alone
        section["verdict"] |= {
            "primary": "adamw_gauge_fixed_best_lr-adamw_best_lr",
            "family": ["adamw_frozen_mlp_best_lr-adamw_best_lr"],
        }
    return config


@pytest.mark.parametrize("at_stage_lr", [True, False])
def test_a_variant_reuses_the_final_runs_where_its_pick_is_the_final_one(tmp_path, at_stage_lr):
    """Each variant's runs: the final runs of an arm whose pick is the final one, the stage's runs at the
    stage's lr where the stage has them, else the arm's robustness runs at the pick's lr (planned, each
    with the arm's settings at that lr); never a run trained twice."""
    planned = plan(copy.deepcopy(robust_config(tmp_path, at_stage_lr)))
    stage = planned.stage_lrs
    arms = planned.calibration_arms
    assert arms == ["adamw", "adamw_gauge_fixed", "adamw_frozen_mlp"]
    # final: the stage's lr for adamw, twice it for the gauge arm, half of it for the frozen-MLP arm
    final = {
        "adamw": stage["adamw"],
        "adamw_gauge_fixed": 2 * stage["adamw"],
        "adamw_frozen_mlp": 0.5 * stage["adamw"],
    }
    picks = {"final": final, "round1": dict(final, adamw=2 * stage["adamw"]), "one_seed": final}
    rows = [
        {"arm": arm, "pick": pick, "lr": lr, "n_seeds": 2}
        for pick, of in picks.items()
        for arm, lr in of.items()
    ]
    picks_file = tmp_path / "calibration_picks.csv"
    pd.DataFrame(rows).to_csv(picks_file, index=False)
    variants = planned.robustness_runs(picks_file)
    assert list(variants) == ["final", "stage_lr", "one_seed", "round1"]
    best = {arm: planned.arm_runs[arm + CALIBRATED_SUFFIX] for arm in arms}
    assert variants["final"] == variants["one_seed"] == [d for arm in arms for d in best[arm]]

    def own(arm, lr):
        label = lr_label(lr)
        return [
            f"{planned.results_dir}/robustness/{arm}/lr{label}/seed{s}" for s in planned.intervention_seeds
        ]

    assert (
        variants["round1"]
        == own("adamw", 2 * stage["adamw"]) + best["adamw_gauge_fixed"] + best["adamw_frozen_mlp"]
    )
    for arm in ("adamw_gauge_fixed", "adamw_frozen_mlp"):  # at the stage's lr, which is not their final pick
        expected = planned.arm_runs[arm] if at_stage_lr else own(arm, stage[arm])
        assert set(expected) <= set(variants["stage_lr"])
    assert set(best["adamw"]) <= set(variants["stage_lr"])
    for run_dir in variants["round1"][: len(planned.intervention_seeds)]:
        spec = planned.robustness[run_dir]
        assert spec.settings["lr"] == 2 * stage["adamw"] and spec.settings["arm"] == "adamw_best_lr"
    needed = {d for dirs in variants.values() for d in dirs}
    assert not needed & set(planned.calibration_runs + planned.refine_runs)
