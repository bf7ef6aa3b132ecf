"""The interventions study around the arms (attnid.plan.interventions and the gathers): its plan and
config checks, the DAG's reuse of the cases' runs, the arms told apart by their moments, the identities in
claims.csv computed from the runs (passing and failing), and Figure 6 with its caption filled from the
same numbers as interventions.csv."""

from __future__ import annotations

import copy
import json
import re
from shlex import split as shlex_split

import pandas as pd
import pytest
import yaml
from figure_checks import invisible_legend_entries, overlapping_labels, visible_labels
from pipeline_helpers import (
    REPO,
    copy_pipeline,
    run_snakemake,
    smoke_config,
    stderr_lines,
    train_jobs,
)
from synthetic_runs import write_run

from attnid import cli
from attnid.plan import ConfigError, interventions, plan
from attnid.plan.schema import config_schema, option_schema
from attnid.reports import appendix, claims, figures, tables
from attnid.reports.figures import fig6_interventions
from attnid.reports.figures.inputs import Sources
from attnid.reports.interventions_table import (
    interventions_table,
    load_runs_by_arm,
    write_interventions_table,
)
from attnid.reports.statistics import minimum_seeds
from attnid.training.rundir import load_run

DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())
PAPER = yaml.safe_load((REPO / "config/paper.yaml").read_text())
# paper.yaml also asks for SmolLM2, whose package the README's set-up line does not install: without it a
# build is refused in one line (test_pipeline's paper DAG test). The interventions stage does not depend on
# it, so its tests plan paper.yaml without SmolLM2 and pass with or without the package.
PAPER["quantization"]["smollm2"] = False
NO_SMOLLM2 = {"quantization": "{smollm2: false}"}
# The default's arms at the stage's lr with a plain verdict rule and no calibration (nor its robustness
# variants): the section the config checks below change one key of.
PLAIN = {
    **DEFAULT,
    "interventions": {
        **{
            k: v
            for k, v in DEFAULT["interventions"].items()
            if k not in ("calibration", "plateau", "robustness")
        },
        "seeds": list(range(8)),
        "verdict": {"alpha": 0.05, "equivalence_margin": 0.01, "family": ["adamw_gauge_fixed"]},
    },
}


# ---------------------------------------------------------------------------- the plan


def _stage(config: dict) -> dict:
    """{arm: [its runs' settings]} of the stage's runs (the pairs the table makes), the case runs it
    reuses included."""
    planned = plan(copy.deepcopy(config))
    arms: dict[str, list] = {}
    for run_dir in planned.intervention_runs:
        spec = planned.runs[run_dir]
        arms.setdefault(interventions.arm_name(spec.case, spec.settings), []).append((run_dir, spec))
    return arms


DEFAULT_ARMS = (
    "adamw",
    "adamw_gauge_fixed",
    "adamw_gauge_fixed_at_init",
    "adamw_from_gauge_point",
    "adamw_frozen_mlp",
)


def test_the_default_stage_compares_every_arm_at_its_best_lr_on_its_own_model():
    """config.yaml: the 2 x 2 and the frozen-MLP control, each calibrated on seeds of its own over an lr grid
    around the section's lr and compared on the comparison seeds at its best lr only, adamw at adamw's; the
    stage trains its own small model for its own steps, the whole val split at declared steps; the primary
    comparison is the main effect of fixing, the margin a fraction of the calibrated baseline's loss."""
    section = DEFAULT["interventions"]
    stage = _stage(DEFAULT)
    assert list(stage) == [arm + "_best_lr" for arm in DEFAULT_ARMS]
    planned = plan(copy.deepcopy(DEFAULT))
    for arm, runs in stage.items():
        assert [spec.settings["seed"] for _, spec in runs] == section["seeds"], arm
        for run_dir, spec in runs:
            assert run_dir == f"results/default/interventions/{arm}/seed{spec.settings['seed']}"
            assert spec.best_lr_of == arm.removesuffix("_best_lr")
            for key in (
                "n_layer",
                "n_head",
                "n_embd",
                "block_size",
                "batch_size",
                "max_iters",
                "full_val_every",
            ):
                assert spec.settings[key] == section[key], (arm, key)
            assert spec.settings["weight_decay"] == DEFAULT["cases"]["adamw"]["weight_decay"]
    assert all(
        planned.runs[d].settings["max_iters"] == DEFAULT["training"]["max_iters"] for d in planned.case_runs
    )
    # the calibration: every arm at each lr of its grid, on seeds none of which is compared
    calibration = section["calibration"]
    assert planned.calibration_arms == list(DEFAULT_ARMS)
    lrs = {float(f"{section['lr'] * factor:.10g}") for factor in calibration["lr_factors"]}
    assert len(planned.calibration_runs) == len(DEFAULT_ARMS) * len(lrs) * len(calibration["seeds"])
    assert {planned.runs[d].settings["lr"] for d in planned.calibration_runs} == lrs
    assert not set(calibration["seeds"]) & set(section["seeds"])
    assert planned.one_job_per_arm and planned.lockstep
    # the float64 identity run stays in the default, with its own length
    (identity,) = planned.identity_runs
    assert planned.runs[identity].case == "adamw_projected"
    assert planned.runs[identity].settings.items() >= {"dtype": "float64", "max_iters": 200}.items()
    rule = section["verdict"]
    comparisons = interventions.planned_comparisons(DEFAULT)
    assert rule["primary"] == "fixing_main_effect_best_lr" and rule["primary"] in comparisons
    assert set(rule["family"]) <= set(comparisons) and rule["primary"] not in rule["family"]
    # the frozen-MLP control like for like in the family (as many entries frozen, from the same start);
    # against adamw it is made and shown, outside the family (docs/experiments.md, 2026-12-07)
    assert "adamw_frozen_mlp_best_lr-adamw_gauge_fixed_at_init_best_lr" in rule["family"]
    assert interventions.arm_name("adamw", {"freeze_mlp": True}) == interventions.FROZEN_MLP_ARM
    assert "adamw_frozen_mlp_best_lr-adamw_best_lr" in set(comparisons) - set(rule["family"])
    assert len(section["seeds"]) >= minimum_seeds(rule["alpha"], len(rule["family"]))
    assert interventions.check_interventions_config(DEFAULT) == []
    flags = interventions.verdict_options(DEFAULT, "tables/calibration.csv")
    assert flags[:6] == [
        "--alpha", "0.05", "--margin-fraction", "0.005", "--calibration", "tables/calibration.csv"
    ]  # fmt: skip
    assert flags[6:8] == ["--primary", rule["primary"]] and flags[-len(rule["family"]) - 1 :] == [
        "--family",
        *rule["family"],
    ]
    with pytest.raises(ValueError, match="needs its table"):
        interventions.verdict_options(DEFAULT)
    # what each gathering job is told, its CLI takes: the table the plateau check too, the robustness
    # variants the rule alone (a default build once failed at its last job on --plateau-last)
    rule_only = interventions.verdict_options(DEFAULT, "tables/calibration.csv", plateau_check=False)
    assert "--plateau-last" in flags and "--plateau-last" not in rule_only
    table, robustness = "interventions-table", "interventions-robustness"
    cli.build_parser(table).parse_args([table, "--runs", "r", "--out-dir", "o", *flags])
    variant = ["--variant", "final", "r", "--out-dir", "o"]
    cli.build_parser(robustness).parse_args([robustness, *variant, *rule_only])
    with pytest.raises(SystemExit):
        cli.build_parser(robustness).parse_args([robustness, *variant, *flags])


