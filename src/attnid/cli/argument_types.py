"""argparse types for the numbers a command takes, each refused in argparse's one line when out of range:
thread counts (:func:`thread_count`) and seeds (:func:`seed_number`). ``attnid train``'s own options are
bounded by their field metadata instead (:mod:`attnid.training.config`)."""

from __future__ import annotations

import argparse

from attnid.common.limits import SEED_MAXIMUM, THREADS_MAXIMUM


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def thread_count(text: str) -> int:
    """A number of threads: 1 to :data:`~attnid.common.limits.THREADS_MAXIMUM`."""
    value = _integer(text)
    if not 1 <= value <= THREADS_MAXIMUM:
        raise argparse.ArgumentTypeError(f"threads must be from 1 to {THREADS_MAXIMUM}, not {value}")
    return value


def seed_number(text: str) -> int:
    """A seed: 0 to :data:`~attnid.common.limits.SEED_MAXIMUM` (it fits in 64 bits)."""
    value = _integer(text)
    if not 0 <= value <= SEED_MAXIMUM:
        raise argparse.ArgumentTypeError(f"a seed must be from 0 to 2**63 - 1, not {value}")
    return value
