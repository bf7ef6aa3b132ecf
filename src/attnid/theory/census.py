"""``attnid census``: every continuous symmetry of a whole model, checked by its Jacobian.

For one whole model at a generic random point (float64), the census lists each symmetry
class of :mod:`attnid.theory.whole_model` with its closed-form dimension and compares their sum
with the **measured** nullity of the Jacobian of the per-position log-probabilities with
respect to every parameter, on enough random token sequences that the informative rows
outnumber the parameters ``ROW_FACTOR`` times. The rank is cut in the largest gap of the singular
values (:func:`spectrum_cut`), allowing inside that gap for the one direction that only epsilon
breaks; a shape *closes* when the sum equals the measurement and the gap is at least
``GAP_REQUIRED`` (docs/theory.md, "The whole model" and "The measurement").

The model is written out here, independently of model.py (as nullity.py does for one
layer), so that one function covers both families: nanoGPT / GPT-2 (LayerNorm with or
without a bias, GELU MLP, learned positions, ``lm_head`` tied to ``wte``) and Llama-family
blocks (RMSNorm, RoPE with half-split pairing, grouped-query attention, gated MLP, untied
``lm_head``), plus the parallel block. For the nanoGPT configuration it gives the log-
probabilities of ``attnid.model.gpt.GPT`` with the same weights (tests/theory/test_census.py), so the
census is about the model we train. RoPE uses base 10 by default, as nullity.py does: the
count holds for any distinct nonzero frequencies, and short sequences would barely turn the
slow planes of base 10,000, blurring the rank.

The norms keep their epsilon (``--norm-eps``, model.py's 1e-5 by default). Epsilon breaks
one symmetry, the global scaling of the residual stream, by a singular value proportional to
epsilon (``near_null_singular``); the census does not count it then but reports it, with the
direction's own ``||J v|| / ||v||`` over the largest singular value (``near_null_scale``). With
``--norm-eps 0`` it is exact and counted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from attnid.theory import whole_model as theory
from attnid.theory.nullity import GAP_REQUIRED, ROW_FACTOR, unflatten
from attnid.theory.rope import rope_rotate  # the model's rotation: the census runs the RoPE the model runs
from attnid.theory.whole_model import CENSUS_ROPE_BASE

if TYPE_CHECKING:
    pass

SEQUENCES_PER_CHUNK = 32  # the Jacobian is built this many sequences at a time (memory)


# ---------------------------------------------------------------------------------------------
# The whole model, written out


def whole_model_parameter_shapes(shape: theory.WholeModelShape) -> dict[str, tuple[int, ...]]:
    """Every parameter tensor by name (nanoGPT's names where they exist), in a fixed order."""
    e, h, g, d, f = (
        shape.attention.n_embd,
        shape.attention.n_head,
        shape.attention.n_kv_head,
        shape.attention.head_dim,
        shape.mlp_hidden,
    )
    shapes: dict[str, tuple[int, ...]] = {"wte": (shape.vocab_size, e)}
    if shape.positions == "learned":
        shapes["wpe"] = (shape.block_size, e)

    def norm(name: str) -> None:
        shapes[f"{name}.weight"] = (e,)
        if shape.norm_bias:
            shapes[f"{name}.bias"] = (e,)

    for layer in range(shape.n_layer):
        p = f"h{layer}."
        norm(p + ("ln" if shape.block == "parallel" else "ln_1"))
        shapes.update({p + "attn.w_q": (h * d, e), p + "attn.w_k": (g * d, e), p + "attn.w_v": (g * d, e)})
        if shape.attention.bias:
            shapes.update({p + "attn.b_q": (h * d,), p + "attn.b_k": (g * d,), p + "attn.b_v": (g * d,)})
        shapes[p + "attn.w_o"] = (e, h * d)
        if shape.attention.out_bias:
            shapes[p + "attn.b_o"] = (e,)
        if shape.block != "parallel":
            norm(p + "ln_2")
        inputs = ("gate", "up") if shape.mlp in theory.GATED_MLPS else ("fc",)
        for name in inputs:
            shapes[p + f"mlp.w_{name}"] = (f, e)
            if shape.mlp_bias:
                shapes[p + f"mlp.b_{name}"] = (f,)
        shapes[p + "mlp.w_down"] = (e, f)
        if shape.mlp_bias:
            shapes[p + "mlp.b_down"] = (e,)
    norm("ln_f")
    if not shape.tied:
        shapes["lm_head"] = (shape.vocab_size, e)
    return shapes


def _norm(
    x: torch.Tensor, p: dict[str, torch.Tensor], name: str, shape: theory.WholeModelShape
) -> torch.Tensor:
    if shape.norm == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), p[f"{name}.weight"], p.get(f"{name}.bias"), shape.norm_eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + shape.norm_eps) * p[f"{name}.weight"]


