"""Failure drills (issue #5): kill a training job under Snakemake, corrupt the data, break the config.

Each drill checks two things: the failure is reported in a way a user can act on, and
nothing half-written is left that Snakemake would trust (a rerun does the right thing).
The kill drills compare the resumed run's metrics.csv with the same run from the shared
uninterrupted smoke DAG (tests/helpers/pipeline_helpers.py), timing columns aside.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_helpers import copy_pipeline, run_snakemake, shared_smoke_run, smoke_config

from attnid.common.locks import FOLDER_LOCK_NAME
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