def test_the_paper_stage_has_every_arm_sgd_with_and_without_the_gauge_and_the_calibration():
    """paper.yaml: 16 seeds of every arm at the cases' 5,000 steps (adamw's and the kept moments' runs of
    the cases' seeds are the case runs), sgd_gauge_fixed against sgd with sgd's lr and adamw's settings
    otherwise (not the sgd case's float64), and every arm but the lr control at its own best lr: a grid of
    4 lrs on 2 seeds of its own, then the comparison seeds at the best."""
    section = PAPER["interventions"]
    stage = _stage(PAPER)
    plain = [
        "adamw",
        "sgd",
        "adamw_projected",
        "adamw_gauge_fixed",
        "adamw_gauge_fixed_at_init",
        "adamw_from_gauge_point",
        "adamw_frozen_mlp",
        "adamw_lr2x",
        "adamw_rebalance",
        "adamw_rebalance_first_moment",
        "sgd_gauge_fixed",
    ]
    calibrated = ["adamw", "sgd", *section["calibration"]["arms"]]
    assert list(stage) == plain + [arm + "_best_lr" for arm in calibrated]
    rule = section["verdict"]
    assert rule["primary"] == "fixing_main_effect_best_lr" and section["full_val_every"] == 250
    assert all(len(runs) == 16 for runs in stage.values()) and section["seeds"] == list(range(16))
    planned = plan(copy.deepcopy(PAPER))
    reused = [d for d in planned.intervention_runs if "/runs/" in d]
    assert sorted(reused) == [
        f"results/paper/runs/{case}/seed{s}" for case in ("adamw", "adamw_rebalance") for s in range(3)
    ]
    assert {spec.settings["max_iters"] for runs in stage.values() for _, spec in runs} == {5000}
    for arm in ("sgd", "sgd_gauge_fixed"):
        for _, spec in stage[arm]:
            assert spec.settings["lr"] == PAPER["cases"]["sgd"]["lr"] and "dtype" not in spec.settings
            assert spec.settings["weight_decay"] == PAPER["cases"]["sgd"]["weight_decay"]
    assert interventions.arm_baseline("sgd_gauge_fixed", "sgd_gauge_fixed") == "sgd"
    # the calibration: 10 arms x 4 lrs x 2 seeds, none a comparison seed; each calibrated run waits for it
    grid = section["calibration"]
    assert (
        len(planned.calibration_runs) == len(calibrated) * len(grid["lr_factors"]) * len(grid["seeds"]) == 80
    )
    assert not set(grid["seeds"]) & set(section["seeds"])
    lrs: dict[str, set] = {}
    for run_dir in planned.calibration_runs:  # results/paper/calibration/<arm>/lr<lr>/seed<N>
        lrs.setdefault(run_dir.split("/")[3], set()).add(planned.runs[run_dir].settings["lr"])
    assert sorted(lrs["adamw_gauge_fixed"]) == [5e-4, 1e-3, 2e-3, 4e-3]
    assert sorted(lrs["sgd_gauge_fixed"]) == [0.25, 0.5, 1.0, 2.0]
    assert len(planned.calibrated()) == 16 * len(calibrated) == 160
    for run_dir in planned.calibrated():
        arm = run_dir.split("/")[3]
        assert planned.runs[run_dir].best_lr_of == arm.removesuffix("_best_lr")
        assert planned.runs[run_dir].settings["arm"] == arm
    family = section["verdict"]["family"]
    planned_comparisons = interventions.planned_comparisons(PAPER)
    descriptive = [
        "adamw_frozen_mlp",
        "adamw_frozen_mlp_best_lr-adamw_best_lr",
    ]  # like for like in the family
    assert (
        sorted([rule["primary"], *family, *descriptive]) == sorted(planned_comparisons) and len(family) == 24
    )
    assert {
        "adamw_frozen_mlp-adamw_gauge_fixed_at_init",
        "adamw_frozen_mlp_best_lr-adamw_gauge_fixed_at_init_best_lr",
    } <= set(family)
    assert "sgd_gauge_fixed-sgd" in family and "sgd_gauge_fixed_best_lr-sgd_best_lr" in family
    assert minimum_seeds(section["verdict"]["alpha"], len(family)) == 10 < 16
    assert interventions.check_interventions_config(PAPER) == []


