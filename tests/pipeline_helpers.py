"""Run the Snakemake pipeline in a scratch directory (for the pipeline, notebook and scale tests).

    workdir = copy_pipeline(tmp_path)               # Snakefile, workflow/, config/, profiles/, paper/main.tex
    proc = run_smoke_dag(workdir, shakespeare_url)  # the whole smoke DAG, --cores 2
    proc = run_snakemake(workdir, "-n", configfile="config/paper.yaml")

``shared_smoke_run`` builds the smoke outputs once per test session, even under
``pytest -n 2`` (a file lock in the directory all xdist workers share), for tests
that only read them.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from attnid.reports.interventions import arm_overrides, intervention_arms
from attnid.reports.interventions_table import BASELINE_CASE
from attnid.reports.studies import reused_points, study_points

REPO = Path(__file__).resolve().parents[1]
# What a user's checkout needs to run the DAG (results/ and data/ are outputs).
PIPELINE_FILES = ("Snakefile", "workflow", "config", "profiles", "paper/main.tex")
SMOKE_CONFIG = "config/smoke.yaml"
# What snakemake prints on stderr when it picks up profiles/default (the workflow profile).
PROFILE_NOTICE = (
    "Using workflow specific profile profiles/default for setting default command line arguments."
)
TABLES = (
    "runs.csv",
    "runs.tex",
    "cases.csv",
    "cases.tex",
    "sweep.csv",
    "sweep.tex",
    "sweep_slopes.csv",
    "claims.csv",
)


def copy_pipeline(dest: str | os.PathLike) -> Path:
    """Copy the files the pipeline needs from the repository into ``dest``; returns ``dest``."""
    dest = Path(dest)
    for name in PIPELINE_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, dirs_exist_ok=True)
        elif source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def snakemake_env() -> dict:
    """The environment for a snakemake child: this Python's ``attnid`` first on PATH, 1 torch thread."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    return env


def run_snakemake(
    workdir: str | os.PathLike,
    *args: str,
    configfile: str | None = SMOKE_CONFIG,
    config: dict | None = None,
    cores: int = 2,
    timeout: float = 600,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """``snakemake --cores N [--configfile F] [ARGS] [--config K=V ...]`` in ``workdir``.

    ``--config`` goes last because it swallows every following argument. A mapping or list
    value is written as YAML flow text (``cases={sgd: {lr: 0.1}}``), as a user would type it.
    ``env`` adds to (or replaces) the child's environment variables, e.g. ``PYTHONPATH``.
    """
    command = [sys.executable, "-m", "snakemake", "--cores", str(cores)]
    if configfile:
        command += ["--configfile", configfile]
    command += list(args)
    if config:
        command += ["--config"] + [f"{key}={config_text(value)}" for key, value in config.items()]
    return subprocess.run(
        command,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**snakemake_env(), **(env or {})},
    )


def run_smoke_dag(
    workdir: str | os.PathLike,
    shakespeare_url: str,
    *args: str,
    config: dict | None = None,
    timeout: float = 1800,
) -> subprocess.CompletedProcess:
    """Run the whole smoke DAG (or ``args`` targets/flags) with the data taken from ``shakespeare_url``.

    About 100 s of CPU time on 2 idle cores; the generous timeout is for a machine shared with other jobs.
    """
    return run_snakemake(
        workdir, *args, config={"data_url": shakespeare_url, **(config or {})}, timeout=timeout
    )


def config_text(value) -> str:
    """A ``--config`` value as text: mappings and lists in YAML flow style, anything else as str()."""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return str(value)


def pipeline_config():
    """workflow/rules/pipeline_config.py, the config's contracts with the package (common.smk imports it
    the same way: snakemake puts each included file's folder on sys.path)."""
    path = REPO / "workflow" / "rules" / "pipeline_config.py"
    if "pipeline_config" not in sys.modules:
        spec = importlib.util.spec_from_file_location("pipeline_config", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["pipeline_config"] = module
        spec.loader.exec_module(module)
    return sys.modules["pipeline_config"]


def smoke_config() -> dict:
    return yaml.safe_load((REPO / SMOKE_CONFIG).read_text())


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """snakemake's non-empty stderr lines after the workflow profile's notice (checked to come first)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[0] == PROFILE_NOTICE, proc.stderr
    return lines[1:]


def lr_label(lr: float) -> str:
    """Same as workflow/rules/common.smk."""
    return f"{float(lr):.10g}"


def reused_study_runs(config: dict) -> list[str]:
    """The study run directories the DAG copies from an earlier point's instead of training (rule
    ``reuse_study_run``)."""
    out = config["results_dir"]
    return [
        f"{out}/studies/{study}/{point}/seed{seed}"
        for study, point in reused_points(config)
        for seed in config[study]["seeds"]
    ]


def trained_intervention_runs(config: dict) -> list[str]:
    """The interventions' run directories the DAG trains (rule ``train_intervention``): every arm and seed
    except those whose run is a case run, i.e. an arm of a configured case whose section equals the adamw
    case's with the arm's own settings on top, for the cases' seeds (those runs are gathered from runs/)."""
    out, cases = config["results_dir"], config["cases"]
    trained = []
    for arm in intervention_arms(config):
        same = arm.case in cases and cases[arm.case] == {**cases[BASELINE_CASE], **arm_overrides(config, arm)}
        trained += [
            f"{out}/interventions/{arm.name}/seed{seed}"
            for seed in config["interventions"]["seeds"]
            if not (same and seed in config["seeds"])
        ]
    return trained


