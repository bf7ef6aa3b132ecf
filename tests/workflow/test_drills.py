"""Failure drills: kill a training job under Snakemake, kill the whole build anywhere, start two builds at
once, corrupt the data, break the config.

Each drill checks two things: the failure is reported in a way a user can act on, and
nothing half-written is left that Snakemake would trust (a rerun does the right thing).
The kill drills compare the resumed run's metrics.csv, and the killed build's tables, with the
shared uninterrupted smoke DAG's (tests/helpers/pipeline_helpers.py), timing columns aside.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_helpers import (
    builds_pdf,
    config_text,
    copy_pipeline,
    run_snakemake,
    say,
    shared_smoke_run,
    smoke_config,
    snakemake_env,
)

from attnid.common import outputs
from attnid.common.files import load_weights_only
from attnid.common.locks import BUILD_LOCK_NAME, FOLDER_LOCK_NAME
from attnid.plan import plan, spec_texts
from attnid.training.rundir import TIMING_COLUMNS

SMOKE = smoke_config()["results_dir"]
RUN = f"{SMOKE}/runs/sgd/seed0"
DRILL_CONFIG = "config/drill.yaml"


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory, shakespeare_url):
    return shared_smoke_run(tmp_path_factory, shakespeare_url)


def _drill_workdir(tmp_path: Path, shakespeare_url: str, smoke_dir: Path, **training) -> Path:
    """A pipeline copy whose smoke config is extended by config/drill.yaml (checkpoint every 5 steps).

    The prepared data is copied (mtimes kept) from the smoke run, so only the training job runs.
    """
    workdir = copy_pipeline(tmp_path / "wf")
    shutil.copytree(smoke_dir / "data", workdir / "data")
    settings = {
        "data_url": shakespeare_url,
        "training": {**smoke_config()["training"], "ckpt_every": 5, **training},
    }
    (workdir / DRILL_CONFIG).write_text(yaml.safe_dump(settings))
    return workdir


def _snakemake_args(*targets: str) -> list[str]:
    return ["--configfile", "config/smoke.yaml", DRILL_CONFIG, "--rerun-incomplete", *targets]


def _training_pids(workdir: Path, out_dir: str) -> list[int]:
    """PIDs of `attnid train` processes running in ``workdir`` for ``out_dir`` (found via /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if (
            cwd == str(workdir)
            and "train" in words
            and out_dir in words
            and "--out" in words
            and not any(w.endswith("snakemake") or w == "-c" for w in words)
        ):
            pids.append(int(proc.name))
    return pids


def _comparable(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).drop(columns=list(TIMING_COLUMNS))


@pytest.mark.slow
@pytest.mark.parametrize("metrics_threads", [0, 1], ids=["metrics-on-training-thread", "metrics-thread"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_training_job_resumes_to_the_uninterrupted_result(
    signum, metrics_threads, tmp_path, shakespeare_url, smoke_dir
):
    """Killed between a checkpoint and the end, rerun by Snakemake: the rows of the uninterrupted run (trained
    with the metrics on the training thread), also when a metrics thread was behind at the kill."""
    workdir = _drill_workdir(tmp_path, shakespeare_url, smoke_dir, metrics_threads=metrics_threads)
    ckpt = workdir / RUN / "ckpt.pt"
    command = [sys.executable, "-m", "snakemake", "--cores", "1", *_snakemake_args(f"{RUN}/run.json")]
    env = dict(
        os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1"
    )
    first = subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    victim = None
    try:
        deadline = time.monotonic() + 300
        while victim is None and time.monotonic() < deadline and first.poll() is None:
            if ckpt.exists():
                pids = _training_pids(workdir, RUN)
                if pids:
                    os.kill(pids[0], signal.SIGSTOP)  # freeze it between checkpoint and finish, then kill
                    if any(p.name.endswith(".tmp") for p in (workdir / RUN).iterdir()):
                        os.kill(pids[0], signal.SIGCONT)  # frozen mid-save: let this checkpoint finish first
                    else:
                        victim = pids[0]
                        break
            time.sleep(0.02)
        assert victim is not None, "never saw the training job write its first checkpoint:\n" + (
            first.communicate(timeout=60)[0] if first.poll() is not None else ""
        )
        assert not (workdir / RUN / "run.json").exists(), "the run finished before the drill could kill it"
        os.kill(victim, signum)
        if signum != signal.SIGKILL:
            os.kill(victim, signal.SIGCONT)  # a stopped process runs its SIGTERM handler once continued
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode != 0, output
    # Nothing Snakemake would trust: no declared output, no temporary file; the checkpoint survives.
    # A SIGKILLed job cannot delete its lock file; the kernel has dropped its flock, so the file is
    # stale and the rerun takes it over (docs/design.md §6.1).
    leftovers = sorted(p.name for p in (workdir / RUN).iterdir())
    stale_lock = [FOLDER_LOCK_NAME] if signum == signal.SIGKILL else []
    assert leftovers == sorted(["ckpt.pt", *stale_lock]), leftovers

    rerun = run_snakemake(workdir, *_snakemake_args(f"{RUN}/run.json"), configfile=None, cores=1)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert not (workdir / RUN / FOLDER_LOCK_NAME).exists(), "the rerun leaves its lock behind"
    run = json.loads((workdir / RUN / "run.json").read_text())
    assert run["status"] == "completed" and run["resumed_at"], run
    assert 0 < run["resumed_at"][0] < run["max_iters"]
    if signum == signal.SIGKILL:  # no chance to save: resumes from the last periodic checkpoint
        assert run["resumed_at"][0] % 5 == 0, run["resumed_at"]
    resumed, reference = (
        _comparable(workdir / RUN / "metrics.csv"),
        _comparable(smoke_dir / RUN / "metrics.csv"),
    )
    # The training trajectory is bit-identical; the float64 diagnostics (rho, beta, ...) agree to
    # round-off (their eigen-solves are not bitwise reproducible across processes).
    trajectory = [c for c in ("step", "lr", "train_loss", "eval_train_loss", "val_loss") if c in reference]
    pd.testing.assert_frame_equal(resumed[trajectory], reference[trajectory], check_exact=True)
    # tau is itself a round-off measurement (~1e-7 in float32): compare it on that scale.
    round_off = [c for c in reference if c.startswith("tau")]
    pd.testing.assert_frame_equal(
        resumed[round_off], reference[round_off], check_exact=False, rtol=0, atol=1e-5
    )
    rest = resumed.drop(columns=round_off), reference.drop(columns=round_off)
    pd.testing.assert_frame_equal(*rest, check_exact=False, rtol=1e-9, atol=1e-300)


def test_corrupted_download_fails_the_fetch_rule_and_leaves_nothing(tmp_path, shakespeare_path):
    workdir = copy_pipeline(tmp_path / "wf")
    corrupted = bytearray(shakespeare_path.read_bytes())
    corrupted[-10:] = b"0123456789"
    bad = tmp_path / "corrupted.txt"
    bad.write_bytes(bytes(corrupted))
    target = ("data/tinyshakespeare/input.txt", "--configfile", "config/smoke.yaml")  # target before nargs=+
    proc = run_snakemake(workdir, *target, configfile=None, config={"data_url": bad.as_uri()})
    assert proc.returncode != 0
    log = (workdir / "data/logs/fetch_data.log").read_text().strip().splitlines()
    assert len(log) == 1 and "checksum mismatch" in log[0] and "file://" in log[0], log
    assert log[0] in proc.stderr, proc.stderr  # the reason reaches the terminal (profiles/default)
    data_dir = workdir / "data/tinyshakespeare"
    assert not data_dir.exists() or list(data_dir.iterdir()) == [], list(data_dir.iterdir())
    # the right file afterwards: the same rule now succeeds
    proc = run_snakemake(workdir, *target, configfile=None, config={"data_url": shakespeare_path.as_uri()})
    assert proc.returncode == 0, proc.stderr
    digest = hashlib.sha256((data_dir / "input.txt").read_bytes()).hexdigest()
    assert digest == smoke_config()["data_sha256"]


def test_truncated_train_bin_stops_training_before_it_starts(tmp_path, prepared_data_dir):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name in ("meta.json", "val.bin"):
        (data_dir / name).write_bytes((prepared_data_dir / name).read_bytes())
    (data_dir / "train.bin").write_bytes((prepared_data_dir / "train.bin").read_bytes()[:-4096])
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnid",
            "train",
            "--data",
            str(data_dir),
            "--case",
            "sgd",
            "--out",
            str(out),
            "--max-iters",
            "5",
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "truncated" in proc.stderr and "attnid prepare" in proc.stderr
    assert not out.exists() or not any(out.iterdir()), "training started on a truncated train.bin"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--case", "sdg"], "sdg"),
        (["--case", "sgd", "--lr", "-1"], "lr"),
    ],
)
def test_unknown_case_or_bad_value_in_attnid_train_is_one_line(argv, expected, tmp_path, prepared_data_dir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnid",
            "train",
            "--data",
            str(prepared_data_dir),
            "--out",
            str(tmp_path / "run"),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_diverging_run_ends_as_diverged_and_the_dag_completes(smoke_dir):
    """The smoke sweep has lr 1e6 for SGD on purpose: a finished job with status 'diverged'."""
    config = smoke_config()
    huge = max(config["sweep"]["sgd"]["lrs"])
    run = json.loads((smoke_dir / f"{SMOKE}/sweep/sgd/lr{huge:.10g}/seed0/run.json").read_text())
    assert run["status"] == "diverged" and run["diverged_step"] is not None
    assert (smoke_dir / f"{SMOKE}/tables/sweep.csv").is_file()
    assert (smoke_dir / f"{SMOKE}/paper/appendix.tex").is_file()
    metrics = pd.read_csv(smoke_dir / f"{SMOKE}/sweep/sgd/lr{huge:.10g}/seed0/metrics.csv")
    assert len(metrics) >= 1


# --------------------------------------------------------------------------------------
# the whole smoke build killed anywhere, two builds at once, a dry run beside a build
# --------------------------------------------------------------------------------------

# Columns of the tables that time the machine, not the runs: a resumed run's wall time and throughput.
TABLE_TIMING_COLUMNS = ("wall_time_s", "tokens_per_s_mean", "tokens_per_s_sd")
# The TeX tables with a timing column: a study point's row ends in its tokens/s.
TEX_TOKENS_PER_S = re.compile(r"& [\d,]+ \\\\$", re.MULTILINE)
TIMED_TEX_TABLES = ("heads.tex", "variants.tex")
# The killed build's config over smoke.yaml: a checkpoint every 5 steps, so that kills meet checkpoints.
KILLED_BUILD = {"training": {"ckpt_every": 5}}
LOCK_REFUSAL = "Directory cannot be locked"
INCOMPLETE_REFUSAL = "IncompleteFilesException"
BUILD_REFUSAL = f"another build of {SMOKE} is running"  # attnid's build lock (attnid.plan.builds)


def _kill_build_command(shakespeare_url: str, *args: str) -> list[str]:
    config = {"data_url": shakespeare_url, **KILLED_BUILD}
    return [
        sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/smoke.yaml", *args,
        "--config", *(f"{key}={config_text(value)}" for key, value in config.items()),
    ]  # fmt: skip


class Build:
    """One snakemake process and every process it starts, in a process group of its own: what a
    laptop's sleep, a SLURM time limit or `kill -9 -PGID` ends at once."""

    def __init__(self, workdir: Path, command: list[str], log: Path):
        self.workdir, self.log = workdir, log
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                command, cwd=workdir, env=snakemake_env(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the whole group, then reap the snakemake process."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=60)

    def running(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _is_leftover(path: Path) -> bool:
    """What no finished build keeps: a hidden file or folder (temporaries, locks, latexmk's scratch
    folder), a `*.tmp`, a checkpoint moved aside."""
    return path.name.startswith(".") or path.name.endswith(".tmp") or ".corrupt" in path.name


def _half_written(workdir: Path) -> list[str]:
    """Every file of the build that does not read as complete in its format: checkpoints load with
    weights_only=True, CSV/JSON/YAML parse, PNG and PDF end as their format ends. Temporary files and
    folders (a killed build's), logs and Snakemake's benchmark records (appended, never trusted) aside."""
    bad = []
    for path in sorted([*(workdir / SMOKE).rglob("*"), *(workdir / "data").rglob("*")]):
        relative = path.relative_to(workdir)
        if (
            not path.is_file()
            or any(_is_leftover(Path(part)) for part in relative.parts)
            or {"logs", "benchmarks"} & set(relative.parts)
        ):
            continue
        try:
            data = path.read_bytes()
            if path.suffix == ".pt":
                load_weights_only(path)
            elif path.suffix == ".csv":
                pd.read_csv(path)
            elif path.suffix == ".json":
                json.loads(data)
            elif path.suffix == ".yaml":
                assert isinstance(yaml.safe_load(data), dict)
            elif path.suffix == ".png":
                assert data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")
            elif path.suffix == ".pdf":
                assert data.startswith(b"%PDF") and b"%%EOF" in data[-1024:]
            elif path.suffix in (".tex", ".rst", ".html", ".txt"):
                assert data.decode("utf-8").strip()
        except Exception as err:  # noqa: BLE001 - any failure to read is the finding
            bad.append(f"{relative}: {type(err).__name__} {err}"[:300])
    return bad


def _wait_until(
    build: Build, condition, what: str, poll: float = 0.05, timeout: float = 1200, check_every: float = 45.0
) -> None:
    """Poll ``condition`` every ``poll`` s while ``build`` runs; every ``check_every`` s freeze the build and
    check that no file of it is half-written (a moment of its own, not one the build chose)."""
    deadline, last_check = time.monotonic() + timeout, time.monotonic()
    while not condition():
        assert build.running(), f"the build ended before {what}:\n{build.output()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        if time.monotonic() - last_check > check_every:
            build.signal(signal.SIGSTOP)
            try:
                assert not _half_written(build.workdir), _half_written(build.workdir)
            finally:
                build.signal(signal.SIGCONT)
            last_check = time.monotonic()
        time.sleep(poll)


def _comparable_tables(tables: Path) -> dict[str, object]:
    """Every table of a build, its timing columns dropped (TABLE_TIMING_COLUMNS; tokens/s in the TeX)."""
    found: dict[str, object] = {}
    for path in sorted(tables.iterdir()):
        if path.suffix == ".csv":
            frame = pd.read_csv(path)
            found[path.name] = frame.drop(columns=[c for c in TABLE_TIMING_COLUMNS if c in frame])
        elif path.name in TIMED_TEX_TABLES:
            found[path.name] = TEX_TOKENS_PER_S.sub("& (tokens/s) \\\\\\\\", path.read_text())
        else:
            found[path.name] = path.read_text()
    return found


@pytest.mark.slow
@pytest.mark.ci  # a third smoke build, killed four times: .ci/run runs it after the README's command
def test_a_build_killed_anywhere_resumes_to_the_uninterrupted_result(smoke_dir, shakespeare_url, tmp_path):
    """The whole smoke build (its process group) started twice at once, then SIGKILLed while a job writes a
    checkpoint, just after one, at a random moment and while the appendix compiles, restarted each time as
    docs/cluster.md says (`--unlock`, then `--rerun-incomplete`); a dry run of another config beside it.
    Checked: one of two builds started at once refuses on the lock; the dry run changes nothing of the
    running build; no file is ever half-written (at each kill and at moments of the test's own); nothing is
    left behind; every run killed with a checkpoint resumed from it; at the end nothing is left to do and
    claims.csv and every table equal the uninterrupted shared smoke build's, timing columns aside."""
    seed = int(os.environ.get("ATTNID_KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    workdir = copy_pipeline(tmp_path / "wf")
    config = {**smoke_config(), "data_url": shakespeare_url}
    config["training"] = {**config["training"], **KILLED_BUILD["training"]}
    planned = plan(copy.deepcopy(config))
    texts = spec_texts(planned)
    run_dirs = [workdir / run_dir for run_dir in planned.trained()]
    paper = workdir / SMOKE / "paper"
    logs = tmp_path / "logs"
    logs.mkdir()
    builds: list[Build] = []
    resumable: set[Path] = set()  # runs killed with a checkpoint of an unfinished run
    kills = []

    def start(name: str, *args: str) -> Build:
        build = Build(workdir, _kill_build_command(shakespeare_url, *args), logs / f"{name}.log")
        builds.append(build)
        return build

    def restart(name: str) -> Build:
        """As docs/cluster.md says after a kill: --unlock, then the build with --rerun-incomplete."""
        unlock = subprocess.run(
            _kill_build_command(shakespeare_url, "--unlock"), cwd=workdir, env=snakemake_env(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert unlock.returncode == 0, unlock.stderr[-3000:]
        return start(name, "--rerun-incomplete")

    def kill(build: Build, moment: str) -> None:
        build.kill()
        kills.append(moment)
        say(f"the killed smoke build: killed {moment} after {time.monotonic() - started:.0f} s")
        half = _half_written(workdir)
        assert not half, f"after the kill {moment} (seed {seed}): {half}"
        for run_dir in run_dirs:
            if (run_dir / "ckpt.pt").is_file() and not (run_dir / "run.json").exists():
                # a finished run's checkpoint (its summary in it) gives its outputs back: nothing to resume
                if load_weights_only(run_dir / "ckpt.pt")["attnid"].get("summary") is None:
                    resumable.add(run_dir)

    def temporaries_of_checkpoints() -> list[Path]:
        return [
            p
            for d in run_dirs
            if d.is_dir()
            for p in d.iterdir()
            if outputs.is_temporary_of(p.name, d / "ckpt.pt")
        ]

    started = time.monotonic()
    try:
        # two builds at once on one checkout: one refuses before any job of its own, on attnid's build lock,
        # never on the other's files being incomplete; so does a second build with --rerun-incomplete (the
        # restart of docs/cluster.md, given while the build still runs)
        first, second = start("first"), start("second")
        deadline = time.monotonic() + 600
        while first.running() and second.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        refused, build = (first, second) if not first.running() else (second, first)
        assert not refused.running() and refused.process.returncode != 0, "neither build refused"
        output = refused.output()
        assert BUILD_REFUSAL in output and INCOMPLETE_REFUSAL not in output, output
        _wait_until(build, lambda: any((workdir / ".snakemake/incomplete").glob("*")), "a job started")
        restart_beside = subprocess.run(
            _kill_build_command(shakespeare_url, "--rerun-incomplete"), cwd=workdir, env=snakemake_env(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert restart_beside.returncode != 0, restart_beside.stdout[-3000:]
        assert BUILD_REFUSAL in restart_beside.stderr, restart_beside.stderr[-3000:]
        assert build.running(), build.output()[-3000:]

        # a dry run of another config while the build runs writes nothing: every spec file the build has
        # written holds the build's text, though the other config changes some of them (adamw's lr). (Their
        # times say nothing: Snakemake touches a job's outputs once it has finished.)
        other = {**config, "cases": {**config["cases"], "adamw": {**config["cases"]["adamw"], "lr": 0.002}}}
        (workdir / "config/other.yaml").write_text(yaml.safe_dump(other))
        changed = [
            path for path, text in spec_texts(plan(copy.deepcopy(other))).items() if texts.get(path) != text
        ]
        _wait_until(
            build, lambda: any((workdir / path).exists() for path in changed), "a spec the dry run changes"
        )
        # plain -n lists the jobs, or, once the build has started jobs, stops at their files being incomplete;
        # -n --rerun-incomplete (no lock is taken by a dry run) lists them either way (docs/cluster.md)
        dry = run_snakemake(workdir, "-n", configfile="config/other.yaml")
        assert dry.returncode == 0 or INCOMPLETE_REFUSAL in dry.stdout + dry.stderr, dry.stdout[-2000:]
        dry = run_snakemake(workdir, "-n", "--rerun-incomplete", configfile="config/other.yaml")
        assert dry.returncode == 0 and "spec_file" in dry.stdout, dry.stdout[-2000:]
        for path in texts:
            if (workdir / path).exists():
                assert (workdir / path).read_text() == texts[path], f"{path} is not the build's own"

        # killed while a job writes a checkpoint (the build frozen with a checkpoint's temporary in place)
        while True:
            # a checkpoint of the smoke model is written in milliseconds: polled every 5 ms
            _wait_until(
                build, lambda: bool(temporaries_of_checkpoints()), "checkpoint being written", poll=0.005
            )
            build.signal(signal.SIGSTOP)
            if temporaries_of_checkpoints():
                break
            build.signal(signal.SIGCONT)
        kill(build, "while a checkpoint is written")
        assert temporaries_of_checkpoints(), "the kill left no checkpoint half-written"

        # restarted without --unlock: takes the killed build's stale build lock over (one line), then is
        # refused on Snakemake's lock, nothing run
        before = sorted(p.relative_to(workdir) for p in (workdir / SMOKE).rglob("*"))
        again = subprocess.run(
            _kill_build_command(shakespeare_url, "--rerun-incomplete"), cwd=workdir, env=snakemake_env(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert again.returncode != 0 and LOCK_REFUSAL in again.stdout + again.stderr, again.stderr[-3000:]
        assert "--unlock" in again.stdout + again.stderr and "its lock is taken over" in again.stderr
        # nothing run: every file as it was but the stale build lock, taken over, then released
        lock = Path(SMOKE) / BUILD_LOCK_NAME
        assert lock in before, "the killed build left no build lock to take over"
        after = sorted(p.relative_to(workdir) for p in (workdir / SMOKE).rglob("*"))
        assert after == [p for p in before if p != lock]

        # killed just after a checkpoint: a run with a new ckpt.pt, unfinished
        build = restart("after-checkpoint")
        since = time.time()

        def fresh_checkpoint() -> bool:
            return any(
                (d / "ckpt.pt").is_file()
                and (d / "ckpt.pt").stat().st_mtime > since
                and not (d / "run.json").exists()
                and not any(outputs.is_temporary_of(p.name, d / "ckpt.pt") for p in d.iterdir())
                for d in run_dirs
                if d.is_dir()
            )

        _wait_until(build, fresh_checkpoint, "a new checkpoint")
        kill(build, "just after a checkpoint")
        assert resumable, "no run was killed with a checkpoint"

        # killed at a random moment
        build = restart("random")
        wait = rng.uniform(10.0, 40.0)
        moment = time.monotonic() + wait
        _wait_until(build, lambda: time.monotonic() > moment, "the random moment")
        kill(build, f"at a random moment ({wait:.1f} s after its start)")

        # killed while the appendix compiles (latexmk's scratch folder in place), or runs where no PDF is
        # built here
        build = restart("appendix")
        if builds_pdf(config):
            _wait_until(build, lambda: any(paper.glob(".latexmk-*")), "latexmk compiling")
            build.signal(signal.SIGSTOP)
            assert any(paper.glob(".latexmk-*"))
            kill(build, "while latexmk compiles the appendix")
            assert any(paper.glob(".latexmk-*")), "the kill left no latexmk scratch folder"
        else:
            _wait_until(build, lambda: (workdir / SMOKE / "logs/appendix.log").exists(), "the appendix job")
            kill(build, "while the appendix job runs")

        # resumed to the end
        build = restart("final")
        build.process.wait(timeout=1800)
        assert build.process.returncode == 0, build.output()[-5000:]
    finally:
        for each in builds:
            if each.running():
                each.kill()
    elapsed = time.monotonic() - started
    say(f"the killed smoke build: {len(kills)} kills, {elapsed:.0f} s in all (seed {seed})")

    assert not _half_written(workdir)
    leftovers = [
        str(p.relative_to(workdir))
        for p in [*(workdir / SMOKE).rglob("*"), *(workdir / "data").rglob("*")]
        if _is_leftover(p)
    ]
    assert not leftovers, f"left behind (seed {seed}): {leftovers}"
    assert not [p for p in (workdir / ".snakemake/incomplete").rglob("*") if p.is_file()]
    nothing = run_snakemake(workdir, *_kill_build_command(shakespeare_url, "-n")[5:], configfile=None)
    assert nothing.returncode == 0 and "Nothing to be done" in nothing.stdout + nothing.stderr, nothing.stdout
    for run_dir in resumable:
        run = json.loads((run_dir / "run.json").read_text())
        assert run["resumed_at"], f"{run_dir} was killed with a checkpoint and not resumed from it"
    built, reference = (
        _comparable_tables(workdir / SMOKE / "tables"),
        _comparable_tables(smoke_dir / SMOKE / "tables"),
    )
    assert sorted(built) == sorted(reference)
    for name, table in reference.items():
        if isinstance(table, pd.DataFrame):
            pd.testing.assert_frame_equal(built[name], table, check_exact=True, obj=name)
        else:
            assert built[name] == table, name
