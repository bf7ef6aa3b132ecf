"""The symmetry orbit of each attention architecture: MHA, GQA, RoPE, RoPE + GQA.

Every quantity the pipeline logs (rho, beta, mu, tau; docs/design.md §3) and every
rebalancing move (§4) must use the orbit of the model's *own* architecture
(§8): the full ``GL_D`` orbit of a RoPE query-key pair contains moves that change
the function, so measuring or moving along it would be wrong.

Factor pairs per key/value group ``g`` (query head ``h`` belongs to group
``h // (H/G)``; model.py's layout), batched as ``(G, D, n)``:

- query-key: ``A = [W_Q^{h_1} | b_Q^{h_1} | W_Q^{h_2} | b_Q^{h_2} | ...]``, the
  group's query heads side by side (``D x (H/G)(E[+1])``), against the shared key
  ``B = [W_K^g | b_K^g]`` (Lemma 4.3, Cor. 4.4; the paper's §4.9 for GQA).
- output-value: ``A = [W_V^g | b_V^g]``, ``B = [W_O^{h_1 T} | W_O^{h_2 T} | ...]``,
  the group's output columns side by side (Lemma 4.6).

With ``G = H`` these are exactly symmetry.py's per-head pairs.

Two orbit kinds act on a pair (``A -> M A``, ``B -> M^{-T} B``):

- ``"gl"``: ``M`` in ``GL_D`` (every output-value pair; query-key pairs without
  RoPE). Geometry: symmetry.py.
- ``"rope"``: query-key pairs of a RoPE model. ``M`` must commute with every
  rotation, so it is block diagonal over the ``D/2`` rotation planes with blocks
  ``a I + b J``, ``J = [[0, -1], [1, 0]]`` (Prop. 4.8): ``D`` parameters, not
  ``D^2``. Half-split pairing: plane ``p`` is rows ``(p, p + D/2)`` of the head.
  Tangent at ``(A, B)``, per plane: ``(A_p, -B_p)`` and ``(J A_p, J B_p)``.
  Conserved by gradient flow: the projection of ``I = A A^T - B B^T`` onto that
  algebra, per plane the trace of ``I``'s 2x2 diagonal block (Lemma 5.1 restricted
  to the subgroup).

All geometry is float64 and batched over any leading shape, like symmetry.py.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from attnid import counts, symmetry
from attnid.symmetry import CIRCUITS, REBALANCE_MIN_SV_RATIO, SINGULAR_RTOL

ORBIT_KINDS = ("gl", "rope")


# --------------------------------------------------------------------------------------
# Layout of an attention layer (model.py) and the orbit kind of each circuit
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionLayout:
    """The attention shape the pairs are cut from: ``E, H, G, D``, RoPE, biases."""

    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    rope: bool
    bias: bool

    @property
    def heads_per_group(self) -> int:
        return self.n_head // self.n_kv_head


def _unwrap(model):
    """The GPT inside DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while not hasattr(model, "config") and (hasattr(model, "module") or hasattr(model, "_orig_mod")):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


def layout_of(model_or_config) -> AttentionLayout:
    """The attention layout of a GPT (possibly wrapped) or of a GPTConfig."""
    config = getattr(_unwrap(model_or_config), "config", model_or_config)
    return AttentionLayout(config.n_embd, config.n_head, config.kv_heads, config.per_head_dim,
                           bool(config.rope), bool(config.bias))


def layer_shape(model_or_config) -> counts.LayerShape:
    """counts.py's LayerShape of one attention layer of this model (values as wide as keys: ``C = D``)."""
    layout = layout_of(model_or_config)
    return counts.layer_shape(layout.n_embd, layout.n_head, layout.n_kv_head, layout.head_dim, layout.head_dim,
                              layout.rope, layout.bias, layout.bias)


