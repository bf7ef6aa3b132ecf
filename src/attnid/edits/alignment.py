"""``attnid align`` and ``attnid compare``: B moved along its own symmetry orbit to the point nearest A
(Frobenius distance over every parameter, float64), and what is left between them (docs/design.md §17).

The classes, in their declared order (:data:`ALIGN_CLASSES`), each a move of
:class:`~attnid.edits.whole_checkpoint.WholeCheckpoint` (the census's names, every matrix out x in):

- ``heads``: a permutation of the heads of a layer (``W_Q``, ``W_K``, ``W_V`` row blocks and their
  biases with ``W_O``'s column blocks); needs ``G = H``.
- ``mlp``: a permutation of the hidden units of a layer (``w_fc`` rows and ``b_fc`` with ``w_down``
  columns).
- ``ov``: per head an orthogonal ``M`` on the output-value pair, ``[W_V | b_V | W_O^T] -> M [...]``
  (:func:`~attnid.edits.orbit_moves.move_value_output` with ``M^-1 = M^T``).
- ``qk``: per head an orthogonal ``M`` on the query-key pair, ``[W_Q | b_Q | W_K | b_K] -> M [...]``
  (:func:`~attnid.edits.orbit_moves.move_query_key`, ``M^-T = M``; no RoPE).
- ``ov_gl``, ``qk_gl`` (only when named): the same pairs under GL(D), from the current point.

The permutations are solved by weight matching as Git Re-Basin does (Hungarian per layer,
``scipy.optimize.linear_sum_assignment``; coordinate descent over the layers in a seeded order until no
permutation changes). When ``ov`` or ``qk`` is also asked for, a head pair's matching cost is its
Procrustes residual (the nuclear norm of the cross matrix), so the permutation and the per-head rotations
are the joint optimum for the orthogonal classes. The orthogonal parts are Procrustes, closed form; the
``ov_gl`` and ``qk_gl`` classes take the pairs on from there in GL(D) (``W_O -> W_O M^-1``,
``W_K -> M^-T W_K``), by L-BFGS with a declared tolerance. Every class's move is checked in float64 by
the census's own forward before the next one (:func:`attnid.edits.quant_moves.exact_log_probs`); a class
that changes the log-probabilities by more than :data:`EXACT_DLOGP` is refused by name.
"""

from __future__ import annotations

import math
import random

import torch
from scipy.optimize import linear_sum_assignment

from attnid.common.errors import UserError
from attnid.edits.checkpoint_types import NANOGPT, Checkpoint
from attnid.edits.orbit_moves import move_query_key, move_value_output
from attnid.edits.quant_moves import exact_log_probs
from attnid.edits.whole_checkpoint import WholeCheckpoint, read_whole_checkpoint

ALIGN_CLASSES = ("heads", "mlp", "ov", "qk", "ov_gl", "qk_gl")  # the declared order (moves, report)
DEFAULT_CLASSES = ("heads", "mlp", "ov", "qk")  # the GL(D) refinement is asked for by name
GROUPS = ("embedding", "attention_qk", "attention_ov", "mlp", "norms")
EXACT_DLOGP = 1e-10  # max |delta log p| of the moves in float64 (the census's forward)
PROBE_TOKENS = 32  # the float64 check's window
MAX_SWEEPS = 100
GL_TOLERANCE = 1e-12  # L-BFGS: stop when the relative gradient (or the relative decrease) falls below it
GL_MAX_ITERATIONS = 500


def parse_classes(text: str | None) -> tuple[str, ...]:
    """``--classes`` (comma-separated, any order) in the declared order; None: :data:`DEFAULT_CLASSES`."""
    if text is None:
        return DEFAULT_CLASSES
    asked = {c.strip() for c in text.split(",") if c.strip()}
    unknown = sorted(asked - set(ALIGN_CLASSES))
    if unknown or not asked:
        raise UserError(f"--classes {text!r}: choose among {', '.join(ALIGN_CLASSES)}")
    return tuple(c for c in ALIGN_CLASSES if c in asked)


def group_of(name: str) -> str:
    """The parameter group of a census name (the report's rows)."""
    if name in ("wte", "wpe", "lm_head"):
        return "embedding"
    if ".ln_" in name or name.startswith("ln_"):
        return "norms"
    if ".mlp." in name:
        return "mlp"
    if name.endswith(("w_q", "w_k", "b_q", "b_k")):
        return "attention_qk"
    return "attention_ov"


