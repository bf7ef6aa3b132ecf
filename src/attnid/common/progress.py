"""Progress on long work: a command that has printed nothing on stderr for a while says what it is doing.

``attnid.cli.main`` runs every command inside :class:`Heartbeat`. Commands print their own
progress (training steps, ``verify``'s cases, large downloads); in between, a stage that
takes longer than :data:`SILENCE_S` (loading a large checkpoint, a model's first
evaluation, a step of a huge model) gets a line ``attnid <command>: still working: <stage>
(<elapsed>)``, so no command is silent for more than about 10 s. The stage is whatever
the command last named with :func:`stage` (a string, or a function returning one, read
when the line is printed): "loading attnid and its libraries" while the parser imports them,
"computing" once the command runs, until it names a finer stage.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

SILENCE_S = 8.0  # a line after this long without one on stderr; the poll adds at most POLL_S
POLL_S = 0.5
SILENCE_ENV = "ATTNID_PROGRESS_S"  # overrides SILENCE_S (the test suite raises it: see tests/conftest.py)

_stage: str | Callable[[], str] = "loading attnid and its libraries"


def stage(description: str | Callable[[], str]) -> None:
    """Name what the command is doing now (shown only if it then runs silently for a while)."""
    global _stage
    _stage = description


def _stage_text() -> str:
    try:
        return _stage() if callable(_stage) else _stage
    except Exception:  # noqa: BLE001 - a progress line must never break the command
        return "working"


class _TimedStream:
    """stderr, remembering when it was last written to."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.last_write = stream, time.monotonic()

    def write(self, text: str) -> int:
        self.last_write = time.monotonic()
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class Heartbeat:
    """While active, print a line on stderr whenever nothing was printed there for :data:`SILENCE_S`."""

    def __init__(self, command: str, silence_s: float | None = None):
        if silence_s is None:
            try:
                silence_s = float(os.environ.get(SILENCE_ENV, SILENCE_S))
            except ValueError:
                silence_s = SILENCE_S
        self.command, self.silence_s = command, silence_s
        self._stop = threading.Event()

    def __enter__(self) -> Heartbeat:
        stage("loading attnid and its libraries")
        self.started = time.monotonic()
        self._original = sys.stderr
        self._stream = sys.stderr = _TimedStream(sys.stderr)
        self._thread = threading.Thread(target=self._watch, name="attnid-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            if now - self._stream.last_write >= self.silence_s:
                elapsed = int(now - self.started)
                self._stream.write(
                    f"attnid {self.command}: still working: {_stage_text()} "
                    f"({elapsed // 60}m{elapsed % 60:02d}s)\n"
                )
                self._stream.flush()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.stderr = self._original
