"""Run the Snakemake pipeline in a scratch directory (for the pipeline, notebook and scale tests).

    workdir = copy_pipeline(tmp_path)               # Snakefile, workflow/, config/, profiles/, paper/main.tex
    proc = run_smoke_dag(workdir, shakespeare_url)  # the whole smoke DAG, --cores 2
    proc = run_snakemake(workdir, "-n", configfile="config/paper.yaml")

``shared_smoke_run`` builds the smoke outputs once per test session, even under
``pytest -n 2`` (a file lock in the directory all xdist workers share), for tests
that only read them.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from attnid.plan import alignment_pairs, plan, quantization_checkpoints, why_no_pdf
from attnid.plan.runs import PENDING_SUFFIX

REPO = Path(__file__).resolve().parents[2]
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


# pytest's config, set by conftest.py: say() needs its capture manager
PYTEST_CONFIG: pytest.Config | None = None
PROGRESS_EVERY_S = 15.0  # at most one "N of M steps" line per this many seconds per build
STEPS_DONE = re.compile(r"^\d+ of \d+ steps \(\d+%\) done$")


def say(line: str) -> None:
    """Print ``line`` on the terminal at once, past pytest's output capture, also from an xdist worker
    (whose standard error is the terminal's): what a long fixture is doing."""
    capture = PYTEST_CONFIG.pluginmanager.getplugin("capturemanager") if PYTEST_CONFIG else None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        sys.stderr.write(f"\n[{worker + ' ' if worker else ''}{time.strftime('%H:%M:%S')}] {line}\n")
        sys.stderr.flush()


def run_snakemake(
    workdir: str | os.PathLike,
    *args: str,
    configfile: str | None = SMOKE_CONFIG,
    config: dict | None = None,
    cores: int = 2,
    timeout: float = 600,
    env: dict | None = None,
    progress: str | None = None,
) -> subprocess.CompletedProcess:
    """``snakemake --cores N [--configfile F] [ARGS] [--config K=V ...]`` in ``workdir``.

    ``--config`` goes last because it swallows every following argument. A mapping or list
    value is written as YAML flow text (``cases={sgd: {lr: 0.1}}``), as a user would type it.
    ``env`` adds to (or replaces) the child's environment variables, e.g. ``PYTHONPATH``.
    ``progress``: name the build on the terminal, then show snakemake's "N of M steps" lines as they come.
    """
    command = [sys.executable, "-m", "snakemake", "--cores", str(cores)]
    if configfile:
        command += ["--configfile", configfile]
    command += list(args)
    if config:
        command += ["--config"] + [f"{key}={config_text(value)}" for key, value in config.items()]
    child_env = {**snakemake_env(), **(env or {})}
    if progress is None:
        return subprocess.run(
            command, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=child_env
        )
    return run_showing_progress(command, workdir, child_env, timeout, progress)


def run_showing_progress(command, workdir, env, timeout: float, what: str) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True) that relays snakemake's progress lines (its standard error)."""
    say(f"{what}: snakemake in {workdir}")
    started, last = time.monotonic(), 0.0
    with tempfile.TemporaryFile("w+") as stdout:
        child = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True
        )
        killer = threading.Timer(timeout, child.kill)
        killer.start()
        stderr = []
        try:
            assert child.stderr is not None
            for line in child.stderr:
                stderr.append(line)
                now = time.monotonic()
                if STEPS_DONE.match(line.strip()) and (now - last >= PROGRESS_EVERY_S or "(100%)" in line):
                    say(f"{what}: {line.strip()} after {now - started:.0f} s")
                    last = now
            child.wait()
        finally:
            killer.cancel()
        if time.monotonic() - started >= timeout:
            raise subprocess.TimeoutExpired(command, timeout, "".join(stderr))
        stdout.seek(0)
        output = stdout.read()
    say(
        f"{what}: {'done' if child.returncode == 0 else f'failed (exit {child.returncode})'} "
        f"after {time.monotonic() - started:.0f} s"
    )
    return subprocess.CompletedProcess(command, child.returncode, output, "".join(stderr))