def distances(a: WholeCheckpoint, b: WholeCheckpoint) -> dict[str, float]:
    """Frobenius distance per parameter group and over every parameter (``total``)."""
    squares = dict.fromkeys(GROUPS, 0.0)
    for name, tensor in a.params.items():
        squares[group_of(name)] += float((tensor - b.params[name]).square().sum())
    return {**{g: math.sqrt(s) for g, s in squares.items()}, "total": math.sqrt(sum(squares.values()))}


def norm_of(whole: WholeCheckpoint) -> float:
    return math.sqrt(sum(float(t.square().sum()) for t in whole.params.values()))


# --------------------------------------------------------------------------------------
# per-head stacks: each class's move is a left multiplication of a (D, n) stack
# --------------------------------------------------------------------------------------


def _head_stack(whole: WholeCheckpoint, layer: int, circuit: str) -> torch.Tensor:
    """``(H, D, n)``: per head ``[W_Q | b_Q | W_K | b_K]`` (``qk``) or ``[W_V | b_V | W_O^T]`` (``ov``)."""
    p, shape = whole.params, whole.shape.attention
    h, d = shape.n_head, shape.head_dim
    prefix = f"h{layer}.attn."
    parts = []
    names = ("w_q", "b_q", "w_k", "b_k") if circuit == "qk" else ("w_v", "b_v")
    for name in names:
        if prefix + name in p:
            tensor = p[prefix + name]
            parts.append(tensor.reshape(h, d, -1))
    if circuit == "ov":
        parts.append(p[prefix + "w_o"].T.reshape(h, d, -1))
    return torch.cat(parts, dim=-1)


def _mlp_stack(whole: WholeCheckpoint, layer: int) -> torch.Tensor:
    """``(F, n)``: per hidden unit ``[w_fc row | b_fc | w_down column]``."""
    p, prefix = whole.params, f"h{layer}.mlp."
    parts = [p[prefix + "w_fc"]]
    if prefix + "b_fc" in p:
        parts.append(p[prefix + "b_fc"][:, None])
    parts.append(p[prefix + "w_down"].T)
    return torch.cat(parts, dim=-1)