def test_the_smoke_stage_is_the_default_s_arms_at_toy_size_below_the_rule_s_minimum():
    smoke = smoke_config()
    stage = _stage(smoke)
    default_arms = [arm.removesuffix("_best_lr") for arm in _stage(DEFAULT)]
    assert list(stage)[:5] == default_arms and list(stage)[5:] == ["adamw_rebalance_first_moment"]
    section = smoke["interventions"]
    assert section["seeds"] == [0] and all(len(runs) == 1 for runs in stage.values())
    rule = section["verdict"]
    assert len(section["seeds"]) < minimum_seeds(rule["alpha"], 1)
    assert rule["primary"] == DEFAULT["interventions"]["verdict"]["primary"].removesuffix("_best_lr")
    assert {rule["primary"], *rule["family"]} <= set(interventions.planned_comparisons(smoke))
    # at the cases' length: adamw's runs are the case runs
    assert [run_dir for run_dir, _ in stage["adamw"]] == ["results/smoke/runs/adamw/seed0"]


def test_the_stage_s_settings_reach_every_run_of_the_stage_and_the_identity_s_own_win():
    """Section-level run settings apply to every arm, baseline and calibration run and to the identity run,
    whose own keys win; the cases keep theirs. They are run settings generated from TrainConfig (typed and
    bounded as its fields), and not those that make an arm what it is."""
    config = smoke_config()
    config["interventions"] |= {"max_iters": 30, "tau_every": 2, "eval_every": 10}
    config["interventions"]["calibration"] = {
        "arms": ["adamw_gauge_fixed"],
        "lr_factors": [0.5, 2],
        "seeds": [9],
    }
    planned = plan(copy.deepcopy(config))
    stage = planned.intervention_runs + planned.calibration_runs
    assert stage and all(d.startswith("results/smoke/interventions/") or "/calibration/" in d for d in stage)
    for run_dir in stage:
        assert (
            planned.runs[run_dir].settings.items()
            >= {"max_iters": 30, "tau_every": 2, "eval_every": 10}.items()
        )
    (identity,) = planned.identity_runs
    own = config["interventions"]["identity"]
    assert (
        planned.runs[identity].settings.items()
        >= {
            "max_iters": own["max_iters"],
            "eval_every": own["eval_every"],
            "tau_every": 2,
            "dtype": "float64",
        }.items()
    )
    assert all(
        planned.runs[d].settings["max_iters"] == config["training"]["max_iters"] for d in planned.case_runs
    )
    # the identity run measures whatever the stage says
    config["interventions"]["metrics"] = False
    planned = plan(copy.deepcopy(config))
    assert planned.runs[planned.intervention_runs[-1]].settings["metrics"] is False
    assert planned.runs[planned.identity_runs[0]].settings["metrics"] is True
    # the schema: generated from the fields
    section = config_schema()["properties"]["interventions"]["properties"]
    assert section["max_iters"] == option_schema("max_iters") | section["max_iters"]
    assert {"arm", "initial_point", "freeze_mlp", "rebalance_moments"}.isdisjoint(section)
    assert section["lr"] == option_schema("lr") | section["lr"]  # the stage's lr: its AdamW arms' own
    assert section["n_embd"] == option_schema("n_embd") | section["n_embd"]  # and its own model
    for change, message in (
        ({"max_iters": 0}, "interventions/max_iters: 0 is less than the minimum of 1"),
        ({"max_iters": 7.5}, "interventions/max_iters: 7.5 is not of type 'integer'"),
        ({"arm": "x"}, "interventions: Additional properties are not allowed ('arm' was unexpected)"),
    ):
        bad = smoke_config()
        bad["interventions"] |= change
        with pytest.raises(ConfigError) as caught:
            plan(bad)
        assert str(caught.value) == message


