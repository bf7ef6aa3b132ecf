"""The symmetry classes that ``attnid align`` moves along, declared once per model shape (docs/design.md §17).

One :class:`AlignSpec` says, for any model the census describes (nanoGPT, GPT-2, Llama, Mistral, Qwen2,
Gemma), what each class acts on; the alignment is one function over it, not a copy per architecture:

- ``heads``: key/value groups permuted together with their query heads, and query heads within a group
  (``G = H``: plain head permutations). Query head ``h`` reads group ``h // (H/G)``.
- ``mlp``: hidden units permuted: the input rows (``w_fc``, or ``w_gate`` and ``w_up`` of a gated MLP)
  and their biases with the ``w_down`` columns.
- ``ov``: per key/value group one ``M`` in O(D): the group's ``W_V`` rows (and ``b_V``) by ``M``, every
  query head's ``W_O`` columns of the group by ``M^-1``; Procrustes over the stacked blocks
  ``[W_V | b_V | W_O^{h T} ...]``.
- ``qk``: per group one ``M``: the group's query heads by ``M``, its key by ``M^-T``. Without RoPE ``M``
  is in O(D) (Procrustes over ``[W_Q^h ... | b_Q^h ... | W_K | b_K]``); with RoPE only the commutant of the
  rotations is a symmetry (:mod:`attnid.theory.rope`, half-split planes ``(p, p + D/2)`` as every
  family here and the census run it): its orthogonal part is a rotation in each plane, whose nearest
  point has a closed form (``theta_p = atan2(C_10 - C_01, C_00 + C_11)`` of the plane's 2x2 cross
  matrix ``C``).
- ``ov_gl``, ``qk_gl``: the same pairs in GL(D) (with RoPE: the whole commutant, a rotation-scaling
  ``a I + b J`` per plane), by L-BFGS from the current point.
- ``stream``: the residual stream's coordinates permuted (every norm commutes with a permutation): the
  embeddings' and ``lm_head``'s columns, every reader's columns, every writer's rows, the norms' entries.
  Matched on the stream-indexed parameters no hidden class moves (:func:`embedding_stream`).
- ``stream_rotation``: ``x -> Q x`` (:func:`attnid.edits.orbit_moves.rotate_stream`; untied models, and
  ``Q 1 = 1`` under LayerNorm), Procrustes on the same parameters in the frame where ``Q`` acts on each
  by left multiplication (each reader through its norm's gain).
- ``norm_gain``: per free norm and coordinate a scale ``s``: gain and bias over ``s``, the readers'
  columns times ``s`` (:func:`attnid.edits.orbit_moves.scale_junctions`); each ``s`` the nearest point
  of its own quartic (:func:`gain_scales`), after a trial of the signs nearest on the gains and biases
  alone (:func:`gain_signs`).

Stacks are ``(G, D, n)`` per layer, every class's move a left multiplication of each group's stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment

from attnid.edits.orbit_moves import all_junctions, writer_names
from attnid.edits.whole_checkpoint import LM_HEAD, WholeCheckpoint
from attnid.theory import whole_model as theory

FULL, PLANES = "orthogonal", "rope-planes"  # the form of a circuit's move


@dataclass(frozen=True)
class AlignSpec:
    """What the classes of one model shape act on."""

    n_layer: int
    n_head: int  # H
    n_kv_head: int  # G
    head_dim: int  # D
    rope: bool
    mlp_inputs: tuple[str, ...]  # ("fc",) or ("gate", "up")
    layernorm: bool = False  # else RMSNorm: a stream rotation need not fix 1_E

    @property
    def per_group(self) -> int:
        return self.n_head // self.n_kv_head

    def form(self, circuit: str) -> str:
        """The move's form: RoPE leaves the query-key pair only the rotations of each plane."""
        return PLANES if circuit == "qk" and self.rope else FULL


def spec_of(whole: WholeCheckpoint) -> AlignSpec:
    shape = whole.shape
    a = shape.attention
    inputs = ("gate", "up") if shape.mlp in theory.GATED_MLPS else ("fc",)
    return AlignSpec(
        shape.n_layer, a.n_head, a.n_kv_head, a.head_dim, shape.positions == "rope", inputs,
        shape.norm == "layernorm",
    )  # fmt: skip


