"""One build of a results_dir at a time (attnid.plan.builds, attnid.common.locks.BuildLock; docs/cluster.md).

Two builds of the smoke config started at the same instant (a barrier) on a scratch copy: one builds, the
other refuses in one line naming the first's pid, never at Snakemake's incomplete-files check. The build's
one job, fetch_data, downloads from a local HTTP server that answers only once the other build has ended,
so the two always overlap, however slowly each parses the workflow. Beside a running build, a dry run,
--lint, --list-rules and --report are not refused; a build killed with its lock held leaves a stale lock,
which the next build takes over in one line. The lock itself: a live holder is named, a killed one's lock
is taken over, a pid that now names another process (its start time differs) is not a holder, and a
record naming a live process is honoured where the filesystem lets ``flock`` through.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pipeline_helpers import PROFILE_NOTICE, SMOKE_CONFIG, config_text, copy_pipeline, snakemake_env

from attnid.common.errors import UserError
from attnid.common.locks import BUILD_LOCK_NAME, BuildLock, Holder, start_ticks

SMOKE = "results/smoke"
# Rounds of two builds started at once: ATTNID_LOCK_ROUNDS=20 for a longer check (20 passed, by hand).
ROUNDS = int(os.environ.get("ATTNID_LOCK_ROUNDS", "2"))
# What Snakemake (and its workflow profile) prints before the workflow executes: not the refusal's.
PREAMBLE = (PROFILE_NOTICE, "Assuming unrestricted shared filesystem usage.")
REFUSAL = f"another build of {SMOKE} is running"
WAIT_S = 600.0
TRICKLE_S = 5.0
# How Snakemake runs one job in a process of its own (snakemake/spawn_jobs.py): the job's own parse.
JOB_ARGS = ("--mode", "remote", "--nolock", "--ignore-incomplete", "--force")


class HeldDownload:
    """A local HTTP server that sends all of tiny shakespeare only once :meth:`release` is called."""

    def __init__(self, text: bytes):
        self.gate = threading.Event()
        gate = self.gate

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                """The headers, then a byte every few seconds (within `attnid fetch`'s read timeout)
                until released, then the rest."""
                deadline, sent = time.monotonic() + WAIT_S, 0
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a killed build hung up
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    while not gate.wait(TRICKLE_S) and time.monotonic() < deadline:
                        self.wfile.write(text[sent : sent + 1])
                        self.wfile.flush()
                        sent += 1
                    self.wfile.write(text[sent:])

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/input.txt"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def held(shakespeare_path):
    download = HeldDownload(shakespeare_path.read_bytes())
    yield download
    download.close()


def _command(url: str, *args: str) -> list[str]:
    config = {"data_url": url, "paper_pdf": False}
    return [
        sys.executable, "-m", "snakemake", "--cores", "1", *args, "--configfile", SMOKE_CONFIG,
        "--config", *(f"{key}={config_text(value)}" for key, value in config.items()),
    ]  # fmt: skip


def _start(workdir: Path, url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        _command(url, *args), cwd=workdir, env=snakemake_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _run(workdir: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(url, *args), cwd=workdir, env=snakemake_env(), capture_output=True, text=True, timeout=WAIT_S
    )


def _own_lines(stderr: str) -> list[str]:
    """The non-empty stderr lines after Snakemake's preamble."""
    return [line for line in stderr.splitlines() if line.strip() and line not in PREAMBLE]


def _first_to_end(builds: list[subprocess.Popen]) -> subprocess.Popen:
    deadline = time.monotonic() + WAIT_S
    while all(build.poll() is None for build in builds):
        assert time.monotonic() < deadline, "neither build ended: both are building"
        time.sleep(0.05)
    return next(build for build in builds if build.poll() is not None)


def _started_together(workdir: Path, url: str) -> list[subprocess.Popen]:
    """Two builds of fetch_data, started by two threads released by one barrier."""
    barrier, builds = threading.Barrier(2), [None, None]

    def start(i: int) -> None:
        barrier.wait()
        builds[i] = _start(workdir, url, "fetch_data")

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return builds


def _end(builds) -> None:
    for build in builds:
        if build is not None and build.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGKILL)
            build.wait()


@pytest.mark.slow
def test_of_two_builds_started_at_once_one_builds_and_the_other_refuses_in_one_line(tmp_path, held):
    """Each round: the first to end refused in one line naming the other's pid (never Snakemake's
    IncompleteFilesException); the other, let through, fetches the data; no lock file is left."""
    workdir = copy_pipeline(tmp_path / "checkout")
    data = workdir / "data/tinyshakespeare/input.txt"
    for round_ in range(ROUNDS):
        held.gate.clear()
        data.unlink(missing_ok=True)
        builds = _started_together(workdir, held.url)
        try:
            refused = _first_to_end(builds)
            (build,) = [b for b in builds if b is not refused]
            assert build.poll() is None, "the build ended before the download was let through"
            held.release()
            out, err = build.communicate(timeout=WAIT_S)
            refused_out, refused_err = refused.communicate()
        finally:
            _end(builds)
        assert build.returncode == 0, f"round {round_}: {err[-3000:]}"
        assert data.is_file()
        assert refused.returncode == 1, f"round {round_}: {refused_err[-3000:]}"
        lines = _own_lines(refused_err)
        assert len(lines) == 1 and lines[0].startswith(REFUSAL), f"round {round_}: {refused_err[-3000:]}"
        assert f"pid {build.pid}," in lines[0] and "IncompleteFiles" not in refused_err + refused_out
        assert not (workdir / SMOKE / BUILD_LOCK_NAME).exists()


