"""One circuit's pairs at a point and across one optimizer step, with the products every measurement shares.

The drift split (every step, docs/design.md §7), ρ (§3.1), β and μ (§3.2, §3.4) all read
the same few ``D x D`` products of the stacked pairs ``(L*G, D, n)`` of a circuit:

- at a point ``(A, B)``: the Gram matrices ``A Aᵀ``, ``B Bᵀ`` (β's imbalance, μ's nuclear
  norm, ρ's normal equations at the pre-step point);
- across a step ``(A0, B0) -> (A1, B1)``: ``dA = A1 - A0``, ``dB = B1 - B0``, the cross
  products ``dA A0ᵀ`` and ``dB B0ᵀ`` (the drift's first-order part and ρ's right-hand side)
  and ``dA dAᵀ``, ``dB dBᵀ`` (the second-order part).

:class:`CircuitPairs` and :class:`CircuitStep` compute each of them once, when first asked
(``D x n`` products are most of a log step's arithmetic), so that one step's drift terms and
its row's ρ, β, μ share them. Everything is float64 and stays on the device of the pairs.
"""

from __future__ import annotations

import threading
from functools import cached_property

import torch

from attnid.model.layout import LayerTensors, stacked_pairs
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS
from attnid.theory.shape import LayerShape


class CircuitPairs:
    """One circuit's stacked pairs ``A`` ``(L*G, D, n_a)``, ``B`` ``(L*G, D, n_b)`` at one point, float64."""

    def __init__(self, pair_a: torch.Tensor, pair_b: torch.Tensor):
        self.pair_a, self.pair_b = pair_a, pair_b

    @cached_property
    def gram_a(self) -> torch.Tensor:
        """``A Aᵀ`` ``(L*G, D, D)``."""
        return factor_pairs.gram(self.pair_a)

    @cached_property
    def gram_b(self) -> torch.Tensor:
        """``B Bᵀ`` ``(L*G, D, D)``."""
        return factor_pairs.gram(self.pair_b)

    @property
    def grams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gram_a, self.gram_b

    def to(self, device: torch.device) -> CircuitPairs:
        """The same pairs on ``device`` (always a copy there; products are recomputed where asked)."""
        return CircuitPairs(self.pair_a.to(device, copy=True), self.pair_b.to(device, copy=True))


class CircuitStep:
    """One circuit across one optimizer step, from :class:`CircuitPairs` ``pre`` to ``post``."""

    def __init__(self, pre: CircuitPairs, post: CircuitPairs):
        self.pre, self.post = pre, post

    @cached_property
    def step_a(self) -> torch.Tensor:
        """``dA = A1 - A0`` (exact: the difference of two float32 numbers is a float64 number)."""
        return self.post.pair_a - self.pre.pair_a

    @cached_property
    def step_b(self) -> torch.Tensor:
        return self.post.pair_b - self.pre.pair_b

    @cached_property
    def _side_a(self) -> tuple[torch.Tensor, torch.Tensor]:
        return factor_pairs.step_products(self.step_a, self.pre.pair_a)

    @cached_property
    def _side_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        return factor_pairs.step_products(self.step_b, self.pre.pair_b)

    @property
    def cross_a(self) -> torch.Tensor:
        """``dA A0ᵀ`` ``(L*G, D, D)``."""
        return self._side_a[0]

    @property
    def cross_b(self) -> torch.Tensor:
        """``dB B0ᵀ`` ``(L*G, D, D)``."""
        return self._side_b[0]

    @property
    def step_gram_a(self) -> torch.Tensor:
        """``dA dAᵀ`` ``(L*G, D, D)``."""
        return self._side_a[1]

    @property
    def step_gram_b(self) -> torch.Tensor:
        return self._side_b[1]

    @cached_property
    def pre_grams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``A0 A0ᵀ`` and ``B0 B0ᵀ`` from the post-step Grams and the step's products, with no ``D x n``
        product: ``A1 A1ᵀ = A0 A0ᵀ + dA A0ᵀ + A0 dAᵀ + dA dAᵀ`` (an identity; the round-off is that of a
        directly computed Gram matrix, ``eps ||A1||²``)."""

        def before(post_gram, cross, step_gram):
            return post_gram - cross - cross.transpose(-1, -2) - step_gram

        return (
            before(self.post.gram_a, self.cross_a, self.step_gram_a),
            before(self.post.gram_b, self.cross_b, self.step_gram_b),
        )

    def step_sq_norm(self) -> torch.Tensor:
        """``||dA||² + ||dB||²`` per pair ``(L*G,)``, traces of ``dA dAᵀ`` and ``dB dBᵀ``: ρ's denominator."""
        return factor_pairs.trace(self.step_gram_a) + factor_pairs.trace(self.step_gram_b)


def read_pairs(tensors_per_layer: list[LayerTensors], layout: LayerShape) -> dict[str, CircuitPairs]:
    """Both circuits' :class:`CircuitPairs` from per-layer ``(c_attn.weight, c_attn.bias, c_proj.weight)``
    (live tensors or a copy, any float dtype; the pairs are float64 on the tensors' device)."""
    return {circuit: CircuitPairs(*stacked_pairs(tensors_per_layer, layout, circuit)) for circuit in CIRCUITS}


def steps_between(pre: dict[str, CircuitPairs], post: dict[str, CircuitPairs]) -> dict[str, CircuitStep]:
    """Per circuit, the :class:`CircuitStep` from ``pre`` to ``post``."""
    return {circuit: CircuitStep(pre[circuit], post[circuit]) for circuit in CIRCUITS}


class Point:
    """The attention tensors of one point of a run (per layer, live or copied) and, built once when first
    asked (from any thread), their :class:`CircuitPairs` on each device the measurements use.

    The pairs where the tensors are come from the tensors; copies on another device come from those
    pairs, never from the tensors again (live tensors move on with training)."""

    def __init__(self, tensors_per_layer: list[LayerTensors], layout: LayerShape) -> None:
        self.tensors, self.layout = tensors_per_layer, layout
        self.device = tensors_per_layer[0][0].device
        self._pairs: dict[torch.device, dict[str, CircuitPairs]] = {}
        self._lock = threading.Lock()

    def pairs(self, device: torch.device | None = None) -> dict[str, CircuitPairs]:
        """Both circuits' pairs where the tensors are (``device`` None) or copied to ``device``."""
        device = self.device if device is None else torch.device(device)
        with self._lock:
            if self.device not in self._pairs:
                self._pairs[self.device] = read_pairs(self.tensors, self.layout)
            if device not in self._pairs:
                self._pairs[device] = {c: p.to(device) for c, p in self._pairs[self.device].items()}
            return self._pairs[device]
