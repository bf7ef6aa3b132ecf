"""Process-level helpers of ``attnid train``: the device, the stop signals, the log lines."""

from __future__ import annotations

import contextlib
import signal
import sys
from types import FrameType
from typing import Any

import torch

from attnid.common.errors import UserError


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device; use --device cpu or auto")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


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
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers, no graceful stop
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
