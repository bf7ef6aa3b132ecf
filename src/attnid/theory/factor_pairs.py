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


# --------------------------------------------------------------------------------------
# Orbit geometry
# --------------------------------------------------------------------------------------


def singular_rtol(dtype: torch.dtype) -> float:
    """:data:`SINGULAR_RTOL` for float64, :data:`SINGULAR_RTOL_FLOAT32` for anything narrower."""
    return SINGULAR_RTOL if dtype == torch.float64 else SINGULAR_RTOL_FLOAT32


def gram(matrix: torch.Tensor) -> torch.Tensor:
    """``M M^T`` for a batch ``(..., D, n)`` -> ``(..., D, D)``."""
    return matrix @ matrix.transpose(-1, -2)


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


def rebalance_pairs(
    pair_a: torch.Tensor,
    pair_b: torch.Tensor,
    target_imbalance: torch.Tensor | None = None,
    target_eigh: tuple[torch.Tensor, torch.Tensor] | None = None,
    product: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move a batch of pairs along their orbits to hit a target imbalance (paper §5; docs/design.md §4).

    ``target_imbalance`` is symmetric ``(..., D, D)`` (zeros = balanced, or the
    initial ``I_0`` to restore the conservation law of Lemma 5.1). With the product's
    thin SVD ``A^T B = U diag(s) V^T`` (:func:`product_svd`), ``I* = P diag(b) P^T``
    and ``p = (b + sqrt(b^2 + 4 s^2)) / 2``, ``W = P diag(sqrt p)``:

        A' = W U^T,   B' = W^{-T} diag(s) V^T

    keeps ``A'^T B' = A^T B`` and gives ``A' A'^T - B' B'^T = P diag(p - s^2/p) P^T = I*``.
    ``s`` (descending) is paired with ``b`` sorted descending; any pairing is exact.

    ``target_eigh`` (``torch.linalg.eigh(target_imbalance)``) and ``product``
    (``product_svd(A, B)``) may be passed precomputed, which
    :meth:`attnid.theory.orbits.GeneralLinearOrbit.rebalance` does. Returns
    ``(A', B', done)``; pairs with ``s_min / s_max < 1e-6`` (or a zero product) are
    returned unchanged with ``done`` False.
    """
    left_full, sing, right_full = product_svd(pair_a, pair_b) if product is None else product
    target_eig, target_vec = (
        torch.linalg.eigh(target_imbalance) if target_eigh is None else target_eigh
    )  # ascending
    target_eig, target_vec = target_eig.flip(-1), target_vec.flip(-1)  # descending, to pair with s
    root = torch.sqrt(target_eig.square() + 4 * sing.square())
    # p = (b + r)/2 cancels catastrophically for b < 0; there use the equal 2 s^2 / (r - b)
    p = torch.where(
        target_eig >= 0,
        (target_eig + root) / 2,
        2 * sing.square() / (root - target_eig).clamp_min(torch.finfo(sing.dtype).tiny),
    )

    done = sing[..., -1] >= REBALANCE_MIN_SV_RATIO * sing[..., 0]
    done = done & (sing[..., 0] > 0)
    p_safe = torch.where(done.unsqueeze(-1), p, torch.ones_like(p))
    new_a = (target_vec * p_safe.sqrt().unsqueeze(-2)) @ left_full.transpose(-1, -2)  # W U^T
    # W^{-T} = P diag(1/sqrt p) because P is orthogonal
    new_b = (target_vec * (sing / p_safe.sqrt()).unsqueeze(-2)) @ right_full.transpose(-1, -2)
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
