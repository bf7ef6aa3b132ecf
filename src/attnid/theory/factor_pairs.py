"""Factor pairs of multi-head attention and the geometry of their symmetry orbits.

A *factor pair* is ``(A, B)`` with ``A`` in R^{D x n_a}, ``B`` in R^{D x n_b}, whose
only effect on the model is through the product ``A^T B``. Every such pair has the
symmetry ``A -> G A, B -> G^{-T} B`` for ``G`` in GL_D:

- query-key (Lemma 4.1, Lemma 4.3, Cor. 4.4): ``A = [W_Q^h | b_Q^h]``,
  ``B = [W_K^h | b_K^h]``; the attention score is ``[x;1]^T A^T B [y;1]``.
- output-value (Lemma 4.6): ``A = [W_V^h | b_V^h]``, ``B = (W_O^h)^T``; the head's
  contribution to the output is ``B^T A [x;1]``.

Everything here is a pure function on float64 tensors (the tangent projection also takes
float32, for the projected step of a float32 model). Pairs are *batched*: ``A``
is ``(..., D, n_a)`` and ``B`` is ``(..., D, n_b)`` with any leading batch shape
(heads, or layers x heads), so one ``torch.linalg.eigh`` call serves every head of
the model. Nothing depends on the device or on global RNG state.

The maths follows docs/design.md: §2 (pairs, tangent projection by a
Sylvester solve with two eigendecompositions), §3 (imbalance, excess norm), §4
(rebalancing to a target imbalance; the paper's §5). The conservation law that
makes the imbalance interesting is Lemma 5.1: plain gradient flow keeps
``A A^T - B B^T`` fixed.

This is the full ``GL_D`` orbit; the RoPE commutant is :mod:`attnid.theory.rope`, and
:mod:`attnid.theory.orbits` gives both one interface. How a model's tensors are cut into
pairs (nanoGPT's layout, GQA groups) is :mod:`attnid.model.layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# An eigenvalue sum b_i + a_j below this fraction of the pair's largest eigenvalue is
# float64 round-off (eigh's absolute error is ~1e-16 * ||M||): that direction of S
# moves nothing and is dropped (pseudo-inverse), and the pair is counted as singular.
SINGULAR_RTOL = 1e-12
# The same cut for float32 (the projected step's solve in a float32 model, docs/design.md §13):
# float32's eigh error is ~1e-7 * ||M||, so sums below ten times that are round-off.
SINGULAR_RTOL_FLOAT32 = 1e-6
# Rebalancing divides by the product's singular values: a pair whose product is this
# close to rank-deficient (s_min / s_max) is left alone and counted (docs/design.md §4).
REBALANCE_MIN_SV_RATIO = 1e-6
# The nuclear norm from Cholesky factors of the Gram matrices (excess_norm_terms) loses accuracy like
# eps * cond(A). A pivot ratio of the factor is at least 1 / cond(A); below this one the pair is far
# from full row rank and its nuclear norm is computed from QRs of A^T and B^T instead.
CHOLESKY_MIN_PIVOT_RATIO = 1e-3
# The nearest pair with a nonzero target imbalance is iterated (docs/design.md §4.3). The fiber is reached
# when ||A A^T - B B^T - I*|| <= this fraction of ||A A^T + B B^T|| (then one more Newton step, whose
# convergence is quadratic, leaves float64 round-off times the move's condition number) ...
FIBER_RTOL = 1e-12
FIBER_NEWTON_STEPS = 100
# The longest generator M of one step S -> (I + M) S (Frobenius norm): a far target is approached in steps
# that rescale the pair by at most 3/2 each.
MAX_GENERATOR_NORM = 0.5
# ... and the nearest point when a Gauss-Newton step moves the pair by less than this fraction of its norm
# (the steps shrink geometrically; below ~1e-15 they are round-off), or its damping falls below the minimum.
NEAREST_RTOL = 1e-12
NEAREST_STEPS = 200
NEAREST_MIN_STEP = 1e-8
# A step that lowered the distance lets the next one grow by this factor (up to the full step): doubling at
# once would retry the step just halved.
NEAREST_STEP_GROWTH = 1.25
# Squared distances are compared with this tolerance relative to ||A||^2 + ||B||^2 (their float64 round-off).
DISTANCE_RTOL = 1e-14


# --------------------------------------------------------------------------------------
# Orbit geometry
# --------------------------------------------------------------------------------------


def singular_rtol(dtype: torch.dtype) -> float:
    """:data:`SINGULAR_RTOL` for float64, :data:`SINGULAR_RTOL_FLOAT32` for anything narrower."""
    return SINGULAR_RTOL if dtype == torch.float64 else SINGULAR_RTOL_FLOAT32


def gram(matrix: torch.Tensor) -> torch.Tensor:
    """``M M^T`` for a batch ``(..., D, n)`` -> ``(..., D, D)``."""
    return matrix @ matrix.transpose(-1, -2)


def step_products(step: torch.Tensor, matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dM M^T, dM dM^T)``, each ``(..., D, D)``, for a batch of factors ``M`` and their steps ``dM``
    ``(..., D, n)``: the drift split's products at every step (docs/design.md §7), as one product
    ``dM [M; dM]^T`` of twice the width, which runs faster on small matrices than two products."""
    both = step @ torch.cat([matrix, step], dim=-2).transpose(-1, -2)  # (..., D, 2D)
    head_dim = matrix.shape[-2]
    return both[..., :head_dim], both[..., head_dim:]