def expected_outputs(config: dict) -> list[str]:
    """Every file the DAG promises for ``config`` (paths relative to the work directory).

    All of them but the shared data lie under the config's ``results_dir``.
    """
    out = config["results_dir"]
    runs = [f"{out}/runs/{case}/seed{seed}" for case in config["cases"] for seed in config["seeds"]]
    sweeps = [
        f"{out}/sweep/{opt}/lr{lr_label(lr)}/seed{seed}"
        for opt, sweep in config["sweep"].items()
        for lr in sweep["lrs"]
        for seed in sweep["seeds"]
    ]
    plan = study_points(config)  # the study sections the config has (each optional)
    studies = [
        f"{out}/studies/{study}/{point.name}/seed{seed}"
        for study, points in plan.items()
        for point in points
        for seed in config[study]["seeds"]
    ]
    edits = config.get("edits")
    edit_runs = [f"{out}/edits/{edits['case']}/seed{seed}" for seed in edits["seeds"]] if edits else []
    interventions = config.get("interventions")
    intervention_runs = trained_intervention_runs(config) if interventions else []
    intervention_runs += [
        f"{out}/interventions/identity/seed{seed}"
        for seed in (interventions["identity"]["seeds"] if interventions else [])
    ]
    files = [
        f"{d}/{name}"
        for d in runs + sweeps + studies + edit_runs + intervention_runs
        for name in ("metrics.csv", "run.json")
    ]
    files += [
        f"{d}/{name}"
        for d in edit_runs
        for name in ("pruned.pt", "prune.json", "balanced.pt", "balance.json")
    ]
    if edits:
        files += [f"{out}/tables/{name}" for name in ("prune.csv", "prune_summary.csv", "prune.tex")]
    files += [f"{out}/tables/{name}" for name in TABLES]
    if plan:
        files += [f"{out}/tables/{study}.{ext}" for study in plan for ext in ("csv", "tex")]
        files += [f"{out}/tables/identification_correlation.{ext}" for ext in ("csv", "tex")]
    figures = (
        [f"fig{i}" for i in range(1, 5)] + (["fig5"] if plan else []) + (["fig6"] if interventions else [])
    )
    files += [f"{out}/figures/{name}.{ext}" for name in figures for ext in ("png", "pdf", "rst")]
    pages = ["cases"] + (["interventions"] if interventions else []) + (["identification"] if plan else [])
    pages += ["prune"] if edits else []
    files += [f"{out}/report/{page}.html" for page in ["claims", *figures, *pages]] + [
        f"{out}/report/index.rst"
    ]
    if interventions:
        files += [f"{out}/tables/interventions.{ext}" for ext in ("csv", "tex")]
    files += [
        f"{out}/theory/counts.csv",
        f"{out}/theory/single_head.csv",
        f"{out}/theory/nullity.csv",
        f"{out}/theory/whole_model.csv",
        f"{out}/theory/census.csv",
        f"{out}/paper/main.tex",
        f"{out}/paper/appendix.tex",
    ]
    return files + ["data/tinyshakespeare/train.bin"]


def shared_smoke_run(tmp_path_factory, shakespeare_url: str) -> Path:
    """The smoke DAG's work directory, built once per session and shared by xdist workers.

    The first caller runs the DAG under an exclusive lock; later callers (in any
    worker) wait for it and reuse the result. A failed build is recorded and
    re-raised for every caller, with snakemake's output.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by all workers of this session
    workdir = root / "smoke_pipeline"
    status_file = root / "smoke_pipeline.status.json"
    with open(root / "smoke_pipeline.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not status_file.exists():
            copy_pipeline(workdir)
            proc = run_smoke_dag(workdir, shakespeare_url)
            status = {"returncode": proc.returncode, "output": (proc.stdout + proc.stderr)[-6000:]}
            status_file.write_text(json.dumps(status))
        status = json.loads(status_file.read_text())
    if status["returncode"] != 0:
        raise AssertionError(f"the smoke DAG failed (exit {status['returncode']}):\n{status['output']}")
    return workdir
