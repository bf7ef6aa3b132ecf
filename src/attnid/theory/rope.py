"""Rotary position embeddings (RoPE) and the orbit they leave a query-key pair (docs/design.md §8).

- :func:`rope_rotate`: the rotation the model applies to queries and keys (Su et al. 2021),
  half-split (GPT-NeoX, Llama) or interleaved (GPT-J, RoFormer) pairing.
- The RoPE commutant: ``M`` must commute with every rotation, so it is block diagonal over
  the ``D/2`` rotation planes with blocks ``a I + b J``, ``J = [[0, -1], [1, 0]]``
  (Prop. 4.8): ``D`` parameters per pair, not ``D^2``. Half-split pairing: plane ``p`` is
  rows ``(p, p + D/2)`` of the head. Tangent at ``(A, B)``, per plane: ``(A_p, -B_p)`` and
  ``(J A_p, J B_p)``. Conserved by gradient flow: the projection of ``I = A A^T - B B^T``
  onto that algebra, per plane the trace of ``I``'s 2x2 diagonal block (Lemma 5.1
  restricted to the subgroup).

Pure functions on float64 pairs (the tangent projection also float32) batched over any leading
shape, like :mod:`attnid.theory.factor_pairs`; :class:`attnid.theory.orbits.RopeCommutantOrbit` is the
interface the rest of the package uses.
"""

from __future__ import annotations

import torch

from attnid.theory.factor_pairs import REBALANCE_MIN_SV_RATIO, singular_rtol

ROPE_BASE = 10000.0


def rope_rotate(x: torch.Tensor, pairing: str = "half", base: float = ROPE_BASE) -> torch.Tensor:
    """Rotate each plane of x (B, heads, T, D) by angle position * base^(-2m/D) (Su et al. 2021).

    ``half`` pairs coordinates (m, m + D/2) (GPT-NeoX, Llama: ``x cos + rotate_half(x) sin``);
    ``interleaved`` pairs (2m, 2m+1) (GPT-J, RoFormer). Plane ``m`` is rotated by
    ``R = cos I + sin J``, ``J = [[0, -1], [1, 0]]``. Position ``t`` is the index along T.
    """
    _, _, seq_len, head_dim = x.shape
    freqs = base ** (-torch.arange(0, head_dim, 2, dtype=x.dtype, device=x.device) / head_dim)  # (D/2,)
    angles = torch.arange(seq_len, dtype=x.dtype, device=x.device)[:, None] * freqs[None, :]  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()
    if pairing == "interleaved":
        first, second = x[..., 0::2], x[..., 1::2]  # (B, heads, T, D/2) each
    elif pairing == "half":
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    else:
        raise ValueError(f"unknown RoPE pairing {pairing!r}; expected 'half' or 'interleaved'")
    rotated_first = first * cos - second * sin
    rotated_second = first * sin + second * cos
    if pairing == "interleaved":
        return torch.stack((rotated_first, rotated_second), dim=-1).flatten(-2)
    return torch.cat((rotated_first, rotated_second), dim=-1)


# --------------------------------------------------------------------------------------
# The commutant of the rotations, half-split planes
# --------------------------------------------------------------------------------------


