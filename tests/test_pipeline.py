"""The Snakemake pipeline: the smoke DAG end to end in a scratch directory, its idempotence,
one-line config errors, and the plan of the paper-scale configuration."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml

from pipeline_helpers import (REPO, copy_pipeline, expected_outputs, lr_label, run_snakemake, run_smoke_dag,
                              shared_smoke_run, smoke_config)


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory, shakespeare_url):
    return shared_smoke_run(tmp_path_factory, shakespeare_url)


def job_counts(dry_run_output: str) -> dict[str, int]:
    """The 'Job stats' table of a snakemake dry run as {rule: count}."""
    table = dry_run_output.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


@pytest.mark.slow
def test_smoke_dag_builds_every_target(smoke_dir):
    config = smoke_config()
    missing = [path for path in expected_outputs(config) if not (smoke_dir / path).is_file()]
    assert not missing, f"the smoke DAG did not make {missing}"
    for i in range(1, 5):
        assert (smoke_dir / f"figures/fig{i}.png").stat().st_size > 10_000
        assert (smoke_dir / f"figures/fig{i}.pdf").read_bytes().startswith(b"%PDF")
    # every job leaves a log and a benchmark
    case, seed = next(iter(config["cases"])), config["seeds"][0]
    assert (smoke_dir / f"results/logs/runs/{case}/seed{seed}.log").is_file()
    assert (smoke_dir / f"results/benchmarks/runs/{case}/seed{seed}.tsv").is_file()
    appendix = (smoke_dir / "paper/appendix.tex").read_text()
    assert "tab:experiment-cases" in appendix and "fig4" in appendix


@pytest.mark.slow
def test_smoke_diverged_sweep_point_is_a_finished_job(smoke_dir):
    config = smoke_config()
    huge = max(config["sweep"]["sgd"]["lrs"])
    run = json.loads((smoke_dir / f"results/sweep/sgd/lr{lr_label(huge)}/seed0/run.json").read_text())
    assert run["status"] == "diverged"
    sweep = pd.read_csv(smoke_dir / "results/tables/sweep.csv")
    row = sweep[(sweep["optimizer"] == "sgd") & (sweep["lr"] == huge)]
    assert row["status"].tolist() == ["diverged"]
    others = sweep[sweep["lr"] != huge]
    assert (others["status"] == "ok").all(), others
    assert "diverged" in (smoke_dir / "results/tables/sweep.tex").read_text()


@pytest.mark.slow
def test_smoke_tables_cover_every_run_and_claim(smoke_dir):
    config = smoke_config()
    runs = pd.read_csv(smoke_dir / "results/tables/runs.csv")
    assert len(runs) == len(config["cases"]) * len(config["seeds"])
    assert set(runs["case"]) == set(config["cases"])
    cases = pd.read_csv(smoke_dir / "results/tables/cases.csv")
    assert cases.set_index("case")["n_seeds"].to_dict() == {c: len(config["seeds"]) for c in config["cases"]}
    claims = pd.read_csv(smoke_dir / "results/tables/claims.csv")
    assert len(claims) == 10 and set(claims["result"]) <= {"pass", "fail", "missing", "not applicable (dtype)"}
    # the smoke runs are tiny, but AdamW must already move along unidentified directions
    adamw = runs[runs["case"] == "adamw"]
    assert (adamw["rho_qk_mean"] > 1e-3).all()


@pytest.mark.slow
def test_smoke_claims_pass_wherever_their_precision_applies(smoke_dir):
    """The smoke config trains sgd, sgd_wd and the SGD sweep in float64: E1 and E2 hold as identities there."""
    config = smoke_config()
    assert all(config["cases"][case]["dtype"] == "float64" for case in ("sgd", "sgd_wd"))
    assert config["sweep"]["sgd"]["dtype"] == "float64"
    claims = pd.read_csv(smoke_dir / "results/tables/claims.csv").set_index("claim")
    assert (claims["result"] == "pass").all(), claims[["measured", "dtype", "result"]]
    assert (claims.loc[claims.index.str.startswith("E1"), "dtype"] == "float64").all()
    runs = pd.read_csv(smoke_dir / "results/tables/runs.csv")
    assert set(runs.loc[runs["case"].isin(["sgd", "sgd_wd"]), "dtype"]) == {"float64"}
    assert set(runs.loc[runs["case"] == "adamw", "dtype"]) == {"float32"}
    sgd = pd.read_csv(smoke_dir / f"results/runs/sgd/seed{config['seeds'][0]}/metrics.csv")
    assert {"drift1_qk", "drift2_ov", "closure_qk"} <= set(sgd.columns)


@pytest.mark.slow
def test_second_run_has_nothing_to_do(smoke_dir, shakespeare_url):
    proc = run_smoke_dag(smoke_dir, shakespeare_url, "-n", "--nolock")  # --nolock: other tests read it too
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.slow
def test_report_has_all_four_figures(smoke_dir, shakespeare_url, tmp_path):
    report = tmp_path / "report.html"
    proc = run_smoke_dag(smoke_dir, shakespeare_url, "--nolock", "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = report.read_text(errors="replace")
    for i in range(1, 5):
        assert f"fig{i}.png" in html
    assert "identification by design" in html and "learning-rate sweep" in html  # the .rst captions


@pytest.mark.parametrize("setting, where", [
    ("threads=0", "threads"),            # range
    ("modle=3", "modle"),                # unknown key
    ("cases={sdg: {lr: 0.1}}", "sdg"),   # case name not in the enum
])
def test_bad_config_value_fails_with_one_line(tmp_path, setting, where):
    copy_pipeline(tmp_path)
    key, value = setting.split("=", 1)
    proc = run_snakemake(tmp_path, "-n", config={key: value})
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("config error: ") and where in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_configfile_replaces_the_default_and_sweeps_need_their_case(tmp_path):
    copy_pipeline(tmp_path)
    config = smoke_config()
    del config["cases"]["sgd_wd"]  # a --configfile is the whole config: no default case creeps back
    (tmp_path / "config/mine.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert job_counts(proc.stdout)["train_case"] == 4 * len(config["seeds"])
    config["sweep"]["sgd_wd"] = {"lrs": [0.1, 0.2], "seeds": [0], "max_iters": 5}
    (tmp_path / "config/mine.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: sweep/sgd_wd"), proc.stderr


def test_paper_config_plans_the_expected_jobs(tmp_path):
    copy_pipeline(tmp_path)
    paper = yaml.safe_load((REPO / "config/paper.yaml").read_text())
    proc = run_snakemake(tmp_path, "-n", configfile="config/paper.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    n_sweep = sum(len(s["lrs"]) * len(s["seeds"]) for s in paper["sweep"].values())
    assert counts["train_case"] == len(paper["cases"]) * len(paper["seeds"]) == 15
    assert counts["train_sweep"] == n_sweep
    for rule in ("fetch_data", "prepare_data", "counts", "verify", "tables", "figures", "appendix", "all"):
        assert counts[rule] == 1, counts
    # CUDA jobs ask for a GPU; every training job has its own log and benchmark
    train_jobs = re.findall(r"rule train_case:.*?(?=\n\n|\Z)", proc.stdout, re.S)
    assert train_jobs and all("gpu=1" in job for job in train_jobs)
    assert all("benchmark: results/benchmarks/runs/" in job for job in train_jobs)
    assert "--device cuda" in proc.stdout or "--n-layer 6" in proc.stdout or train_jobs


def test_default_config_is_valid_and_plans_all_cases(tmp_path):
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p", configfile=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert set(default["cases"]) == {"sgd", "sgd_wd", "sgd_momentum", "adamw", "adamw_rebalance"}
    assert counts["train_case"] == 5 * len(default["seeds"])
    # the shell command carries the case's own settings and one thread per job
    assert re.search(r"attnid train .*--case adamw_rebalance .*--rebalance-every 200", proc.stdout)
    assert re.search(r"attnid train .*--case sgd .*--threads 1", proc.stdout)
    assert "gpu=" not in proc.stdout  # CPU config asks for no GPU
