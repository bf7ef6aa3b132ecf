"""The smoke pipeline on a real single-node SLURM cluster, through profiles/slurm (issue #5).

Starts munge, MariaDB, slurmdbd, slurmctld and slurmd under tmp_path
(tests/helpers/slurm_cluster.py), runs the whole smoke DAG (fetch, prepare, counts, verify, every training
run, tables, figures, appendix) with ``--profile profiles/slurm`` plus test-only overrides,
preempts one running training job with ``scontrol requeue``, and checks:

- every job of the DAG ran as a SLURM job (sacct); the training jobs requested the GPU and no other job did;
- the preempted job was requeued by SLURM (the profile's ``slurm-requeue``) and the DAG finished;
- the tables equal those of a local run of the same DAG.

Needs root and Debian's slurm/munge/mariadb packages (the README's apt line; ``.ci/run`` installs
them): without them it skips and names what is missing, except under ``.ci/run``, where it fails.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_helpers import (
    REPO,
    TABLES,
    copied_study_runs,
    copy_pipeline,
    expected_outputs,
    job_counts,
    run_showing_progress,
    run_snakemake,
    shared_smoke_run,
    smoke_config,
    snakemake_env,
)
from slurm_cluster import PARTITION, SlurmCluster, missing_requirements
from system_packages import require_or_skip

PROFILE = REPO / "profiles" / "slurm"
SNAKEMAKE_TIMEOUT_S = 1500
TIMING = ("wall_time_s", "wall_s", "tokens_per_s")
# rules with one job per seed of the config's edits section
PER_EDIT_SEED_RULES = ("prune_biases", "balance")
# rules whose job count the test derives from the config, not from the rule list
COUNTED_RULES = ("all", "reuse_study_run", *PER_EDIT_SEED_RULES)


def _workflow_text() -> str:
    text = "\n".join(path.read_text() for path in sorted((REPO / "workflow" / "rules").glob("*.smk")))
    return text + (REPO / "Snakefile").read_text()


def declared_rules() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(training rules, every other rule with one job) as the workflow declares them.

    Read from the rule files, so a new stage is covered without editing this test: every
    training rule is ``train_case`` or a ``use rule train_case as ... with:`` of it.
    """
    text = _workflow_text()
    training = ("train_case", *re.findall(r"^\s*use rule train_case as (\w+) with:", text, re.MULTILINE))
    others = tuple(
        rule
        for rule in re.findall(r"^\s*rule (\w+):", text, re.MULTILINE)
        if rule not in training and rule not in COUNTED_RULES and rule not in local_rules()
    )
    return training, others


def local_rules() -> tuple[str, ...]:
    """The rules whose jobs run beside Snakemake, never on SLURM (``localrule: True``): the spec files."""
    blocks = re.split(r"^(?=\s*(?:use )?rule \w+)", _workflow_text(), flags=re.MULTILINE)
    return tuple(
        match.group(1)
        for block in blocks
        if (match := re.match(r"\s*rule (\w+):", block)) and re.search(r"^\s*localrule: True", block, re.M)
    )


TRAINING_RULES, OTHER_RULES = declared_rules()
LOCAL_RULES = local_rules()


def test_the_rule_lists_are_read_from_the_workflow():
    assert {"train_case", "train_sweep", "train_study", "train_edits", "train_intervention"} <= set(
        TRAINING_RULES
    )
    assert {"fetch_data", "census", "intervention_table", "appendix"} <= set(OTHER_RULES)
    assert not set(OTHER_RULES) & set(COUNTED_RULES)
    assert LOCAL_RULES == ("spec_file",)


def profile_settings() -> dict:
    return yaml.safe_load((PROFILE / "config.yaml").read_text())


def test_profile_requeues_and_sets_resources():
    profile = profile_settings()
    assert profile["executor"] == "slurm" and profile["slurm-requeue"] is True
    assert profile["retries"] >= 1 and profile["rerun-incomplete"] is True
    assert {"runtime", "mem_mb"} <= set(profile["default-resources"])
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"snakemake-executor-plugin-slurm==' in pyproject  # pinned in the [slurm] extra


