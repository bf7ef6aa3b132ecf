"""The interventions study around the arms (attnid.plan.interventions and the gathers): its plan and
config checks, the DAG's reuse of the cases' runs, the arms told apart by their moments, the identities in
claims.csv computed from the runs (passing and failing), and Figure 6 with its caption filled from the
same numbers as interventions.csv."""

from __future__ import annotations

import json
import re

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

from attnid.plan import ConfigError, interventions, plan
from attnid.reports import appendix, claims, figures, tables
from attnid.reports.figures import fig6_interventions
from attnid.reports.figures.inputs import Sources
from attnid.reports.interventions_table import (
    interventions_table,
    load_runs_by_arm,
    write_interventions_table,
)
from attnid.reports.statistics import minimum_seeds

DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())


# ---------------------------------------------------------------------------- the plan


def test_the_default_plan_has_every_arm_eight_seeds_and_a_float64_identity_run():
    arms = interventions.intervention_arms(DEFAULT)
    assert [arm.name for arm in arms] == [
        "adamw",
        "adamw_projected",
        "adamw_gauge_fixed",
        "adamw_rebalance",
        "adamw_rebalance_first_moment",
    ]
    # the rule's minimum: the smallest n at which the exact test can reject after Holm over the family
    smoke = smoke_config()
    for config, seeds in ((DEFAULT, 8), (yaml.safe_load((REPO / "config/paper.yaml").read_text()), 16)):
        section = config["interventions"]
        assert len(section["seeds"]) >= seeds
        rule = section["verdict"]
        assert len(section["seeds"]) >= minimum_seeds(rule["alpha"], len(rule["family"]))
        assert interventions.check_interventions_config(config) == []
    rule = smoke["interventions"]["verdict"]
    assert len(smoke["interventions"]["seeds"]) < minimum_seeds(rule["alpha"], len(rule["family"]))
    keep, first_moment = arms[3], arms[4]
    # a rebalancing arm rebalances as its case does; only the moments tell the two apart
    rebalance = {k: DEFAULT["cases"]["adamw_rebalance"][k] for k in ("rebalance_every", "rebalance_target")}
    assert interventions.arm_overrides(DEFAULT, keep) == rebalance
    moments = {"rebalance_moments": "first-moment"}
    assert interventions.arm_overrides(DEFAULT, first_moment) == rebalance | moments
    assert interventions.arm_overrides(DEFAULT, arms[1]) == {}
    identity = interventions.identity_overrides(DEFAULT)
    assert identity["dtype"] == "float64" and identity["max_iters"] < DEFAULT["training"]["max_iters"]
    assert "seeds" not in identity
    assert interventions.check_interventions_config(DEFAULT) == []
    assert interventions.intervention_arms({**DEFAULT, "interventions": None}) == []
    assert interventions.planned_comparisons(DEFAULT) == [
        "adamw_projected",
        "adamw_gauge_fixed",
        "adamw_rebalance",
        "adamw_rebalance_first_moment",
        "adamw_rebalance_first_moment-adamw_rebalance",
    ]
    flags = interventions.verdict_options(DEFAULT)
    assert flags[:4] == ["--alpha", "0.05", "--equivalence-margin", "0.01"] and flags[4] == "--family"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"arms": [{"case": "adamw"}]}, "'adamw' is the baseline of every arm"),
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
                "verdict": {
                    **DEFAULT["interventions"]["verdict"],
                    "family": ["adamw_projected", "start_x_frozen"],
                }
            },
            "start_x_frozen is no comparison of the arms",
        ),
        ({"arms": [{"case": "adamw", "lr": 2e-3}]}, "an arm that sets lr names itself (arm: NAME)"),
    ],
)
def test_a_bad_interventions_section_is_one_problem(change, message):
    config = {**DEFAULT, "interventions": {**DEFAULT["interventions"], **change}}
    problems = interventions.check_interventions_config(config)
    assert len(problems) == 1 and message in problems[0][1], problems
    no_baseline = {**DEFAULT, "cases": {k: v for k, v in DEFAULT["cases"].items() if k != "adamw"}}
    key, problem = interventions.check_interventions_config(no_baseline)[0]
    assert key == "interventions" and "no case 'adamw' under cases" in problem


def test_a_run_that_attnid_train_refuses_is_a_config_error_naming_its_key():
    """The identity run's warmup longer than its steps passes the schema; the plan checks every run as
    `attnid train` will, and names the section that asks for it."""
    config = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    config["interventions"]["identity"].update(max_iters=10, warmup_iters=20)
    with pytest.raises(ConfigError) as caught:
        plan(config)
    assert str(caught.value).startswith("interventions/identity: need 0 <= --warmup-iters (20) <")
    assert "(run results/smoke/interventions/identity/seed0)" in str(caught.value)


def test_the_dag_reuses_the_cases_runs_and_trains_the_rest_like_adamw(tmp_path):
    """Dry run of the default config: the baseline and kept-moments arm train only the seeds the cases do
    not; every arm job carries adamw's lr, weight decay and steps; the identity run is float64."""
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p", configfile=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = DEFAULT["results_dir"]
    jobs = train_jobs(tmp_path, proc.stdout)
    planned = {run_dir for run_dir in jobs if run_dir.startswith(f"{out}/interventions/")}
    extra_seeds = [s for s in DEFAULT["interventions"]["seeds"] if s not in DEFAULT["seeds"]]
    keep_arms = ("adamw", "adamw_rebalance")  # their runs for the cases' seeds are the case runs
    expected = {
        f"{out}/interventions/{arm}/seed{seed}"
        for arm in (
            "adamw",
            "adamw_projected",
            "adamw_gauge_fixed",
            "adamw_rebalance",
            "adamw_rebalance_first_moment",
        )
        for seed in DEFAULT["interventions"]["seeds"]
        if arm not in keep_arms or seed in extra_seeds
    }
    assert planned == expected | {f"{out}/interventions/identity/seed0"}
    assert f"{out}/interventions/adamw/seed{DEFAULT['seeds'][0]}" not in planned  # the case run is gathered
    adamw = DEFAULT["cases"]["adamw"]
    for run_dir in planned:
        job = jobs[run_dir]
        assert job["lr"] == adamw["lr"] and job["weight_decay"] == adamw["weight_decay"], job
        if "/identity/" in run_dir:
            assert job["case"] == "adamw_projected" and job["dtype"] == "float64"
        else:
            assert job["max_iters"] == DEFAULT["training"]["max_iters"]
    transport = [run_dir for run_dir, job in jobs.items() if job.get("rebalance_moments") == "first-moment"]
    assert transport and all(
        "/interventions/adamw_rebalance_first_moment/" in run_dir for run_dir in transport
    )
    assert {jobs[run_dir]["case"] for run_dir in transport} == {"adamw_rebalance"}
    gather = re.search(r"attnid interventions-table --runs ([^\n]*) --out-dir", proc.stdout).group(1).split()
    assert f"{out}/runs/adamw/seed0" in gather and f"{out}/runs/adamw_rebalance/seed0" in gather
    assert len(gather) == len(DEFAULT["interventions"]["seeds"]) * 5
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
