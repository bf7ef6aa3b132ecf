"""``attnid align`` and ``attnid compare``: B moved along its own symmetry orbit to the point nearest A
(Frobenius distance over every parameter, float64), and what is left between them (docs/design.md §17).

The classes, in their declared order (:data:`ALIGN_CLASSES`), each a move of
:class:`~attnid.edits.whole_checkpoint.WholeCheckpoint` (the census's names, every matrix out x in), declared
once for every family by :mod:`attnid.edits.alignment_classes` (nanoGPT, GPT-2, Llama, Mistral, Qwen2,
Gemma): ``heads`` (key/value groups with their query heads, and query heads within a group), ``mlp``
(hidden units; gate and up rows with down columns for a gated MLP), ``ov`` (O(D) per key/value group),
``qk`` (O(D) per group; with RoPE a rotation per plane, the orthogonal part of the RoPE commutant),
``stream`` and ``stream_rotation`` first (the residual stream's coordinates permuted, rotated), ``ov_gl``
and ``qk_gl`` after ``qk`` (GL(D); with RoPE the whole commutant), ``norm_gain`` last (alternating with
every per-layer class until a sweep moves B by almost nothing). By default every class the architecture
has (``all``); ``--classes`` names a subset.

The permutations are solved by weight matching as Git Re-Basin does (Hungarian per layer,
``scipy.optimize.linear_sum_assignment``; coordinate descent over the layers in a seeded order until no
permutation changes). When ``ov`` or ``qk`` is also asked for, a pair's matching value is its
nearest point's (the nuclear norm of the cross matrix; per RoPE plane its closed form), so the permutation
and the per-group moves are solved together (nested for grouped heads: query heads within each pair of
groups, then the groups). The orthogonal parts are Procrustes, closed form; the
``ov_gl`` and ``qk_gl`` classes take the pairs on from there in GL(D) (``W_O -> W_O M^-1``,
``W_K -> M^-T W_K``), by Gauss-Newton and Newton (:mod:`attnid.edits.gl_nearest`; the commutant's few
variables by L-BFGS) to a declared tolerance. Every class's move is checked in float64 by
the census's own forward before the next one (:func:`attnid.edits.quant_moves.exact_log_probs`); a class
that changes the log-probabilities by more than :data:`EXACT_DLOGP` is refused by name.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import torch

from attnid.common.errors import UserError
from attnid.edits.alignment_classes import (
    FULL,
    AlignSpec,
    assignment,
    best_move,
    class_notes,
    gain_scales,
    gain_signs,
    gl_matrix,
    gl_sides,
    gl_start,
    group_stack,
    match_heads,
    match_stream,
    mlp_stack,
    permute_heads,
    permute_mlp,
    permute_stream,
    spec_of,
    stream_rotation_move,
)
from attnid.edits.checkpoint_types import Checkpoint
from attnid.edits.gl_nearest import gl_nearest
from attnid.edits.orbit_moves import (
    all_junctions,
    move_query_key,
    move_value_output,
    rotate_stream,
    scale_junctions,
)
from attnid.edits.quant_moves import exact_log_probs
from attnid.edits.whole_checkpoint import LM_HEAD, WholeCheckpoint, read_whole_checkpoint, stored_params

# the declared order (moves, report): the stream first, matched on what no hidden class moves
ALIGN_CLASSES = ("stream", "stream_rotation", "heads", "mlp", "ov", "qk", "ov_gl", "qk_gl", "norm_gain")
# no --classes: every class the architecture has (GL(D) too: its cost on two seeds, docs/design.md §17)
DEFAULT_CLASSES = ALIGN_CLASSES
PER_HEAD_CLASSES = ("heads", "mlp", "ov", "qk")  # the alignment stage's (docs/design.md §18)
PER_LAYER_CLASSES = (*PER_HEAD_CLASSES, "ov_gl", "qk_gl")  # each reads and moves one layer only
STREAM_CLASSES = ("stream", "stream_rotation", "norm_gain")
GROUPS = ("embedding", "attention_qk", "attention_ov", "mlp", "norms")
EXACT_DLOGP = 1e-10  # max |delta log p| of the moves in float64 (the census's forward)
PROBE_TOKENS = 32  # the float64 check's window
MAX_SWEEPS = 100
GL_TOLERANCE = 1e-12  # GL(D): a step moving M by less (relative); the commutant's L-BFGS: its gtol and ftol
GL_MAX_ITERATIONS = 500
GL_FIRST_SWEEP_TOLERANCE = 1e-4  # GL(D) in norm_gain's first sweep; then GL_SWEEP_SHARE of the last move
GL_SWEEP_SHARE = 1e-2
GAIN_TOLERANCE = 1e-8  # norm_gain's sweeps stop when one moves B by less than this share of ||A||


def parse_classes(text: str | None) -> tuple[str, ...]:
    """``--classes`` (comma-separated, any order) in the declared order; ``all``: :data:`ALIGN_CLASSES`, None
    (the default): :data:`DEFAULT_CLASSES`, each of which :func:`align_whole` narrows to the architecture's
    own."""
    if text is None:
        return DEFAULT_CLASSES
    if text.strip() == "all":
        return ALIGN_CLASSES
    asked = {c.strip() for c in text.split(",") if c.strip()}
    unknown = sorted(asked - set(ALIGN_CLASSES))
    if unknown or not asked:
        raise UserError(f"--classes {text!r}: choose among {', '.join(ALIGN_CLASSES)}, or all")
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


def match_permutations(
    a: WholeCheckpoint, b: WholeCheckpoint, kind: str, classes: tuple, seed: int
) -> dict[str, int]:
    """Weight matching of ``kind`` (``heads`` or ``mlp``) in place on ``b``: coordinate descent over the
    layers in a seeded order until a sweep changes no permutation. Returns the sweeps and the units
    moved (each layer's matching reads only its own layer, so the second sweep finds nothing to change)."""
    spec = spec_of(a)
    layers = list(range(a.shape.n_layer))
    random.Random(seed).shuffle(layers)
    moved = sweeps = 0
    for sweeps in range(1, MAX_SWEEPS + 1):  # noqa: B007 (the count is reported)
        changed = False
        for layer in layers:
            if kind == "heads":
                order = match_heads(a, b, spec, layer, classes)
            else:
                order = assignment(mlp_stack(a, spec, layer) @ mlp_stack(b, spec, layer).T)
            if order != sorted(order):
                changed = True
                moved += sum(i != j for i, j in enumerate(order))
                (permute_heads if kind == "heads" else permute_mlp)(b, layer, order)
        if not changed:
            break
    return {"sweeps": sweeps, "units_moved": moved}


def _gl_objective(x, pair: tuple, scale: float, spec: AlignSpec, circuit: str):
    """``(||A_1 - M B_1||^2 + ||A_2 - M^-T B_2||^2) / scale`` and its gradient in the variables of ``M``."""
    a1, b1, a2, b2 = pair
    variables = torch.tensor(x, dtype=torch.float64).requires_grad_()
    m = gl_matrix(variables, spec, circuit)
    value = ((a1 - m @ b1).square().sum() + (a2 - torch.linalg.inv(m).T @ b2).square().sum()) / scale
    value.backward()
    assert variables.grad is not None
    return float(value.detach()), variables.grad.numpy()


def gl_moves(
    a: WholeCheckpoint, b: WholeCheckpoint, circuit: str, tolerance: float = GL_TOLERANCE
) -> tuple[list[torch.Tensor], int]:
    """Per layer ``(G, D, D)``: ``M`` in GL(D) (with RoPE on ``qk``: in the commutant) minimising
    ``||A_1 - M B_1||^2 + ||A_2 - M^-T B_2||^2`` per key/value group from the identity (the current point:
    the Procrustes one after ``ov``/``qk``). GL(D): Gauss-Newton, then Newton
    (:func:`~attnid.edits.gl_nearest.gl_nearest`), until a step moves ``M`` by less than ``tolerance``;
    the commutant's ``D`` variables: L-BFGS (scipy), that tolerance on the
    objective relative to ``||A||^2``. Returns the moves and the most iterations a group took."""
    # lazy: scipy.optimize's minimize is only needed here
    from scipy.optimize import minimize

    spec = spec_of(a)
    moves, worst = [], 0
    for layer in range(spec.n_layer):
        (a1, a2), (b1, b2) = gl_sides(a, spec, layer, circuit), gl_sides(b, spec, layer, circuit)
        layer_moves = []
        for group in range(spec.n_kv_head):
            pair = (a1[group], b1[group], a2[group], b2[group])
            if spec.form(circuit) == FULL:
                move, iterations = gl_nearest(pair, tolerance, GL_MAX_ITERATIONS)
                worst = max(worst, iterations)
                layer_moves.append(move)
                continue
            scale = float(a1[group].square().sum() + a2[group].square().sum()) or 1.0
            result = minimize(
                _gl_objective,
                gl_start(spec, circuit).numpy(),
                args=(pair, scale, spec, circuit),
                jac=True,
                method="L-BFGS-B",
                options={"gtol": tolerance, "ftol": tolerance, "maxiter": GL_MAX_ITERATIONS},
            )
            worst = max(worst, int(result.nit))
            layer_moves.append(gl_matrix(torch.tensor(result.x, dtype=torch.float64), spec, circuit))
        moves.append(torch.stack(layer_moves))
    return moves, worst


def procrustes_moves(a: WholeCheckpoint, b: WholeCheckpoint, circuit: str) -> list[torch.Tensor]:
    """Per layer ``(G, D, D)``: the ``M`` of the circuit's form nearest ``M B_g`` to ``A_g`` over each
    group's stack (:func:`~attnid.edits.alignment_classes.best_move`)."""
    spec = spec_of(a)
    moves = []
    for layer in range(spec.n_layer):
        sa, sb = group_stack(a, spec, layer, circuit), group_stack(b, spec, layer, circuit)
        moves.append(best_move(sa @ sb.transpose(-1, -2), spec.form(circuit)))
    return moves


def _alternate_gains(
    a: WholeCheckpoint,
    b: WholeCheckpoint,
    hidden: list,
    classes: tuple,
    seed: int,
    floor: float,
    gains: bool = True,
) -> int:
    """The gain scales (``gains``) and the ``hidden`` classes in turn, in place, until a sweep moves ``b``
    by no more than ``floor`` (Frobenius): not until it removes little, which a move of the square root of
    that size still does (a second alignment would then move on), in a sweep of every class; the sweeps.
    A permutation class that changed nothing in a sweep is left out of the next ones until a sweep moves
    ``b`` by less than ``floor``; then a sweep of every class decides. GL(D) is solved to a
    tolerance that follows the sweeps' moves (:data:`GL_SWEEP_SHARE` of the last one, relative to what
    ``floor`` is a share of), down to :data:`GL_TOLERANCE`: an early sweep's exact GL(D) point would be moved
    by the next sweep anyway, and the last sweep, which moves ``b`` by less than ``floor``, solves it to a
    hundredth of that."""
    sweeps, tolerance = 0, GL_FIRST_SWEEP_TOLERANCE
    resting: set[str] = set()
    for sweeps in range(1, MAX_SWEEPS + 1):  # noqa: B007 (the count is reported)
        start = dict(b.params)  # every move replaces tensors: holding them holds the sweep's start
        every_class, now_resting = not resting, set()
        if gains:
            scale_junctions(b, gain_scales(a, b))
        for name in hidden:
            if name not in resting:
                detail = move_class(a, b, name, classes, seed, tolerance)
                if name in ("heads", "mlp") and not detail["units_moved"]:
                    now_resting.add(name)
        moved = math.sqrt(
            sum(float((b.params[n] - t).square().sum()) for n, t in start.items() if b.params[n] is not t)
        )
        if moved <= floor and every_class:
            break
        # a permutation that found nothing to change rests until the sweeps stop moving, and then one sweep of
        # every class checks the end (its Hungarian matchings are most of a sweep's cost on a large model)
        resting = set() if moved <= floor else resting | now_resting
        tolerance = max(GL_TOLERANCE, min(tolerance, GL_SWEEP_SHARE * moved * GAIN_TOLERANCE / floor))
    return sweeps


def gain_units(whole: WholeCheckpoint) -> list[tuple[dict[str, str], WholeCheckpoint]]:
    """What ``norm_gain``'s descent moves, cut where it is independent: per layer its norms, attention and
    MLP (every hidden class and every gain scale reads and moves one layer only), and an untied model's
    final norm with ``lm_head`` (no hidden class moves them). Each unit is a one-layer (or no-layer) model
    of ``whole``'s own tensors, not copies, named as layer 0, with its census name of each."""
    shape = replace(whole.shape, n_layer=1, tied=True)  # tied: its ln_f is no free norm (held by no unit)
    units = []
    for layer in range(whole.shape.n_layer):
        prefix = f"h{layer}."
        names = {"h0." + n.removeprefix(prefix): n for n in whole.params if n.startswith(prefix)}
        units.append(names)
    shapes = [shape] * len(units)
    if not whole.shape.tied:
        units.append({n: n for n in whole.params if n.startswith("ln_f.") or n == LM_HEAD})
        shapes.append(replace(whole.shape, n_layer=0))
    return [
        (
            names,
            WholeCheckpoint(
                unit_shape, {n: whole.params[f] for n, f in names.items()}, whole.gain_offset, whole.rope_base
            ),
        )
        for names, unit_shape in zip(units, shapes, strict=True)
    ]


def descend_gains(
    a: WholeCheckpoint, b: WholeCheckpoint, classes: tuple, seed: int, gains: bool = True
) -> dict:
    """``norm_gain``: the gain scales (:func:`~attnid.edits.alignment_classes.gain_scales`) and the asked
    per-layer classes (heads, MLP, orthogonal and GL(D)) solved again in turn (each its best given the
    others, so the distance never rises) until a sweep moves B by less than :data:`GAIN_TOLERANCE` of
    ``||A||``: a scale changes the readers' columns that the heads' matching, Procrustes and GL(D) read, so
    one pass alone is not a fixed point. Each unit of :func:`gain_units` descends on its own (the distance
    is a sum over them). ``gains`` False: the per-layer classes alone, no scale and no sign trial (after
    GL(D) where ``norm_gain`` is not asked: :func:`solve_class`).

    A negative scale (a gain's sign flipped, its readers' columns too) is where that descent stops short:
    the per-head classes, solved before it, matched flipped columns. So where the gains and biases alone
    ask for a flip (:func:`~attnid.edits.alignment_classes.gain_signs`), a unit is moved twice from the
    same start: flipped, its per-head classes solved again and the descent run, then the plain descent;
    the nearer of the two is kept (docs/design.md §17), so the distance never rises. The two are compared
    without GL(D), whose Newton solve on the losing branch, far from any orbit point, would cost most of
    the alignment; the kept one then descends with it. Every move puts new tensors in the unit's dict and
    changes none in place, so the start is kept exactly by holding its tensors, one unit at a time: no
    second model."""
    floor = GAIN_TOLERANCE * norm_of(a)  # of ||A||, not of what is left: near 0 that never ends
    every = [c for c in PER_LAYER_CLASSES if c in classes]
    sweeps = flips = 0
    for (names, unit_a), (_, unit_b) in zip(gain_units(a), gain_units(b), strict=True):
        hidden = every if unit_b.shape.n_layer else []
        if not (gains or hidden):
            continue
        start = dict(unit_b.params)
        signs = gain_signs(unit_a, unit_b) if gains else {}
        unit_flips = sum(int((s < 0).sum()) for s in signs.values())
        flipped: dict[str, torch.Tensor] = {}
        trial = [c for c in hidden if not c.endswith("_gl")] if unit_flips else hidden
        if unit_flips:
            scale_junctions(unit_b, signs)
            for name in trial:
                move_class(unit_a, unit_b, name, classes, seed)
            flipped_sweeps = _alternate_gains(unit_a, unit_b, trial, classes, seed, floor)
            flipped, flipped_distance = unit_b.params, distances(unit_a, unit_b)["total"]
            unit_b.params = dict(start)
        unit_sweeps = _alternate_gains(unit_a, unit_b, trial, classes, seed, floor, gains)
        if flipped and flipped_distance < distances(unit_a, unit_b)["total"]:
            unit_b.params, unit_sweeps = flipped, flipped_sweeps
            flips += unit_flips
        if trial != hidden:  # the kept branch, on with GL(D)
            unit_sweeps += _alternate_gains(unit_a, unit_b, hidden, classes, seed, floor, gains)
        sweeps = max(sweeps, unit_sweeps)
        b.params.update({names[n]: tensor for n, tensor in unit_b.params.items()})
    return {"sweeps": sweeps, "sign_flips": flips}


def move_class(
    a: WholeCheckpoint,
    b: WholeCheckpoint,
    name: str,
    classes: tuple,
    seed: int,
    gl_tolerance: float = GL_TOLERANCE,
) -> dict:
    """One class's move of ``b`` towards ``a`` (``b`` changed in place, or replaced: use the return);
    GL(D) solved to ``gl_tolerance``."""
    if name in ("heads", "mlp"):
        return match_permutations(a, b, name, classes, seed)
    if name == "stream":
        order = match_stream(a, b, "norm_gain" in classes)
        permute_stream(b, order)
        return {"units_moved": sum(i != j for i, j in enumerate(order))}
    if name == "stream_rotation":
        rotation = stream_rotation_move(a, b, spec_of(a))
        rotate_stream(b, rotation)
        eye = torch.eye(rotation.shape[0], dtype=torch.float64)
        return {"max_move_from_identity": float((rotation - eye).abs().max())}
    if name == "norm_gain":
        return descend_gains(a, b, classes, seed)
    circuit = name.removesuffix("_gl")
    detail: dict = {}
    if name.endswith("_gl"):
        moves, iterations = gl_moves(a, b, circuit, gl_tolerance)
        detail["gl_max_iterations"] = iterations
    else:
        moves = procrustes_moves(a, b, circuit)
    moved = (move_value_output if circuit == "ov" else move_query_key)(b, moves)
    b.params = moved.params
    eye = torch.eye(moves[0].shape[-1], dtype=torch.float64)
    detail["max_move_from_identity"] = max(float((m - eye).abs().max()) for m in moves)
    return detail


def solve_class(a: WholeCheckpoint, b: WholeCheckpoint, name: str, classes: tuple, seed: int) -> dict:
    """:func:`move_class` in :func:`align_whole`'s order. After the last GL(D) class, when ``norm_gain``
    (whose descent does it) is not asked: the heads' matching and Procrustes read what GL(D) moved, so the
    per-layer classes are solved again in turn until a sweep moves B by less than :data:`GAIN_TOLERANCE`
    of ``||A||`` (a second alignment starts where the first stopped)."""
    detail = move_class(a, b, name, classes, seed)
    last_gl = next((c for c in reversed(classes) if c.endswith("_gl")), None)
    if name == last_gl and "norm_gain" not in classes:
        detail["sweeps"] = descend_gains(a, b, classes, seed, gains=False)["sweeps"]
    return detail


# --------------------------------------------------------------------------------------
# checks, products, the whole alignment
# --------------------------------------------------------------------------------------


def check_same_architecture(a: Checkpoint, b: Checkpoint, wa: WholeCheckpoint, wb: WholeCheckpoint) -> None:
    """One line saying what differs between A and B (format, family, shape, a tensor, RoPE's base), or
    nothing."""
    kinds = (a.kind, a.payload.get("model_type")), (b.kind, b.payload.get("model_type"))
    if kinds[0] != kinds[1]:
        first, second = (" ".join(str(x) for x in kind if x is not None) for kind in kinds)
        raise UserError(f"{a.path} and {b.path} differ in format: {first} vs {second}")
    if wa.shape != wb.shape:
        fa, fb = vars(wa.shape), vars(wb.shape)
        diff = [f"{k} {fa[k]} vs {fb[k]}" for k in fa if fa[k] != fb.get(k)]
        raise UserError(f"{a.path} and {b.path} differ in architecture: {'; '.join(diff)}")
    for name, tensor in wa.params.items():
        other = wb.params.get(name)
        if other is None or other.shape != tensor.shape:
            got = None if other is None else tuple(other.shape)
            raise UserError(f"{a.path} and {b.path} differ in shape: {name} {tuple(tensor.shape)} vs {got}")
    if (wa.rope_base, wa.gain_offset) != (wb.rope_base, wb.gain_offset):
        raise UserError(
            f"{a.path} and {b.path} differ in architecture: RoPE base {wa.rope_base:g} vs {wb.rope_base:g}"
        )


def align_refusal(whole: WholeCheckpoint, classes: tuple) -> str | None:
    """Why a class asked for is not a symmetry of this architecture (or not aligned here), or None."""
    for name in classes:
        if whole.shape.block == "parallel" and name in ("heads", "mlp", *STREAM_CLASSES):
            return f"class {name}: a parallel block's shared norm is not aligned here"
        if name == "stream_rotation" and whole.shape.tied:
            return (
                "class stream_rotation: a rotation of the residual stream needs lm_head untied from wte "
                "(census class stream_rotation; a tied model keeps none when V > E)"
            )
        if name in ("stream_rotation", "norm_gain"):
            zero = [n for n in all_junctions(whole) if bool((whole.params[n + ".weight"] == 0).any())]
            if zero:
                return f"class {name}: {zero[0]} has a zero gain, which no scale or rotation moves past"
    return None


def classes_of(whole: WholeCheckpoint, classes: tuple) -> tuple:
    """``classes``, or for ``all`` (:data:`ALIGN_CLASSES`) and the default (:data:`DEFAULT_CLASSES`) those
    this architecture has."""
    if classes not in (ALIGN_CLASSES, DEFAULT_CLASSES):
        return classes
    return tuple(c for c in classes if align_refusal(whole, (c,)) is None)


def probe_tokens(whole: WholeCheckpoint, seed: int) -> torch.Tensor:
    """``(1, T + 1)`` seeded random token ids: the window of :func:`~attnid.edits.quant_moves.exact_log_probs`
    (the census's float64 forward of its first ``T``)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = whole.params["wte"].shape[0]
    length = min(PROBE_TOKENS, whole.params["wpe"].shape[0]) if "wpe" in whole.params else PROBE_TOKENS
    return torch.randint(0, vocab, (1, length + 1), generator=generator)


def product_distances(a: WholeCheckpoint, b: WholeCheckpoint) -> dict:
    """Per layer and query head ``||W_Q^{h T} W_K^g (A) - (B)||_F`` and ``||W_O^h W_V^g (A) - (B)||_F``
    (``g`` the head's key/value group): what no per-group move removes; and each summed in quadrature over
    the heads."""
    spec = spec_of(a)
    h, d, per = spec.n_head, spec.head_dim, spec.per_group
    rows: dict[str, list[list[float]]] = {"qk": [], "ov": []}
    for layer in range(spec.n_layer):
        prefix = f"h{layer}.attn."
        products = {}
        for side, whole in (("a", a), ("b", b)):
            p = whole.params
            q = p[prefix + "w_q"].reshape(h, d, -1)
            k = p[prefix + "w_k"].reshape(-1, d, q.shape[-1]).repeat_interleave(per, dim=0)
            v = p[prefix + "w_v"].reshape(-1, d, q.shape[-1]).repeat_interleave(per, dim=0)
            o = p[prefix + "w_o"].reshape(-1, h, d).transpose(0, 1)
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


def _product_totals(a: WholeCheckpoint, b: WholeCheckpoint) -> dict:
    """The identified products' distances summed over the heads (``qk``, ``ov``)."""
    products = product_distances(a, b)
    return {"qk": products["qk"], "ov": products["ov"]}


def _checked_change(
    moved: WholeCheckpoint, name: str, tokens: torch.Tensor, reference: torch.Tensor
) -> float:
    """The largest change of the float64 log-probabilities since ``reference`` after class ``name``'s move;
    UserError where it exceeds :data:`EXACT_DLOGP`."""
    change = float((exact_log_probs(moved, tokens) - reference).abs().max())
    if not change <= EXACT_DLOGP:
        raise UserError(
            f"class {name}: the move changes the float64 log-probabilities by {change:.3g} "
            f"(> {EXACT_DLOGP:g}); nothing written"
        )
    return change


def align_whole(
    a: WholeCheckpoint,
    b: WholeCheckpoint,
    classes: tuple = DEFAULT_CLASSES,
    seed: int = 0,
    in_place: bool = False,
    measure: bool = True,
) -> tuple[WholeCheckpoint, dict]:
    """``b`` moved class by class (declared order) to the point of its orbit nearest ``a``, and the report.
    ``in_place``: ``b`` itself is moved (and returned), not a copy: a whole float64 model less to hold
    (``attnid align``, docs/design.md §17). ``measure`` False: the moves and their float64 check only, the
    report their classes and ``exact_max_abs_dlogp`` (``attnid align``'s idempotence check, which keeps
    only the model: no distances and no heads' products, each step's a product per head and layer).
    Raises UserError naming the first class whose move changes ``b``'s float64 log-probabilities by more
    than :data:`EXACT_DLOGP`."""
    classes = classes_of(b, classes)
    reason = align_refusal(b, classes)
    if reason is not None:
        raise UserError(reason)
    tokens = probe_tokens(b, seed)
    reference = exact_log_probs(b, tokens)
    moved = b if in_place else b.clone()
    if not measure:
        worst = 0.0
        for name in classes:
            solve_class(a, moved, name, classes, seed)
            worst = max(worst, _checked_change(moved, name, tokens, reference))
        return moved, {"classes": list(classes), "exact_max_abs_dlogp": worst}
    norm_b, products_before = norm_of(b), _product_totals(a, b)  # before b moves, where it is moved
    before = distances(a, moved)
    steps, previous, worst = [], before, 0.0
    for name in classes:
        detail = solve_class(a, moved, name, classes, seed)
        worst = max(worst, _checked_change(moved, name, tokens, reference))
        after = distances(a, moved)
        removed = (
            (previous["total"] ** 2 - after["total"] ** 2) / before["total"] ** 2 if before["total"] else 0.0
        )
        identified = product_distances(a, moved)
        products = {"qk": identified["qk"], "ov": identified["ov"]}
        steps.append(
            {"class": name, "distance": after, "share_removed": removed, "products": products, **detail}
        )
        previous = after
    total_before, norm_a = before["total"], norm_of(a)
    report = {
        "classes": list(classes),
        "notes": class_notes(spec_of(b), classes),
        "seed": seed,
        "gl_tolerance": GL_TOLERANCE if any(c.endswith("_gl") for c in classes) else None,
        "norm_a": norm_a,
        "norm_b": norm_b,
        "distance_before": before,
        "products_before": products_before,
        "steps": steps,
        "distance_after": previous,
        "relative_distance_after": previous["total"] / norm_a if norm_a else 0.0,
        "share_removed": 1 - previous["total"] ** 2 / total_before**2 if total_before else 0.0,
        # the last step's, not computed again (E x E per query head and layer, twice)
        "identified_products": identified if classes else product_distances(a, moved),
        "exact_max_abs_dlogp": worst,
        "probe_tokens": int(tokens.shape[1]) - 1,
    }
    return moved, report


def read_pair(a: Checkpoint, b: Checkpoint) -> tuple[WholeCheckpoint, WholeCheckpoint]:
    """Both checkpoints in float64 census names (nanoGPT files, GPT-2 or Llama-family folders), checked to
    be of one format and architecture."""
    wa, wb = read_whole_checkpoint(a), read_whole_checkpoint(b)
    check_same_architecture(a, b, wa, wb)
    return wa, wb


def relative_move(first: WholeCheckpoint, second: WholeCheckpoint) -> float:
    """``||first - second|| / ||first||``: how far a second alignment moves an aligned model."""
    norm = norm_of(first)
    return distances(first, second)["total"] / norm if norm else 0.0


def stored_relative_move(first: Checkpoint, second: WholeCheckpoint) -> float:
    """:func:`relative_move` from the model ``first`` stores (read one parameter at a time, so that no
    second float64 copy is held): how far a second alignment moves the aligned model as written."""
    squares = norms = 0.0
    for name, tensor in stored_params(first, second.shape):
        squares += float((tensor - second.params[name]).square().sum())
        norms += float(tensor.square().sum())
    return math.sqrt(squares / norms) if norms else 0.0
