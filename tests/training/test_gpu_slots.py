"""GPU slots (attnid.training.gpu_slots): concurrent jobs take different slots, wait when all are taken,
and a killed holder frees its slot. Runs on the CPU: a slot is only a lock file and an index."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import attnid
from attnid.common.errors import UserError
from attnid.training import gpu_slots

SRC = str(Path(attnid.__file__).resolve().parents[1])

# A job: take a slot, print "<index> <CUDA_VISIBLE_DEVICES>", hold the slot until stdin closes.
HOLDER = """
import os, sys
from attnid.training.gpu_slots import acquire_gpu_slot
index = acquire_gpu_slot(int(sys.argv[1]), sys.argv[2], wait_message_every=0.2, poll_every=0.05)
print(index, os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
sys.stdin.read()
"""


def start_holder(n_slots: int, slot_dir: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", gpu_slots.SLOTS_ENV)}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(n_slots), str(slot_dir)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_slot(proc: subprocess.Popen, timeout: float) -> tuple[int, str] | None:
    """The holder's "<index> <CUDA_VISIBLE_DEVICES>" line, or None if it prints nothing within timeout."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return None
    line = proc.stdout.readline().split()
    assert len(line) == 2, (
        f"holder printed {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
    )
    return int(line[0]), line[1]


def release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def holders():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


def test_concurrent_jobs_get_different_slots_and_a_third_waits(tmp_path, holders):
    first = start_holder(2, tmp_path)
    holders.append(first)
    first_slot = read_slot(first, timeout=60)
    second = start_holder(2, tmp_path)
    holders.append(second)
    second_slot = read_slot(second, timeout=60)
    assert first_slot is not None and second_slot is not None
    assert {first_slot[0], second_slot[0]} == {0, 1}
    for index, visible in (first_slot, second_slot):
        assert visible == str(index)

    third = start_holder(2, tmp_path)
    holders.append(third)
    # released only once the third says it waits: on a loaded machine its start (imports) can outlast any
    # fixed wait, and a slot freed before it asks is simply taken, with nothing to say
    ready, _, _ = select.select([third.stderr], [], [], 120)
    waiting = third.stderr.readline() if ready else ""
    assert "are taken" in waiting, f"the waiting job printed no waiting message: {waiting!r}"
    assert str(tmp_path) in waiting and str(first.pid) in waiting
    assert read_slot(third, timeout=1.0) is None, "a third job took a slot while both were held"
    assert third.poll() is None
    release(first)
    third_slot = read_slot(third, timeout=30)
    assert third_slot == first_slot
    third.stdin.close()
    third.wait(timeout=30)


def test_a_sigkilled_holder_frees_its_slot(tmp_path, holders):
    holder = start_holder(1, tmp_path)
    holders.append(holder)
    assert read_slot(holder, timeout=60) == (0, "0")
    waiter = start_holder(1, tmp_path)
    holders.append(waiter)
    assert read_slot(waiter, timeout=3.0) is None
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert read_slot(waiter, timeout=30) == (0, "0")


def test_cuda_visible_devices_set_by_a_scheduler_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert gpu_slots.acquire_gpu_slot(2, tmp_path / "slots") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert not (tmp_path / "slots").exists()


def test_in_process_slot_is_kept_and_released(tmp_path, monkeypatch, holders):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with gpu_slots.gpu_slot(2, tmp_path) as index:
        assert index == 0 and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        assert gpu_slots.acquire_gpu_slot(2, tmp_path) == 0  # a second call keeps the slot it holds
        assert (tmp_path / "slot0.lock").read_text().strip() == str(os.getpid())
        other = start_holder(2, tmp_path)
        holders.append(other)
        assert read_slot(other, timeout=60) == (1, "1")
        release(other)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    again = start_holder(1, tmp_path)
    holders.append(again)
    assert read_slot(again, timeout=60) == (0, "0")


def test_slot_count_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(gpu_slots.SLOTS_ENV, "0")
    assert gpu_slots.acquire_gpu_slot(slot_dir=tmp_path / "off") is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and not (tmp_path / "off").exists()
    monkeypatch.setenv(gpu_slots.SLOTS_ENV, "3")
    assert gpu_slots.slot_count(None) == 3
    assert gpu_slots.slot_count(1) == 1  # the argument wins
    monkeypatch.setenv(gpu_slots.SLOTS_ENV, "four")
    with pytest.raises(UserError, match="ATTNID_GPU_SLOTS='four'"):
        gpu_slots.slot_count(None)


def test_slot_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(gpu_slots.SLOT_DIR_ENV, str(tmp_path / "shared-slots"))
    assert gpu_slots.default_slot_dir() == tmp_path / "shared-slots"
    monkeypatch.delenv(gpu_slots.SLOT_DIR_ENV)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert gpu_slots.default_slot_dir() == tmp_path / "attnid-gpu-slots"


def test_waiting_costs_no_busy_loop(tmp_path, holders):
    """A waiting job sleeps between tries: its CPU time stays far below the wall time it waits."""
    holder = start_holder(1, tmp_path)
    holders.append(holder)
    assert read_slot(holder, timeout=60) is not None
    waiter = start_holder(1, tmp_path)
    holders.append(waiter)
    time.sleep(4.0)
    with open(f"/proc/{waiter.pid}/stat", encoding="utf-8") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    assert read_slot(waiter, timeout=0.1) is None
    assert cpu_s < 3.0, f"the waiting job used {cpu_s:.1f} s of CPU in 4 s"