def run_smoke_dag(
    workdir: str | os.PathLike,
    shakespeare_url: str,
    *args: str,
    config: dict | None = None,
    timeout: float = 1800,
    progress: str | None = None,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run the whole smoke DAG (or ``args`` targets/flags) with the data taken from ``shakespeare_url``
    (``env`` as for :func:`run_snakemake`).

    About 100 s of CPU time on 2 idle cores; the generous timeout is for a machine shared with other jobs.
    """
    return run_snakemake(
        workdir,
        *args,
        config={"data_url": shakespeare_url, **(config or {})},
        timeout=timeout,
        progress=progress,
        env=env,
    )


def config_text(value) -> str:
    """A ``--config`` value as text: mappings and lists in YAML flow style, anything else as str()."""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return str(value)


def smoke_config() -> dict:
    return yaml.safe_load((REPO / SMOKE_CONFIG).read_text())


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """snakemake's non-empty stderr lines after the workflow profile's notice (checked to come first)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[0] == PROFILE_NOTICE, proc.stderr
    return lines[1:]


def copied_study_runs(config: dict) -> list[str]:
    """The study run directories the DAG copies from an earlier study run instead of training (rule
    ``reuse_study_run``)."""
    return [run_dir for run_dir in plan(copy.deepcopy(config)).copied() if "/studies/" in run_dir]


# A spec job's command as `snakemake -n -p` prints it (rule spec_file, workflow/rules/train.smk): the file's
# text, one shell word, then the file's temporary name.
PRINTED_SPEC = re.compile(r"printf '%s' ('[^']*'(?:\"'\"'[^']*')*) > (\S+)\.tmp && mv ")


def printed_spec_texts(printed: str) -> dict[str, str]:
    """{spec file: its text} of every spec job that ``snakemake -n -p`` printed (a dry run writes none)."""
    return {path: shlex.split(word)[0] for word, path in PRINTED_SPEC.findall(printed)}


def train_jobs(workdir: str | os.PathLike, printed: str) -> dict[str, dict]:
    """{run directory: the options its job trains with} for every ``attnid train`` (or ``train-runs``: each
    of its runs) command that ``snakemake -n -p`` printed: the spec file its ``--config`` names (its text as
    its spec job prints it, or the file in ``workdir`` where no job writes it anew), and the command's own
    flags on top, as ``attnid train`` reads them. A run at an arm's best lr, whose spec the calibration
    writes, has its pending spec's options (the lr marked ``{calibrated: ARM}``)."""
    texts = printed_spec_texts(printed)

    def text(path: str) -> str | None:
        if path in texts:
            return texts[path]
        return (Path(workdir) / path).read_text() if (Path(workdir) / path).is_file() else None

    jobs = {}
    for line in printed.splitlines():
        match = re.search(r"attnid train(-runs)? (.*?) > \S+ 2>&1$", line)
        if not match:
            continue
        lists: dict[str, list[str]] = {}
        for word in shlex.split(match.group(2)):  # --flag value ..., train-runs' --configs/--outs lists
            if word.startswith("--"):
                key = word[2:].replace("-", "_")
                lists[key] = []
            else:
                lists[key].append(word)
        configs, outs = (
            lists.pop("configs", None) or lists.pop("config"),
            lists.pop("outs", None) or lists.pop("out"),
        )
        # --flag value, or a switch (--restart-if-changed): True
        flags = {key: values[0] if values else True for key, values in lists.items()}
        for spec, out in zip(configs, outs, strict=True):
            pending = spec.removesuffix(".yaml") + PENDING_SUFFIX
            if text(spec) is None and text(pending) is not None:
                options = yaml.safe_load(text(pending))["options"]
            else:
                options = yaml.safe_load(text(spec))
            jobs[out] = options | flags | {"out": out}
    return jobs


def expected_outputs(config: dict) -> list[str]:
    """Every file the DAG promises for ``config`` (paths relative to the work directory).

    All of them but the shared data lie under the config's ``results_dir``.
    """
    out = config["results_dir"]
    checked = copy.deepcopy(config)  # its defaults filled in by the plan
    planned = plan(checked)
    edits = config.get("edits")
    interventions = config.get("interventions")
    files = [f"{d}/{name}" for d in planned.runs for name in ("metrics.csv", "run.json")]
    files += [
        f"{d}/{name}"
        for d in planned.edit_runs
        for name in ("pruned.pt", "prune.json", "balanced.pt", "balance.json")
    ]
    if edits:
        files += [f"{out}/tables/{name}" for name in ("prune.csv", "prune_summary.csv", "prune.tex")]
    files += [f"{out}/tables/{name}" for name in TABLES]
    studies = planned.study_runs
    if studies:
        files += [f"{out}/tables/{study}.{ext}" for study in studies for ext in ("csv", "tex")]
        files += [f"{out}/tables/identification_correlation.{ext}" for ext in ("csv", "tex")]
    quantization = config.get("quantization")
    pairs = alignment_pairs(checked, planned)  # the alignment stage's (none: no job, no Figure 8)
    figures = (
        [f"fig{i}" for i in range(1, 5)]
        + (["fig5"] if studies else [])
        + (["fig6"] if interventions else [])
        + (["fig7"] if quantization else [])
        + (["fig8"] if pairs else [])
    )
    files += [f"{out}/figures/{name}.{ext}" for name in figures for ext in ("png", "pdf", "rst")]
    pages = ["cases"] + (["interventions"] if interventions else []) + (["identification"] if studies else [])
    pages += ["prune"] if edits else []
    pages += ["quantization"] if quantization else []
    pages += ["alignment"] if pairs else []
    files += [f"{out}/report/{page}.html" for page in ["claims", *figures, *pages]] + [
        f"{out}/report/index.rst"
    ]
    if interventions:
        files += [f"{out}/tables/interventions.{ext}" for ext in ("csv", "tex")]
    if quantization:
        files += [f"{out}/tables/quantization{tail}" for tail in (".csv", "_seeds.csv", ".tex")]
        studied = quantization_checkpoints(config, out)  # its seeds that the config trains
        files += [
            f"{out}/quantization/{quantization['case']}/{run.rsplit('/', 1)[1]}.json" for run in studied
        ]
    files += [f"{out}/alignment/{pair.name}.json" for pair in pairs]
    if pairs:
        files += [f"{out}/tables/{name}" for name in ("alignment.csv", "alignment_line.csv", "alignment.tex")]
    files += [
        f"{out}/theory/counts.csv",
        f"{out}/theory/single_head.csv",
        f"{out}/theory/nullity.csv",
        f"{out}/theory/whole_model.csv",
        f"{out}/theory/census.csv",
        f"{out}/paper/main.tex",
        f"{out}/paper/appendix.tex",
    ]
    if builds_pdf(config):
        files.append(f"{out}/paper/main.pdf")
    return files + ["data/tinyshakespeare/train.bin"]


def builds_pdf(config: dict) -> bool:
    """Whether a build of ``config`` here makes the appendix PDF (common.smk's WANT_PDF)."""
    setting = config.get("paper_pdf", "auto")
    return why_no_pdf() is None if setting == "auto" else bool(setting)


SHARED_SMOKE_BUILD = "ATTNID_SMOKE_BUILD"  # a directory: one smoke build for several pytest sessions


def shared_smoke_run(tmp_path_factory, shakespeare_url: str) -> Path:
    """The smoke DAG's work directory, built once per session and shared by xdist workers.

    The first caller runs the DAG under an exclusive lock; later callers (in any
    worker) wait for it and reuse the result. A failed build is recorded and
    re-raised for every caller, with snakemake's output. With ``ATTNID_SMOKE_BUILD`` set
    to a directory, the build there is shared by every session that names it: ``.ci/run``
    builds the smoke DAG once for its two pytest sessions. Tests read it, and copy it to change it.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by all workers of this session
    if os.environ.get(SHARED_SMOKE_BUILD):
        root = Path(os.environ[SHARED_SMOKE_BUILD])
        root.mkdir(parents=True, exist_ok=True)
    workdir = root / "smoke_pipeline"
    status_file = root / "smoke_pipeline.status.json"
    with open(root / "smoke_pipeline.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("the shared smoke build: waiting for the worker that makes it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not status_file.exists():
            copy_pipeline(workdir)
            proc = run_smoke_dag(workdir, shakespeare_url, progress="the shared smoke build (once a session)")
            status = {"returncode": proc.returncode, "output": (proc.stdout + proc.stderr)[-6000:]}
            status_file.write_text(json.dumps(status))
        status = json.loads(status_file.read_text())
    if status["returncode"] != 0:
        raise AssertionError(f"the smoke DAG failed (exit {status['returncode']}):\n{status['output']}")
    return workdir


def job_counts(dry_run_output: str) -> dict[str, int]:
    """{rule: jobs} from the "Job stats" table of a dry run's output."""
    table = dry_run_output.split("Job stats:", 1)[1]
    found = {}
    for line in table.splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        found[parts[0]] = int(parts[1])
    found.pop("total", None)  # the table's last row sums the others
    return found
