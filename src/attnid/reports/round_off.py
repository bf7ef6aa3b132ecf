"""Numerical round-off of the relative quantities a run logs (ρ, β, the drift parts, μ): the one table of unit
round-offs, the floor a quantity of weights trained in a precision cannot go below, and whether a series is
that floor rather than data (docs/design.md §3).

The claims (:mod:`attnid.reports.claims`) use it to decide whether a precision resolves a threshold; the
figures draw a series at round-off on its floor instead of as data, and the sweep's slopes are never fitted
to one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

# Unit round-off of each training precision (run.json "dtype", as :func:`run_dtype` reads it).
UNIT_ROUND_OFF = {"float64": 2.0**-53, "float32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
# A relative quantity computed from weights trained in some precision has a round-off floor at that
# precision's unit round-off; a series whose largest value is below this many floors is round-off, not data.
ROUND_OFF_MARGIN = 10.0


def run_dtype(info: dict) -> str:
    """The training precision of a run: run.json's ``dtype``; runs that predate it were float32 (CPU)
    or bf16."""
    dtype = info.get("dtype")
    if dtype:
        return "bf16" if dtype == "bfloat16" else str(dtype)
    return "bf16" if info.get("device") == "cuda" else "float32"


def dtypes_of(frame: pd.DataFrame) -> str:
    """The training precisions of ``frame``'s runs (a ``dtype`` column), e.g. ``float64`` or
    ``float32+float64`` ('' for none)."""
    if frame.empty or "dtype" not in frame:
        return ""
    names = set()
    for value in frame["dtype"].dropna().astype(str):
        names.update(value.split("+"))
    return "+".join(sorted(names))


def coarsest_dtype(dtypes: Iterable[str]) -> str:
    """The precision with the highest round-off floor among ``dtypes`` (``float32`` when none is known)."""
    known = [d for d in dtypes if d in UNIT_ROUND_OFF]
    return max(known, key=lambda dtype: UNIT_ROUND_OFF[dtype]) if known else "float32"


def round_off_floor(dtype: str, order: int = 1) -> float:
    """The round-off floor of a relative quantity of weights stored in ``dtype``: its unit round-off, to the
    power ``order`` for a quantity that rounding moves only at that order (μ at its minimum, the balanced
    point: order 2), and never below float64's, in which the quantity is computed."""
    return max(UNIT_ROUND_OFF[dtype] ** order, UNIT_ROUND_OFF["float64"])


def round_off_ceiling(dtype: str, steps: int = 1, order: int = 1) -> float:
    """The largest value still counted as round-off: ``ROUND_OFF_MARGIN`` floors, times ``sqrt(steps)`` for a
    sum of ``steps`` per-step terms each rounded independently (the drift parts, docs/design.md §7)."""
    return ROUND_OFF_MARGIN * round_off_floor(dtype, order) * math.sqrt(max(int(steps), 1))


def at_round_off(values: ArrayLike, dtype: str, steps: int = 1) -> bool:
    """Whether a relative quantity is numerical round-off for runs trained in ``dtype``: its largest
    finite value is below :func:`round_off_ceiling` (all zero counts as round-off)."""
    finite = (
        pd.to_numeric(pd.Series(values, dtype=float), errors="coerce")
        .replace([np.inf, -np.inf], np.nan)
        .dropna()
    )
    if not len(finite):
        return False
    return float(finite.abs().max()) < round_off_ceiling(dtype, steps)