BAD_SECTIONS = [
    ({"arms": [{"case": "adamw"}]}, "'adamw' is a baseline (of the arms that train its optimizer)"),
    ({"arms": [{"case": "sgd"}]}, "'sgd' is a baseline"),
    ({"arms": [{"case": "sgd_momentum"}]}, "sgd_momentum trains the optimizer of no baseline (adamw, sgd)"),
    (
        {"arms": [{"case": "adamw_projected", "rebalance_moments": "first-moment"}]},
        "needs a rebalancing case",
    ),
    (
        {"arms": [{"case": "adamw_projected"}, {"case": "adamw_projected"}]},
        "adamw_projected listed twice",
    ),
    (
        {"arms": [{"case": "adamw_rebalance"}, {"case": "adamw_rebalance", "rebalance_moments": "keep"}]},
        "adamw_rebalance listed twice",
    ),
    (
        {
            "arms": [{"case": "adamw_gauge_fixed"}],
            "verdict": {
                **PLAIN["interventions"]["verdict"],
                "family": ["adamw_gauge_fixed", "start_x_frozen"],
            },
        },
        "start_x_frozen is no comparison of the arms (they make: adamw_gauge_fixed)",
    ),
    ({"arms": [{"case": "adamw", "lr": 2e-3}]}, "an arm that sets lr names itself (arm: NAME)"),
    ({"arms": [{"case": "adamw", "arm": "adamw_best_lr"}]}, "a name ending in _best_lr is the calibration's"),
    (
        {"calibration": {"arms": ["adamw_projected"], "lr_factors": [1, 2], "seeds": [9]}},
        "adamw_projected is no arm of the stage (they are: adamw, adamw_gauge_fixed,",
    ),
    (
        {
            "arms": [{"case": "adamw", "lr": 2e-3, "arm": "adamw_lr2x"}],
            "calibration": {"arms": ["adamw_lr2x"], "lr_factors": [1, 2], "seeds": [9]},
        },
        "adamw_lr2x sets its own lr: the calibration chooses an arm's lr",
    ),
    (
        {"calibration": {"arms": ["adamw_gauge_fixed"], "lr_factors": [1, 2], "seeds": [7, 8]}},
        "seed(s) 7 are also comparison seeds",
    ),
    (
        {
            "calibration": {
                "arms": ["adamw_gauge_fixed"],
                "lr_factors": [1, 2],
                "seeds": [9],
                "refine": {"top": 2, "seeds": [10, 7]},
            }
        },
        "seed(s) 7 are also comparison seeds",
    ),
    (
        {
            "calibration": {
                "arms": ["adamw_gauge_fixed"],
                "lr_factors": [1, 2],
                "seeds": [9],
                "refine": {"top": 2, "seeds": [9, 10]},
            }
        },
        "seed(s) 9 are round 1's too: round 2 adds seeds of its own",
    ),
    (
        {
            "calibration": {
                "arms": ["adamw_gauge_fixed"],
                "lr_factors": [1, 2],
                "seeds": [9],
                "refine": {"top": 3, "seeds": [10]},
            }
        },
        "the 3 best of a grid of 2 lrs",
    ),
    (
        {"robustness": {"variants": ["stage_lr"]}},
        "its variants move the calibrated arms' lrs: no calibration",
    ),
    (
        {
            "calibration": {"arms": ["adamw_gauge_fixed"], "lr_factors": [1, 2], "seeds": [9]},
            "robustness": {"variants": ["round1"]},
        },
        "round1 is the final pick without calibration/refine",
    ),
    (
        {"verdict": {**PLAIN["interventions"]["verdict"], "primary": "fixing_main_effect_best_lr"}},
        "fixing_main_effect_best_lr is no comparison of the arms",
    ),
    (
        {"verdict": {**PLAIN["interventions"]["verdict"], "primary": "adamw_gauge_fixed"}},
        "adamw_gauge_fixed is also in the family: the primary comparison is tested alone",
    ),
    (
        {
            "verdict": {
                **PLAIN["interventions"]["verdict"],
                "equivalence_margin": {"fraction_of_baseline_loss": 0.005},
            }
        },
        "fraction_of_baseline_loss needs adamw in the calibration",
    ),
    (
        {"plateau": {"last_fraction": 0.25, "improvement": 0.01}, "full_val_every": 700},
        "full_val_every (700) must divide that step",
    ),
]


def test_lockstep_needs_one_job_per_arm():
    config = copy.deepcopy(DEFAULT)
    config["interventions"]["one_job_per_arm"] = False
    with pytest.raises(ConfigError, match="interventions/lockstep: .*needs one_job_per_arm: true"):
        plan(config)
    config["interventions"]["lockstep"] = False
    assert not plan(config).lockstep


@pytest.mark.parametrize(
    "change, refusal",
    [
        ({"metrics": True}, "it measures rho, beta, tau, mu"),
        ({"dropout": 0.1}, "--dropout is not 0"),
        ({"compile": True}, "--compile is on"),
    ],
)
def test_a_run_lockstep_cannot_train_is_a_config_error(change, refusal):
    """Every run of a lockstep job is checked as `attnid train-runs --lockstep` checks it, at config time."""
    config = copy.deepcopy(DEFAULT)
    config["interventions"].update(change)
    with pytest.raises(
        ConfigError, match=rf"interventions/lockstep: run .* cannot train in lockstep: {refusal}"
    ):
        plan(config)
    config["interventions"]["lockstep"] = False
    assert plan(config).lockstep_runs() == []


@pytest.mark.parametrize("change, message", BAD_SECTIONS)
def test_a_bad_interventions_section_is_one_problem(change, message):
    config = {**PLAIN, "interventions": {**PLAIN["interventions"], **change}}
    problems = interventions.check_interventions_config(config)
    assert len(problems) == 1 and message in problems[0][1], problems
    no_baseline = {**PLAIN, "cases": {k: v for k, v in PLAIN["cases"].items() if k != "adamw"}}
    key, problem = interventions.check_interventions_config(no_baseline)[0]
    assert key == "interventions" and "no case 'adamw' under cases" in problem
    sgd_arm = {**PLAIN["interventions"], "arms": [{"case": "sgd_gauge_fixed"}]}
    no_sgd = {**PLAIN, "interventions": sgd_arm, "cases": {"adamw": PLAIN["cases"]["adamw"]}}
    assert interventions.check_interventions_config(no_sgd)[0][1].startswith("no case 'sgd' under cases")


def test_a_calibrated_arm_is_compared_with_its_baseline_at_the_baseline_s_best_lr():
    calibration = {"arms": ["adamw_gauge_fixed"], "lr_factors": [1, 2], "seeds": [9]}
    config = {**PLAIN, "interventions": {**PLAIN["interventions"], "calibration": calibration}}
    assert interventions.check_interventions_config(config) == []
    comparisons = interventions.planned_comparisons(config)
    assert comparisons[-4:] == [
        "adamw_gauge_fixed_best_lr-adamw_best_lr",
        "fixing_main_effect",
        "start_main_effect",
        "start_x_frozen",
    ]
    arms = interventions.intervention_arms(config)
    assert [arm.name for arm in arms][-2:] == ["adamw_best_lr", "adamw_gauge_fixed_best_lr"]
    assert (
        arms[-1].settings() == {"arm": "adamw_gauge_fixed_best_lr"} and arms[-1].baseline == "adamw_best_lr"
    )
    # at_stage_lr: false: only the arms at their best lr are compared (and trained on the comparison seeds)
    config["interventions"]["calibration"] = calibration | {"at_stage_lr": False}
    assert [arm.name for arm in interventions.intervention_arms(config)] == [
        "adamw_best_lr",
        "adamw_gauge_fixed_best_lr",
    ]
    assert interventions.planned_comparisons(config) == ["adamw_gauge_fixed_best_lr-adamw_best_lr"]


