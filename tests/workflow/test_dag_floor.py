"""benchmarks/dag_floor.py reads the workflow's own training commands: every `attnid train` job of a dry
run parses with `attnid train`'s flags (and its spec file, from the plan: a dry run writes none) and lands
in a stage, and a build's benchmark files add up per stage. (The timing itself is a benchmark, never a
test.)"""

from __future__ import annotations

import argparse
import importlib.util
import os

import pytest
from pipeline_helpers import REPO, copy_pipeline, smoke_config

from attnid.cli.train import add_train_arguments, config_from_args
from attnid.plan import plan


@pytest.fixture(scope="module")
def dag_floor():
    spec = importlib.util.spec_from_file_location("dag_floor", REPO / "benchmarks" / "dag_floor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_training_job_of_the_smoke_build_is_read(dag_floor, monkeypatch, tmp_path):
    monkeypatch.chdir(copy_pipeline(tmp_path))  # the dry run's .snakemake/ goes there, not into the checkout
    jobs = dag_floor.train_commands(tmp_path / "config" / "smoke.yaml")
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    stages: dict[str, int] = {}
    runs = dag_floor.planned(tmp_path / "config" / "smoke.yaml")
    for words in jobs:
        # a shell word the parser does not know would exit here
        flags = parser.parse_args(dag_floor.with_written_specs(words, runs, tmp_path / "written"))
        stage = dag_floor.stage_of(flags.out, "results/smoke")
        stages[stage] = stages.get(stage, 0) + 1
        assert config_from_args(flags).max_iters > 0  # the settings of its spec file (--config)
    # every run the plan trains (a copied study point is not a job), in the stage the plan puts it
    planned: dict[str, int] = {}
    for run_dir in plan(smoke_config()).trained():
        stage = dag_floor.stage_of(run_dir, "results/smoke")
        planned[stage] = planned.get(stage, 0) + 1
    assert stages == planned and set(stages) == {"runs", "sweep", "studies", "edits", "interventions"}


def test_benchmark_files_add_up_per_stage(dag_floor, tmp_path):
    header = "s\th:m:s\tmax_rss\n"
    for relative, seconds in [
        ("runs/adamw/seed0.tsv", 10.5),
        ("runs/sgd/seed0.tsv", 20.0),
        ("interventions/identity/seed0.tsv", 4.0),
        ("census.tsv", 3.0),
    ]:
        path = tmp_path / relative
        os.makedirs(path.parent, exist_ok=True)
        path.write_text(header + f"{seconds}\t0:00:10\t100\n")
    assert dag_floor.measured_job_seconds(tmp_path) == {"runs": 30.5, "interventions": 4.0, "census": 3.0}
