"""Process-level helpers of ``attnid train``: the device and what runs where on it (``--metrics-device``,
``--compile``, the GPU model a checkpoint was written on), the stop signals, the log lines."""

from __future__ import annotations

import contextlib
import signal
import sys
from types import FrameType
from typing import Any

import torch

from attnid.common import interrupts
from attnid.common.errors import UserError


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device; use --device cpu or auto")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_metrics_device(requested: str, device: torch.device) -> str:
    """``host`` or ``device`` for ``--metrics-device auto|host|device``.

    ``auto`` is ``host`` when training on CUDA: a log step's float64 ``eigh``/``svd``/``qr``
    on 64x64 head matrices is dispatched by PyTorch one matrix at a time to cuSOLVER,
    about 500 small calls per log step at the paper's size, which the host's LAPACK does
    in milliseconds. This choice follows that analysis; it has not been timed on a GPU
    (``benchmarks/gpu_check.sh`` times both). On the CPU ``auto`` is ``device`` (no copies).
    """
    if requested not in ("auto", "host", "device"):
        raise UserError(f"unknown --metrics-device {requested!r}: choose auto, host or device")
    if requested == "auto":
        return "host" if device.type == "cuda" else "device"
    return requested


def resolve_compile(requested: bool | None, device: torch.device) -> bool:
    """``--compile``: on by default for CUDA (nanoGPT's speed is with it), off on the CPU."""
    return device.type == "cuda" if requested is None else requested


def device_name(device: torch.device) -> str | None:
    """The GPU model (for the checkpoint), None on the CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def other_gpu_warning(saved: str | None, current: str | None) -> str | None:
    """One warning line when a checkpoint from one GPU model is resumed on another, else None."""
    if saved is None or current is None or saved == current:
        return None
    return (
        f"warning: the checkpoint was written on a {saved}, resuming on a {current}: the run continues, "
        f"but its numbers are not those it would have had on the {saved}"
    )


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def say(message: str) -> None:
    """One ``attnid train:`` line on stderr."""
    print(f"attnid train: {message}", file=sys.stderr, flush=True)


class StopSignals:
    """Turns SIGTERM/SIGINT into a flag the loop checks after each step (then: checkpoint, exit 143/130)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}  # signal -> the handler it had (signal.signal's return)

    def __enter__(self) -> StopSignals:
        interrupts.stop_if_received()  # a Ctrl-C while torch was imported, which a library swallowed
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers, no graceful stop
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