@pytest.mark.slow
def test_beside_a_build_no_dry_run_or_report_is_refused_and_a_killed_builds_lock_is_taken_over(
    tmp_path, held
):
    """While a build waits on its download: -n, --lint, --list-rules, --report and a job's own run of
    the Snakefile (--mode remote) run (none takes the lock). Then the build is killed (its process
    group): its lock file stays, the next build (after Snakemake's own --unlock) says in one line that
    it takes it over, and builds."""
    workdir = copy_pipeline(tmp_path / "checkout")
    build = _start(workdir, held.url, "fetch_data")
    lock = workdir / SMOKE / BUILD_LOCK_NAME
    try:
        deadline = time.monotonic() + WAIT_S
        while Holder.read(lock) is None:
            assert build.poll() is None, build.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the build took no lock"
            time.sleep(0.05)
        assert Holder.read(lock).pid == build.pid
        for args in (["-n", "--rerun-incomplete"], ["--lint"], ["--list-rules"], ["--report", "r.html"]):
            beside = _run(workdir, held.url, *args)
            assert REFUSAL not in beside.stderr, (args, beside.stderr[-3000:])
            assert beside.returncode == 0 or args[0] == "--report", (args, beside.stderr[-3000:])
        # the report of an unbuilt workflow stops at its first missing page: past the lock, at the report
        assert "marked for report but does not exist" in beside.stderr, beside.stderr[-3000:]
        # a job's own parse of the Snakefile, as a SLURM node (or a local group job) runs it: not refused
        job = _run(workdir, held.url, *JOB_ARGS, "paper_main")
        assert job.returncode == 0 and (workdir / SMOKE / "paper/main.tex").is_file(), job.stderr[-3000:]
        assert build.poll() is None and Holder.read(lock).pid == build.pid
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
    finally:
        _end([build])
    assert lock.exists()
    assert _run(workdir, held.url, "--unlock").returncode == 0
    held.release()
    again = _run(workdir, held.url, "fetch_data", "--rerun-incomplete")
    assert again.returncode == 0, again.stderr[-3000:]
    taken = [line for line in _own_lines(again.stderr) if "its lock is taken over" in line]
    assert len(taken) == 1 and f"pid {build.pid}," in taken[0], again.stderr[-3000:]
    assert taken[0].startswith(f"{SMOKE}: the build that held its lock") and not lock.exists()


# ----------------------------------------------------------------------- the lock, without Snakemake

HOLD = "from attnid.common.locks import BuildLock; import sys, time; BuildLock(sys.argv[1]).acquire(); print(1, flush=True); time.sleep(600)"  # noqa: E501


@pytest.fixture
def holder(tmp_path):
    """Another process that holds the build lock of tmp_path/results (killed at the end)."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "results")], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert child.stdout.readline().strip() == "1"
    yield child
    child.kill()
    child.wait()


def test_a_held_lock_refuses_naming_its_holder_and_a_killed_holders_is_taken_over(tmp_path, holder):
    with pytest.raises(UserError) as refused:
        BuildLock(tmp_path / "results").acquire()
    line = str(refused.value)
    assert "\n" not in line and f"pid {holder.pid}, started " in line and f"kill {holder.pid}" in line
    holder.kill()
    holder.wait()
    with BuildLock(tmp_path / "results") as lock:
        assert lock.taken_over is not None and f"pid {holder.pid}," in lock.taken_over
        assert Holder.read(lock.path).pid == os.getpid()
    assert not lock.path.exists()


def _record(path: Path, holder: Holder) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(holder)))


def test_a_pid_given_to_another_process_is_not_a_holder(tmp_path):
    """A record naming this process's pid with another start time: the pid was reused, the lock is stale."""
    me = Holder.me()
    assert me.ticks is not None and me.ticks == start_ticks(os.getpid()), "no process start time (/proc)"
    lock = BuildLock(tmp_path / "results")
    _record(lock.path, Holder(me.pid, me.ticks + 1, me.host, "earlier"))
    with lock:
        assert lock.taken_over is not None and "started earlier" in lock.taken_over


def test_a_record_naming_a_live_process_is_honoured_without_flock(tmp_path):
    """Where flock lets everyone through (a filesystem without it), the record of a live holder still
    refuses: here the holder is a live child process whose lock file nobody flocks. Killed, and before
    its parent reaps it (a zombie), it is gone: its lock is taken over."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock = BuildLock(tmp_path / "results")
        _record(lock.path, Holder(child.pid, start_ticks(child.pid), Holder.me().host, "now"))
        with pytest.raises(UserError, match=f"pid {child.pid}, started now"):
            lock.acquire()
        assert lock.fd is None
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped
        with lock:
            assert lock.taken_over is not None and f"pid {child.pid}," in lock.taken_over
    finally:
        child.kill()
        child.wait()
