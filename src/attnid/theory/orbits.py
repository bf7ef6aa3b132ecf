"""The symmetry groups that act on a factor pair, one type each, with one interface.

A group acts on a pair ``(A, B)`` by ``A -> M A``, ``B -> M^{-T} B``, which keeps
``A^T B`` and so the function (docs/design.md §2, §8):

- :class:`GeneralLinearOrbit`: ``M`` in ``GL_D``. Every output-value pair, and the
  query-key pairs of a model without RoPE (Lemma 4.1, 4.3, 4.6). With grouped-query
  attention the pair is a key/value group's (its query heads side by side), still ``GL_D``
  (the paper's §4.9). Geometry: :mod:`attnid.theory.factor_pairs`.
- :class:`RopeCommutantOrbit`: the query-key pairs of a RoPE model. ``M`` must commute
  with every rotation: per plane ``a I + b J`` (Prop. 4.8), ``D`` parameters instead of
  ``D^2``. Geometry: :mod:`attnid.theory.rope`.

Both have the same methods (tangent projection and its squared norm, the conserved
imbalance, the excess norm, rebalancing, a random element, the orbit dimension), so
callers hold an :class:`Orbit` and never ask which one it is. Which orbit a model's
circuit uses is :func:`attnid.model.layout.orbit_of`'s decision. Everything is float64
and batched over any leading shape of the stacked pairs ``(..., D, n)``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from attnid.theory import factor_pairs, rope

# What Orbit.rebalance_target prepares and Orbit.rebalance takes: the target imbalance, or None for balanced.
RebalanceTarget = torch.Tensor | None


@dataclass(frozen=True)
class Rebalanced:
    """What :meth:`Orbit.rebalance` returns: the moved pairs, which pairs were moved, and per pair the
    minimum of ``||A||_F^2 + ||B||_F^2`` over the orbit at the weights *before* the move (μ's denominator,
    computed on the way; a caller that measures μ at those weights again can reuse it)."""

    pair_a: torch.Tensor  # (..., D, n_a)
    pair_b: torch.Tensor  # (..., D, n_b)
    done: torch.Tensor  # (...) bool: False where the pair was left alone (near rank-deficient product)
    minimum: torch.Tensor  # (...)


class Orbit(ABC):
    """The orbit of a factor pair under one symmetry group (see the module docstring)."""

    name: str  # how tables and reports call it: "gl" or "rope"

    @abstractmethod
    def tangent_projection(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Orthogonal projection of a step ``(dA, dB)`` onto the orbit's tangent at ``(A, B)``: the
        unidentified part of the step (docs/design.md §2.2, §8)."""

    @abstractmethod
    def unidentified_sq_norm(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(||proj(dA, dB)||^2, singular)`` per pair: ρ's numerator (docs/design.md §3.1), and a bool
        marking pairs whose normal equations were singular (solved by pseudo-inverse)."""

    @abstractmethod
    def unidentified_sq_norm_from_products(
        self, gram_a: torch.Tensor, gram_b: torch.Tensor, cross_a: torch.Tensor, cross_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`unidentified_sq_norm` from ``D x D`` products: ``A A^T``, ``B B^T`` at the pre-step point,
        ``dA A^T`` and ``dB B^T`` (the drift split's, docs/design.md §7), each ``(..., D, D)``."""

    @abstractmethod
    def project_to_algebra(self, symmetric: torch.Tensor) -> torch.Tensor:
        """Orthogonal projection of symmetric ``(..., D, D)`` matrices onto the orbit's Lie algebra
        (``P`` of docs/design.md §8): the identity for ``GL_D``."""

    def conserved_imbalance(self, pair_a: torch.Tensor, pair_b: torch.Tensor) -> torch.Tensor:
        """What gradient flow conserves on this orbit, ``(..., D, D)``: ``P(A A^T - B B^T)`` (Lemma 5.1).
        β compares it with its value at step 0; it is also the form of a rebalancing target."""
        return self.conserved_imbalance_from_grams(factor_pairs.gram(pair_a), factor_pairs.gram(pair_b))

    def conserved_imbalance_from_grams(self, gram_a: torch.Tensor, gram_b: torch.Tensor) -> torch.Tensor:
        """:meth:`conserved_imbalance` from the Gram matrices ``A A^T``, ``B B^T``."""
        return self.project_to_algebra(gram_a - gram_b)

    @abstractmethod
    def excess_norm_terms(
        self,
        pair_a: torch.Tensor,
        pair_b: torch.Tensor,
        grams: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(||A||_F^2 + ||B||_F^2, its minimum over the orbit)`` per pair: μ's two sums (§3.4).
        ``grams``: ``(A A^T, B B^T)`` when the caller has them already."""

    @abstractmethod
    def rebalance_target(self, imbalance: torch.Tensor | None) -> RebalanceTarget:
        """A rebalancing target prepared once (e.g. per run): ``imbalance`` ``(..., D, D)`` in the form
        :meth:`conserved_imbalance` gives, or None for balanced (zero). Pass it to :meth:`rebalance`."""

    @abstractmethod
    def rebalance(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, target: RebalanceTarget = None
    ) -> Rebalanced:
        """Move every pair along the orbit to the prepared ``target`` (None: balanced), keeping ``A^T B``
        (docs/design.md §4, §8). Pairs too close to rank-deficient are left alone (``done`` False)."""

    @abstractmethod
    def random_element(
        self, batch_shape: tuple[int, ...], head_dim: int, generator: torch.Generator, spread: float = 0.5
    ) -> torch.Tensor:
        """A random, well-conditioned group element ``M`` ``(*batch_shape, D, D)``, float64."""

    @staticmethod
    def act(
        element: torch.Tensor, pair_a: torch.Tensor, pair_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The symmetry ``A -> M A``, ``B -> M^{-T} B`` (keeps ``A^T B``)."""
        return element @ pair_a, torch.linalg.solve(element.transpose(-1, -2), pair_b)

    @abstractmethod
    def tangent_rank(self, pair_a: torch.Tensor, pair_b: torch.Tensor) -> int:
        """The orbit's dimension at these pairs, summed over the batch: the rank of the tangent map
        ``X -> (X A, -X^T B)`` on the group's Lie algebra."""

    @abstractmethod
    def generic_dimension(self, head_dim: int, n_a: int, n_b: int) -> int:
        """The orbit dimension of one pair ``(D x n_a, D x n_b)`` at a generic point (compare with
        :mod:`attnid.theory.counts`' closed forms)."""


class GeneralLinearOrbit(Orbit):
    """``GL_D`` acting on a pair (Lemma 4.1, 4.3, 4.6); geometry in :mod:`attnid.theory.factor_pairs`."""

    name = "gl"

    def tangent_projection(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return factor_pairs.tangent_projection(pair_a, pair_b, step_a, step_b)

    def unidentified_sq_norm(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return factor_pairs.unidentified_sq_norm(pair_a, pair_b, step_a, step_b)

    def unidentified_sq_norm_from_products(
        self, gram_a: torch.Tensor, gram_b: torch.Tensor, cross_a: torch.Tensor, cross_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return factor_pairs.unidentified_sq_norm_from_products(gram_a, gram_b, cross_a, cross_b)

    def project_to_algebra(self, symmetric: torch.Tensor) -> torch.Tensor:
        return symmetric

    def excess_norm_terms(
        self,
        pair_a: torch.Tensor,
        pair_b: torch.Tensor,
        grams: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return factor_pairs.excess_norm_terms(pair_a, pair_b, grams)

    def rebalance_target(self, imbalance: torch.Tensor | None) -> RebalanceTarget:
        """The target itself (None: balanced)."""
        return imbalance

    def rebalance(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, target: RebalanceTarget = None
    ) -> Rebalanced:
        if target is not None:
            target = target.reshape(*pair_a.shape[:-2], *target.shape[-2:]).to(pair_a)
        product = factor_pairs.product_svd(pair_a, pair_b)
        new_a, new_b, done = factor_pairs.rebalance_pairs(pair_a, pair_b, target, product=product)
        return Rebalanced(new_a, new_b, done, 2 * product[1].sum(-1))

    def random_element(
        self, batch_shape: tuple[int, ...], head_dim: int, generator: torch.Generator, spread: float = 0.5
    ) -> torch.Tensor:
        """``exp(spread X)`` for Gaussian ``X / sqrt(D)``."""
        shape = (*batch_shape, head_dim, head_dim)
        noise = torch.randn(shape, generator=generator, dtype=torch.float64) / math.sqrt(head_dim)
        return torch.linalg.matrix_exp(spread * noise)

    def tangent_rank(self, pair_a: torch.Tensor, pair_b: torch.Tensor) -> int:
        """The tangent map's normal operator is ``X -> X A A^T + B B^T X``, with eigenvalues ``a_j + b_i``
        over the two Gram eigenbases: count those above round-off."""
        eig_a = torch.linalg.eigvalsh(factor_pairs.gram(pair_a)).clamp_min(0)
        eig_b = torch.linalg.eigvalsh(factor_pairs.gram(pair_b)).clamp_min(0)
        sums = eig_b.unsqueeze(-1) + eig_a.unsqueeze(-2)
        scale = sums.flatten(-2).amax(-1)[..., None, None]
        return int((sums > factor_pairs.singular_rtol(sums.dtype) * scale).sum())

    def generic_dimension(self, head_dim: int, n_a: int, n_b: int) -> int:
        """``D^2`` minus the stabiliser ``{X : X A = 0, X^T B = 0}``, of dimension
        ``(D - rank A)(D - rank B)``."""
        return head_dim**2 - (head_dim - min(head_dim, n_a)) * (head_dim - min(head_dim, n_b))


class RopeCommutantOrbit(Orbit):
    """The commutant of the RoPE rotations (Prop. 4.8; docs/design.md §8); geometry in
    :mod:`attnid.theory.rope`."""

    name = "rope"

    def tangent_projection(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope.rope_tangent_projection(pair_a, pair_b, step_a, step_b)

    def unidentified_sq_norm(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope.rope_unidentified_sq_norm(pair_a, pair_b, step_a, step_b)

    def unidentified_sq_norm_from_products(
        self, gram_a: torch.Tensor, gram_b: torch.Tensor, cross_a: torch.Tensor, cross_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope.rope_unidentified_sq_norm_from_products(gram_a, gram_b, cross_a, cross_b)

    def project_to_algebra(self, symmetric: torch.Tensor) -> torch.Tensor:
        """The plane blocks ``(t_p / 2) I_2``: the ``J`` part of a symmetric block is zero, off-plane
        entries project to zero."""
        return rope.rope_from_plane_traces(rope.rope_plane_traces(symmetric))

    def excess_norm_terms(
        self,
        pair_a: torch.Tensor,
        pair_b: torch.Tensor,
        grams: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope.rope_excess_norm_terms(pair_a, pair_b, grams)

    def rebalance_target(self, imbalance: torch.Tensor | None) -> RebalanceTarget:
        """Only the plane traces of the target matter (:func:`attnid.theory.rope.rope_rebalance_pairs`)."""
        return imbalance

    def rebalance(
        self, pair_a: torch.Tensor, pair_b: torch.Tensor, target: RebalanceTarget = None
    ) -> Rebalanced:
        if target is not None:
            target = target.reshape(*pair_a.shape[:-2], *target.shape[-2:]).to(pair_a)
        minimum = rope.rope_excess_norm_terms(pair_a, pair_b)[1]
        new_a, new_b, done = rope.rope_rebalance_pairs(pair_a, pair_b, target)
        return Rebalanced(new_a, new_b, done, minimum)

    def random_element(
        self, batch_shape: tuple[int, ...], head_dim: int, generator: torch.Generator, spread: float = 0.5
    ) -> torch.Tensor:
        """Per plane ``r R(theta)``, ``log r`` in ``[-spread, spread]``, ``theta`` uniform."""
        shape = (*batch_shape, head_dim, head_dim)
        half = head_dim // 2
        log_r = (2 * torch.rand((*batch_shape, half), generator=generator, dtype=torch.float64) - 1) * spread
        theta = 2 * math.pi * torch.rand((*batch_shape, half), generator=generator, dtype=torch.float64)
        r_cos, r_sin = log_r.exp() * theta.cos(), log_r.exp() * theta.sin()
        element = torch.zeros(shape, dtype=torch.float64)
        idx = torch.arange(half)
        element[..., idx, idx] = r_cos
        element[..., idx + half, idx + half] = r_cos
        element[..., idx, idx + half] = -r_sin  # J = [[0, -1], [1, 0]] in the plane (p, p + D/2)
        element[..., idx + half, idx] = r_sin
        return element

    def tangent_rank(self, pair_a: torch.Tensor, pair_b: torch.Tensor) -> int:
        """Per plane the two tangent directions have norm ``|A_p|^2 + |B_p|^2`` and are orthogonal:
        2 per plane that is not zero."""
        norm = rope.plane_sq_norms(pair_a) + rope.plane_sq_norms(pair_b)
        return int(2 * (norm > factor_pairs.singular_rtol(norm.dtype) * norm.amax(-1, keepdim=True)).sum())

    def generic_dimension(self, head_dim: int, n_a: int, n_b: int) -> int:
        """``D``: a scale and a rotation per plane."""
        return head_dim


GENERAL_LINEAR = GeneralLinearOrbit()
ROPE_COMMUTANT = RopeCommutantOrbit()
ORBITS: dict[str, Orbit] = {orbit.name: orbit for orbit in (GENERAL_LINEAR, ROPE_COMMUTANT)}
