"""benchmarks/build_budget.py: a build's job time per stage and in all, from Snakemake's benchmark files,
against its budget (the exit status says whether the build is over it)."""

from __future__ import annotations

import importlib.util

import pytest
from pipeline_helpers import REPO

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


@pytest.fixture(scope="module")
def build_budget():
    spec = importlib.util.spec_from_file_location("build_budget", REPO / "benchmarks" / "build_budget.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_benchmarks(results, files):
    for relative, seconds in files.items():
        path = results / "benchmarks" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = "".join(f"{s}\t0:00:01\t1\t1\t1\t1\t0\t0\t50\t{s}\n" for s in seconds)
        path.write_text(HEADER + rows)


FILES = {
    "runs/adamw/seed0.tsv": [100.25],
    "runs/sgd/seed0.tsv": [50.5],
    "interventions/adamw_best_lr.tsv": [240.0],
    "interventions/identity/seed0.tsv": [4.0],
    "calibration/adamw/lr0.01.tsv": [30.0, 31.0],  # a job benchmarked twice (repeat): both rows count
    "verify.tsv": [2.0],
    "census.tsv": [3.0],
}


def test_job_time_adds_up_per_stage(build_budget, tmp_path):
    write_benchmarks(tmp_path, FILES)
    per_stage = build_budget.stage_seconds(tmp_path / "benchmarks")
    assert per_stage == {
        "runs": (2, pytest.approx(150.75)),
        "interventions": (2, pytest.approx(244.0)),
        "calibration": (1, pytest.approx(61.0)),
        "theory": (2, pytest.approx(5.0)),
    }


@pytest.mark.parametrize("budget, status", [(461.0, 0), (460.0, 1)])
def test_exit_status_says_whether_over_budget(build_budget, tmp_path, capsys, budget, status):
    write_benchmarks(tmp_path, FILES)  # 460.75 s in all
    assert build_budget.main([str(tmp_path), "--budget", str(budget)]) == status
    printed = capsys.readouterr().out
    assert ("OVER budget" in printed) == bool(status)
    assert build_budget.main([str(tmp_path), "--budget", str(budget), "--report-only"]) == 0


def test_a_folder_without_benchmarks_is_one_line(build_budget, tmp_path, capsys):
    assert build_budget.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cpu_time_is_the_other_column(build_budget, tmp_path):
    write_benchmarks(tmp_path, {"runs/adamw/seed0.tsv": [10.0]})
    path = tmp_path / "benchmarks" / "runs" / "adamw" / "seed0.tsv"
    path.write_text(path.read_text().replace("\t50\t10.0\n", "\t50\t4.5\n"))
    assert build_budget.stage_seconds(tmp_path / "benchmarks", "cpu_time") == {"runs": (1, 4.5)}
    assert build_budget.stage_seconds(tmp_path / "benchmarks") == {"runs": (1, 10.0)}
