"""A Ctrl-C is never lost while a command starts (docs/design.md §6.1).

Python turns SIGINT into a ``KeyboardInterrupt`` raised in whatever code the main thread is running. While a
command imports torch and the libraries it pulls in, that code can be a third-party ``except:`` or ``except
BaseException:`` that swallows it, and the command would then run to the end as if nothing had been asked.
:func:`recorded` installs a handler that remembers the signal before raising, and :func:`stop_if_received`,
called where a command is about to start its long work, raises it again.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

_received: list[int] = []


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def recorded() -> Iterator[None]:
    """Remember every SIGINT while the block runs (main thread only; elsewhere Python allows no handler),
    then give SIGINT back the handler it had."""
    _received.clear()
    previous = signal.getsignal(signal.SIGINT)
    installed = False
    if previous is signal.default_int_handler:  # not ignored, and not someone else's
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGINT, _handle)
            installed = True
    try:
        yield
    finally:
        _received.clear()  # the next command (tests run many in one process) starts with none received
        if installed:
            signal.signal(signal.SIGINT, previous)


def stop_if_received() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT arrived inside :func:`recorded`, even a swallowed one."""
    if _received:
        raise KeyboardInterrupt
