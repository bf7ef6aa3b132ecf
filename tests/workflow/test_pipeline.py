"""The Snakemake pipeline: the smoke DAG end to end in a scratch directory, its idempotence,
separate outputs per config, typed and merged --config overrides, one-line config errors,
failed jobs' reasons on the terminal, lint and formatting, and the plan of the paper-scale
configuration."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_helpers import (
    REPO,
    copy_pipeline,
    expected_outputs,
    job_counts,
    run_smoke_dag,
    run_snakemake,
    shared_smoke_run,
    smoke_config,
    stderr_lines,
    train_jobs,
)
from system_packages import needs

from attnid.plan import why_no_pdf
from attnid.plan.quantization import SMOLLM2_INSTALL, smollm2_gguf
from attnid.plan.runs import lr_label
from attnid.reports.claim_kinds import claim_kind

SMOKE = smoke_config()["results_dir"]


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory, shakespeare_url):
    return shared_smoke_run(tmp_path_factory, shakespeare_url)


@pytest.mark.slow
def test_smoke_dag_builds_every_target(smoke_dir):
    config = smoke_config()
    missing = [path for path in expected_outputs(config) if not (smoke_dir / path).is_file()]
    assert not missing, f"the smoke DAG did not make {missing}"
    for i in range(1, 9):  # Figure 8 too: the smoke build's alignment pairs (alignment/pairs_from)
        assert (smoke_dir / f"{SMOKE}/figures/fig{i}.png").stat().st_size > 10_000
        assert (smoke_dir / f"{SMOKE}/figures/fig{i}.pdf").read_bytes().startswith(b"%PDF")
    # every job leaves a log and a benchmark
    case, seed = next(iter(config["cases"])), config["seeds"][0]
    assert (smoke_dir / f"{SMOKE}/logs/runs/{case}/seed{seed}.log").is_file()
    assert (smoke_dir / f"{SMOKE}/benchmarks/runs/{case}/seed{seed}.tsv").is_file()
    appendix = (smoke_dir / f"{SMOKE}/paper/appendix.tex").read_text()
    assert "tab:experiment-cases" in appendix and "fig4" in appendix
    assert "tab:study-heads" in appendix and "tab:study-variants" in appendix and "fig5" in appendix
    assert "tab:interventions" in appendix and "fig6" in appendix and "fig7" in appendix
    assert "fig8" in appendix
    quantization = (smoke_dir / f"{SMOKE}/tables/claims.csv").read_text()
    assert "quantization: moves exact in float64" in quantization
    assert (smoke_dir / f"{SMOKE}/benchmarks/quantization/adamw/seed0.tsv").is_file()


@pytest.mark.slow
def test_smoke_build_makes_the_appendix_pdf_where_latexmk_is_installed(smoke_dir):
    """config/smoke.yaml's paper_pdf: auto, as the README says: the PDF where latexmk and the LaTeX packages
    exist, else none."""
    assert smoke_config()["paper_pdf"] == "auto"
    pdf = smoke_dir / SMOKE / "paper" / "main.pdf"
    if why_no_pdf() is not None:
        assert not pdf.exists()
    else:
        assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 50_000
        assert not list(pdf.parent.glob(".latexmk-*")), "scratch build folder left behind"


def _with_tex(tmp_path) -> dict:
    """An environment with a TeX for a dry run, which runs no latexmk: a latexmk, and a kpsewhich that finds
    every package, first on PATH. ``paper_pdf: true`` is then planned where TeX is not installed (the
    README's set-up line installs none); without one it is refused in one line
    (test_paper_pdf_true_without_latexmk_is_one_line below)."""
    fake = tmp_path / "tex-for-a-dry-run"
    fake.mkdir()
    (fake / "latexmk").write_text("#!/bin/sh\nexit 1\n")
    (fake / "kpsewhich").write_text('#!/bin/sh\necho "/usr/share/texmf/$1"\n')
    for program in ("latexmk", "kpsewhich"):
        (fake / program).chmod(0o755)
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), str(fake), os.environ["PATH"]])}


def _without_siunitx(tmp_path) -> dict:
    """An environment whose TeX lacks siunitx: a kpsewhich first on PATH that finds nothing."""
    fake = tmp_path / "tex-without-siunitx"
    fake.mkdir()
    (fake / "kpsewhich").write_text("#!/bin/sh\nexit 1\n")
    (fake / "kpsewhich").chmod(0o755)
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), str(fake), os.environ["PATH"]])}


@pytest.mark.slow
@needs("latexmk")
def test_paper_pdf_auto_without_siunitx_finishes_the_build_and_says_why_there_is_no_pdf(
    smoke_dir, shakespeare_url, tmp_path
):
    """With latexmk but not texlive-science, paper_pdf: auto leaves the PDF out and says so once (the
    appendix job, the one job that changes, finishes without it); paper_pdf: true is one config error."""
    workdir = tmp_path / "built"
    shutil.copytree(smoke_dir, workdir, symlinks=True)
    env = _without_siunitx(tmp_path)
    expected = (
        "paper_pdf: auto: this build makes no appendix PDF: siunitx.sty not found (the appendix sets its "
        "numbers with siunitx): apt-get install texlive-science"
    )
    proc = run_smoke_dag(workdir, shakespeare_url, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(expected) == 1, proc.stderr[-3000:]
    assert re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", proc.stderr) == ["appendix", "all"], proc.stderr
    # the job's --pdf went, nothing else (Snakemake 9.27 writes the empty side as '', older ones in words)
    assert re.search(r"before: '--pdf' now: (''|<nothing exclusive>)", proc.stderr), proc.stderr[-3000:]
    assert (workdir / SMOKE / "paper/appendix.tex").is_file()
    proc = run_smoke_dag(workdir, shakespeare_url, "-n", config={"paper_pdf": True}, env=env)
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0] == (
        "config error: paper_pdf: true, but siunitx.sty not found (the appendix sets its numbers with "
        "siunitx): apt-get install texlive-science (or set paper_pdf: auto)"
    )


@pytest.mark.slow
def test_smoke_diverged_sweep_point_is_a_finished_job(smoke_dir):
    config = smoke_config()
    huge = max(config["sweep"]["sgd"]["lrs"])
    run = json.loads((smoke_dir / f"{SMOKE}/sweep/sgd/lr{lr_label(huge)}/seed0/run.json").read_text())
    assert run["status"] == "diverged"
    sweep = pd.read_csv(smoke_dir / f"{SMOKE}/tables/sweep.csv")
    row = sweep[(sweep["optimizer"] == "sgd") & (sweep["lr"] == huge)]
    assert row["status"].tolist() == ["diverged"]
    others = sweep[sweep["lr"] != huge]
    assert (others["status"] == "ok").all(), others
    assert "diverged" in (smoke_dir / f"{SMOKE}/tables/sweep.tex").read_text()


@pytest.mark.slow
def test_smoke_tables_cover_every_run_and_claim(smoke_dir):
    config = smoke_config()
    runs = pd.read_csv(smoke_dir / f"{SMOKE}/tables/runs.csv")
    assert len(runs) == len(config["cases"]) * len(config["seeds"])
    assert set(runs["case"]) == set(config["cases"])
    cases = pd.read_csv(smoke_dir / f"{SMOKE}/tables/cases.csv")
    assert cases.set_index("case")["n_seeds"].to_dict() == {c: len(config["seeds"]) for c in config["cases"]}
    claims = pd.read_csv(smoke_dir / f"{SMOKE}/tables/claims.csv")
    comparisons = pd.read_csv(smoke_dir / f"{SMOKE}/tables/interventions.csv")
    verdicts = comparisons.loc[comparisons["in_family"].astype(bool), "verdict"].tolist()
    # the theory's five claims (T1-T6, of the theory stage's nullity.csv) and the experiments' ten first, the
    # interventions' six identities (the census's row between) and a row per verdict of its family, then the
    # quantization stage's four (its two identities, and two targets on the build's checkpoint), then the
    # alignment stage's one (its pairs exact), appended last
    assert claims["claim"].iloc[:5].str.match(r"T[1-6][ -]").all()
    assert claims["claim"].iloc[5:15].str.match(r"(E[123] |drift split)").all()
    assert claims["claim"].iloc[-11 - len(verdicts) : -5].str.startswith("interventions: ").all()
    assert claims["result"].iloc[-5 - len(verdicts) : -5].tolist() == verdicts and verdicts  # as labelled
    assert claims["claim"].iloc[-5:-1].str.startswith("quantization: ").all()
    assert claims["claim"].iloc[-1].startswith("alignment: ") and claims["result"].iloc[-1] == "pass"
    census = claims["claim"].str.startswith("whole-model census").sum()
    assert len(claims) == 5 + 10 + census + 6 + len(verdicts) + 4 + 1
    assert set(claims["result"]) - set(verdicts) <= {"pass", "fail", "holds", "rejected", "missing"} | {
        "not applicable (dtype)"
    }
    # each row's kind: the paper's T1-T6 and E1-E3, our findings (the census, the verdicts, the quantization
    # targets), the checks
    assert claims["kind"].tolist() == [claim_kind(c, p) for c, p in zip(claims["claim"], claims["paper"])]
    kinds = claims.groupby("kind")["claim"].apply(list)
    assert set(kinds.index) == {"paper", "finding", "check"}
    assert all(claim[0] in "TE" for claim in kinds["paper"]) and len(kinds["paper"]) == 5 + 9
    assert len(kinds["finding"]) == census + len(verdicts) + 2
    # the smoke runs are tiny, but AdamW must already move along unidentified directions
    adamw = runs[runs["case"] == "adamw"]
    assert (adamw["rho_qk_mean"] > 1e-3).all()


@pytest.mark.slow
def test_smoke_claims_pass_wherever_their_precision_applies(smoke_dir):
    """The smoke config trains sgd, sgd_wd and the SGD sweep in float64: E1 and E2 hold as identities
    there."""
    config = smoke_config()
    assert all(config["cases"][case]["dtype"] == "float64" for case in ("sgd", "sgd_wd"))
    assert config["sweep"]["sgd"]["dtype"] == "float64"
    claims = pd.read_csv(smoke_dir / f"{SMOKE}/tables/claims.csv").set_index("claim")
    # the quantization stage's targets (a picked seed, the optimized move) are measurements, which a 40-step
    # toy model need not meet; its identities (the same function at every point) must hold
    targets = claims.index.str.startswith("quantization: ") & ~claims.index.str.contains("keeps|exact")
    assert claims.index[targets].size == 2 and (claims.loc[targets, "kind"] == "finding").all()
    # and one seed gives the interventions' verdicts no label (n too small): findings, not failures
    verdicts = claims["paper"] == "interventions (ours)"
    assert (claims.loc[verdicts, "result"] == "n too small").all() and verdicts.any()
    claims = claims[~targets & ~verdicts]
    held = claims["kind"].map({"paper": "pass", "check": "pass", "finding": "holds"})  # the census holds
    assert (claims["result"] == held).all(), claims[["measured", "dtype", "result"]]
    assert (claims.loc[claims.index.str.startswith("E1"), "dtype"] == "float64").all()
    runs = pd.read_csv(smoke_dir / f"{SMOKE}/tables/runs.csv")
    assert set(runs.loc[runs["case"].isin(["sgd", "sgd_wd"]), "dtype"]) == {"float64"}
    assert set(runs.loc[runs["case"] == "adamw", "dtype"]) == {"float32"}
    sgd = pd.read_csv(smoke_dir / f"{SMOKE}/runs/sgd/seed{config['seeds'][0]}/metrics.csv")
    assert {"drift1_qk", "drift2_ov", "closure_qk"} <= set(sgd.columns)


@pytest.mark.slow
def test_second_run_has_nothing_to_do(smoke_dir, shakespeare_url):
    proc = run_smoke_dag(smoke_dir, shakespeare_url, "-n", "--nolock")  # --nolock: other tests read it too
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.slow
def test_a_changed_setting_reruns_exactly_the_runs_it_changes(smoke_dir, shakespeare_url, tmp_path):
    """A built smoke DAG (a copy, times kept, Snakemake's records too) with one case's weight decay changed:
    Snakemake plans that case's spec jobs only (their text, a parameter, changed), then only those training
    jobs (and the gathers after them); the dry run writes nothing."""
    workdir = tmp_path / "built"
    shutil.copytree(smoke_dir, workdir, symlinks=True)
    seeds = smoke_config()["seeds"]
    proc = run_smoke_dag(workdir, shakespeare_url, "-n", config={"cases": {"sgd_wd": {"weight_decay": 0.2}}})
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    training = {rule: n for rule, n in counts.items() if rule.startswith("train_")}
    assert training == {"train_case": len(seeds)} and counts["spec_file"] == len(seeds), counts
    reruns = re.findall(r"output: (\S+)/metrics.csv", proc.stdout)
    assert sorted(reruns) == [f"{SMOKE}/runs/sgd_wd/seed{seed}" for seed in seeds]
    assert "reason: Params have changed since last execution" in proc.stdout
    assert f"reason: Input files updated by another job: {SMOKE}/specs/runs/sgd_wd/seed0.yaml" in proc.stdout
    # changed back (never built in between): nothing was written, so nothing to do
    proc = run_smoke_dag(workdir, shakespeare_url, "-n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    # built with the change: the job starts over (its checkpoint has the old settings) and trains with it
    run_dir = workdir / SMOKE / f"runs/sgd_wd/seed{seeds[0]}"
    target = (str((run_dir / "run.json").relative_to(workdir)), "--configfile", "config/smoke.yaml")
    config = {"data_url": shakespeare_url, "cases": {"sgd_wd": {"weight_decay": 0.2}}}
    proc = run_snakemake(workdir, *target, configfile=None, config=config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["weight_decay"] == 0.2 and run["status"] == "completed" and not run["resumed_at"]
    log = (workdir / SMOKE / f"logs/runs/sgd_wd/seed{seeds[0]}.log").read_text()
    assert "written with other settings (weight_decay: 0.1 in ckpt vs 0.2 now): starting over" in log, log


@pytest.mark.parametrize(
    "setting, where",
    [
        ("threads=0", "threads"),  # range
        ("modle=3", "modle"),  # unknown key
        ("cases={sdg: {lr: 0.1}}", "sdg"),  # case name not in the enum
        (
            "cases={sgd: {lr: -0.1}}",
            "cases/sgd/lr: -0.1 is less than or equal to the minimum of 0",
        ),  # nested, typed
        ("results_dir=results/{case}", "results_dir"),  # braces would be wildcards in every output path
    ],
)
def test_bad_config_value_fails_with_one_line(tmp_path, setting, where):
    copy_pipeline(tmp_path)
    key, value = setting.split("=", 1)
    proc = run_snakemake(tmp_path, "-n", config={key: value})
    assert proc.returncode != 0
    lines = stderr_lines(proc)
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
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("config error: sweep/sgd_wd"), proc.stderr


def test_paper_config_plans_the_expected_jobs(tmp_path):
    copy_pipeline(tmp_path)
    paper = yaml.safe_load((REPO / "config/paper.yaml").read_text())
    proc = run_snakemake(tmp_path, "-n", "-p", configfile="config/paper.yaml")
    if smollm2_gguf() is None:  # the paper config asks for SmolLM2: one line naming its install command
        assert (
            proc.returncode != 0
            and f"quantization/smollm2: SmolLM2 needs its package: {SMOLLM2_INSTALL}" in proc.stderr
        )
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    n_sweep = sum(len(s["lrs"]) * len(s["seeds"]) for s in paper["sweep"].values())
    assert counts["train_case"] == len(paper["cases"]) * len(paper["seeds"]) == 15
    assert counts["train_sweep"] == n_sweep
    for rule in (
        "fetch_data",
        "prepare_data",
        "counts",
        "verify",
        "tables",
        "report_pages",
        "appendix",
        "all",
    ):
        assert counts[rule] == 1, counts
    assert (
        counts["figure"] == 8
    )  # one per figure: the paper config has the studies, interventions, quantization, alignment
    assert counts["quant_study"] == len(paper["quantization"]["seeds"]) and counts["smollm2_study"] == 1
    # the alignment stage's planted SmolLM2 element, whose report the tables read
    assert counts["alignment_plant_smollm2"] == counts["alignment_planted_smollm2"] == 1
    tables_job = re.search(r"rule tables:.*?(?=\n\n|\Z)", proc.stdout, re.S)
    assert (
        tables_job
        and "--alignment-planted" in proc.stdout
        and "alignment/planted/smollm2.json" in tables_job[0]
    )
    # CUDA jobs ask for a GPU; every training job has its own log and benchmark
    case_jobs = re.findall(r"rule train_case:.*?(?=\n\n|\Z)", proc.stdout, re.S)
    assert case_jobs and all("gpu=1" in job for job in case_jobs)
    assert all(f"benchmark: {paper['results_dir']}/benchmarks/runs/" in job for job in case_jobs)
    jobs = train_jobs(tmp_path, proc.stdout)
    assert jobs and all(job["device"] == "cuda" and job["n_layer"] == 6 for job in jobs.values())


def test_default_config_is_valid_and_plans_all_cases(tmp_path):
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p", configfile=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert set(default["cases"]) == {"sgd", "sgd_wd", "sgd_momentum", "adamw", "adamw_rebalance"}
    assert counts["train_case"] == 5 * len(default["seeds"])
    # each job trains with its case's own settings (its spec file) and one thread
    jobs = train_jobs(tmp_path, proc.stdout)
    assert jobs["results/default/runs/adamw_rebalance/seed0"]["rebalance_every"] == 200
    assert jobs["results/default/runs/sgd/seed0"]["case"] == "sgd"
    assert {job["threads"] for job in jobs.values()} == {"1"}
    assert "gpu=" not in proc.stdout  # CPU config asks for no GPU


def test_nested_config_overrides_are_typed_and_merge_into_the_config(tmp_path):
    """--config values are YAML: numbers and booleans inside mappings validate; a nested
    mapping changes only the keys it names (the other cases and SGD's weight decay stay)."""
    copy_pipeline(tmp_path)
    proc = run_snakemake(
        tmp_path,
        "-n",
        "-p",
        configfile=None,
        config={
            "cases": "{sgd: {lr: 0.1}, adamw: {lr: 1e-3}}",
            "paper_pdf": "true",
            "seeds": "[0]",
            "training": "{max_iters: 7, warmup_iters: 1}",  # a run attnid train accepts
        },
        env=_with_tex(tmp_path),  # paper_pdf: true asks for a TeX, found where none is installed
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert job_counts(proc.stdout)["train_case"] == len(default["cases"])  # every case, one seed
    jobs = train_jobs(tmp_path, proc.stdout)
    sgd = jobs["results/default/runs/sgd/seed0"]
    assert sgd["case"] == "sgd" and sgd["lr"] == 0.1
    assert sgd["weight_decay"] == default["cases"]["sgd"]["weight_decay"]
    assert sgd["max_iters"] == 7 and sgd["log_every"] == default["training"]["log_every"]
    assert jobs["results/default/runs/adamw/seed0"]["lr"] == 0.001
    assert "results/default/paper/main.pdf" in proc.stdout  # paper_pdf=true asks for the PDF


def test_paper_pdf_true_without_latexmk_is_one_line(tmp_path):
    """A build that asks for the PDF where no latexmk is found stops before any job, in one line naming what
    to install (the other tests' dry runs of paper_pdf: true bring their own: _with_tex)."""
    copy_pipeline(tmp_path)
    shadow = tmp_path / "path-without-latexmk"  # every program on PATH, but latexmk, whatever is installed
    shadow.mkdir()
    for folder in [Path(sys.executable).parent] + [Path(p) for p in os.environ["PATH"].split(os.pathsep)]:
        for program in sorted(folder.iterdir()) if folder.is_dir() else []:
            linked = shadow / program.name
            if program.name != "latexmk" and not linked.exists() and os.access(program, os.X_OK):
                linked.symlink_to(program)
    no_tex = {"PATH": str(shadow)}
    proc = run_snakemake(tmp_path, "-n", configfile=None, config={"paper_pdf": "true"}, env=no_tex)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "config error: paper_pdf: true, but latexmk not found: install TeX" in proc.stderr, proc.stderr


def test_failed_job_reason_reaches_the_terminal(tmp_path, shakespeare_path):
    """profiles/default turns on --show-failed-logs: the command's one-line reason is on stderr."""
    copy_pipeline(tmp_path)
    target = ("data/tinyshakespeare/input.txt", "--configfile", "config/smoke.yaml")  # target before nargs=+
    proc = run_snakemake(
        tmp_path,
        *target,
        configfile=None,
        config={"data_url": shakespeare_path.as_uri(), "data_sha256": "ab" * 32},
    )
    assert proc.returncode != 0
    log = (tmp_path / "data/logs/fetch_data.log").read_text().strip()
    assert "checksum mismatch" in log and log in proc.stderr, proc.stderr[-3000:]


def test_workflow_has_no_lint_and_is_snakefmt_formatted(tmp_path):
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "--lint", configfile=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr
    files = [REPO / "Snakefile", *sorted((REPO / "workflow/rules").glob("*.smk"))]
    fmt = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def _snapshot(root):
    """{path: (size, mtime_ns)} of every file under ``root``."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.mark.slow
@pytest.mark.ci  # a second whole build: .ci/run runs it after the README's command
def test_smoke_and_default_builds_share_no_output(smoke_dir, shakespeare_url, tmp_path):
    """After the smoke build, a (shortened) default build in the same checkout succeeds, writes
    only under its own results_dir, and leaves the smoke build complete and untouched."""
    workdir = tmp_path / "checkout"
    shutil.copytree(smoke_dir, workdir, symlinks=True)  # the smoke build's checkout, mtimes kept
    smoke_before = _snapshot(workdir / SMOKE)
    shortened = {  # the default config with nested overrides: tiny model, few steps, 1 seed, tiny sweeps
        "data_url": shakespeare_url,
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "batch_size": 4},
        "training": {"max_iters": 6, "eval_every": 3, "log_every": 2, "warmup_iters": 1},
        "cases": {"adamw_rebalance": {"rebalance_every": 3}},
        "seeds": [0],
        "sweep": {
            "sgd": {"lrs": [0.01, 0.1], "seeds": [0], "max_iters": 4, "warmup_iters": 1},
            "adamw": {"lrs": [1e-3, 1e-2], "seeds": [0], "max_iters": 4},
        },
        "heads": {"n_heads": [1, 2], "seeds": [0], "max_iters": 4, "eval_every": 2, "warmup_iters": 1},
        "variants": {
            "seeds": [0],
            "max_iters": 4,
            "eval_every": 2,
            "warmup_iters": 1,
        },  # the default's points
        # the default's arms, protocol and per-arm jobs, at toy length: the calibration's round 1 on one seed
        # over three lrs, its round 2 (the top 2) on one more, the whole val split every 2 steps (the plateau
        # check's last quarter is steps 6 to 8)
        "interventions": {
            "seeds": [0],
            "max_iters": 8,
            "warmup_iters": 1,
            "log_every": 2,
            "eval_every": 8,
            "full_val_every": 2,
            "calibration": {"lr_factors": [0.5, 1, 2], "seeds": [100], "refine": {"top": 2, "seeds": [101]}},
            "identity": {"max_iters": 4, "warmup_iters": 1, "eval_every": 2, "log_every": 2},
        },
        "edits": {"seeds": [0], "max_iters": 6},  # the section's own length (the default's 500) wins
        "paper_pdf": False,
    }
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert default["results_dir"] != SMOKE
    proc = run_snakemake(
        workdir, configfile=None, config=shortened, timeout=1800, progress="a shortened default build"
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    stage = shortened["interventions"]
    merged = {
        **default,
        "training": {**default["training"], **shortened["training"]},
        "cases": {
            **default["cases"],
            "adamw_rebalance": {**default["cases"]["adamw_rebalance"], "rebalance_every": 3},
        },
        "seeds": [0],
        "sweep": shortened["sweep"],
        "model": shortened["model"],
        "heads": {**default["heads"], **shortened["heads"]},
        "variants": {**default["variants"], **shortened["variants"]},
        "interventions": {
            **default["interventions"],
            **{key: value for key, value in stage.items() if not isinstance(value, dict)},
            "calibration": {**default["interventions"]["calibration"], **stage["calibration"]},
            "identity": {**default["interventions"]["identity"], **stage["identity"]},
        },
        "edits": {**default["edits"], "seeds": [0], "max_iters": 6},
        "paper_pdf": False,
    }
    missing = [path for path in expected_outputs(merged) if not (workdir / path).is_file()]
    assert not missing, missing
    runs = pd.read_csv(workdir / default["results_dir"] / "tables/runs.csv")
    assert sorted(runs["case"]) == sorted(default["cases"])
    for case in default["cases"]:  # the nested overrides reached every run; the rest is the default's
        run = json.loads((workdir / default["results_dir"] / f"runs/{case}/seed0/run.json").read_text())
        assert run["max_iters"] == 6 and run["status"] in ("completed", "diverged"), run
    assert _snapshot(workdir / SMOKE) == smoke_before, "the default build touched the smoke outputs"
    again = run_smoke_dag(workdir, shakespeare_url, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    again = run_snakemake(workdir, "-n", configfile=None, config=shortened)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
