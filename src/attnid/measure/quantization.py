"""Simulated quantization and what it is measured by (docs/design.md §16): pure functions.

- :func:`round_to_nearest`: symmetric round-to-nearest (RTN) onto ``2^(b-1) - 1`` levels each side of 0,
  one scale (the group's largest magnitude) per group of ``group`` consecutive entries along the last axis,
  or per row (``group = 0``: per output channel of a weight, per token of an activation).
- :func:`kl_per_token`: ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` of the float model's next-token
  distribution ``p`` against the quantized model's ``q``, per position.
- :func:`activation_shape`: Pearson's kurtosis (``scipy.stats.kurtosis``, 3 for a Gaussian) of every entry
  and ``max |x| / rms(x)``, what rotations are meant to flatten.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def round_to_nearest(x: torch.Tensor, bits: int, group: int = 0) -> torch.Tensor:
    """``x`` rounded to a symmetric ``bits``-bit grid, one scale per ``group`` entries of the last axis
    (0: one per row); a group of zeros stays zero. The last axis must be a multiple of ``group``."""
    if bits < 2:
        raise ValueError(f"bits must be at least 2, got {bits}")
    levels = 2 ** (bits - 1) - 1
    width = x.shape[-1] if group == 0 else group
    if x.shape[-1] % width:
        raise ValueError(f"the last axis ({x.shape[-1]}) is not a multiple of the group size {width}")
    grouped = x.reshape(*x.shape[:-1], x.shape[-1] // width, width)
    scale = grouped.abs().amax(dim=-1, keepdim=True) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    rounded = torch.clamp(torch.round(grouped / safe), -levels, levels) * safe
    return rounded.reshape(x.shape)


def kl_per_token(reference_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` in nats at every position: ``(..., V)`` log-probabilities of both -> ``(...)``."""
    return (reference_logp.exp() * (reference_logp - logp)).sum(dim=-1)


def activation_shape(x: torch.Tensor) -> dict[str, float]:
    """``kurtosis`` (Pearson's, over every entry) and ``max_over_rms`` of an activation."""
    # lazy: scipy.stats takes seconds to import, and every checkpoint command imports this module
    from scipy import stats

    values = x.detach().reshape(-1).to(torch.float64).numpy()
    rms = float(np.sqrt(np.mean(values**2)))
    return {
        "kurtosis": float(stats.kurtosis(values, fisher=False)),
        "max_over_rms": float(np.max(np.abs(values)) / rms) if rms > 0 else math.nan,
    }