def orbit_kind(model_or_config, circuit: str) -> str:
    """``"rope"`` for the query-key pairs of a RoPE model, else ``"gl"``."""
    if circuit not in CIRCUITS:
        raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")
    return "rope" if circuit == "qk" and layout_of(model_or_config).rope else "gl"


# --------------------------------------------------------------------------------------
# Extracting and writing back the pairs of any variant
# --------------------------------------------------------------------------------------

def _rows(weight: torch.Tensor, bias: torch.Tensor | None, n_heads: int, head_dim: int) -> torch.Tensor:
    """(heads*D, E) rows [+ (heads*D,) bias] -> (heads, D, E[+1]) float64."""
    per_head = weight.detach().to(torch.float64).reshape(n_heads, head_dim, -1)
    if bias is None:
        return per_head
    return torch.cat([per_head, bias.detach().to(torch.float64).reshape(n_heads, head_dim, 1)], dim=-1)


def _side_by_side(per_head: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(H, D, n) -> (G, D, (H/G) n): each group's heads' columns next to each other."""
    n_head, head_dim, width = per_head.shape
    grouped = per_head.reshape(n_groups, n_head // n_groups, head_dim, width)  # (G, H/G, D, n)
    return grouped.transpose(1, 2).reshape(n_groups, head_dim, -1)


def _unside_by_side(pairs: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of :func:`_side_by_side`: (G, D, (H/G) n) -> (H, D, n)."""
    n_groups, head_dim, columns = pairs.shape
    per_group = n_head // n_groups
    grouped = pairs.reshape(n_groups, head_dim, per_group, columns // per_group)  # (G, D, H/G, n)
    return grouped.transpose(1, 2).reshape(n_head, head_dim, -1)


def _row_blocks(layout: AttentionLayout) -> tuple[slice, slice, slice]:
    """Row ranges of W_Q, W_K, W_V in ``c_attn``."""
    q_rows = layout.n_head * layout.head_dim
    kv_rows = layout.n_kv_head * layout.head_dim
    return slice(0, q_rows), slice(q_rows, q_rows + kv_rows), slice(q_rows + kv_rows, q_rows + 2 * kv_rows)


def pairs_from_tensors(c_attn_weight, c_attn_bias, c_proj_weight, layout: AttentionLayout,
                       circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's pairs of one circuit, each ``(G, D, n)`` float64 (see the module docstring)."""
    expected = (layout.n_head * layout.head_dim + 2 * layout.n_kv_head * layout.head_dim, layout.n_embd)
    if tuple(c_attn_weight.shape) != expected:
        raise ValueError(f"c_attn.weight is {tuple(c_attn_weight.shape)}, the layout needs {expected}")
    query, key, value = _row_blocks(layout)

    def bias_of(rows: slice):
        return None if c_attn_bias is None else c_attn_bias[rows]

    g, d = layout.n_kv_head, layout.head_dim
    if circuit == "qk":
        queries = _rows(c_attn_weight[query], bias_of(query), layout.n_head, d)  # (H, D, E[+1])
        return _side_by_side(queries, g), _rows(c_attn_weight[key], bias_of(key), g, d)
    if circuit == "ov":
        outputs = _rows(c_proj_weight.t(), None, layout.n_head, d)  # (H, D, E_out)
        return _rows(c_attn_weight[value], bias_of(value), g, d), _side_by_side(outputs, g)
    raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")


def layer_pairs(model, layer: int, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(A, B)`` pairs (each ``(G, D, n)``) of one circuit of one layer."""
    block = symmetry.attention_blocks(model)[layer]
    return pairs_from_tensors(*symmetry.layer_tensors(block), layout_of(model), circuit)


def model_pairs(model, circuit: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the float64 ``(A, B)`` pairs of one circuit, for any variant."""
    return [layer_pairs(model, layer, circuit) for layer in range(len(symmetry.attention_blocks(model)))]


def _copy_rows(c_attn, rows: slice, pairs: torch.Tensor, n_embd: int) -> None:
    """Write (heads, D, E[+1]) float64 pairs into c_attn rows (and bias) in place."""
    c_attn.weight[rows].copy_(pairs[..., :n_embd].reshape(-1, n_embd).to(c_attn.weight.dtype))
    if c_attn.bias is not None:
        c_attn.bias[rows].copy_(pairs[..., n_embd].reshape(-1).to(c_attn.bias.dtype))


@torch.no_grad()
def write_pairs_back(model, circuit: str, per_layer_pairs) -> None:
    """Write per-layer ``(A, B)`` pairs back into the attention parameters, in place.

    Exact inverse of :func:`model_pairs`; values are cast to the parameters' dtype.
    Parameters outside the circuit (and ``c_proj.bias``) are untouched.
    """
    if circuit not in CIRCUITS:
        raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")
    layout = layout_of(model)
    query, key, value = _row_blocks(layout)
    for block, (pair_a, pair_b) in zip(symmetry.attention_blocks(model), per_layer_pairs, strict=True):
        c_attn, c_proj = block.attn.c_attn, block.attn.c_proj
        if circuit == "qk":
            _copy_rows(c_attn, query, _unside_by_side(pair_a, layout.n_head), layout.n_embd)
            _copy_rows(c_attn, key, pair_b, layout.n_embd)
        else:
            _copy_rows(c_attn, value, pair_a, layout.n_embd)
            outputs = _unside_by_side(pair_b, layout.n_head)  # (H, D, E_out)
            c_proj.weight.copy_(outputs.reshape(-1, layout.n_embd).t().to(c_proj.weight.dtype))


# --------------------------------------------------------------------------------------
# The RoPE-restricted orbit (docs/design.md §8; Prop. 4.8), half-split planes
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


def _plane_sq_norms(pair: torch.Tensor) -> torch.Tensor:
    """``||X_p||_F^2`` per plane: (..., D, n) -> (..., D/2)."""
    return planes(pair).square().sum((-1, -2))


def _rope_coefficients(pair_a, pair_b, step_a, step_b):
    """Per plane, the step's inner products with the two tangent directions and their squared norm.

    ``u_1 = (A_p, -B_p)``, ``u_2 = (J A_p, J B_p)``. Their 2x2 Gram matrix is
    ``(|A_p|^2 + |B_p|^2) I_2``: ``<u_1, u_2> = <A_p, J A_p> - <B_p, J B_p> = 0``
    because ``J`` is antisymmetric (exactly, in floating point too), and
    ``|J X| = |X|``. Returns ``(r_1, r_2, norm, solvable)``, each ``(..., D/2)``.
    """
    a_planes, b_planes = planes(pair_a), planes(pair_b)
    da_planes, db_planes = planes(step_a), planes(step_b)
    norm = a_planes.square().sum((-1, -2)) + b_planes.square().sum((-1, -2))
    r_1 = (da_planes * a_planes).sum((-1, -2)) - (db_planes * b_planes).sum((-1, -2))
    r_2 = (da_planes * rotate_j(a_planes)).sum((-1, -2)) + (db_planes * rotate_j(b_planes)).sum((-1, -2))
    solvable = norm > SINGULAR_RTOL * norm.amax(-1, keepdim=True)
    return r_1, r_2, norm, solvable


def rope_tangent_projection(pair_a, pair_b, step_a, step_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthogonal projection of ``(dA, dB)`` onto the RoPE orbit's tangent at ``(A, B)``.

    Per plane ``c_i = <step, u_i> / (|A_p|^2 + |B_p|^2)`` and the projection is
    ``c_1 u_1 + c_2 u_2`` (see :func:`_rope_coefficients`); planes are orthogonal
    to each other (disjoint rows). A plane with ``A_p = B_p = 0`` contributes nothing.
    """
    r_1, r_2, norm, solvable = _rope_coefficients(pair_a, pair_b, step_a, step_b)
    inv = torch.where(solvable, 1 / torch.where(solvable, norm, torch.ones_like(norm)), torch.zeros_like(norm))
    c_1, c_2 = (r_1 * inv)[..., None, None], (r_2 * inv)[..., None, None]
    a_planes, b_planes = planes(pair_a), planes(pair_b)
    proj_a = c_1 * a_planes + c_2 * rotate_j(a_planes)
    proj_b = -c_1 * b_planes + c_2 * rotate_j(b_planes)
    return unplanes(proj_a), unplanes(proj_b)


def rope_unidentified_sq_norm(pair_a, pair_b, step_a, step_b) -> tuple[torch.Tensor, torch.Tensor]:
    """``||proj(dA, dB)||^2 = sum_p (r_1^2 + r_2^2) / (|A_p|^2 + |B_p|^2)`` per pair, and singular flags."""
    r_1, r_2, norm, solvable = _rope_coefficients(pair_a, pair_b, step_a, step_b)
    safe = torch.where(solvable, norm, torch.ones_like(norm))
    sq = torch.where(solvable, (r_1.square() + r_2.square()) / safe, torch.zeros_like(norm)).sum(-1)
    return sq, ~solvable.all(-1)


def rope_plane_traces(matrix: torch.Tensor) -> torch.Tensor:
    """Per plane the trace of the 2x2 diagonal block of a (..., D, D) matrix: (..., D/2)."""
    diagonal = matrix.diagonal(dim1=-2, dim2=-1)
    half = diagonal.shape[-1] // 2
    return diagonal[..., :half] + diagonal[..., half:]


def rope_from_plane_traces(traces: torch.Tensor) -> torch.Tensor:
    """The (..., D, D) matrix of the algebra with these plane traces: diagonal blocks ``(t_p / 2) I_2``."""
    return torch.diag_embed(torch.cat([traces, traces], dim=-1) / 2)


def rope_rebalance_pairs(pair_a, pair_b, target_imbalance=None
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
    a, b = _plane_sq_norms(pair_a), _plane_sq_norms(pair_b)
    target = torch.zeros_like(a) if target_imbalance is None else rope_plane_traces(target_imbalance)
    geometric = (a * b).sqrt()  # the plane's share of the product, invariant on the orbit
    done = (geometric.amin(-1) >= REBALANCE_MIN_SV_RATIO * geometric.amax(-1)) & (geometric.amax(-1) > 0)
    root = torch.sqrt(target.square() + 4 * a * b)
    safe_a = torch.where(a > 0, a, torch.ones_like(a))
    # (t + r) / (2a) cancels for t < 0; there use the equal 2b / (r - t)
    x = torch.where(target >= 0, (target + root) / (2 * safe_a),
                    2 * b / (root - target).clamp_min(torch.finfo(a.dtype).tiny))
    x = torch.where(done.unsqueeze(-1), x, torch.ones_like(x))
    scale = x.sqrt()[..., None, None]  # (..., D/2, 1, 1)
    new_a = unplanes(planes(pair_a) * scale)
    new_b = unplanes(planes(pair_b) / scale)
    return new_a, new_b, done


def rope_excess_norm_terms(pair_a, pair_b) -> tuple[torch.Tensor, torch.Tensor]:
    """``(||A||^2 + ||B||^2, min over the restricted orbit)`` per pair.

    On the RoPE orbit only the plane scales change norms: ``min_s sum_p (s_p^2 a_p
    + b_p / s_p^2) = sum_p 2 sqrt(a_p b_p)``, reached when every plane trace of ``I``
    is zero. Same role as symmetry.excess_norm_terms' ``2 ||A^T B||_*`` for ``GL_D``.
    """
    a, b = _plane_sq_norms(pair_a), _plane_sq_norms(pair_b)
    return (a + b).sum(-1), 2 * (a * b).sqrt().sum(-1)


# --------------------------------------------------------------------------------------
# One interface for both orbit kinds
# --------------------------------------------------------------------------------------

def _check_kind(kind: str) -> None:
    if kind not in ORBIT_KINDS:
        raise ValueError(f"unknown orbit kind {kind!r}; expected one of {ORBIT_KINDS}")


def tangent_projection(kind: str, pair_a, pair_b, step_a, step_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Projection of a step onto the tangent of the orbit of this kind (the unidentified part)."""
    _check_kind(kind)
    if kind == "rope":
        return rope_tangent_projection(pair_a, pair_b, step_a, step_b)
    return symmetry.tangent_projection(pair_a, pair_b, step_a, step_b)


def unidentified_sq_norm(kind: str, pair_a, pair_b, step_a, step_b) -> tuple[torch.Tensor, torch.Tensor]:
    """``(||proj(dA, dB)||^2, singular)`` per pair: the numerator of rho (docs/design.md §3)."""
    _check_kind(kind)
    if kind == "rope":
        return rope_unidentified_sq_norm(pair_a, pair_b, step_a, step_b)
    return symmetry.unidentified_sq_norm(pair_a, pair_b, step_a, step_b)


def project_to_algebra(kind: str, symmetric: torch.Tensor) -> torch.Tensor:
    """Orthogonal projection of symmetric (..., D, D) matrices onto the orbit's Lie algebra.

    Identity for ``"gl"``; for ``"rope"`` the plane blocks ``(t_p / 2) I_2`` (the
    ``J`` part of a symmetric block is zero, off-plane entries project to zero).
    """
    _check_kind(kind)
    return rope_from_plane_traces(rope_plane_traces(symmetric)) if kind == "rope" else symmetric


def conserved_imbalance(kind: str, pair_a, pair_b) -> torch.Tensor:
    """What gradient flow conserves on this orbit, as (..., D, D): ``I = A A^T - B B^T`` for
    ``"gl"`` (Lemma 5.1), its projection onto the RoPE algebra for ``"rope"``. Use it for
    beta: ``||conserved_t - conserved_0||_F``; it is also the target form of :func:`rebalance_pairs`."""
    return project_to_algebra(kind, symmetry.imbalance(pair_a, pair_b))


def excess_norm_terms(kind: str, pair_a, pair_b) -> tuple[torch.Tensor, torch.Tensor]:
    """``(||A||^2 + ||B||^2, minimum of that over the orbit)`` per pair: mu's two sums."""
    _check_kind(kind)
    if kind == "rope":
        return rope_excess_norm_terms(pair_a, pair_b)
    return symmetry.excess_norm_terms(pair_a, pair_b)


def rebalance_pairs(kind: str, pair_a, pair_b, target_imbalance=None, target_eigh=None, product=None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move pairs along their orbit to a target conserved imbalance (None = balanced): ``(A', B', done)``.

    ``target_imbalance`` is (..., D, D), e.g. :func:`conserved_imbalance` at step 0.
    ``"gl"`` passes the optional precomputed ``target_eigh`` / ``product`` on to
    symmetry.rebalance_pairs; ``"rope"`` needs neither.
    """
    _check_kind(kind)
    if kind == "rope":
        return rope_rebalance_pairs(pair_a, pair_b, target_imbalance)
    if target_imbalance is None and target_eigh is None:
        target_imbalance = torch.zeros(*pair_a.shape[:-1], pair_a.shape[-2], dtype=pair_a.dtype)
    return symmetry.rebalance_pairs(pair_a, pair_b, target_imbalance, target_eigh=target_eigh, product=product)


def random_group_element(kind: str, batch_shape, head_dim: int, generator: torch.Generator,
                         spread: float = 0.5) -> torch.Tensor:
    """A random, well-conditioned ``M`` (batch..., D, D) in the orbit's group (float64).

    ``"gl"``: ``exp(spread X)`` for Gaussian ``X / sqrt(D)``. ``"rope"``: per plane
    ``r R(theta)``, ``log r`` in ``[-spread, spread]``, ``theta`` uniform.
    """
    _check_kind(kind)
    shape = (*batch_shape, head_dim, head_dim)
    if kind == "gl":
        noise = torch.randn(shape, generator=generator, dtype=torch.float64) / math.sqrt(head_dim)
        return torch.linalg.matrix_exp(spread * noise)
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


def act(element: torch.Tensor, pair_a, pair_b) -> tuple[torch.Tensor, torch.Tensor]:
    """The symmetry ``A -> M A``, ``B -> M^{-T} B`` (keeps ``A^T B``)."""
    return element @ pair_a, torch.linalg.solve(element.transpose(-1, -2), pair_b)


# --------------------------------------------------------------------------------------
# Orbit dimension (compare with counts.py's closed forms)
# --------------------------------------------------------------------------------------

def _orbit_rank(kind: str, pair_a, pair_b) -> int:
    """Rank of the tangent map ``X -> (X A, -X^T B)`` on the Lie algebra, summed over the batch.

    ``"gl"``: the map's normal operator is ``X -> X A A^T + B B^T X``, eigenvalues
    ``a_j + b_i`` over the two Gram eigenbases; count those above round-off.
    ``"rope"``: per plane the two tangent directions have norm ``|A_p|^2 + |B_p|^2``
    and are orthogonal: 2 per plane that is not zero.
    """
    if kind == "rope":
        norm = _plane_sq_norms(pair_a) + _plane_sq_norms(pair_b)
        return int(2 * (norm > SINGULAR_RTOL * norm.amax(-1, keepdim=True)).sum())
    eig_a = torch.linalg.eigvalsh(symmetry.gram(pair_a)).clamp_min(0)
    eig_b = torch.linalg.eigvalsh(symmetry.gram(pair_b)).clamp_min(0)
    sums = eig_b.unsqueeze(-1) + eig_a.unsqueeze(-2)
    scale = sums.flatten(-2).amax(-1)[..., None, None]
    return int((sums > SINGULAR_RTOL * scale).sum())


def generic_orbit_dimension(kind: str, n_pairs: int, head_dim: int, n_a: int, n_b: int) -> int:
    """Orbit dimension at a generic point: ``D`` per RoPE pair; for ``GL_D`` ``D^2`` minus the
    stabiliser ``{X : X A = 0, X^T B = 0}``, of dimension ``(D - rank A)(D - rank B)``."""
    _check_kind(kind)
    if kind == "rope":
        return n_pairs * head_dim
    return n_pairs * (head_dim ** 2 - (head_dim - min(head_dim, n_a)) * (head_dim - min(head_dim, n_b)))


def orbit_dimension(model_or_config, layer: int, circuit: str) -> int:
    """Dimension of the orbit of one layer's pairs of one circuit under the architecture's group.

    For a model, the rank of the tangent map at its weights; for a GPTConfig, the
    generic value. Equals counts.unidentified_qk_params / unidentified_ov_params of
    :func:`layer_shape` (``H D^2`` MHA, ``G D^2`` GQA, ``G D`` RoPE query-key; ``G D^2``
    output-value) at any point where the Gram matrices are nonsingular.
    """
    kind = orbit_kind(model_or_config, circuit)
    if hasattr(_unwrap(model_or_config), "config"):
        return _orbit_rank(kind, *layer_pairs(model_or_config, layer, circuit))
    layout = layout_of(model_or_config)
    if not 0 <= layer < model_or_config.n_layer:
        raise ValueError(f"layer {layer} out of range for n_layer={model_or_config.n_layer}")
    columns = layout.n_embd + (1 if layout.bias else 0)
    if circuit == "qk":
        n_a, n_b = layout.heads_per_group * columns, columns
    else:
        n_a, n_b = columns, layout.heads_per_group * layout.n_embd
    return generic_orbit_dimension(kind, layout.n_kv_head, layout.head_dim, n_a, n_b)


def orbit_dimension_rows(model) -> list[dict]:
    """Per layer and circuit: the orbit kind, the orbit dimension at the model's weights and
    counts.py's closed form for the layer shape (for ``attnid inspect``)."""
    shape = layer_shape(model)
    closed_form = {"qk": counts.unidentified_qk_params(shape), "ov": counts.unidentified_ov_params(shape)}
    return [{"layer": layer, "circuit": circuit, "orbit": orbit_kind(model, circuit),
             "orbit_dimension": orbit_dimension(model, layer, circuit), "closed_form": closed_form[circuit]}
            for layer in range(len(symmetry.attention_blocks(model))) for circuit in CIRCUITS]


# --------------------------------------------------------------------------------------
# Whole-model moves (rebalancing, and the tau probe's move-and-restore)
# --------------------------------------------------------------------------------------

REBALANCE_TARGETS = ("initial", "balanced")


def initial_conserved(model, circuit: str) -> torch.Tensor:
    """The conserved imbalance of every pair of one circuit, stacked ``(L, G, D, D)``:
    the target that :func:`rebalance_model` restores (beta's reference ``I_0``)."""
    kind = orbit_kind(model, circuit)
    return torch.stack([conserved_imbalance(kind, a, b) for a, b in model_pairs(model, circuit)])


def _gl_target_eigh(initial: torch.Tensor, target: str) -> tuple[torch.Tensor, torch.Tensor]:
    """eigh of a ``GL_D`` rebalancing target. ``balanced``: eigenvalues 0 and the identity as basis
    (any orthonormal basis is exact; the identity keeps ``A' = sqrt(s) U^T`` simple)."""
    if target == "initial":
        return torch.linalg.eigh(initial)
    eye = torch.eye(initial.shape[-1], dtype=initial.dtype, device=initial.device).expand_as(initial)
    return torch.zeros(initial.shape[:-1], dtype=initial.dtype, device=initial.device), eye


def rebalance_target(kind: str, initial: torch.Tensor, target: str) -> dict[str, torch.Tensor | tuple | None]:
    """The keyword arguments of :func:`rebalance_model` for a run's rebalancing target (docs/design.md §4).

    ``initial`` is the pairs' conserved imbalance at step 0 (:func:`conserved_imbalance`,
    ``(..., D, D)``); ``target`` is ``"initial"`` (restore it, Lemma 5.1) or ``"balanced"``
    (zero). For ``"gl"`` the target's eigendecomposition is done here, once per run.
    """
    _check_kind(kind)
    if target not in REBALANCE_TARGETS:
        raise ValueError(f"rebalance target must be 'initial' or 'balanced', got {target!r}")
    if kind == "rope":
        return {"target_imbalance": initial if target == "initial" else None}
    return {"target_eigh": _gl_target_eigh(initial, target)}


def stacked_pairs(tensors_per_layer, layout: AttentionLayout, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One circuit's pairs of every layer, ``(L*G, D, n)`` float64, layer-major, from per-layer
    ``(c_attn.weight, c_attn.bias, c_proj.weight)`` (the live tensors or a float64 snapshot)."""
    per_layer = [pairs_from_tensors(w, b, p, layout, circuit) for w, b, p in tensors_per_layer]
    return torch.cat([a for a, _ in per_layer]), torch.cat([b for _, b in per_layer])


def attention_tensors(model) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """Per layer the live ``(c_attn.weight, c_attn.bias, c_proj.weight)`` (through wrappers)."""
    return [symmetry.layer_tensors(block) for block in symmetry.attention_blocks(model)]


def weight_columns(layout: AttentionLayout, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the weight-matrix columns of a pair's ``A`` and ``B`` (the rest are bias columns).

    A GQA query-key ``A`` holds ``H/G`` blocks ``[W_Q^h | b_Q^h]`` side by side, so with
    biases its bias columns are every ``(E+1)``-th, not only the last one.
    """
    columns = layout.n_embd + (1 if layout.bias else 0)
    heads_block = torch.arange(layout.heads_per_group * columns)
    with_bias = torch.arange(columns)
    if circuit == "qk":
        return heads_block[heads_block % columns < layout.n_embd], with_bias[:layout.n_embd]
    if circuit == "ov":
        return with_bias[:layout.n_embd], torch.arange(layout.heads_per_group * layout.n_embd)
    raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")


@dataclass
class Move:
    """What :func:`rebalance_model` did to one circuit: pairs left alone, and the stacked pairs
    ``(L*G, D, n)`` *before* the move with mu's per-pair orbit minimum there, so a caller that
    measures mu at those weights again (the tau probe restores them) can skip the SVD."""

    skipped: int
    pair_a: torch.Tensor
    pair_b: torch.Tensor
    minimum: torch.Tensor


@torch.no_grad()
def rebalance_model(model, circuit: str, target_imbalance: torch.Tensor | None = None,
                    target_eigh: tuple[torch.Tensor, torch.Tensor] | None = None,
                    compute_device: torch.device | None = None) -> Move:
    """Move every pair of one circuit along the architecture's own orbit, in place (docs/design.md §4, §8).

    The target is ``target_imbalance`` (``(L, G, D, D)`` or ``(L*G, D, D)``, e.g.
    :func:`initial_conserved` at step 0; None = balanced) or, for ``"gl"``, its
    precomputed ``target_eigh`` (:func:`rebalance_target`). The function of the model is
    unchanged up to round-off. ``Move.skipped`` counts pairs left alone because they are
    too close to degenerate. ``compute_device`` (e.g. the CPU for a CUDA model) is where the
    pairs are copied to and the maths runs; the moved pairs are written back to the model.
    """
    kind, layout = orbit_kind(model, circuit), layout_of(model)
    pair_a, pair_b = stacked_pairs(attention_tensors(model), layout, circuit)
    if compute_device is not None:
        pair_a, pair_b = pair_a.to(compute_device, copy=True), pair_b.to(compute_device, copy=True)
    if target_imbalance is not None:
        target_imbalance = target_imbalance.reshape(-1, *target_imbalance.shape[-2:]).to(pair_a)
    if target_eigh is not None:
        target_eigh = (target_eigh[0].to(pair_a.device), target_eigh[1].to(pair_a.device))
    if kind == "gl":
        product = symmetry.product_svd(pair_a, pair_b)
        minimum = 2 * product[1].sum(-1)
        new_a, new_b, done = rebalance_pairs(kind, pair_a, pair_b, target_imbalance, target_eigh=target_eigh,
                                             product=product)
    else:
        minimum = rope_excess_norm_terms(pair_a, pair_b)[1]
        new_a, new_b, done = rebalance_pairs(kind, pair_a, pair_b, target_imbalance)
    n_layer = len(symmetry.attention_blocks(model))
    write_pairs_back(model, circuit, list(zip(new_a.chunk(n_layer), new_b.chunk(n_layer), strict=True)))
    return Move(int((~done).sum()), pair_a, pair_b, minimum)


@contextlib.contextmanager
def kept_attention_weights(model):
    """Restore the attention tensors bit-identically on exit: an orbit move inside is a probe only.

    Saves and restores just the attention tensors, not a deep copy of the model (slow,
    and fragile for compiled models).
    """
    tensors = attention_tensors(model)
    saved = [tuple(None if t is None else t.detach().clone() for t in layer) for layer in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for live, kept in zip(tensors, saved):
                for live_tensor, kept_tensor in zip(live, kept):
                    if live_tensor is not None:
                        live_tensor.copy_(kept_tensor)