def _nuclear_cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(H, H)``: ``||A_i B_j^T||_*``, the largest ``<A_i, M B_j>`` over orthogonal ``M``."""
    cross = torch.einsum("idn,jen->ijde", a, b)
    return torch.linalg.svdvals(cross).sum(-1)


def _head_similarity(a: WholeCheckpoint, b: WholeCheckpoint, layer: int, classes: tuple) -> torch.Tensor:
    total = torch.zeros(a.shape.attention.n_head, a.shape.attention.n_head, dtype=torch.float64)
    for circuit in ("qk", "ov"):
        sa, sb = _head_stack(a, layer, circuit), _head_stack(b, layer, circuit)
        if circuit in classes:
            total += _nuclear_cross(sa, sb)
        else:
            total += torch.einsum("idn,jdn->ij", sa, sb)
    return total


def permute_heads(whole: WholeCheckpoint, layer: int, order: list[int]) -> None:
    """Head ``i`` of the result is head ``order[i]`` of ``whole`` (in place)."""
    p, shape = whole.params, whole.shape.attention
    h, d = shape.n_head, shape.head_dim
    prefix = f"h{layer}.attn."
    index = torch.tensor(order)
    for name in ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v"):
        if prefix + name in p:
            tensor = p[prefix + name]
            p[prefix + name] = tensor.reshape(h, d, -1)[index].reshape(tensor.shape).clone()
    w_o = p[prefix + "w_o"]
    p[prefix + "w_o"] = w_o.reshape(w_o.shape[0], h, d)[:, index].reshape(w_o.shape).clone()


def permute_mlp(whole: WholeCheckpoint, layer: int, order: list[int]) -> None:
    """Hidden unit ``i`` of the result is unit ``order[i]`` of ``whole`` (in place)."""
    p, prefix = whole.params, f"h{layer}.mlp."
    index = torch.tensor(order)
    p[prefix + "w_fc"] = p[prefix + "w_fc"][index].clone()
    if prefix + "b_fc" in p:
        p[prefix + "b_fc"] = p[prefix + "b_fc"][index].clone()
    p[prefix + "w_down"] = p[prefix + "w_down"][:, index].clone()


def _matching(similarity: torch.Tensor) -> list[int]:
    rows, cols = linear_sum_assignment(similarity.numpy(), maximize=True)
    order = [0] * len(rows)
    for row, col in zip(rows, cols, strict=True):
        order[int(row)] = int(col)
    return order


def match_permutations(
    a: WholeCheckpoint, b: WholeCheckpoint, kind: str, classes: tuple, seed: int
) -> dict[str, int]:
    """Weight matching of ``kind`` (``heads`` or ``mlp``) in place on ``b``: coordinate descent over the
    layers in a seeded order until a sweep changes no permutation. Returns the sweeps and the units
    moved (each layer's matching reads only its own layer, so the second sweep finds nothing to change)."""
    layers = list(range(a.shape.n_layer))
    random.Random(seed).shuffle(layers)
    moved = sweeps = 0
    for sweeps in range(1, MAX_SWEEPS + 1):  # noqa: B007 (the count is reported)
        changed = False
        for layer in layers:
            if kind == "heads":
                order = _matching(_head_similarity(a, b, layer, classes))
            else:
                order = _matching(_mlp_stack(a, layer) @ _mlp_stack(b, layer).T)
            if order != sorted(order):
                changed = True
                moved += sum(i != j for i, j in enumerate(order))
                (permute_heads if kind == "heads" else permute_mlp)(b, layer, order)
        if not changed:
            break
    return {"sweeps": sweeps, "units_moved": moved}


def _gl_parts(whole: WholeCheckpoint, layer: int, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H, D, n1)``, ``(H, D, n2)``: what ``M`` multiplies (``W_V | b_V``; ``W_Q | b_Q``) and what
    ``M^-T`` does (``W_O^T``; ``W_K | b_K``)."""
    p, shape = whole.params, whole.shape.attention
    h, d = shape.n_head, shape.head_dim
    prefix = f"h{layer}.attn."
    first, second = (("w_q", "b_q"), ("w_k", "b_k")) if circuit == "qk" else (("w_v", "b_v"), ())
    sides = []
    for names in (first, second):
        parts = [p[prefix + n].reshape(h, d, -1) for n in names if prefix + n in p]
        if circuit == "ov" and not names:
            parts = [p[prefix + "w_o"].T.reshape(h, d, -1)]
        sides.append(torch.cat(parts, dim=-1))
    return sides[0], sides[1]


def _gl_objective(x, pair: tuple, scale: float):
    """``(||A_1 - M B_1||^2 + ||A_2 - M^-T B_2||^2) / scale`` and its gradient in ``M`` (flattened)."""
    a1, b1, a2, b2 = pair
    d = a1.shape[0]
    m = torch.tensor(x, dtype=torch.float64).reshape(d, d).requires_grad_()
    value = ((a1 - m @ b1).square().sum() + (a2 - torch.linalg.inv(m).T @ b2).square().sum()) / scale
    value.backward()
    assert m.grad is not None
    return float(value.detach()), m.grad.flatten().numpy()


def gl_moves(a: WholeCheckpoint, b: WholeCheckpoint, circuit: str) -> tuple[list[torch.Tensor], int]:
    """Per layer ``(H, D, D)``: ``M`` in GL(D) minimising ``||A_1 - M B_1||^2 + ||A_2 - M^-T B_2||^2`` per
    head, by L-BFGS (scipy) from the identity (the current point: the Procrustes one after ``ov``/``qk``),
    tolerance :data:`GL_TOLERANCE` on the objective relative to ``||A||^2``. Returns the moves and the
    largest number of iterations a head took."""
    # lazy: scipy.optimize's minimize is only needed here
    from scipy.optimize import minimize

    moves, worst = [], 0
    d = a.shape.attention.head_dim
    for layer in range(a.shape.n_layer):
        (a1, a2), (b1, b2) = _gl_parts(a, layer, circuit), _gl_parts(b, layer, circuit)
        layer_moves = []
        for head in range(a.shape.attention.n_head):
            pair = (a1[head], b1[head], a2[head], b2[head])
            scale = float(a1[head].square().sum() + a2[head].square().sum()) or 1.0
            start = torch.eye(d, dtype=torch.float64).flatten().numpy()
            result = minimize(
                _gl_objective,
                start,
                args=(pair, scale),
                jac=True,
                method="L-BFGS-B",
                options={"gtol": GL_TOLERANCE, "ftol": GL_TOLERANCE, "maxiter": GL_MAX_ITERATIONS},
            )
            worst = max(worst, int(result.nit))
            layer_moves.append(torch.tensor(result.x, dtype=torch.float64).reshape(d, d))
        moves.append(torch.stack(layer_moves))
    return moves, worst


def procrustes_moves(a: WholeCheckpoint, b: WholeCheckpoint, circuit: str) -> list[torch.Tensor]:
    """Per layer ``(H, D, D)``: the orthogonal ``M`` nearest ``M B_h`` to ``A_h`` (``U V^T`` of ``A_h
    B_h^T = U S V^T``)."""
    moves = []
    for layer in range(a.shape.n_layer):
        cross = _head_stack(a, layer, circuit) @ _head_stack(b, layer, circuit).transpose(-1, -2)
        u, _, vh = torch.linalg.svd(cross)
        moves.append(u @ vh)
    return moves


def move_class(a: WholeCheckpoint, b: WholeCheckpoint, name: str, classes: tuple, seed: int) -> dict:
    """One class's move of ``b`` towards ``a`` (``b`` changed in place, or replaced: use the return)."""
    if name in ("heads", "mlp"):
        return match_permutations(a, b, name, classes, seed)
    circuit = name.removesuffix("_gl")
    detail: dict = {}
    if name.endswith("_gl"):
        moves, iterations = gl_moves(a, b, circuit)
        detail["lbfgs_max_iterations"] = iterations
    else:
        moves = procrustes_moves(a, b, circuit)
    moved = (move_value_output if circuit == "ov" else move_query_key)(b, moves)
    b.params = moved.params
    eye = torch.eye(moves[0].shape[-1], dtype=torch.float64)
    return {**detail, "max_move_from_identity": max(float((m - eye).abs().max()) for m in moves)}


# --------------------------------------------------------------------------------------
# checks, products, the whole alignment
# --------------------------------------------------------------------------------------


def check_same_architecture(a: Checkpoint, b: Checkpoint, wa: WholeCheckpoint, wb: WholeCheckpoint) -> None:
    """One line saying what differs between A and B, or nothing."""
    if wa.shape != wb.shape:
        fa, fb = vars(wa.shape), vars(wb.shape)
        diff = [f"{k} {fa[k]} vs {fb[k]}" for k in fa if fa[k] != fb.get(k)]
        raise UserError(f"{a.path} and {b.path} differ in architecture: {'; '.join(diff)}")
    for name, tensor in wa.params.items():
        other = wb.params.get(name)
        if other is None or other.shape != tensor.shape:
            got = None if other is None else tuple(other.shape)
            raise UserError(f"{a.path} and {b.path} differ in shape: {name} {tuple(tensor.shape)} vs {got}")


def _per_head(whole: WholeCheckpoint) -> bool:
    return whole.shape.attention.n_kv_head == whole.shape.attention.n_head


def align_refusal(whole: WholeCheckpoint, classes: tuple) -> str | None:
    attention = whole.shape.attention
    grouped = [c for c in classes if c != "mlp"] if attention.n_kv_head != attention.n_head else []
    if grouped:
        return f"class {grouped[0]}: grouped key/value heads (G < H) are not aligned here yet"
    if ("qk" in classes or "qk_gl" in classes) and attention.rope:
        return "class qk: under RoPE the query-key orbit is the RoPE commutant, not aligned here yet"
    if "mlp" in classes and "h0.mlp.w_fc" not in whole.params:
        return "class mlp: only the GELU MLP (c_fc, c_proj) is permuted here yet"
    return None


def probe_tokens(whole: WholeCheckpoint, seed: int) -> torch.Tensor:
    """``(1, T + 1)`` seeded random token ids: the window of :func:`~attnid.edits.quant_moves.exact_log_probs`
    (the census's float64 forward of its first ``T``)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = whole.params["wte"].shape[0]
    length = min(PROBE_TOKENS, whole.params["wpe"].shape[0]) if "wpe" in whole.params else PROBE_TOKENS
    return torch.randint(0, vocab, (1, length + 1), generator=generator)


def product_distances(a: WholeCheckpoint, b: WholeCheckpoint) -> dict:
    """Per layer and head ``||W_Q^T W_K (A) - (B)||_F`` and ``||W_O W_V (A) - (B)||_F``: what no
    per-head move removes; and each summed in quadrature over the heads."""
    shape = a.shape.attention
    h, d = shape.n_head, shape.head_dim
    rows: dict[str, list[list[float]]] = {"qk": [], "ov": []}
    for layer in range(a.shape.n_layer):
        prefix = f"h{layer}.attn."
        products = {}
        for side, whole in (("a", a), ("b", b)):
            p = whole.params
            q, k = p[prefix + "w_q"].reshape(h, d, -1), p[prefix + "w_k"].reshape(h, d, -1)
            v, o = p[prefix + "w_v"].reshape(h, d, -1), p[prefix + "w_o"].reshape(-1, h, d).transpose(0, 1)
            products[side] = (q.transpose(-1, -2) @ k, o @ v)
        for i, circuit in enumerate(("qk", "ov")):
            diff = products["a"][i] - products["b"][i]
            rows[circuit].append([float(x) for x in diff.flatten(1).norm(dim=1)])
    return {
        "per_head_qk": rows["qk"],
        "per_head_ov": rows["ov"],
        "qk": math.sqrt(sum(x * x for r in rows["qk"] for x in r)),
        "ov": math.sqrt(sum(x * x for r in rows["ov"] for x in r)),
    }


def _product_totals(a: WholeCheckpoint, b: WholeCheckpoint) -> dict | None:
    """The identified products' distances summed over the heads (``qk``, ``ov``); None without per-head
    products (grouped heads)."""
    if not _per_head(a):
        return None
    products = product_distances(a, b)
    return {"qk": products["qk"], "ov": products["ov"]}


def align_whole(
    a: WholeCheckpoint, b: WholeCheckpoint, classes: tuple = DEFAULT_CLASSES, seed: int = 0
) -> tuple[WholeCheckpoint, dict]:
    """``b`` moved class by class (declared order) to the point of its orbit nearest ``a``, and the report.
    Raises UserError naming the first class whose move changes ``b``'s float64 log-probabilities by more
    than :data:`EXACT_DLOGP`."""
    reason = align_refusal(b, classes)
    if reason is not None:
        raise UserError(reason)
    moved = WholeCheckpoint(b.shape, {k: v.clone() for k, v in b.params.items()}, b.gain_offset, b.rope_base)
    tokens = probe_tokens(b, seed)
    reference = exact_log_probs(b, tokens)
    before = distances(a, moved)
    steps, previous, worst = [], before, 0.0
    for name in classes:
        detail = move_class(a, moved, name, classes, seed)
        change = float((exact_log_probs(moved, tokens) - reference).abs().max())
        if not change <= EXACT_DLOGP:
            raise UserError(
                f"class {name}: the move changes the float64 log-probabilities by {change:.3g} "
                f"(> {EXACT_DLOGP:g}); nothing written"
            )
        worst = max(worst, change)
        after = distances(a, moved)
        removed = (
            (previous["total"] ** 2 - after["total"] ** 2) / before["total"] ** 2 if before["total"] else 0.0
        )
        products = _product_totals(a, moved)
        steps.append(
            {"class": name, "distance": after, "share_removed": removed, "products": products, **detail}
        )
        previous = after
    total_before, norm_a = before["total"], norm_of(a)
    report = {
        "classes": list(classes),
        "seed": seed,
        "gl_tolerance": GL_TOLERANCE if any(c.endswith("_gl") for c in classes) else None,
        "norm_a": norm_a,
        "norm_b": norm_of(b),
        "distance_before": before,
        "products_before": _product_totals(a, b),
        "steps": steps,
        "distance_after": previous,
        "relative_distance_after": previous["total"] / norm_a if norm_a else 0.0,
        "share_removed": 1 - previous["total"] ** 2 / total_before**2 if total_before else 0.0,
        "identified_products": product_distances(a, moved) if _per_head(a) else None,
        "exact_max_abs_dlogp": worst,
        "probe_tokens": int(tokens.shape[1]) - 1,
    }
    return moved, report


def read_pair(a: Checkpoint, b: Checkpoint) -> tuple[WholeCheckpoint, WholeCheckpoint]:
    """Both checkpoints in float64 census names, checked to be nanoGPT files of one architecture."""
    for checkpoint in (a, b):
        if checkpoint.kind != NANOGPT:
            raise UserError(f"{checkpoint.path}: align and compare read nanoGPT ckpt.pt files only (yet)")
    wa, wb = read_whole_checkpoint(a), read_whole_checkpoint(b)
    check_same_architecture(a, b, wa, wb)
    return wa, wb


def relative_move(first: WholeCheckpoint, second: WholeCheckpoint) -> float:
    """``||first - second|| / ||first||``: how far a second alignment moves an aligned model."""
    norm = norm_of(first)
    return distances(first, second)["total"] / norm if norm else 0.0