def test_a_run_that_attnid_train_refuses_is_a_config_error_naming_its_key():
    """The identity run's warmup longer than its steps passes the schema; the plan checks every run as
    `attnid train` will, and names the section that asks for it."""
    config = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    config["interventions"]["identity"].update(max_iters=10, warmup_iters=20)
    with pytest.raises(ConfigError) as caught:
        plan(config)
    assert str(caught.value).startswith("interventions/identity: need 0 <= --warmup-iters (20) <")
    assert "(run results/smoke/interventions/identity/seed0)" in str(caught.value)


def test_the_default_dag_trains_each_arm_s_seeds_in_one_job_after_its_calibration(tmp_path):
    """Dry run of the default config: one `attnid train-runs` job per arm (its comparison seeds, at its best
    lr: their specs are the calibration table's outputs) and one per round of the calibration (every arm's
    runs of the round, each arm's a lockstep group across its lrs);
    the gather pairs exactly the arms' runs, with the rule's primary and margin rule; the identity run is
    float64."""
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p", configfile=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, section = DEFAULT["results_dir"], DEFAULT["interventions"]
    jobs = train_jobs(tmp_path, proc.stdout)
    expected = {
        f"{out}/interventions/{arm}_best_lr/seed{seed}" for arm in DEFAULT_ARMS for seed in section["seeds"]
    }
    planned = {run_dir for run_dir in jobs if run_dir.startswith(f"{out}/interventions/")}
    assert planned == expected | {f"{out}/interventions/identity/seed0"}
    for run_dir in expected:
        assert jobs[run_dir]["lr"] == {"calibrated": run_dir.split("/")[3].removesuffix("_best_lr")}
        assert jobs[run_dir]["max_iters"] == section["max_iters"]
    assert jobs[f"{out}/interventions/identity/seed0"]["dtype"] == "float64"
    per_arm = re.findall(r"attnid train-runs --configs .*? --outs (.*?) --data", proc.stdout)
    commands = re.findall(r"attnid train-runs [^\n]*", proc.stdout)
    assert len(commands) == len(per_arm) and all(" --lockstep " in command for command in commands)
    # per arm: its comparison seeds; round 1: every arm at every lr of the grid on its seeds; round 2:
    # every arm at its top lrs on its seeds (the robustness variants' jobs are known only after the
    # calibration)
    grid, refine = section["calibration"], section["calibration"]["refine"]
    arms = len(grid["arms"])
    assert sorted(len(shlex_split(outs)) for outs in per_arm) == sorted(
        [len(section["seeds"])] * len(DEFAULT_ARMS)
        + [len(grid["seeds"]) * arms * len(grid["lr_factors"])]
        + [len(refine["seeds"]) * arms * refine["top"]]
    )
    for rank in range(1, refine["top"] + 1):  # each round-2 run waits for round 1's table to have its lr
        run_dir = f"{out}/calibration/adamw/top{rank}/seed{refine['seeds'][0]}"
        assert jobs[run_dir]["lr"] == {"calibrated": "adamw", "rank": rank}
    assert re.search(r"attnid calibration-table --runs [^\n]* --refine-runs ", proc.stdout)
    assert "interventions_robustness" in proc.stdout
    assert {jobs[f"{out}/runs/adamw/seed{seed}"]["max_iters"] for seed in DEFAULT["seeds"]} == {
        DEFAULT["training"]["max_iters"]
    }
    gather = re.search(r"attnid interventions-table --runs ([^\n]*) --out-dir", proc.stdout).group(1).split()
    assert sorted(gather) == sorted(expected)
    command = re.search(r"attnid interventions-table [^\n]*", proc.stdout).group(0)
    assert "--primary fixing_main_effect_best_lr" in command and "--margin-fraction 0.005" in command
    assert "--plateau-last 0.25" in command
    assert "--identity-runs" in re.search(r"attnid figures fig6 [^\n]*", proc.stdout).group(0)


def test_interventions_null_turns_the_stage_off(tmp_path):
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p", config={"interventions": "null"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interventions/" not in proc.stdout and "interventions-table" not in proc.stdout
    assert (
        "fig6" not in proc.stdout
        and "--omit" in proc.stdout
        and "interventions" in re.search(r"attnid appendix [^\n]*", proc.stdout).group(0)
    )
    smoke = smoke_config()
    smoke["interventions"]["arms"].append({"case": "adamw_gauge_fixed"})
    (tmp_path / "config/twice.yaml").write_text(yaml.safe_dump(smoke))
    proc = run_snakemake(tmp_path, "-n", configfile="config/twice.yaml")
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0] == "config error: interventions/arms: adamw_gauge_fixed listed twice"


def test_the_paper_dag_waits_for_the_calibration_before_the_runs_at_the_best_lr(tmp_path):
    """Dry run of paper.yaml: every training job of the plan, the calibration runs' and the calibrated
    runs' too; each calibrated run's spec is an output of `attnid calibration-table` (its pending spec says
    which arm's best lr it takes), whose inputs are every calibration run."""
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p", configfile="config/paper.yaml", config=NO_SMOLLM2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = train_jobs(tmp_path, proc.stdout)
    planned = plan(copy.deepcopy(PAPER))
    # round 2: each calibrated arm's 2 best lrs of round 1 on 6 more seeds, at the stage's steps
    section = PAPER["interventions"]
    refined = len(planned.calibration_arms) * 2 * 6
    assert len(planned.refine_runs) == refined == 120
    assert set(jobs) == set(planned.trained()) and len(jobs) == 482 + refined
    steps = section.get("max_iters", PAPER["training"]["max_iters"])
    assert sum(int(job["max_iters"]) for job in jobs.values()) == 2_327_500 + refined * steps
    calibrated = planned.calibrated()
    for run_dir in calibrated:
        assert jobs[run_dir]["lr"] == {"calibrated": run_dir.split("/")[3].removesuffix("_best_lr")}
        assert not (tmp_path / planned.spec_file(run_dir)).exists()
    # round 1's table writes round 2's specs; the final table reads both rounds and writes the picks'
    first, final = sorted(
        re.findall(r"attnid calibration-table --runs ([^\n]*) > ", proc.stdout), key=lambda c: "--refine" in c
    )
    runs, _, pending = first.partition(" --out-dir ")
    assert runs.split() == planned.calibration_runs
    assert sorted(pending.split()[2:]) == sorted(planned.pending_spec_file(d) for d in planned.refine_runs)
    runs, _, pending = final.partition(" --out-dir ")
    first_round, _, second = runs.partition(" --refine-runs ")
    assert first_round.split() == planned.calibration_runs and second.split() == planned.refine_runs
    assert sorted(pending.split()[2:]) == sorted(planned.pending_spec_file(d) for d in calibrated)