def class_notes(spec: AlignSpec, classes: tuple) -> list[str]:
    """Each asked class in this architecture's terms (the report's ``notes``)."""
    g, h, d = spec.n_kv_head, spec.n_head, spec.head_dim
    heads = "heads" if g == h else f"{g} key/value groups with their query heads, {spec.per_group} per group"
    qk = f"a rotation per RoPE plane (p, p + {d // 2})" if spec.rope else f"O({d}) per group"
    notes = {
        "heads": f"heads: permutations of {heads}",
        "mlp": f"mlp: permutations of the hidden units ({' and '.join(spec.mlp_inputs)} rows, down columns)",
        "ov": f"ov: O({d}) per key/value group (W_V rows by M, W_O columns by M^-1)",
        "qk": f"qk: {qk} (queries by M, the key by M^-T)",
        "ov_gl": f"ov_gl: GL({d}) per key/value group",
        "qk_gl": "qk_gl: the RoPE commutant per group" if spec.rope else f"qk_gl: GL({d}) per group",
        "stream": "stream: permutations of the residual stream's coordinates",
        "stream_rotation": "stream_rotation: a rotation of the residual stream"
        + (" fixing 1 (LayerNorm)" if spec.layernorm else ""),
        "norm_gain": "norm_gain: a scale per coordinate of every free norm (gain, bias / s; readers * s)",
    }
    return [notes[c] for c in classes]


# --------------------------------------------------------------------------------------
# stacks: (G, D, n) per group, (H, D, n) per query head
# --------------------------------------------------------------------------------------


