"""One training job per GPU: concurrent jobs on a multi-GPU machine bind to different devices.

Snakemake on one machine with several GPUs,

    snakemake --cores all --configfile config/paper.yaml --resources gpu=4

runs at most 4 training jobs at once, because each declares ``resources: gpu=1``
(``resources.gpu`` in the configuration) and ``--resources gpu=4`` caps their sum.
Snakemake does not say *which* GPU a job should use, so without more every job
would train on device 0. :func:`acquire_gpu_slot` closes that gap: each job takes
an exclusive lock on one of N lock files, ``slot0.lock`` ... ``slot{N-1}.lock``,
and sets ``CUDA_VISIBLE_DEVICES`` to the index of the slot it holds. With
``--resources gpu=N`` and N GPUs a free slot always exists when a job starts;
a job started by hand beyond that waits, printing one line every 30 seconds.

The locks are ``fcntl.flock`` locks on an open file, held for the life of the
process: the kernel drops them when the process ends in any way, SIGKILL and
out-of-memory kills included, so a dead job never leaves a slot taken and there
is no lock file to clean up. (The files stay; they are empty of meaning except
for the pid written into them, which the waiting message shows.)

Rules:

- ``CUDA_VISIBLE_DEVICES`` already set (SLURM with ``--gpus=1``, a user's choice):
  nothing happens; the scheduler has chosen the device.
- N comes from the argument, else ``ATTNID_GPU_SLOTS``, else the GPUs present.
  ``ATTNID_GPU_SLOTS=0`` (or no GPU) turns slots off.
- The slot directory is the argument, else ``ATTNID_GPU_SLOT_DIR``, else
  ``$XDG_RUNTIME_DIR/attnid-gpu-slots``, else ``<temp dir>/attnid-gpu-slots-<uid>``.
  It must be on a local filesystem (flock over NFS is unreliable). The default is
  per user; point ``ATTNID_GPU_SLOT_DIR`` at a shared directory to coordinate
  several users' jobs.
- Each job uses one GPU: a job that needs several must not take a slot.

Call it before anything initialises CUDA, ``torch.cuda.is_available()`` included:
CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import torch

from attnid.common.errors import UserError

SLOTS_ENV = "ATTNID_GPU_SLOTS"
SLOT_DIR_ENV = "ATTNID_GPU_SLOT_DIR"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
WAIT_MESSAGE_EVERY_S = 30.0
POLL_EVERY_S = 1.0

# The slot this process holds: (index, open file whose flock is the lock). Kept open for the
# process's lifetime; closing the file releases the lock.
_held: tuple[int, TextIO] | None = None


def default_slot_dir() -> Path:
    if os.environ.get(SLOT_DIR_ENV):
        return Path(os.environ[SLOT_DIR_ENV])
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and os.path.isdir(runtime_dir):
        return Path(runtime_dir) / "attnid-gpu-slots"
    return Path(tempfile.gettempdir()) / f"attnid-gpu-slots-{os.getuid()}"


def gpu_count() -> int:
    """GPUs on this machine, counted without initialising CUDA in this process."""
    if not torch.backends.cuda.is_built():
        return 0
    count_nvml = getattr(torch.cuda, "_device_count_nvml", None)  # NVML does not initialise CUDA
    count = count_nvml() if count_nvml is not None else -1
    if count >= 0:
        return count
    # without NVML torch.cuda.device_count() initialises the driver, which fixes CUDA_VISIBLE_DEVICES: count
    # in a child process instead
    result = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return int(result.stdout.strip() or 0) if result.returncode == 0 else 0


def slot_count(n_slots: int | None) -> int:
    if n_slots is None and os.environ.get(SLOTS_ENV, "").strip():
        raw = os.environ[SLOTS_ENV].strip()
        try:
            n_slots = int(raw)
        except ValueError:
            raise UserError(
                f"{SLOTS_ENV}={raw!r} must be a whole number of GPU slots (0 turns slots off)"
            ) from None
    if n_slots is None:
        n_slots = gpu_count()
    if n_slots < 0:
        raise UserError(f"the number of GPU slots must be >= 0, not {n_slots}")
    return n_slots


def _try_lock(path: Path) -> TextIO | None:
    """The open lock file if this process got the slot's exclusive lock, else None."""
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - must stay open to hold the lock
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _holders(paths: list[Path]) -> str:
    pids = []
    for path in paths:
        with contextlib.suppress(OSError):
            pids.append(path.read_text(encoding="utf-8").strip() or "?")
    return ", ".join(pids)


def acquire_gpu_slot(
    n_slots: int | None = None,
    slot_dir: str | os.PathLike | None = None,
    *,
    wait_message_every: float = WAIT_MESSAGE_EVERY_S,
    poll_every: float = POLL_EVERY_S,
) -> int | None:
    """Take a free GPU slot, set ``CUDA_VISIBLE_DEVICES`` to its index and return the index.

    Returns None and changes nothing when ``CUDA_VISIBLE_DEVICES`` was set by someone
    else or there are no slots. Waits while all slots are taken. A second call in the
    same process returns the slot it already holds.
    """
    global _held
    if _held is not None:
        return _held[0]
    if VISIBLE_ENV in os.environ:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("acquire_gpu_slot() must run before CUDA is initialised in this process")
    n_slots = slot_count(n_slots)
    if n_slots == 0:
        return None
    directory = Path(slot_dir) if slot_dir is not None else default_slot_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the GPU slot directory {directory} ({err.strerror}); "
            f"set {SLOT_DIR_ENV} to a writable local directory"
        ) from None
    paths = [directory / f"slot{index}.lock" for index in range(n_slots)]
    waiting_since, last_message = None, -float("inf")
    while True:
        for index, path in enumerate(paths):
            handle = _try_lock(path)
            if handle is not None:
                _held = (index, handle)
                os.environ[VISIBLE_ENV] = str(index)
                if waiting_since is not None:
                    print(
                        f"attnid: got GPU slot {index} after {time.monotonic() - waiting_since:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                return index
        now = time.monotonic()
        waiting_since = now if waiting_since is None else waiting_since
        if now - last_message >= wait_message_every:
            last_message = now
            print(
                f"attnid: all {n_slots} GPU slots in {directory} are taken (pids {_holders(paths)}); "
                f"waiting {now - waiting_since:.0f} s so far",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(poll_every)


def release_gpu_slot() -> None:
    """Give back the slot this process holds (the process ending does the same)."""
    global _held
    if _held is None:
        return
    index, handle = _held
    _held = None
    handle.close()
    if os.environ.get(VISIBLE_ENV) == str(index):
        del os.environ[VISIBLE_ENV]


@contextlib.contextmanager
def gpu_slot(n_slots: int | None = None, slot_dir: str | os.PathLike | None = None) -> Iterator[int | None]:
    """:func:`acquire_gpu_slot` for a ``with`` block; the slot is released at its end."""
    already_held = _held is not None
    index = acquire_gpu_slot(n_slots, slot_dir)
    try:
        yield index
    finally:
        if not already_held:
            release_gpu_slot()