def trace(matrix: torch.Tensor) -> torch.Tensor:
    """The trace of each ``(..., D, D)`` matrix: ``(...)``."""
    return matrix.diagonal(dim1=-2, dim2=-1).sum(-1)


def imbalance(pair_a: torch.Tensor, pair_b: torch.Tensor) -> torch.Tensor:
    """``I = A A^T - B B^T`` ``(..., D, D)``: conserved by gradient flow (Lemma 5.1)."""
    return gram(pair_a) - gram(pair_b)


def _sylvester_in_eigenbases(
    gram_a: torch.Tensor, gram_b: torch.Tensor, rhs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The normal equations of the tangent projection, diagonalised (docs/design.md §2.2).

    From the Gram matrices ``A A^T``, ``B B^T`` and the right-hand side ``C = dA A^T - B dB^T``
    returns ``(rhs_eig, inv_denom, vec_a, vec_b, singular)``: ``C' = U_b^T C U_a``,
    ``1 / (b_i + a_j)`` (0 where the sum is round-off), the two eigenbases, and a bool
    ``(...)`` marking pairs with such round-off sums.
    """
    eig_a, vec_a = torch.linalg.eigh(gram_a)  # (..., D), (..., D, D)
    eig_b, vec_b = torch.linalg.eigh(gram_b)
    eig_a, eig_b = eig_a.clamp_min(0), eig_b.clamp_min(0)
    rhs_eig = vec_b.transpose(-1, -2) @ rhs @ vec_a
    denom = eig_b.unsqueeze(-1) + eig_a.unsqueeze(-2)  # (..., D, D): b_i + a_j
    scale = torch.maximum(eig_a.amax(-1), eig_b.amax(-1)).unsqueeze(-1).unsqueeze(-1)
    solvable = denom > singular_rtol(denom.dtype) * scale
    inv_denom = torch.where(
        solvable, 1 / torch.where(solvable, denom, torch.ones_like(denom)), torch.zeros_like(denom)
    )
    return rhs_eig, inv_denom, vec_a, vec_b, ~solvable.flatten(-2).all(-1)


def _sylvester_rhs(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> torch.Tensor:
    """``C = dA A^T - B dB^T`` ``(..., D, D)``, the right-hand side of the normal equations."""
    return step_a @ pair_a.transpose(-1, -2) - pair_b @ step_b.transpose(-1, -2)


def tangent_solve(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The generator ``S`` ``(..., D, D)`` of the projection of a step onto the orbit's tangent space.

    The tangent space at ``(A, B)`` is ``{(S A, -S^T B)}`` (the derivative of the
    GL_D action of Lemma 4.1/4.6). Minimising ``||dA - S A||^2 + ||dB + S^T B||^2``
    gives the Sylvester equation ``S (A A^T) + (B B^T) S = dA A^T - B dB^T``, solved
    in the eigenbases ``A A^T = U_a diag(a) U_a^T``, ``B B^T = U_b diag(b) U_b^T`` as
    ``S = U_b [(U_b^T C U_a) / (b_i + a_j)] U_a^T``.

    Where ``b_i + a_j`` is round-off (both Gram matrices singular), that component
    of ``S`` moves neither ``A`` nor ``B``; it is set to zero, which is the
    pseudo-inverse and still gives the exact orthogonal projection. Returns
    ``(S, singular)`` with ``singular`` a bool ``(...)`` marking such pairs.
    """
    rhs_eig, inv_denom, vec_a, vec_b, singular = _sylvester_in_eigenbases(
        gram(pair_a), gram(pair_b), _sylvester_rhs(pair_a, pair_b, step_a, step_b)
    )
    generator = vec_b @ (rhs_eig * inv_denom) @ vec_a.transpose(-1, -2)
    return generator, singular


def unidentified_sq_norm_from_products(
    gram_a: torch.Tensor, gram_b: torch.Tensor, cross_a: torch.Tensor, cross_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``||proj(dA, dB)||²`` per pair ``(...)`` and the singular flags, from ``D x D`` products only.

    ``gram_a = A A^T``, ``gram_b = B B^T`` at the pre-step point and ``cross_a = dA A^T``,
    ``cross_b = dB B^T``: the right-hand side is ``C = cross_a - cross_b^T``. With
    ``T(S) = (S A, -S^T B)`` and ``S`` solving the normal equations ``T*T(S) = C``
    (:func:`tangent_solve`), ``||T S||² = <S, C>``, which in the eigenbases is
    ``sum_ij C'_ij² / (b_i + a_j)``: no D x n products beyond those the drift split of
    docs/design.md §7 computes at every step anyway (``cross_a``, ``cross_b``).
    """
    rhs = cross_a - cross_b.transpose(-1, -2)
    rhs_eig, inv_denom, _, _, singular = _sylvester_in_eigenbases(gram_a, gram_b, rhs)
    return (rhs_eig.square() * inv_denom).sum((-1, -2)), singular


def unidentified_sq_norm(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``||proj(dA, dB)||²`` per pair ``(...)``, without forming the projection, and the singular flags
    (:func:`unidentified_sq_norm_from_products` of the pairs' products)."""
    return unidentified_sq_norm_from_products(
        gram(pair_a), gram(pair_b), step_a @ pair_a.transpose(-1, -2), step_b @ pair_b.transpose(-1, -2)
    )


def tangent_step(
    pair_a: torch.Tensor, pair_b: torch.Tensor, generator: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tangent vector ``(S A, -S^T B)`` generated by ``S`` at ``(A, B)``."""
    return generator @ pair_a, -generator.transpose(-1, -2) @ pair_b


def tangent_projection(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthogonal projection of a step ``(dA, dB)`` onto the orbit's tangent space at ``(A, B)``.

    This is the unidentified part of the step (Lemma 4.1/4.3/4.6): moving along it
    changes no ``A^T B`` to first order. See :func:`tangent_solve` for the solve.
    """
    generator, _ = tangent_solve(pair_a, pair_b, step_a, step_b)
    return tangent_step(pair_a, pair_b, generator)


def _nuclear_norm_by_qr(pair_a: torch.Tensor, pair_b: torch.Tensor) -> torch.Tensor:
    """``||A^T B||_*`` per pair from thin QRs ``A^T = Q_1 R_1``, ``B^T = Q_2 R_2``: ``||R_1 R_2^T||_*``
    (any shapes, rank-deficient pairs included)."""
    r_a = torch.linalg.qr(pair_a.transpose(-1, -2), mode="r")[1]  # (..., min(n_a, D), D)
    r_b = torch.linalg.qr(pair_b.transpose(-1, -2), mode="r")[1]
    return torch.linalg.svdvals(r_a @ r_b.transpose(-1, -2)).sum(-1)


def excess_norm_terms(
    pair_a: torch.Tensor, pair_b: torch.Tensor, grams: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(||A||_F^2 + ||B||_F^2, 2 ||A^T B||_*)`` per pair, each of shape ``(...)``.

    The first is at least the second on every orbit (AM-GM on the singular values),
    with equality exactly at balanced points ``A A^T = B B^T``: their gap is the
    weight norm spent in unidentified directions (docs/design.md §3.4).

    The nuclear norm comes from the Gram matrices (``grams``: ``(A A^T, B B^T)``, computed
    here when not given): with Cholesky factors ``A A^T = L_a L_a^T``, ``B B^T = L_b L_b^T``,
    ``A^T = Q_1 L_a^T`` and ``B^T = Q_2 L_b^T`` for matrices ``Q_1``, ``Q_2`` with orthonormal
    columns, so ``||A^T B||_* = ||L_a^T L_b||_*``, a ``D x D`` singular-value problem with no
    ``D x n`` factorisation. A pair whose Cholesky factor has a pivot below
    :data:`CHOLESKY_MIN_PIVOT_RATIO` of its largest (``A`` or ``B`` far from full row rank,
    where the Gram matrix has lost the small singular values to round-off) takes the thin QRs
    of ``A^T`` and ``B^T`` instead (:func:`_nuclear_norm_by_qr`).
    """
    gram_a, gram_b = (gram(pair_a), gram(pair_b)) if grams is None else grams
    frobenius_sq = trace(gram_a) + trace(gram_b)  # ||A||² = tr(A Aᵀ)
    chol_a, info_a = torch.linalg.cholesky_ex(gram_a)  # (..., D, D) lower; info > 0: not positive definite
    chol_b, info_b = torch.linalg.cholesky_ex(gram_b)
    well_conditioned = (info_a == 0) & (info_b == 0)
    for chol in (chol_a, chol_b):
        pivots = chol.diagonal(dim1=-2, dim2=-1)
        well_conditioned &= pivots.amin(-1) >= CHOLESKY_MIN_PIVOT_RATIO * pivots.amax(-1)
    product = chol_a.transpose(-1, -2) @ chol_b
    keep = well_conditioned.unsqueeze(-1).unsqueeze(-1)
    # a failed factorisation may hold NaN: give svdvals a harmless matrix there, the QRs replace its value
    nuclear = torch.linalg.svdvals(torch.where(keep, product, torch.zeros_like(product))).sum(-1)
    if not bool(well_conditioned.all()):
        redo = ~well_conditioned.reshape(-1)
        flat_a, flat_b = pair_a.reshape(-1, *pair_a.shape[-2:]), pair_b.reshape(-1, *pair_b.shape[-2:])
        nuclear = nuclear.reshape(-1).clone()
        nuclear[redo] = _nuclear_norm_by_qr(flat_a[redo], flat_b[redo])
        nuclear = nuclear.reshape(well_conditioned.shape)
    return frobenius_sq, 2 * nuclear


def product_svd(
    pair_a: torch.Tensor, pair_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of the product, ``A^T B = U diag(s) V^T``, without forming the n_a x n_b product.

    Thin QRs ``A^T = Q_1 R_1``, ``B^T = Q_2 R_2`` and ``R_1 R_2^T = u diag(s) v^T`` give
    ``U = Q_1 u`` ``(..., n_a, D)``, ``s`` ``(..., D)`` descending, ``V = Q_2 v`` ``(..., n_b, D)``.
    Needs ``n_a, n_b >= D``.
    """
    if min(pair_a.shape[-1], pair_b.shape[-1]) < pair_a.shape[-2]:
        raise ValueError(f"product_svd needs n >= D, got A {tuple(pair_a.shape)}, B {tuple(pair_b.shape)}")
    q_a, r_a = torch.linalg.qr(pair_a.transpose(-1, -2))  # (..., n_a, D), (..., D, D)
    q_b, r_b = torch.linalg.qr(pair_b.transpose(-1, -2))
    left, sing, right_h = torch.linalg.svd(r_a @ r_b.transpose(-1, -2))
    return q_a @ left, sing, q_b @ right_h.transpose(-1, -2)


def nearest_balanced(
    pair_a: torch.Tensor, pair_b: torch.Tensor, product: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The balanced point of the orbit nearest to ``(A, B)`` (docs/design.md §4.2): closed form.

    With the product's thin SVD ``A^T B = U diag(s) V^T`` (``product``, :func:`product_svd`), the
    balanced points with that product are ``(R A_1, R B_1)``, ``A_1 = diag(sqrt s) U^T``,
    ``B_1 = diag(sqrt s) V^T``, ``R`` in ``O(D)``. The nearest in ``||A' - A||^2 + ||B' - B||^2`` maximises
    ``tr(R^T C)`` with ``C = A A_1^T + B B_1^T`` (orthogonal Procrustes): ``R = W Z^T`` for
    ``C = W diag(c) Z^T``. A pair that is balanced already gives ``C = R_* (A_1 A_1^T + B_1 B_1^T)``,
    whose polar factor is ``R_*``: the pair itself.
    """
    left, sing, right = product
    root = sing.sqrt().unsqueeze(-1)  # (..., D, 1)
    first_a, first_b = root * left.transpose(-1, -2), root * right.transpose(-1, -2)  # A_1, B_1
    cross = pair_a @ first_a.transpose(-1, -2) + pair_b @ first_b.transpose(-1, -2)  # (..., D, D)
    polar_left, _, polar_right_h = torch.linalg.svd(cross)
    rotation = polar_left @ polar_right_h
    return rotation @ first_a, rotation @ first_b


def _lyapunov(gram_sum: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """The symmetric ``N`` with ``N G + G N = rhs`` for SPD ``G`` ``(..., D, D)``, in ``G``'s eigenbasis."""
    eig, vec = torch.linalg.eigh(gram_sum)
    rhs_eig = vec.transpose(-1, -2) @ rhs @ vec
    return vec @ (rhs_eig / (eig.unsqueeze(-1) + eig.unsqueeze(-2))) @ vec.transpose(-1, -2)


@dataclass(frozen=True)
class _FiberPoint:
    """The pair ``(S A, S^{-T} B)`` seen through ``D x D`` products (docs/design.md §4.3)."""

    element: torch.Tensor  # S (..., D, D)
    inverse_t: torch.Tensor  # S^{-T}
    gram_a: torch.Tensor  # S A A^T S^T
    gram_b: torch.Tensor  # S^{-T} B B^T S^{-1}

    @staticmethod
    def of(element: torch.Tensor, gram_a0: torch.Tensor, gram_b0: torch.Tensor) -> _FiberPoint:
        inverse_t = torch.linalg.inv(element).transpose(-1, -2)
        gram_a = element @ gram_a0 @ element.transpose(-1, -2)
        gram_b = inverse_t @ gram_b0 @ inverse_t.transpose(-1, -2)
        return _FiberPoint(element, inverse_t, gram_a, gram_b)

    @property
    def imbalance(self) -> torch.Tensor:
        return self.gram_a - self.gram_b


def _sq_distance(point: _FiberPoint, gram_a0: torch.Tensor, gram_b0: torch.Tensor) -> torch.Tensor:
    """``||S A - A||^2 + ||S^{-T} B - B||^2`` per pair, from ``(S - I)`` and
    ``S^{-T} - I = -S^{-T} (S - I)^T`` (no cancellation when the move is small)."""
    eye = torch.eye(point.element.shape[-1], dtype=point.element.dtype, device=point.element.device)
    diff_a = point.element - eye
    diff_b = -point.inverse_t @ diff_a.transpose(-1, -2)
    return ((diff_a @ gram_a0) * diff_a).sum((-1, -2)) + ((diff_b @ gram_b0) * diff_b).sum((-1, -2))


def _relative_residual(point: _FiberPoint, target: torch.Tensor) -> torch.Tensor:
    """``||A A^T - B B^T - I*|| / ||A A^T + B B^T||`` per pair."""
    scale = torch.linalg.matrix_norm(point.gram_a + point.gram_b)
    return torch.linalg.matrix_norm(point.imbalance - target) / scale


def _step(generator: torch.Tensor) -> torch.Tensor:
    """The group element ``I + M`` of a step with generator ``M``: invertible, because :func:`_capped` keeps
    ``||M||_2 <= ||M||_F <= 1/2``. Any invertible element moves the pair exactly along its orbit; ``exp(M)``
    would agree to second order at several times the cost."""
    return torch.eye(generator.shape[-1], dtype=generator.dtype, device=generator.device) + generator


def _capped(generator: torch.Tensor, step_scale: torch.Tensor) -> torch.Tensor:
    """``generator`` times ``step_scale`` ``(...)``, shrunk to Frobenius norm at most
    :data:`MAX_GENERATOR_NORM` (a trust region, which also keeps :func:`_step` invertible)."""
    norm = torch.linalg.matrix_norm(generator) * step_scale
    shrink = step_scale * torch.where(norm > MAX_GENERATOR_NORM, MAX_GENERATOR_NORM / norm, 1.0)
    return generator * shrink[..., None, None]


def _onto_fiber(
    point: _FiberPoint, gram_a0: torch.Tensor, gram_b0: torch.Tensor, target: torch.Tensor, polish: bool
) -> tuple[_FiberPoint, torch.Tensor]:
    """Newton's method for ``A A^T - B B^T = I*`` along the symmetric generators, the directions of the orbit
    normal to the fiber (docs/design.md §4.3): each step solves ``N G + G N = I* - I`` with
    ``G = A A^T + B B^T``. A step that does not lower ``||I - I*||`` is halved (and a step longer than
    :func:`_capped` allows is shortened) until every pair is within :data:`FIBER_RTOL`; with ``polish`` one
    more step takes it to round-off (the convergence is quadratic). Returns the point and a bool ``(...)``:
    True where the relative residual is within :data:`FIBER_RTOL`."""

    def newton_step(point, residual, step_scale, active):
        generator = _capped(_lyapunov(point.gram_a + point.gram_b, target - point.imbalance), step_scale)
        trial = _FiberPoint.of(_step(generator) @ point.element, gram_a0, gram_b0)
        trial_residual = torch.linalg.matrix_norm(trial.imbalance - target)
        better = (trial_residual < residual) & active
        return _where(better, trial, point), torch.where(better, trial_residual, residual), better

    def reached(point):
        return _relative_residual(point, target) <= FIBER_RTOL

    residual = torch.linalg.matrix_norm(point.imbalance - target)
    step_scale = torch.ones_like(residual)
    for _ in range(FIBER_NEWTON_STEPS):
        active = ~reached(point)
        if not bool(active.any()):
            break
        point, residual, better = newton_step(point, residual, step_scale, active)
        step_scale = torch.where(better, (2 * step_scale).clamp_max(1), step_scale / 2)
    if polish:
        point, _, _ = newton_step(point, residual, torch.ones_like(residual), residual > 0)
    return point, reached(point)


def _where(mask: torch.Tensor, new: _FiberPoint, old: _FiberPoint) -> _FiberPoint:
    keep = mask[..., None, None]
    return _FiberPoint(
        *(torch.where(keep, n, o) for n, o in zip(vars(new).values(), vars(old).values(), strict=True))
    )


def _gauss_newton_step(
    point: _FiberPoint, gram_a0: torch.Tensor, gram_b0: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The generator ``M`` of the Gauss-Newton step towards the nearest point of the fiber and its size
    ``(||M A||^2 + ||M^T B||^2)^{1/2}`` (docs/design.md §4.3).

    Linearised at the current pair ``(A, B)`` (moved from ``(A_0, B_0)``), the orbit step ``(M A, -M^T B)``
    that comes nearest to ``(A_0 - A, B_0 - B)`` while moving the imbalance by ``I* - I`` is
    ``M = Y + N``: ``Y`` solves the Sylvester equation ``Y A A^T + B B^T Y = C`` of §2.2 with
    ``C = (A_0 - A) A^T - B (B_0 - B)^T``, and the symmetric ``N`` solves
    ``N G + G N = I* - I - (C + C^T)``, ``G = A A^T + B B^T``.
    """
    gram_sum = point.gram_a + point.gram_b
    rhs = gram_a0 @ point.element.transpose(-1, -2) - point.inverse_t @ gram_b0 - point.imbalance  # C
    rhs_eig, inv_denom, vec_a, vec_b, _ = _sylvester_in_eigenbases(point.gram_a, point.gram_b, rhs)
    toward = vec_b @ (rhs_eig * inv_denom) @ vec_a.transpose(-1, -2)  # Y
    generator = toward + _lyapunov(gram_sum, target - point.imbalance - (rhs + rhs.transpose(-1, -2)))
    size_sq = ((generator @ point.gram_a) * generator).sum((-1, -2)) + (
        (generator.transpose(-1, -2) @ point.gram_b) * generator.transpose(-1, -2)
    ).sum((-1, -2))
    return generator, size_sq.clamp_min(0).sqrt()


def nearest_on_fiber(
    gram_a0: torch.Tensor, gram_b0: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The orbit element ``S`` ``(..., D, D)`` that moves ``(A, B)`` to the nearest pair with imbalance ``I*``
    (docs/design.md §4.3), from ``A A^T`` and ``B B^T`` alone, and a bool ``(...)``: True where the
    imbalance was reached and the step size fell below :data:`NEAREST_RTOL`.

    First Newton's method along the normal (symmetric) generators reaches the fiber; then damped
    Gauss-Newton steps (:func:`_gauss_newton_step`), each followed by the same Newton correction, lower
    the distance to ``(A, B)`` while staying on the fiber. A step that does not lower it is halved. A pair
    already at ``I*`` gives the identity: both right-hand sides are zero.
    """
    eye = torch.eye(gram_a0.shape[-1], dtype=gram_a0.dtype, device=gram_a0.device).expand_as(gram_a0)
    start = _FiberPoint.of(eye.clone(), gram_a0, gram_b0)
    point, on_fiber = _onto_fiber(start, gram_a0, gram_b0, target, polish=False)
    distance = _sq_distance(point, gram_a0, gram_b0)
    scale = (trace(gram_a0) + trace(gram_b0)).sqrt()  # ||A||^2 + ||B||^2, so that sizes are relative
    floor = DISTANCE_RTOL * scale.square()
    generator, size = _gauss_newton_step(point, gram_a0, gram_b0, target)
    step_scale = torch.ones_like(distance)
    converged = ~on_fiber
    for _ in range(NEAREST_STEPS):
        converged = converged | (size <= NEAREST_RTOL * scale)
        if bool(converged.all()):
            break
        moved = _FiberPoint.of(_step(_capped(generator, step_scale)) @ point.element, gram_a0, gram_b0)
        trial, trial_on_fiber = _onto_fiber(moved, gram_a0, gram_b0, target, polish=False)
        trial_distance = _sq_distance(trial, gram_a0, gram_b0)
        trial_generator, trial_size = _gauss_newton_step(trial, gram_a0, gram_b0, target)
        # progress: a lower distance, or, where the change is below the distance's round-off (steps of
        # relative size 1e-8 and less), a smaller step (the first-order condition nearer to hold)
        better = (
            trial_on_fiber
            & ~converged
            & (
                (trial_distance < distance - floor)
                | ((trial_distance <= distance + floor) & (trial_size < size))
            )
        )
        point = _where(better, trial, point)
        distance = torch.where(better, trial_distance, distance)
        generator = torch.where(better[..., None, None], trial_generator, generator)
        size = torch.where(better, trial_size, size)
        step_scale = torch.where(better, (NEAREST_STEP_GROWTH * step_scale).clamp_max(1), step_scale / 2)
        converged = converged | (step_scale < NEAREST_MIN_STEP)
    point, on_fiber = _onto_fiber(point, gram_a0, gram_b0, target, polish=True)
    return point.element, on_fiber, converged


def rebalance_pairs(
    pair_a: torch.Tensor,
    pair_b: torch.Tensor,
    target_imbalance: torch.Tensor | None = None,
    product: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move a batch of pairs to the nearest point of their orbit with a target imbalance (paper §5;
    docs/design.md §4).

    ``target_imbalance`` is symmetric ``(..., D, D)``; None or zeros = balanced (the closed form
    :func:`nearest_balanced`), otherwise e.g. the initial ``I_0`` that restores the conservation law of
    Lemma 5.1 (:func:`nearest_on_fiber`). Either keeps ``A'^T B' = A^T B`` and reaches
    ``A' A'^T - B' B'^T = I*``, and of all such pairs takes the one nearest to ``(A, B)`` in
    ``||A' - A||^2 + ||B' - B||^2``: a pair already at ``I*`` is returned as it is (to round-off), so
    rebalancing twice is rebalancing once.

    ``product`` (``product_svd(A, B)``) may be passed precomputed, which
    :meth:`attnid.theory.orbits.GeneralLinearOrbit.rebalance` does. Returns ``(A', B', done)``; pairs
    with ``s_min / s_max < 1e-6`` (or a zero product), and pairs where the iteration did not reach the
    target, are returned unchanged with ``done`` False.
    """
    left_full, sing, right_full = product_svd(pair_a, pair_b) if product is None else product
    done = (sing[..., -1] >= REBALANCE_MIN_SV_RATIO * sing[..., 0]) & (sing[..., 0] > 0)
    if target_imbalance is None or not bool(target_imbalance.any()):
        new_a, new_b = nearest_balanced(pair_a, pair_b, (left_full, sing, right_full))
    else:
        eye = torch.eye(pair_a.shape[-2], dtype=pair_a.dtype, device=pair_a.device)
        gram_a0 = torch.where(done[..., None, None], gram(pair_a), eye)  # skipped pairs: a harmless problem
        gram_b0 = torch.where(done[..., None, None], gram(pair_b), eye)
        target = torch.where(done[..., None, None], target_imbalance, 0)
        element, reached, _ = nearest_on_fiber(gram_a0, gram_b0, target)
        done = done & reached
        new_a = element @ pair_a
        new_b = torch.linalg.solve(element.transpose(-1, -2), pair_b)
    if bool(done.all()):  # the usual case: no pair to put back (a full-size select per factor saved)
        return new_a, new_b, done
    keep = done.unsqueeze(-1).unsqueeze(-1)
    return torch.where(keep, new_a, pair_a), torch.where(keep, new_b, pair_b), done


def rebalance_pair(
    pair_a: torch.Tensor, pair_b: torch.Tensor, target_imbalance: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One pair ``(D, n_a), (D, n_b)`` to a target imbalance: ``(A', B')``, or ``None`` if skipped.

    See :func:`rebalance_pairs` (the batched version) for the construction.
    """
    new_a, new_b, done = rebalance_pairs(pair_a, pair_b, target_imbalance)
    return (new_a, new_b) if bool(done) else None