def planes(pair: torch.Tensor) -> torch.Tensor:
    """(..., D, n) -> (..., D/2, 2, n): plane ``p`` holds rows ``p`` and ``p + D/2`` (half-split pairing)."""
    *batch, head_dim, width = pair.shape
    if head_dim % 2:
        raise ValueError(f"RoPE planes need an even D, got {head_dim}")
    return pair.reshape(*batch, 2, head_dim // 2, width).transpose(-3, -2)


def unplanes(planar: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`planes`: (..., D/2, 2, n) -> (..., D, n)."""
    *batch, n_planes, _, width = planar.shape
    return planar.transpose(-3, -2).reshape(*batch, 2 * n_planes, width)


def rotate_j(planar: torch.Tensor) -> torch.Tensor:
    """``J X_p`` for every plane, ``J = [[0, -1], [1, 0]]``: (x, y) -> (-y, x)."""
    return torch.stack([-planar[..., 1, :], planar[..., 0, :]], dim=-2)


def plane_sq_norms(pair: torch.Tensor) -> torch.Tensor:
    """``||X_p||_F^2`` per plane: (..., D, n) -> (..., D/2)."""
    return planes(pair).square().sum((-1, -2))


def plane_blocks(matrix: torch.Tensor) -> torch.Tensor:
    """The 2x2 diagonal blocks of a ``(..., D, D)`` matrix, one per plane: ``(..., D/2, 2, 2)``;
    block ``p`` holds rows and columns ``(p, p + D/2)`` (half-split pairing)."""
    *batch, head_dim, _ = matrix.shape
    half = head_dim // 2
    blocks = matrix.reshape(*batch, 2, half, 2, half).diagonal(dim1=-3, dim2=-1)  # (..., 2, 2, D/2)
    return blocks.movedim(-1, -3)


def _plane_products(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``(left right^T)``'s plane blocks ``(..., D/2, 2, 2)`` from ``(..., D, n)`` factors, without the
    ``D x D`` product."""
    return planes(left) @ planes(right).transpose(-1, -2)


def _rope_coefficients(
    gram_a: torch.Tensor, gram_b: torch.Tensor, cross_a: torch.Tensor, cross_b: torch.Tensor
):
    """Per plane, the step's inner products with the two tangent directions and their squared norm.

    ``u_1 = (A_p, -B_p)``, ``u_2 = (J A_p, J B_p)``. Their 2x2 Gram matrix is
    ``(|A_p|^2 + |B_p|^2) I_2``: ``<u_1, u_2> = <A_p, J A_p> - <B_p, J B_p> = 0``
    because ``J`` is antisymmetric, and ``|J X| = |X|``. Everything is read off the plane
    blocks ``(..., D/2, 2, 2)`` of ``A A^T``, ``B B^T``, ``dA A^T`` and ``dB B^T``:
    ``|A_p|^2`` is a block's trace, ``<dA_p, A_p>`` likewise, and with ``J = [[0, -1], [1, 0]]``
    ``<dA_p, J A_p> = (dA A^T)_p[1, 0] - (dA A^T)_p[0, 1]``. Returns ``(r_1, r_2, norm, solvable)``,
    each ``(..., D/2)``.
    """

    def block_trace(blocks):
        return blocks[..., 0, 0] + blocks[..., 1, 1]

    def block_rotation(blocks):  # <X, J Y> of a block X Yᵀ
        return blocks[..., 1, 0] - blocks[..., 0, 1]

    norm = block_trace(gram_a) + block_trace(gram_b)
    r_1 = block_trace(cross_a) - block_trace(cross_b)
    r_2 = block_rotation(cross_a) + block_rotation(cross_b)
    solvable = norm > singular_rtol(norm.dtype) * norm.amax(-1, keepdim=True)
    return r_1, r_2, norm, solvable


def _pair_coefficients(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
):
    """:func:`_rope_coefficients` from the pairs and the step (plane blocks only: no ``D x D`` products)."""
    return _rope_coefficients(
        _plane_products(pair_a, pair_a),
        _plane_products(pair_b, pair_b),
        _plane_products(step_a, pair_a),
        _plane_products(step_b, pair_b),
    )


def rope_tangent_projection(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthogonal projection of ``(dA, dB)`` onto the RoPE orbit's tangent at ``(A, B)``.

    Per plane ``c_i = <step, u_i> / (|A_p|^2 + |B_p|^2)`` and the projection is
    ``c_1 u_1 + c_2 u_2`` (see :func:`_rope_coefficients`); planes are orthogonal
    to each other (disjoint rows). A plane with ``A_p = B_p = 0`` contributes nothing.
    """
    r_1, r_2, norm, solvable = _pair_coefficients(pair_a, pair_b, step_a, step_b)
    inv = torch.where(
        solvable, 1 / torch.where(solvable, norm, torch.ones_like(norm)), torch.zeros_like(norm)
    )
    c_1, c_2 = (r_1 * inv)[..., None, None], (r_2 * inv)[..., None, None]
    a_planes, b_planes = planes(pair_a), planes(pair_b)
    proj_a = c_1 * a_planes + c_2 * rotate_j(a_planes)
    proj_b = -c_1 * b_planes + c_2 * rotate_j(b_planes)
    return unplanes(proj_a), unplanes(proj_b)


def _sq_norm_from_coefficients(r_1, r_2, norm, solvable) -> tuple[torch.Tensor, torch.Tensor]:
    safe = torch.where(solvable, norm, torch.ones_like(norm))
    sq = torch.where(solvable, (r_1.square() + r_2.square()) / safe, torch.zeros_like(norm)).sum(-1)
    return sq, ~solvable.all(-1)


def rope_unidentified_sq_norm(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``||proj(dA, dB)||^2 = sum_p (r_1^2 + r_2^2) / (|A_p|^2 + |B_p|^2)`` per pair, and singular flags."""
    return _sq_norm_from_coefficients(*_pair_coefficients(pair_a, pair_b, step_a, step_b))


def rope_unidentified_sq_norm_from_products(
    gram_a: torch.Tensor, gram_b: torch.Tensor, cross_a: torch.Tensor, cross_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_unidentified_sq_norm` from the ``D x D`` products ``A A^T``, ``B B^T`` (pre-step),
    ``dA A^T`` and ``dB B^T``, which the drift split computes at every step (docs/design.md §7)."""
    return _sq_norm_from_coefficients(
        *_rope_coefficients(
            plane_blocks(gram_a), plane_blocks(gram_b), plane_blocks(cross_a), plane_blocks(cross_b)
        )
    )


def rope_plane_traces(matrix: torch.Tensor) -> torch.Tensor:
    """Per plane the trace of the 2x2 diagonal block of a (..., D, D) matrix: (..., D/2)."""
    diagonal = matrix.diagonal(dim1=-2, dim2=-1)
    half = diagonal.shape[-1] // 2
    return diagonal[..., :half] + diagonal[..., half:]


def rope_from_plane_traces(traces: torch.Tensor) -> torch.Tensor:
    """The (..., D, D) matrix of the algebra with these plane traces: diagonal blocks ``(t_p / 2) I_2``."""
    return torch.diag_embed(torch.cat([traces, traces], dim=-1) / 2)


def rope_rebalance_pairs(
    pair_a: torch.Tensor, pair_b: torch.Tensor, target_imbalance: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move RoPE query-key pairs along the restricted orbit to a target (docs/design.md §8).

    Scales plane ``p``'s query rows by ``s_p`` and key rows by ``1/s_p`` (a rotation
    in the plane would not change the plane's norms, so scales suffice). With
    ``a = |A_p|^2``, ``b = |B_p|^2`` and target trace ``t_p`` (of the target's 2x2
    diagonal block; zeros/None = balanced) the trace equation ``a x - b / x = t``,
    ``x = s_p^2``, gives ``x = (t + sqrt(t^2 + 4ab)) / (2a)`` (``s_p^4 = b/a`` for
    balance). Returns ``(A', B', done)``; a pair with a plane where ``sqrt(ab)`` is
    below ``1e-6`` of its largest plane's is returned unchanged, ``done`` False.
    """
    a, b = plane_sq_norms(pair_a), plane_sq_norms(pair_b)
    target = torch.zeros_like(a) if target_imbalance is None else rope_plane_traces(target_imbalance)
    geometric = (a * b).sqrt()  # the plane's share of the product, invariant on the orbit
    done = (geometric.amin(-1) >= REBALANCE_MIN_SV_RATIO * geometric.amax(-1)) & (geometric.amax(-1) > 0)
    root = torch.sqrt(target.square() + 4 * a * b)
    safe_a = torch.where(a > 0, a, torch.ones_like(a))
    # (t + r) / (2a) cancels for t < 0; there use the equal 2b / (r - t)
    x = torch.where(
        target >= 0,
        (target + root) / (2 * safe_a),
        2 * b / (root - target).clamp_min(torch.finfo(a.dtype).tiny),
    )
    x = torch.where(done.unsqueeze(-1), x, torch.ones_like(x))
    scale = x.sqrt()[..., None, None]  # (..., D/2, 1, 1)
    new_a = unplanes(planes(pair_a) * scale)
    new_b = unplanes(planes(pair_b) / scale)
    return new_a, new_b, done


def rope_excess_norm_terms(
    pair_a: torch.Tensor, pair_b: torch.Tensor, grams: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(||A||^2 + ||B||^2, min over the restricted orbit)`` per pair.

    On the RoPE orbit only the plane scales change norms: ``min_s sum_p (s_p^2 a_p
    + b_p / s_p^2) = sum_p 2 sqrt(a_p b_p)``, reached when every plane trace of ``I``
    is zero. Same role as :func:`attnid.theory.factor_pairs.excess_norm_terms`' ``2 ||A^T B||_*`` for
    ``GL_D``. With ``grams`` (``(A A^T, B B^T)``) the plane norms are their plane traces.
    """
    if grams is None:
        a, b = plane_sq_norms(pair_a), plane_sq_norms(pair_b)
    else:
        a, b = rope_plane_traces(grams[0]), rope_plane_traces(grams[1])
    return (a + b).sum(-1), 2 * (a * b).sqrt().sum(-1)
