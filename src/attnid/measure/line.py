"""The loss barrier of a straight line between two models (docs/design.md §18): the loss above the chord
joining the end points' losses, and its largest value. Pure; read by ``attnid barrier``
(:mod:`attnid.edits.barrier`) and by the alignment table that recomputes it
(:mod:`attnid.reports.alignment_table`)."""

from __future__ import annotations


def chord_gap(ts: list[float], losses: list[float]) -> list[float]:
    """``L(t) - ((1 - t) L(0) + t L(1))`` at each ``t`` (``ts`` from 0 to 1, ``losses`` at them)."""
    first, last = losses[0], losses[-1]
    return [loss - ((1 - t) * first + t * last) for t, loss in zip(ts, losses, strict=True)]


def barrier_height(ts: list[float], losses: list[float]) -> float:
    """The largest loss above the chord, 0 when the path never rises above it."""
    return max(0.0, *chord_gap(ts, losses))