def _by_head(tensor: torch.Tensor, d: int) -> torch.Tensor:
    """``(H D, ...)`` rows -> ``(H, D, n)``."""
    return tensor.reshape(tensor.shape[0] // d, d, -1)


def head_parts(whole: WholeCheckpoint, spec: AlignSpec, layer: int, circuit: str) -> torch.Tensor:
    """``(H, D, n)``: per query head what the group's ``M`` multiplies: ``[W_Q^h | b_Q^h]`` (``qk``) or
    ``W_O^{h T}`` (``ov``)."""
    p, prefix, d = whole.params, f"h{layer}.attn.", spec.head_dim
    if circuit == "ov":
        return _by_head(p[prefix + "w_o"].T, d)
    return torch.cat([_by_head(p[prefix + n], d) for n in ("w_q", "b_q") if prefix + n in p], dim=-1)


def shared_parts(whole: WholeCheckpoint, spec: AlignSpec, layer: int, circuit: str) -> torch.Tensor:
    """``(G, D, n)``: per key/value group its own rows: ``[W_K | b_K]`` (``qk``) or ``[W_V | b_V]``."""
    p, prefix = whole.params, f"h{layer}.attn."
    names = ("w_k", "b_k") if circuit == "qk" else ("w_v", "b_v")
    return torch.cat([_by_head(p[prefix + n], spec.head_dim) for n in names if prefix + n in p], dim=-1)


def group_stack(whole: WholeCheckpoint, spec: AlignSpec, layer: int, circuit: str) -> torch.Tensor:
    """``(G, D, n)``: everything the group's ``M`` multiplies (orthogonal ``M``: ``M^-T = M``), the query
    heads' blocks side by side."""
    heads = head_parts(whole, spec, layer, circuit)
    g, d = spec.n_kv_head, spec.head_dim
    grouped = heads.reshape(g, spec.per_group, d, -1).transpose(1, 2).reshape(g, d, -1)
    return torch.cat([grouped, shared_parts(whole, spec, layer, circuit)], dim=-1)


def mlp_stack(whole: WholeCheckpoint, spec: AlignSpec, layer: int) -> torch.Tensor:
    """``(F, n)``: per hidden unit its input rows and biases and its ``w_down`` column."""
    p, prefix = whole.params, f"h{layer}.mlp."
    parts = []
    for name in spec.mlp_inputs:
        parts.append(p[prefix + f"w_{name}"])
        if prefix + f"b_{name}" in p:
            parts.append(p[prefix + f"b_{name}"][:, None])
    parts.append(p[prefix + "w_down"].T)
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------------------------
# the nearest point of each form: value (for matching) and move (Procrustes)
# --------------------------------------------------------------------------------------


def _planes(cross: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per plane ``p`` of ``cross`` ``(..., D, D)``: ``(C_00 + C_11, C_10 - C_01)`` over ``(p, p + D/2)``."""
    half = cross.shape[-1] // 2
    diagonal = torch.diagonal(cross, dim1=-2, dim2=-1)
    upper = torch.diagonal(cross[..., :half, half:], dim1=-2, dim2=-1)  # C_01
    lower = torch.diagonal(cross[..., half:, :half], dim1=-2, dim2=-1)  # C_10
    return diagonal[..., :half] + diagonal[..., half:], lower - upper


def best_value(cross: torch.Tensor, form: str | None) -> torch.Tensor:
    """``max <A, M B>`` over the form's ``M`` given ``cross = A B^T`` ``(..., D, D)``; None: ``M = I``."""
    if form is None:
        return torch.diagonal(cross, dim1=-2, dim2=-1).sum(-1)
    if form == FULL:
        return torch.linalg.svdvals(cross).sum(-1)
    cosine, sine = _planes(cross)
    return torch.sqrt(cosine**2 + sine**2).sum(-1)


def plane_matrix(scale_cos: torch.Tensor, scale_sin: torch.Tensor) -> torch.Tensor:
    """``(..., D, D)``: ``a I + b J`` in every plane ``(p, p + D/2)`` (``a``, ``b``: ``(..., D/2)``), the
    RoPE commutant (:func:`attnid.edits.orbit_moves.random_rope_commutant`'s layout)."""
    a, b = torch.diag_embed(scale_cos), torch.diag_embed(scale_sin)
    return torch.cat([torch.cat([a, -b], dim=-1), torch.cat([b, a], dim=-1)], dim=-2)


def best_move(cross: torch.Tensor, form: str) -> torch.Tensor:
    """The form's ``M`` maximising ``<A, M B>`` given ``cross = A B^T``: ``U V^T`` (O(D)), or per plane
    the rotation by ``atan2(C_10 - C_01, C_00 + C_11)``."""
    if form == FULL:
        u, _, vh = torch.linalg.svd(cross)
        return u @ vh
    angle = torch.atan2(*reversed(_planes(cross)))
    return plane_matrix(torch.cos(angle), torch.sin(angle))


# --------------------------------------------------------------------------------------
# permutations: the matching of one layer, and the moves
# --------------------------------------------------------------------------------------


def assignment(similarity: torch.Tensor) -> list[int]:
    """``order[i]``: the column matched to row ``i`` (largest total similarity, Hungarian)."""
    rows, cols = linear_sum_assignment(similarity.numpy(), maximize=True)
    order = [0] * len(rows)
    for row, col in zip(rows, cols, strict=True):
        order[int(row)] = int(col)
    return order


def match_heads(a: WholeCheckpoint, b: WholeCheckpoint, spec: AlignSpec, layer: int, classes: tuple) -> list:
    """``order`` over the query heads: head ``i`` of the aligned layer is head ``order[i]`` of ``b``.

    Each circuit counts by its nearest point when its class is asked (``ov``/``qk``; Procrustes residual),
    else as it stands. Query heads within a pair of groups are matched first by their own blocks, then
    the groups by everything the group's move multiplies in that head order (weight matching, nested)."""
    g, per = spec.n_kv_head, spec.per_group
    head_cross, shared_cross, forms = [], [], []
    for circuit in ("qk", "ov"):
        forms.append(spec.form(circuit) if circuit in classes or circuit + "_gl" in classes else None)
        ha, hb = head_parts(a, spec, layer, circuit), head_parts(b, spec, layer, circuit)
        head_cross.append(torch.einsum("idn,jen->ijde", ha, hb))  # (H, H, D, D)
        sa, sb = shared_parts(a, spec, layer, circuit), shared_parts(b, spec, layer, circuit)
        shared_cross.append(torch.einsum("idn,jen->ijde", sa, sb))  # (G, G, D, D)
    inner: dict[tuple[int, int], list[int]] = {}
    if per > 1:
        per_head = torch.stack([best_value(c, f) for c, f in zip(head_cross, forms, strict=True)]).sum(0)
        for i in range(g):
            for j in range(g):
                inner[i, j] = assignment(per_head[i * per : (i + 1) * per, j * per : (j + 1) * per])
    else:
        inner = {(i, j): [0] for i in range(g) for j in range(g)}
    group_value = torch.zeros(g, g, dtype=torch.float64)
    for cross, shared, form in zip(head_cross, shared_cross, forms, strict=True):
        total = shared.clone()
        for (i, j), matched in inner.items():
            for k, m in enumerate(matched):
                total[i, j] += cross[i * per + k, j * per + m]
        group_value += best_value(total, form)
    groups = assignment(group_value) if g > 1 else [0]
    return [groups[i] * per + inner[i, groups[i]][k] for i in range(g) for k in range(per)]


def permute_heads(whole: WholeCheckpoint, layer: int, order: list[int]) -> None:
    """Query head ``i`` of the result is head ``order[i]`` of ``whole``, its key/value group following
    (``order`` must move whole groups); in place."""
    p, a = whole.params, whole.shape.attention
    d, per = a.head_dim, a.n_head // a.n_kv_head
    groups = [order[i * per] // per for i in range(a.n_kv_head)]
    if any(order[i] // per != groups[i // per] for i in range(a.n_head)):
        raise ValueError(f"head order {order} splits a key/value group of {per} query heads")
    prefix = f"h{layer}.attn."
    for names, index in ((("w_q", "b_q"), order), (("w_k", "b_k", "w_v", "b_v"), groups)):
        for name in names:
            if prefix + name in p:
                tensor = p[prefix + name]
                p[prefix + name] = _by_head(tensor, d)[torch.tensor(index)].reshape(tensor.shape).clone()
    w_o = p[prefix + "w_o"]
    p[prefix + "w_o"] = w_o.reshape(w_o.shape[0], -1, d)[:, torch.tensor(order)].reshape(w_o.shape).clone()


def permute_mlp(whole: WholeCheckpoint, layer: int, order: list[int]) -> None:
    """Hidden unit ``i`` of the result is unit ``order[i]`` of ``whole`` (in place)."""
    p, prefix = whole.params, f"h{layer}.mlp."
    index = torch.tensor(order)
    for name in ("w_fc", "b_fc", "w_gate", "b_gate", "w_up", "b_up"):
        if prefix + name in p:
            p[prefix + name] = p[prefix + name][index].clone()
    p[prefix + "w_down"] = p[prefix + "w_down"][:, index].clone()


# --------------------------------------------------------------------------------------
# GL(D) and the RoPE commutant: the two sides of a pair
# --------------------------------------------------------------------------------------


def gl_sides(whole: WholeCheckpoint, spec: AlignSpec, layer: int, circuit: str) -> tuple:
    """``(G, D, n1)``, ``(G, D, n2)``: what ``M`` multiplies (``W_V | b_V``; the query heads) and what
    ``M^-T`` does (the ``W_O^{h T}``; ``W_K | b_K``)."""
    g, d = spec.n_kv_head, spec.head_dim
    heads = head_parts(whole, spec, layer, circuit)
    grouped = heads.reshape(g, spec.per_group, d, -1).transpose(1, 2).reshape(g, d, -1)
    shared = shared_parts(whole, spec, layer, circuit)
    return (grouped, shared) if circuit == "qk" else (shared, grouped)


def gl_matrix(x: torch.Tensor, spec: AlignSpec, circuit: str) -> torch.Tensor:
    """``M`` of the optimiser's variables: ``D^2`` entries, or under RoPE ``(a_p, b_p)`` per plane."""
    d = spec.head_dim
    if spec.form(circuit) == PLANES:
        return plane_matrix(x[: d // 2], x[d // 2 :])
    return x.reshape(d, d)


def gl_start(spec: AlignSpec, circuit: str) -> torch.Tensor:
    """The identity in the optimiser's variables."""
    d = spec.head_dim
    if spec.form(circuit) == PLANES:
        return torch.cat([torch.ones(d // 2), torch.zeros(d // 2)]).double()
    return torch.eye(d, dtype=torch.float64).flatten()


# --------------------------------------------------------------------------------------
# the residual stream: its coordinates permuted, rotated, and the norms' gains
# --------------------------------------------------------------------------------------


def stream_axes(whole: WholeCheckpoint) -> dict[str, int]:
    """Every parameter indexed by the residual stream, with that axis (0: rows, 1: columns)."""
    p = whole.params
    axes = {name: 1 for name in ("wte", "wpe", LM_HEAD) if name in p}
    for norm, readers in all_junctions(whole).items():
        axes |= {reader: 1 for reader in readers}
        axes |= {norm + part: 0 for part in (".weight", ".bias") if norm + part in p}
    return axes | {name: 0 for name in writer_names(whole)}


def permute_stream(whole: WholeCheckpoint, order: list[int]) -> None:
    """Residual coordinate ``i`` of the result is coordinate ``order[i]`` of ``whole`` (in place)."""
    index = torch.tensor(order)
    for name, axis in stream_axes(whole).items():
        whole.params[name] = whole.params[name].index_select(axis, index)  # a new tensor: no clone


def embedding_stream(whole: WholeCheckpoint, rotation_frame: bool) -> torch.Tensor:
    """``(E, n)``: the stream-indexed parameters that no hidden class (heads, mlp, ov, qk) moves, one
    column each: ``wte``, ``wpe`` and ``lm_head`` rows, every norm's gain and bias, each coordinate's gain
    and bias with the gain's sign taken out (``|g|``, ``b sign g``: a sign flip of ``norm_gain`` moves
    neither, docs/design.md §17). In the rotation's frame (``Q`` multiplies each column): ``lm_head`` rows
    times the final gain, each bias over its gain, no gains (:func:`attnid.edits.orbit_moves.rotate_stream`;
    every ``norm_gain`` scale leaves these as they are)."""
    p = whole.params
    columns = [p[name].T for name in ("wte", "wpe") if name in p]
    if LM_HEAD in p:
        columns.append(p["ln_f.weight"][:, None] * p[LM_HEAD].T if rotation_frame else p[LM_HEAD].T)
    for norm in all_junctions(whole):
        gain, bias = p[norm + ".weight"], p.get(norm + ".bias")
        if not rotation_frame:
            columns.append(gain.abs()[:, None])
        if bias is not None:
            columns.append((bias / gain if rotation_frame else torch.where(gain < 0, -bias, bias))[:, None])
    return torch.cat(columns, dim=1)


def match_stream(a: WholeCheckpoint, b: WholeCheckpoint, gains_move: bool) -> list[int]:
    """``order``: residual coordinate ``i`` of the aligned ``b`` is its coordinate ``order[i]``. Where
    ``norm_gain`` moves too (``gains_move``), matched in the rotation's frame, which no gain scale moves:
    the gains that it leaves would otherwise ask a second alignment for another order."""
    return assignment(embedding_stream(a, gains_move) @ embedding_stream(b, gains_move).T)


def complement_of_ones(n: int) -> torch.Tensor:
    """``(n, n - 1)``: an orthonormal basis of the vectors orthogonal to ``1_n`` (a Householder's columns)."""
    v = -torch.full((n,), n**-0.5, dtype=torch.float64)
    v[-1] += 1.0
    householder = torch.eye(n, dtype=torch.float64) - 2 * torch.outer(v, v) / (v @ v)
    return householder[:, :-1]


def stream_rotation_move(a: WholeCheckpoint, b: WholeCheckpoint, spec: AlignSpec) -> torch.Tensor:
    """``Q`` orthogonal (fixing ``1_E`` under LayerNorm) maximising ``<S_A, Q S_B>`` for the
    :func:`embedding_stream` in the rotation's frame: Procrustes (on ``1``'s complement under LayerNorm)."""
    sa, sb = embedding_stream(a, True), embedding_stream(b, True)
    if not spec.layernorm:
        return best_move(sa @ sb.T, FULL)
    basis = complement_of_ones(sa.shape[0])
    inner = best_move(basis.T @ sa @ sb.T @ basis, FULL)
    ones = torch.full((sa.shape[0], 1), sa.shape[0] ** -0.5, dtype=torch.float64)
    return basis @ inner @ basis.T + ones @ ones.T


def gain_scales(a: WholeCheckpoint, b: WholeCheckpoint) -> dict[str, torch.Tensor]:
    """Per free norm (its readers are not the tied embedding) the scales ``s`` ``(E,)`` that bring ``b``
    nearest ``a`` when its gain and bias are divided by ``s`` and its readers' columns multiplied:
    per coordinate ``f(s) = alpha / s^2 - 2 beta / s + gamma s^2 - 2 delta s`` (``alpha = g_B^2 + b_B^2``,
    ``beta = g_A g_B + b_A b_B``, ``gamma = sum ||W_B[:, i]||^2``, ``delta = sum <W_A[:, i], W_B[:, i]>``),
    whose stationary points are the real roots of ``gamma s^4 - delta s^3 + beta s - alpha``; the best of
    them and ``s = 1`` (so the move never moves away)."""
    pa, pb = a.params, b.params
    scales = {}
    for norm, readers in all_junctions(b).items():
        if readers == ["wte"]:
            continue  # a tied final norm: its reader is also the embedding (not a free norm)
        parts = [norm + ".weight"] + ([norm + ".bias"] if norm + ".bias" in pb else [])
        alpha = torch.stack([pb[n].square() for n in parts]).sum(0)
        beta = torch.stack([pa[n] * pb[n] for n in parts]).sum(0)
        gamma = torch.stack([pb[r].square().sum(0) for r in readers]).sum(0)
        delta = torch.stack([(pa[r] * pb[r]).sum(0) for r in readers]).sum(0)
        scales[norm] = best_scale(alpha, beta, gamma, delta)
    return scales


def gain_signs(a: WholeCheckpoint, b: WholeCheckpoint) -> dict[str, torch.Tensor]:
    """Per free norm the signs ``s`` ``(E,)`` (``norm_gain`` restricted to ``s = +-1``) nearest over what no
    hidden class moves, the gain and bias: ``s_i = -1`` where ``g_A g_B + b_A b_B < 0`` (their distance
    ``alpha - 2 s beta + ||A_i||^2``), else 1."""
    pa, pb = a.params, b.params
    signs = {}
    for norm, readers in all_junctions(b).items():
        if readers == ["wte"]:
            continue  # a tied final norm (not a free norm), as in gain_scales
        parts = [norm + ".weight"] + ([norm + ".bias"] if norm + ".bias" in pb else [])
        beta = torch.stack([pa[n] * pb[n] for n in parts]).sum(0)
        signs[norm] = torch.where(beta < 0, -1.0, 1.0).to(torch.float64)
    return signs


def best_scale(
    alpha: torch.Tensor, beta: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor
) -> torch.Tensor:
    """Per coordinate the ``s`` of :func:`gain_scales`: the companion matrices' real eigenvalues and 1."""
    n = alpha.shape[0]
    safe = torch.where(gamma > 0, gamma, torch.ones_like(gamma))
    companion = torch.zeros(n, 4, 4, dtype=torch.float64)
    companion[:, 1:, :3] = torch.eye(3, dtype=torch.float64)
    companion[:, :, 3] = torch.stack([alpha / safe, -beta / safe, torch.zeros_like(alpha), delta / safe], -1)
    roots = torch.linalg.eigvals(companion)  # s^4 - (delta/gamma) s^3 + (beta/gamma) s - alpha/gamma
    real = roots.real.where(
        roots.imag.abs() <= 1e-9 * roots.abs().clamp(min=1.0), torch.ones_like(roots.real)
    )
    real = real.where((real.abs() > 1e-12) & (gamma > 0)[:, None], torch.ones_like(real))
    candidates = torch.cat([torch.ones(n, 1, dtype=torch.float64), real], dim=1)
    columns = alpha[:, None], beta[:, None], gamma[:, None], delta[:, None]
    value = columns[0] / candidates**2 - 2 * columns[1] / candidates + columns[2] * candidates**2
    value = value - 2 * columns[3] * candidates
    return candidates.gather(1, value.argmin(1, keepdim=True)).squeeze(1)