@pytest.mark.slow
def test_the_calibration_end_to_end_at_toy_size(tmp_path, shakespeare_url):
    """A tiny config through Snakemake: the stage at its own length (its own adamw and sgd runs),
    sgd_gauge_fixed against sgd, and the gauge arm and adamw calibrated on a seed of their own. The runs at
    the best lr train with calibration.csv's lowest mean loss; the table pairs runs of equal steps, each arm
    with its baseline; a second run has nothing to do."""
    copy_pipeline(tmp_path)
    smoke = smoke_config()
    tiny = {key: smoke[key] for key in ("data_sha256", "device", "threads", "resources")}
    tiny |= {
        "results_dir": "results/tiny",
        "data_url": shakespeare_url,
        "paper_pdf": False,
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 32, "batch_size": 16},
        "training": {"max_iters": 10, "log_every": 3, "eval_every": 3, "warmup_iters": 1, "eval_iters": 2},
        "cases": {
            "adamw": {"lr": 1e-3, "weight_decay": 0.1},
            "sgd": {"lr": 0.3, "weight_decay": 0.0, "dtype": "float64"},
        },
        "seeds": [0],
        "sweep": {},
        "interventions": {
            "max_iters": 6,
            "one_job_per_arm": True,
            "lockstep": True,  # the default's jobs: each calibration round one job, each arm one group
            "metrics": False,
            "arms": [{"case": "adamw_gauge_fixed"}, {"case": "sgd_gauge_fixed"}],
            "seeds": [0, 1],
            "calibration": {
                "arms": ["adamw_gauge_fixed"],
                "lr_factors": [0.5, 2],
                "seeds": [7],
                "refine": {"top": 1, "seeds": [8]},
            },
            "robustness": {"variants": ["stage_lr", "one_seed", "round1"]},
            "verdict": {
                "alpha": 0.05,
                "equivalence_margin": 0.01,
                "family": [
                    "adamw_gauge_fixed",
                    "sgd_gauge_fixed-sgd",
                    "adamw_gauge_fixed_best_lr-adamw_best_lr",
                ],
            },
            "identity": {"seeds": [0], "max_iters": 4, "warmup_iters": 1},
        },
    }
    (tmp_path / "config/tiny.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    target = "results/tiny/tables/interventions.csv"
    robustness_target = "results/tiny/tables/interventions_robustness.csv"
    # a flag between --configfile (which takes every word after it) and the targets
    proc = run_snakemake(
        tmp_path,
        "-p",
        target,
        robustness_target,
        configfile="config/tiny.yaml",
        progress="the calibration at toy size",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each round one job; in it each arm one lockstep group, its runs at their own lrs (round 1: 2 lrs)
    for round_, runs in (("round1", 2), ("round2", 1)):
        log = (tmp_path / f"results/tiny/logs/calibration/{round_}.log").read_text()
        assert f"lockstep group 2/2: {runs} runs" in log and "group 3/" not in log, log[-2000:]
    tables = tmp_path / "results/tiny/tables"
    calibration = pd.read_csv(tables / "calibration.csv")
    first = calibration[calibration["round"] == 1]
    assert first[["arm", "lr"]].values.tolist() == [
        ["adamw", 5e-4],
        ["adamw", 2e-3],
        ["adamw_gauge_fixed", 5e-4],
        ["adamw_gauge_fixed", 2e-3],
    ]
    # round 2 (top 1): round 1's best lr on seed 8 too, the pick the same lr over both rounds' seeds
    best = first.loc[first.groupby("arm")["mean"].idxmin()].set_index("arm")["lr"]
    second = calibration[calibration["round"] == 2].set_index("arm")
    assert second["lr"].to_dict() == best.to_dict() and set(second["n_seeds"]) == {2}
    assert (
        calibration["best"].sum() == 2
        and (calibration.loc[calibration["best"], "round"] == 2).all()
        and calibration.loc[calibration["best"], "lr"].tolist() == best.tolist()
    )
    for arm in ("adamw", "adamw_gauge_fixed"):
        info, _ = load_run(tmp_path / f"results/tiny/calibration/{arm}/top1/seed8")
        assert info["lr"] == best[arm] and info["seed"] == 8
    # the variants: one seed's and round 1's picks are the final ones (their runs the final runs), the
    # stage's lr the stage's own runs, so each row is one of interventions.csv's
    robustness = pd.read_csv(tables / robustness_target.rsplit("/", 1)[1])
    assert set(robustness["variant"]) == {"final", "stage_lr", "one_seed", "round1"}
    by_variant = robustness.set_index(["variant", "comparison"])["delta"]
    final = by_variant["final"]["adamw_gauge_fixed_best_lr-adamw_best_lr"]
    assert by_variant["one_seed"].tolist() == by_variant["round1"].tolist() == [final]
    compared = pd.read_csv(tables / "interventions.csv").set_index("comparison")["delta_mean"]
    assert final == pytest.approx(compared["adamw_gauge_fixed_best_lr-adamw_best_lr"], abs=1e-12)
    stage = by_variant["stage_lr"]["adamw_gauge_fixed_best_lr-adamw_best_lr"]
    assert stage == pytest.approx(compared["adamw_gauge_fixed"], abs=1e-12)
    assert not (tmp_path / "results/tiny/robustness").exists()  # no run trained twice
    for seed in (0, 1):
        for arm in ("adamw", "adamw_gauge_fixed"):
            info, _ = load_run(tmp_path / f"results/tiny/interventions/{arm}_best_lr/seed{seed}")
            assert info["lr"] == best[arm] and info["config"]["arm"] == f"{arm}_best_lr"
            assert info["seed"] == seed and info["max_iters"] == 6
        info, _ = load_run(tmp_path / f"results/tiny/interventions/sgd/seed{seed}")
        # sgd with the sgd case's lr, the stage's settings otherwise (not the case's float64)
        assert info["lr"] == 0.3 and info["dtype"] == "float32" and info["max_iters"] == 6
    seeds = pd.read_csv(tables / "interventions_seeds.csv")
    assert sorted(set(zip(seeds["arm"], seeds["baseline"], strict=True))) == [
        ("adamw_gauge_fixed", "adamw"),
        ("adamw_gauge_fixed_best_lr", "adamw_best_lr"),
        ("sgd_gauge_fixed", "sgd"),
    ]
    assert len(seeds) == 6 and seeds["difference"].notna().all()
    table = pd.read_csv(tables / "interventions.csv")
    assert sorted(table["comparison"]) == sorted(tiny["interventions"]["verdict"]["family"])
    assert (table["verdict"] == "n too small").all()
    again = run_snakemake(tmp_path, "-n", target, robustness_target, configfile="config/tiny.yaml")
    assert "Nothing to be done" in again.stdout + again.stderr, (again.stdout + again.stderr)[-3000:]


# ---------------------------------------------------------------------------- gathering


def _run(root, arm_dir: str, case: str, seed: int, final: float, *, moments: str | None = None, **kwargs):
    run_dir = write_run(
        root / arm_dir / f"seed{seed}", case, seed, 1e-3, final_val_loss=final, dtype="float32", **kwargs
    )
    info = json.loads((run_dir / "run.json").read_text())
    if moments is not None:
        info["config"]["rebalance_moments"] = moments
    info["config"] |= {"n_layer": 2, "n_head": 4, "n_embd": 32}
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def study_runs(root, gauge_drop: int = 1024, rho_identity: float = 1e-29, transported_tau: float = 2e-7):
    """Three seeds of adamw and of every arm (attention 8,192 entries; D = 8, G = 4, L = 2: 2LGD^2 = 1,024)
    and a float64 identity run; numbers chosen so that each claim's measured value is known."""
    dirs = []
    for seed in range(3):
        base = 2.0 + 0.01 * seed
        dirs.append(_run(root, "adamw", "adamw", seed, base))
        dirs.append(
            _run(
                root,
                "adamw_projected",
                "adamw_projected",
                seed,
                base - 0.002,
                rho_qk=1e-12,
                rho_ov=1e-12,
                drift1=1e-8,
                drift2=1e-3,
            )
        )
        dirs.append(_run(root, "adamw_gauge_fixed", "adamw_gauge_fixed", seed, base - 0.05))
        dirs.append(_run(root, "adamw_rebalance", "adamw_rebalance", seed, base + 0.001, rebalance_every=20))
        dirs.append(
            _run(
                root,
                "adamw_rebalance_first_moment",
                "adamw_rebalance",
                seed,
                base + 0.03,
                moments="first-moment",
                rebalance_every=20,
                tau=transported_tau,
            )
        )
    for run_dir in dirs:
        info = json.loads((run_dir / "run.json").read_text())
        info["trained_attention_params"] = 8192 - (gauge_drop if info["case"] == "adamw_gauge_fixed" else 0)
        if info["case"] == "adamw_gauge_fixed":  # the same initial function: adamw's step-0 val loss
            info["gauge"] = {"condition": 30.0, "logit_change": 3e-7}
            metrics = pd.read_csv(run_dir / "metrics.csv")
            metrics.loc[0, "val_loss"] = 3.0 + 0.01 * info["seed"]
            metrics.to_csv(run_dir / "metrics.csv", index=False)
        (run_dir / "run.json").write_text(json.dumps(info))
    identity = write_run(
        root / "identity" / "seed0",
        "adamw_projected",
        0,
        1e-3,
        rho_qk=rho_identity,
        rho_ov=rho_identity,
        drift1=1e-17,
        drift2=1e-4,
        dtype="float64",
    )
    return [str(d) for d in dirs], [str(identity)]


def test_arms_are_told_apart_by_their_moments_and_transport_meets_keep(tmp_path):
    arm_dirs, _ = study_runs(tmp_path)
    by_arm = load_runs_by_arm(None, arm_dirs)
    assert list(by_arm) == [
        "adamw",
        "adamw_rebalance",
        "adamw_rebalance_first_moment",
        "adamw_projected",
        "adamw_gauge_fixed",
    ]
    table, notes = interventions_table(by_arm)
    final = table.set_index(["arm", "baseline"])
    assert set(final.index) == {
        ("adamw_rebalance", "adamw"),
        ("adamw_rebalance_first_moment", "adamw"),
        ("adamw_rebalance_first_moment", "adamw_rebalance"),
        ("adamw_projected", "adamw"),
        ("adamw_gauge_fixed", "adamw"),
    }
    assert final.loc[("adamw_rebalance_first_moment", "adamw_rebalance"), "comparison"] == (
        "adamw_rebalance_first_moment-adamw_rebalance"
    )
    assert final.loc[("adamw_rebalance_first_moment", "adamw_rebalance"), "delta_mean"] == pytest.approx(
        0.029
    )
    gauge = final.loc[("adamw_gauge_fixed", "adamw")]
    assert gauge["delta_mean"] == pytest.approx(-0.05) and not notes
    assert gauge["verdict"] == "n too small"  # 3 seeds, five comparisons: the rule needs 8


def test_the_identities_are_claims_computed_from_the_runs(tmp_path):
    arm_dirs, identity = study_runs(tmp_path / "good")
    good = claims.intervention_claims(
        tables.runs_table([_path(d) for d in arm_dirs]), tables.runs_table([_path(d) for d in identity])
    )
    results = {row["claim"]: row for row in good}
    assert [row["result"] for row in good] == ["pass"] * 6, good
    assert results["interventions: projected rho max < 1e-20"]["measured"] == pytest.approx(1e-29)
    assert results["interventions: projected drift1/drift2 < 1e-9"]["measured"] == pytest.approx(1e-13)
    assert results["interventions: gauge-fixed trains 2 L G D^2 fewer attention entries"]["measured"] == 0
    assert results["interventions: first-moment rebalance tau max < 1e-5"]["measured"] == pytest.approx(2e-7)
    # a wrong count, a projected step that moved along the orbit, a move that changed the function: fail
    arm_dirs, identity = study_runs(
        tmp_path / "bad", gauge_drop=1012, rho_identity=1e-12, transported_tau=1e-3
    )
    bad = {
        row["claim"]: row
        for row in claims.intervention_claims(
            tables.runs_table([_path(d) for d in arm_dirs]), tables.runs_table([_path(d) for d in identity])
        )
    }
    assert bad["interventions: gauge-fixed trains 2 L G D^2 fewer attention entries"]["measured"] == 12
    for claim in (
        "interventions: projected rho max < 1e-20",
        "interventions: first-moment rebalance tau max < 1e-5",
        "interventions: gauge-fixed trains 2 L G D^2 fewer attention entries",
    ):
        assert bad[claim]["result"] == "fail", bad[claim]
    # an identity run in float32 cannot resolve the float64 thresholds
    float32 = write_run(tmp_path / "f32" / "seed0", "adamw_projected", 0, 1e-3, rho_qk=1e-12, dtype="float32")
    rows = {
        row["claim"]: row for row in claims.intervention_claims(pd.DataFrame(), tables.runs_table([float32]))
    }
    assert rows["interventions: projected rho max < 1e-20"]["result"] == claims.NOT_APPLICABLE
    assert rows["interventions: gauge-fixed initial logits = adamw's (< 1e-5)"]["result"] == "missing"
    # arms that move no moments (the default config's) make no first-moment claim, not a `missing` row
    assert "interventions: first-moment rebalance tau max < 1e-5" not in rows


def _path(run_dir):
    from pathlib import Path

    return Path(run_dir)


def test_figure6_and_its_caption_carry_the_tables_numbers(tmp_path):
    """Figure 6 as the workflow's rule makes it: from the interventions tables (and the runs, for the orbit
    panels); its caption carries every comparison's numbers and says that 3 seeds decide nothing."""
    arm_dirs, identity = study_runs(tmp_path / "runs")
    table = write_interventions_table(None, tmp_path / "tables", runs=arm_dirs)[0]
    sources = Sources(tables=tmp_path / "tables", intervention_runs=arm_dirs, identity_runs=identity)
    paths = figures.make_figure("fig6", sources, tmp_path)
    assert [p.name for p in paths] == ["fig6.png", "fig6.pdf", "fig6.rst"]
    assert paths[0].stat().st_size > 10_000
    fig = fig6_interventions.draw(sources).figure  # every series shown, the projected arm's on its floors
    assert not invisible_legend_entries(fig) and not overlapping_labels(fig)
    for title in ("unidentified share", "first-order drift"):
        (ax,) = [ax for ax in fig.axes if ax.get_title().startswith(title)]
        expected = {"AdamW", "AdamW, projected (float32)", "AdamW, projected (float64 identity run)"}
        assert expected <= visible_labels(ax), visible_labels(ax)
    caption = " ".join((tmp_path / "fig6.rst").read_text().split())
    assert caption.startswith("**Figure 6 — does identification change training?")
    assert "{{" not in caption and "{%" not in caption
    value = figures.caption_value
    for row in table.itertuples():
        shown = f"``{row.comparison}`` {value(row.delta_mean)} [{value(row.ci_low)}, {value(row.ci_high)}]"
        assert f"{shown}, n = 3, n too small, detectable none at this n" in caption, shown
    assert "With 3 seed pairs no comparison is decided" in caption and "at most 1e-29" in caption
    tex = appendix.figure_caption("fig6", tmp_path)["caption"]
    assert tex.startswith(r"\textbf{does identification change") and "$-$0.05" in tex  # a true minus sign


def _figure_inputs(printed: str, figure: str) -> list[str]:
    """The input files of the ``figure`` job that ``snakemake -n`` printed."""
    for block in printed.split("rule figure:")[1:]:
        if re.search(rf"wildcards: figure={figure}\b", block):
            return re.search(r"input: ([^\n]*)", block).group(1).split(", ")
    raise AssertionError(f"no figure job for {figure}")


def test_figure6_s_rule_reads_the_calibration_and_the_along_table_where_the_build_has_them(tmp_path):
    """Dry runs: the default config (a calibration, whole-split evaluations along the way) hands Figure 6
    calibration.csv and interventions_along.csv; the smoke config (no calibration) the along table only."""
    copy_pipeline(tmp_path)
    for configfile, config in ((None, DEFAULT), ("config/smoke.yaml", smoke_config())):
        tables = f"{config['results_dir']}/tables"
        target = f"{config['results_dir']}/figures/fig6.png"
        proc = run_snakemake(tmp_path, "-n", target, configfile=configfile)
        assert proc.returncode == 0, proc.stderr[-3000:]
        inputs = _figure_inputs(proc.stdout, "fig6")
        assert f"{tables}/interventions_along.csv" in inputs and f"{tables}/interventions.csv" in inputs
        assert (f"{tables}/calibration.csv" in inputs) == bool(config["interventions"].get("calibration"))
    assert DEFAULT["interventions"].get("calibration") and not smoke_config()["interventions"].get(
        "calibration"
    )