def slurm_snakemake_command(shakespeare_url: str) -> list[str]:
    """snakemake --profile profiles/slurm + the overrides this test cluster needs.

    A command-line option replaces the profile's value of the same option, so the
    profile's default-resources and set-resources are repeated with the additions.
    """
    profile = profile_settings()
    default_resources = [f"{k}={v}" for k, v in profile["default-resources"].items()]
    default_resources.append(f"slurm_partition={PARTITION}")
    set_resources = [
        f"{rule}:{k}={v}" for rule, res in profile["set-resources"].items() for k, v in res.items()
    ]
    # The smoke config trains on the CPU; ask for the (fake) GPU anyway, as config/paper.yaml does.
    set_resources += [f"{rule}:gpu=1" for rule in TRAINING_RULES]
    return [
        "timeout",
        "-k",
        "20",
        str(SNAKEMAKE_TIMEOUT_S),
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        str(PROFILE),
        "--configfile",
        "config/smoke.yaml",
        "--slurm-no-account",
        "--default-resources",
        *default_resources,
        "--set-resources",
        *set_resources,
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--seconds-between-status-checks",
        "2",
        "--jobs",
        "6",
        "--config",
        f"data_url={shakespeare_url}",
    ]


def preempt_first_training_job(cluster: SlurmCluster, stop: threading.Event, preempted: list[str]) -> None:
    """Requeue (as a preemption would) the first training job seen RUNNING for a few seconds."""
    while not stop.is_set():
        result = subprocess.run(
            ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k|%M"],
            capture_output=True,
            text=True,
            env=cluster.env,
            timeout=30,
        )
        for line in result.stdout.splitlines():
            job_id, comment, elapsed = line.split("|")
            if comment.startswith("rule_train_case") and elapsed not in ("0:00", "0:01", "0:02"):
                requeue = subprocess.run(
                    ["scontrol", "requeue", job_id],
                    capture_output=True,
                    text=True,
                    env=cluster.env,
                    timeout=30,
                )
                if requeue.returncode == 0:
                    preempted.append(job_id)
                    return
        stop.wait(0.5)


def _numeric_equal(a: pd.Series, b: pd.Series, atol: float) -> bool:
    pairs = zip(a.astype(float), b.astype(float))
    return all(
        (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=atol) for x, y in pairs
    )


