"""Reference statistics computed by hand, against which the tests read attnid.reports.statistics' tables:
the exact sign-flip p by enumerating every sign vector, and Holm's adjustment as defined."""

from __future__ import annotations

import itertools

import numpy as np


def enumerated_sign_flip_p(values: np.ndarray) -> float:
    observed = abs(values.sum())
    signs = itertools.product((1, -1), repeat=len(values))
    return float(np.mean([abs(np.dot(sign, values)) >= observed * (1 - 1e-12) for sign in signs]))


def holm_by_hand(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's adjusted p as defined: the i-th smallest times (m - i + 1), running maximum, at most 1."""
    ordered = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for i, name in enumerate(ordered):
        running = max(running, (len(ordered) - i) * p_values[name])
        adjusted[name] = min(1.0, running)
    return adjusted