def _linear(x: torch.Tensor, p: dict[str, torch.Tensor], weight: str, bias: str) -> torch.Tensor:
    y = x @ p[weight].T
    return y + p[bias] if bias in p else y


def _attention(
    x: torch.Tensor, p: dict[str, torch.Tensor], prefix: str, shape: theory.WholeModelShape, rope_base: float
) -> torch.Tensor:
    """Causal self-attention of one layer on the norm's output x (B, T, E) -> (B, T, E)."""
    batch, seq_len, _ = x.shape
    h, g, d = shape.attention.n_head, shape.attention.n_kv_head, shape.attention.head_dim
    q = (
        _linear(x, p, prefix + "w_q", prefix + "b_q").view(batch, seq_len, h, d).transpose(1, 2)
    )  # (B, H, T, D)
    k = (
        _linear(x, p, prefix + "w_k", prefix + "b_k").view(batch, seq_len, g, d).transpose(1, 2)
    )  # (B, G, T, D)
    v = (
        _linear(x, p, prefix + "w_v", prefix + "b_v").view(batch, seq_len, g, d).transpose(1, 2)
    )  # (B, G, T, D)
    if shape.positions == "rope":
        q, k = rope_rotate(q, "half", rope_base), rope_rotate(k, "half", rope_base)
    k = k.repeat_interleave(h // g, dim=1)  # (B, H, T, D): head h reads group h // (H/G)
    v = v.repeat_interleave(h // g, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = (weights @ v).transpose(1, 2).reshape(batch, seq_len, h * d)  # (B, T, H*D)
    return _linear(y, p, prefix + "w_o", prefix + "b_o")


def _mlp(
    x: torch.Tensor, p: dict[str, torch.Tensor], prefix: str, shape: theory.WholeModelShape
) -> torch.Tensor:
    """(B, T, E) -> (B, T, F) -> (B, T, E); GELU is the exact (erf) one, as nn.GELU()."""
    if shape.mlp == "gelu":
        hidden = F.gelu(_linear(x, p, prefix + "w_fc", prefix + "b_fc"))
    else:
        activation = F.silu if shape.mlp == "swiglu" else F.gelu
        hidden = activation(_linear(x, p, prefix + "w_gate", prefix + "b_gate")) * _linear(
            x, p, prefix + "w_up", prefix + "b_up"
        )
    return _linear(hidden, p, prefix + "w_down", prefix + "b_down")


def log_probs(
    p: dict[str, torch.Tensor],
    idx: torch.Tensor,
    shape: theory.WholeModelShape,
    rope_base: float = CENSUS_ROPE_BASE,
) -> torch.Tensor:
    """Token ids idx (B, T) -> per-position log-probabilities (B, T, V)."""
    seq_len = idx.shape[1]
    x = p["wte"][idx]  # (B, T, E)
    if shape.positions == "learned":
        x = x + p["wpe"][:seq_len]
    for layer in range(shape.n_layer):
        prefix = f"h{layer}."
        if shape.block == "parallel":  # Falcon / GPT-J: both read one norm of the same x
            normed = _norm(x, p, prefix + "ln", shape)
            x = (
                x
                + _attention(normed, p, prefix + "attn.", shape, rope_base)
                + _mlp(normed, p, prefix + "mlp.", shape)
            )
        else:
            x = x + _attention(_norm(x, p, prefix + "ln_1", shape), p, prefix + "attn.", shape, rope_base)
            x = x + _mlp(_norm(x, p, prefix + "ln_2", shape), p, prefix + "mlp.", shape)
    x = _norm(x, p, "ln_f", shape)
    logits = x @ (p["wte"] if shape.tied else p["lm_head"]).T  # (B, T, V)
    return logits.log_softmax(dim=-1)


def params_from_gpt(model: Any) -> dict[str, torch.Tensor]:  # a GPT: attnid.model is a layer above
    """This module's parameters from an ``attnid.model.gpt.GPT`` (nanoGPT layout, docs/design.md §2.1)."""
    config = model.config
    state = {k: v.detach() for k, v in model.state_dict().items()}
    e, h, g, d = config.n_embd, config.n_head, config.kv_heads, config.per_head_dim
    p = {"wte": state["transformer.wte.weight"]}
    if "transformer.wpe.weight" in state:
        p["wpe"] = state["transformer.wpe.weight"]
    split = (h * d, g * d, g * d)
    for layer in range(config.n_layer):
        src, dst = f"transformer.h.{layer}.", f"h{layer}."
        for name in ("ln_1", "ln_2"):
            p[f"{dst}{name}.weight"] = state[f"{src}{name}.weight"]
            if config.bias:
                p[f"{dst}{name}.bias"] = state[f"{src}{name}.bias"]
        for part, tensor in zip("qkv", state[src + "attn.c_attn.weight"].split(split)):
            p[f"{dst}attn.w_{part}"] = tensor
        p[dst + "attn.w_o"] = state[src + "attn.c_proj.weight"]
        p[dst + "mlp.w_fc"] = state[src + "mlp.c_fc.weight"]
        p[dst + "mlp.w_down"] = state[src + "mlp.c_proj.weight"]
        if config.bias:
            for part, tensor in zip("qkv", state[src + "attn.c_attn.bias"].split(split)):
                p[f"{dst}attn.b_{part}"] = tensor
            p[dst + "attn.b_o"] = state[src + "attn.c_proj.bias"]
            p[dst + "mlp.b_fc"] = state[src + "mlp.c_fc.bias"]
            p[dst + "mlp.b_down"] = state[src + "mlp.c_proj.bias"]
    p["ln_f.weight"] = state["transformer.ln_f.weight"]
    if config.bias:
        p["ln_f.bias"] = state["transformer.ln_f.bias"]
    if not config.tied:
        p["lm_head"] = state["lm_head.weight"]
    assert e == p["wte"].shape[1]
    return p


def shape_of_gpt_config(
    config: Any,  # a GPTConfig: attnid.model is a layer above
    norm_eps: float = theory.DEFAULT_NORM_EPS,
    in_domain: bool = True,
) -> theory.WholeModelShape:
    """The census shape of ``attnid train``'s model (``attnid.model.gpt.GPTConfig``); ``in_domain``: as
    :func:`attnid.theory.whole_model.whole_model_shape`."""
    return theory.whole_model_shape(
        n_layer=config.n_layer,
        n_embd=config.n_embd,
        n_head=config.n_head,
        vocab_size=config.vocab_size,
        block_size=config.block_size,
        n_kv_head=config.kv_heads,
        head_dim=config.per_head_dim,
        norm="layernorm",
        norm_bias=config.bias,
        qkv_bias=config.bias,
        out_bias=config.bias,
        mlp="gelu",
        mlp_hidden=4 * config.n_embd,
        mlp_bias=config.bias,
        tied=config.tied,
        positions="rope" if config.rope else "learned",
        norm_eps=norm_eps,
        in_domain=in_domain,
    )


# ---------------------------------------------------------------------------------------------
# The generic point and the measurement


def random_point(shape: theory.WholeModelShape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A generic point: matrices ``N(0, 1/fan_in)`` (scores and MLP inputs O(1), softmax neither flat nor
    saturated), embeddings ``N(0, 1)`` (a stream of unit scale, so epsilon is a small perturbation),
    gains uniform in [0.5, 1.5] (distinct and nonzero), biases ``N(0, 1/4)``."""
    point = {}
    for name, size in whole_model_parameter_shapes(shape).items():
        if name in ("wte", "wpe"):
            value = torch.randn(size, generator=generator, dtype=torch.float64)
        elif name.endswith(".weight"):  # norm gains
            value = 0.5 + torch.rand(size, generator=generator, dtype=torch.float64)
        elif len(size) == 1:
            value = 0.5 * torch.randn(size, generator=generator, dtype=torch.float64)
        else:
            value = torch.randn(size, generator=generator, dtype=torch.float64) / math.sqrt(size[1])
        point[name] = value
    return point


def informative_rows_per_position(shape: theory.WholeModelShape) -> int:
    """Everything before the final norm reaches a position's log-probabilities through at most
    ``min(V - 1, E')`` directions (log-softmax drops one), so only these rows count towards saturation."""
    return min(shape.vocab_size - 1, theory.stream_dim(shape))


ENUMERATE_BELOW = 200_000  # input domains up to this many sequences are drawn without replacement


def distinct_context_rows(shape: theory.WholeModelShape, tokens: torch.Tensor) -> int:
    """Informative rows of ``tokens`` (S, T): position ``i`` of a sequence is a context (its prefix); repeated
    contexts repeat rows, so count each distinct prefix once, ``min(V - 1, E')`` rows each."""
    prefixes = sum(torch.unique(tokens[:, : i + 1], dim=0).shape[0] for i in range(tokens.shape[1]))
    return prefixes * informative_rows_per_position(shape)


def sample_sequences(
    shape: theory.WholeModelShape, rows_needed: int, generator: torch.Generator
) -> torch.Tensor:
    """Random sequences (S, T) whose distinct contexts give at least ``rows_needed`` informative rows.

    A model's whole input domain is finite: ``sum_i V^i`` contexts of length 1..T. When even all of
    them give fewer rows than needed, the function on that domain has null directions that are not
    symmetries (too few inputs to pin the parameters), and the shape cannot be checked: ValueError.
    """
    vocab, length = shape.vocab_size, shape.block_size
    per_context = informative_rows_per_position(shape)
    if per_context * sum(vocab**i for i in range(1, length + 1)) < rows_needed:
        raise ValueError(
            f"the model's whole input domain ({vocab} tokens, {length} positions) gives fewer than "
            f"{rows_needed} informative Jacobian rows: too small to measure"
        )
    total = vocab**length
    pool = None
    if total <= ENUMERATE_BELOW:  # every sequence once, in random order
        order = torch.randperm(total, generator=generator)
        digits = vocab ** torch.arange(length - 1, -1, -1)
        pool = (order[:, None] // digits) % vocab  # (total, T)
    n_sequences = math.ceil(rows_needed / (per_context * length))
    while True:
        if pool is not None:
            tokens = pool[:n_sequences]
        else:
            tokens = torch.randint(0, vocab, (n_sequences, length), generator=generator)
        if distinct_context_rows(shape, tokens) >= rows_needed:
            return tokens
        if pool is not None and n_sequences >= total:
            raise ValueError(
                f"the model's whole input domain gives fewer than {rows_needed} informative rows"
            )
        n_sequences = math.ceil(n_sequences * 1.25) + 1


def residual_scale_direction(
    shape: theory.WholeModelShape, point: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The tangent of the global stream scaling (class ``residual_scale``): every write times ``lambda``, and,
    tied, the final norm's gain and bias over ``lambda``."""
    writes = ("wte", "wpe", "attn.w_o", "attn.b_o", "mlp.w_down", "mlp.b_down")
    direction = {}
    for name, value in point.items():
        if name in ("wte", "wpe") or any(name.endswith("." + w) for w in writes[2:]):
            direction[name] = value.clone()
        elif shape.tied and name in ("ln_f.weight", "ln_f.bias"):
            direction[name] = -value
        else:
            direction[name] = torch.zeros_like(value)
    return direction


def spectrum_cut(
    singular: torch.Tensor, inside: int = 0, inside_at_most: float | None = None
) -> tuple[int, float]:
    """The rank read off singular values (descending), and the gap it is cut in: ``(rank, gap)``.

    The cut lies in the largest gap of the spectrum that holds exactly ``inside`` values, which are kept:
    the rank ``r`` maximises ``s[r - 1 - inside] / s[r]``, among the cuts whose values inside are at most
    ``inside_at_most * s[0]`` (when given, and when any cut qualifies). ``inside`` is the number of
    directions the closed forms expect between the informative spectrum and round-off
    (``theory.eps_broken_dim``: the residual scaling, whose singular value is proportional to epsilon and
    may sit anywhere in that gap, at or below its measured near-null scale; docs/theory.md, "The
    measurement"). Values below the dtype's machine epsilon times ``s[0]`` count as that floor, and the
    floor closes the spectrum, so that neither round-off's own spread nor exact zeros can pose as the gap,
    and a matrix of full rank has rank ``n``.
    """
    n = singular.numel()
    if n == 0 or singular[0] <= 0:
        return 0, float("inf")
    floor = torch.finfo(singular.dtype).eps * singular[0]
    padded = torch.cat([singular.clamp(min=floor), floor.reshape(1)])  # (n + 1,)
    ratios = padded[: n - inside] / padded[inside + 1 :]  # the cut at r = inside + 1 .. n
    if inside and inside_at_most is not None:
        # the largest value inside the gap of the cut at r is s[r - inside]
        allowed = padded[1 : n - inside + 1] <= max(inside_at_most * singular[0], floor)
        if bool(allowed.any()):
            ratios = torch.where(allowed, ratios, torch.zeros_like(ratios))
    best = int(ratios.argmax())
    return best + inside + 1, ratios[best].item()


def measure(
    shape: theory.WholeModelShape,
    seed: int = 0,
    row_factor: float = ROW_FACTOR,
    rope_base: float = CENSUS_ROPE_BASE,
) -> dict:
    """The measured nullity of the whole model's log-probabilities at a random point, with its gap.

    ``smallest_kept`` and ``largest_dropped`` are the singular values on either side of the gap, over the
    largest. With epsilon, the residual scaling's singular value inside the gap is ``near_null_singular``,
    and the direction's own ``|J v| / (|v| s_max)`` is ``near_null_scale``, which bounds where the cut
    may place it."""
    generator = torch.Generator().manual_seed(seed)
    point = random_point(shape, generator)
    shapes = {name: tuple(value.shape) for name, value in point.items()}
    flat = torch.cat([value.reshape(-1) for value in point.values()])
    n_params = flat.numel()
    tokens = sample_sequences(shape, math.ceil(row_factor * n_params), generator)
    n_sequences = tokens.shape[0]

    def outputs(theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return log_probs(unflatten(theta, shapes), idx, shape, rope_base).reshape(-1)

    jacobian = torch.cat(
        [
            torch.func.jacfwd(outputs)(flat, tokens[start : start + SEQUENCES_PER_CHUNK])
            for start in range(0, n_sequences, SEQUENCES_PER_CHUNK)
        ]
    )  # (rows, n_params)
    singular = torch.linalg.svdvals(jacobian)  # (n_params,), descending
    largest = singular[0].item()
    scale = torch.cat([v.reshape(-1) for v in residual_scale_direction(shape, point).values()])
    near_null_scale = (jacobian @ scale).norm().item() / (scale.norm().item() * largest)
    inside = theory.eps_broken_dim(shape)
    rank, _ = spectrum_cut(singular, inside, inside_at_most=near_null_scale)
    kept = singular[rank - 1 - inside].item() if rank > inside else float("nan")
    dropped = singular[rank].item() if rank < singular.numel() else 0.0
    return {
        "n_params": n_params,
        "n_rows": jacobian.shape[0],
        "n_sequences": n_sequences,
        "measured": n_params - rank,
        "gap": kept / dropped if dropped > 0 else float("inf"),
        "smallest_kept": kept / largest,
        "largest_dropped": dropped / largest,
        "near_null_singular": singular[rank - 1].item() / largest if inside else float("nan"),
        "near_null_scale": near_null_scale,
    }


def closed_form_row(shape: theory.WholeModelShape) -> dict:
    """The closed-form part of a census row: the shape's fields, its label, each class's dimension and
    their sum (``theory``)."""
    dims = theory.class_dims(shape)
    return {
        **theory.shape_columns(shape),
        "shape": describe_shape(shape),
        **{f"class_{name}": value for name, value in dims.items()},
        "theory": sum(dims.values()),
    }


def census(shape: theory.WholeModelShape, seed: int = 0, rope_base: float = CENSUS_ROPE_BASE) -> dict:
    """Closed forms and measurement of one shape: one row of census.csv."""
    row = closed_form_row(shape)
    row.update(measure(shape, seed, rope_base=rope_base))
    row["attention_only"] = theory.attention_only_unidentified(shape)
    row["closes"] = bool(row["theory"] == row["measured"] and row["gap"] >= GAP_REQUIRED)
    return row


def describe_shape(shape: theory.WholeModelShape) -> str:
    """A short label: ``L1 E8 H2 G2 D4 V65 T4 ln tied learned gelu``, with the biases and options set."""
    parts = [
        f"L{shape.n_layer}",
        f"E{shape.attention.n_embd}",
        f"H{shape.attention.n_head}",
        f"G{shape.attention.n_kv_head}",
        f"D{shape.attention.head_dim}",
        f"V{shape.vocab_size}",
        f"T{shape.block_size}",
        f"F{shape.mlp_hidden}",
        "ln" if shape.norm == "layernorm" else "rms",
        "tied" if shape.tied else "untied",
        shape.positions,
        shape.mlp,
    ]
    biases = [
        name
        for name, on in (
            ("norm", shape.norm_bias),
            ("qkv", shape.attention.bias),
            ("out", shape.attention.out_bias),
            ("mlp", shape.mlp_bias),
        )
        if on
    ]
    if biases:
        parts.append("bias:" + "+".join(biases))
    if shape.block == "parallel":
        parts.append("parallel")
    if shape.norm_eps != theory.DEFAULT_NORM_EPS:
        parts.append(f"eps{shape.norm_eps:g}")
    return " ".join(parts)


def measurable(shape: theory.WholeModelShape, max_params: int | None = None) -> None:
    """Raise ValueError if the census cannot measure ``shape``: too many parameters (``max_params``), or
    an input domain too small to give ``ROW_FACTOR`` informative rows per parameter (see
    :func:`sample_sequences`)."""
    n_params = theory.whole_model_params(shape)
    if max_params is not None and n_params > max_params:
        raise ValueError(f"{n_params} parameters > {max_params}")
    rows = informative_rows_per_position(shape) * sum(
        shape.vocab_size**i for i in range(1, shape.block_size + 1)
    )
    if rows < ROW_FACTOR * n_params:
        raise ValueError(
            f"the model's whole input domain ({shape.vocab_size} tokens, {shape.block_size} positions) "
            f"gives fewer than {ROW_FACTOR * n_params} informative Jacobian rows: too small to measure"
        )