def assert_tables_match(got_dir: Path, want_dir: Path) -> None:
    """Same rows and values, timing aside; tau (a round-off measurement, ~1e-7) to 1e-5 absolute."""
    for name in (t for t in TABLES if t.endswith(".csv")):
        got, want = pd.read_csv(got_dir / name), pd.read_csv(want_dir / name)
        assert list(got.columns) == list(want.columns) and got.shape == want.shape, name
        for column in got.columns:
            if column in TIMING:
                continue
            if pd.api.types.is_numeric_dtype(want[column]):
                round_off = column.startswith("tau") or (name == "claims.csv" and column == "measured")
                tau_rows = want["claim"].str.contains("tau") if name == "claims.csv" else None
                if tau_rows is not None and round_off:
                    ok = _numeric_equal(
                        got[column][~tau_rows], want[column][~tau_rows], 0.0
                    ) and _numeric_equal(got[column][tau_rows], want[column][tau_rows], 1e-5)
                else:
                    ok = _numeric_equal(got[column], want[column], 1e-5 if round_off else 0.0)
                assert ok, f"{name}: column {column} differs:\n{got[column]}\n{want[column]}"
            else:
                assert (
                    got[column].fillna("").astype(str).tolist()
                    == want[column].fillna("").astype(str).tolist()
                ), f"{name}: column {column} differs"


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.ci  # the smoke build again, through SLURM: .ci/run runs it after the README's command
def test_smoke_pipeline_on_a_real_slurm_cluster(tmp_path, shakespeare_url, tmp_path_factory):
    require_or_skip(missing_requirements(), "the SLURM test")
    local_dir = shared_smoke_run(
        tmp_path_factory, shakespeare_url
    )  # the local reference (shared, built once)
    workdir = copy_pipeline(tmp_path / "wf")
    config = smoke_config()
    dry = run_snakemake(workdir, "-n", config={"data_url": shakespeare_url})
    planned = job_counts(dry.stdout)  # every job the smoke build has, by rule
    runs = sum(1 for path in expected_outputs(config) if path.endswith("/run.json"))
    n_training = runs - len(copied_study_runs(config))  # a repeated study point is copied, not trained

    with SlurmCluster(tmp_path / "slurm") as cluster:
        env = snakemake_env()
        env.update(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=f"{cluster.bin}:{env['PATH']}")
        stop, preempted = threading.Event(), []
        watcher = threading.Thread(
            target=preempt_first_training_job, args=(cluster, stop, preempted), daemon=True
        )
        watcher.start()
        started = time.monotonic()
        try:
            proc = run_showing_progress(
                slurm_snakemake_command(shakespeare_url),
                workdir,
                env,
                SNAKEMAKE_TIMEOUT_S + 60,
                "the smoke build on a SLURM test cluster",
            )
        finally:
            stop.set()
            watcher.join(timeout=60)
        elapsed = time.monotonic() - started
        diagnostics = (
            f"\n--- snakemake ---\n{(proc.stdout + proc.stderr)[-5000:]}\n--- daemons ---\n{cluster.logs()}"
        )
        assert proc.returncode == 0, f"snakemake exited {proc.returncode} after {elapsed:.0f} s" + diagnostics
        print(f"smoke DAG through SLURM: {elapsed:.0f} s")

        fields = ["JobID", "JobName", "State", "Comment", "AllocTRES", "ReqTRES", "ExitCode"]
        jobs = cluster.sacct(fields)  # the last record of every job
        attempts = cluster.sacct(fields, duplicates=True)  # every run of every job (requeues too)

    training = [job for job in jobs if job["Comment"].startswith(tuple(f"rule_{r}_" for r in TRAINING_RULES))]
    others = [job for job in jobs if job not in training]
    # every training job was a SLURM job that completed, and asked for (and got) the GPU
    assert len(training) == n_training, [job["Comment"] for job in jobs]
    assert len({job["Comment"] for job in training}) == n_training
    for job in training:
        assert job["State"] == "COMPLETED", job
        assert "gres/gpu=1" in job["ReqTRES"] and "gres/gpu=1" in job["AllocTRES"], job
    # every other rule of the DAG ran on SLURM too, without a GPU; the local ones (the spec files) beside
    # Snakemake
    ran = sorted(job["Comment"].removeprefix("rule_").split("_wildcards_")[0] for job in others)
    expected = [
        rule
        for rule, count in planned.items()
        if rule not in (*TRAINING_RULES, *LOCAL_RULES, "all")
        for _ in range(count)
    ]
    assert planned["spec_file"] == n_training and not set(ran) & set(LOCAL_RULES)
    assert set(expected) <= {*OTHER_RULES, *COUNTED_RULES}, expected  # the rule files declare each
    assert planned.get("reuse_study_run", 0) == len(copied_study_runs(config))  # copies of a repeated point
    assert ran == sorted(expected), others
    assert all("gres/gpu" not in job["ReqTRES"] for job in others), others
    # the preempted job was requeued by SLURM (not resubmitted by Snakemake) and then completed
    assert preempted, "no training job was seen running long enough to preempt"
    runs_of_preempted = [a for a in attempts if a["JobID"] == preempted[0]]
    assert any(a["State"] == "REQUEUED" for a in runs_of_preempted), runs_of_preempted
    assert runs_of_preempted[-1]["State"] == "COMPLETED", runs_of_preempted

    missing_outputs = [path for path in expected_outputs(config) if not (workdir / path).is_file()]
    assert not missing_outputs, missing_outputs
    tables = Path(config["results_dir"]) / "tables"
    assert_tables_match(workdir / tables, local_dir / tables)
