"""How a model's attention tensors are cut into factor pairs, and which orbit each circuit has.

Factor pairs per key/value group ``g`` (query head ``h`` belongs to group ``h // (H/G)``;
the layout of :mod:`attnid.model.gpt`), batched as ``(G, D, n)``:

- query-key: ``A = [W_Q^{h_1} | b_Q^{h_1} | W_Q^{h_2} | b_Q^{h_2} | ...]``, the
  group's query heads side by side (``D x (H/G)(E[+1])``), against the shared key
  ``B = [W_K^g | b_K^g]`` (Lemma 4.3, Cor. 4.4; the paper's §4.9 for GQA).
- output-value: ``A = [W_V^g | b_V^g]``, ``B = [W_O^{h_1 T} | W_O^{h_2 T} | ...]``,
  the group's output columns side by side (Lemma 4.6).

With ``G = H`` these are one pair per head (docs/design.md §2.1). Every quantity the
pipeline logs and every rebalancing move must use the orbit of the model's *own*
architecture (docs/design.md §8): :func:`orbit_of` gives ``GL_D`` for every circuit except
the query-key pairs of a RoPE model, which have the RoPE commutant (the full ``GL_D``
orbit of a RoPE query-key pair contains moves that change the function).

The tensors are nanoGPT's: per layer ``c_attn.weight`` ``(H*D + 2*G*D, E)`` with rows
``[W_Q; W_K; W_V]``, ``c_attn.bias`` likewise, and ``c_proj.weight`` ``(E, H*D)``. A
model is read through its ``transformer.h`` blocks; other formats (Hugging Face GPT-2)
bring their tensors into this layout first (:mod:`attnid.edits.checkpoints`, and
:mod:`attnid.edits.hf_llama` for Llama-family folders, whose stacked ``[q_proj; k_proj; v_proj]``
are these ``c_attn`` rows).
"""

from __future__ import annotations

from typing import Any

import torch

from attnid.theory.circuits import CIRCUITS, check_circuit
from attnid.theory.orbits import GENERAL_LINEAR, ROPE_COMMUTANT, Orbit
from attnid.theory.shape import LayerShape

# Per layer (c_attn.weight, c_attn.bias or None, c_proj.weight): the tensors pairs are cut from
LayerTensors = tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor]
# A GPT (possibly wrapped by DDP or torch.compile), its GPTConfig, or a LayerShape: read by attribute
# (config, attention), so typed loosely
ModelOrConfig = Any


# --------------------------------------------------------------------------------------
# The shape of an attention layer and the orbit of each circuit
# --------------------------------------------------------------------------------------


def _unwrap(model: Any) -> Any:
    """The GPT inside DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while not hasattr(model, "config") and (hasattr(model, "module") or hasattr(model, "_orig_mod")):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


def layout_of(model_or_config: ModelOrConfig) -> LayerShape:
    """The attention shape the pairs are cut by: of a GPT (possibly wrapped), of a GPTConfig
    (:attr:`attnid.model.gpt.GPTConfig.attention`), or a LayerShape itself (the shape of a checkpoint read
    without building a model, :mod:`attnid.edits`)."""
    if isinstance(model_or_config, LayerShape):
        return model_or_config
    config: Any = getattr(_unwrap(model_or_config), "config", model_or_config)  # a GPTConfig
    return config.attention


def orbit_of(model_or_config: ModelOrConfig, circuit: str) -> Orbit:
    """The orbit of one circuit's pairs: the RoPE commutant for the query-key pairs of a RoPE model,
    ``GL_D`` otherwise (docs/design.md §8)."""
    check_circuit(circuit)
    return ROPE_COMMUTANT if circuit == "qk" and layout_of(model_or_config).rope else GENERAL_LINEAR


# --------------------------------------------------------------------------------------
# Reading a model's tensors
# --------------------------------------------------------------------------------------


def attention_blocks(model: torch.nn.Module) -> Any:  # transformer.h, Blocks read by attribute
    """The model's transformer blocks, through DDP (``.module``) and ``torch.compile``
    (``._orig_mod``) wrappers."""
    return _unwrap(model).transformer.h


def layer_tensors(block: Any) -> LayerTensors:  # a Block of attention_blocks
    """The three attention tensors of a block: c_attn weight, c_attn bias (or None), c_proj weight."""
    attn = block.attn
    return attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight


def attention_tensors(model: torch.nn.Module) -> list[LayerTensors]:
    """Per layer the live ``(c_attn.weight, c_attn.bias, c_proj.weight)`` (through wrappers)."""
    return [layer_tensors(block) for block in attention_blocks(model)]


# --------------------------------------------------------------------------------------
# Cutting pairs out of the tensors, and writing them back
# --------------------------------------------------------------------------------------


def _rows(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    n_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(heads*D, E) rows [+ (heads*D,) bias] -> (heads, D, E[+1]) in ``dtype``."""
    per_head = weight.detach().to(dtype).reshape(n_heads, head_dim, -1)
    if bias is None:
        return per_head
    return torch.cat([per_head, bias.detach().to(dtype).reshape(n_heads, head_dim, 1)], dim=-1)


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


def row_blocks(layout: LayerShape) -> tuple[slice, slice, slice]:
    """Row ranges of W_Q, W_K, W_V in ``c_attn``."""
    q_rows = layout.n_head * layout.head_dim
    kv_rows = layout.n_kv_head * layout.head_dim
    return slice(0, q_rows), slice(q_rows, q_rows + kv_rows), slice(q_rows + kv_rows, q_rows + 2 * kv_rows)


def pairs_from_tensors(
    c_attn_weight: torch.Tensor,
    c_attn_bias: torch.Tensor | None,
    c_proj_weight: torch.Tensor,
    layout: LayerShape,
    circuit: str,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's pairs of one circuit, each ``(G, D, n)`` in ``dtype`` (see the module docstring)."""
    expected = (layout.n_head * layout.head_dim + 2 * layout.n_kv_head * layout.head_dim, layout.n_embd)
    if tuple(c_attn_weight.shape) != expected:
        raise ValueError(f"c_attn.weight is {tuple(c_attn_weight.shape)}, the layout needs {expected}")
    query, key, value = row_blocks(layout)

    def bias_of(rows: slice):
        return None if c_attn_bias is None else c_attn_bias[rows]

    g, d = layout.n_kv_head, layout.head_dim
    if circuit == "qk":
        queries = _rows(c_attn_weight[query], bias_of(query), layout.n_head, d, dtype)  # (H, D, E[+1])
        return _side_by_side(queries, g), _rows(c_attn_weight[key], bias_of(key), g, d, dtype)
    if circuit == "ov":
        outputs = _rows(c_proj_weight.t(), None, layout.n_head, d, dtype)  # (H, D, E_out)
        return _rows(c_attn_weight[value], bias_of(value), g, d, dtype), _side_by_side(outputs, g)
    raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")


def stacked_pairs(
    tensors_per_layer: list[LayerTensors],
    layout: LayerShape,
    circuit: str,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One circuit's pairs of every layer, ``(L*G, D, n)`` in ``dtype``, layer-major, from per-layer
    ``(c_attn.weight, c_attn.bias, c_proj.weight)`` (the live tensors or a float64 snapshot).

    The same numbers as :func:`pairs_from_tensors` layer by layer, concatenated; each tensor is copied once,
    cast on the way, into its place in the result (the metrics read every step's pairs: docs/design.md §7)."""
    check_circuit(circuit)
    g, d, e = layout.n_kv_head, layout.head_dim, layout.n_embd
    per_group, columns = layout.n_head // g, e + (1 if layout.bias else 0)
    expected = (layout.n_head * d + 2 * g * d, e)
    first = tensors_per_layer[0][0]
    n_a, n_b = (per_group * columns, columns) if circuit == "qk" else (columns, per_group * e)
    pair_a = torch.empty(len(tensors_per_layer) * g, d, n_a, dtype=dtype, device=first.device)
    pair_b = torch.empty(len(tensors_per_layer) * g, d, n_b, dtype=dtype, device=first.device)
    query, key, value = row_blocks(layout)
    for layer, (weight, bias, proj) in enumerate(tensors_per_layer):
        if tuple(weight.shape) != expected:
            raise ValueError(f"c_attn.weight is {tuple(weight.shape)}, the layout needs {expected}")
        groups = slice(layer * g, (layer + 1) * g)
        if circuit == "qk":
            _fill_heads(pair_a[groups], per_group, weight[query], None if bias is None else bias[query])
            _fill_heads(pair_b[groups], 1, weight[key], None if bias is None else bias[key])
        else:
            _fill_heads(pair_a[groups], 1, weight[value], None if bias is None else bias[value])
            _fill_heads(pair_b[groups], per_group, proj.t(), None)
    return pair_a, pair_b


def _fill_heads(out: torch.Tensor, per_group: int, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Copy rows ``(G*(H/G)*D, E)`` [+ bias ``(G*(H/G)*D,)``] into ``out`` ``(G, D, (H/G)(E[+1]))``: each
    group's heads side by side, each head's bias after its columns (:func:`_rows`, :func:`_side_by_side`)."""
    n_groups, head_dim, width = out.shape
    heads = out.view(n_groups, head_dim, per_group, width // per_group).transpose(1, 2)  # (G, H/G, D, n)
    n_embd = weight.shape[-1]
    with torch.no_grad():
        heads[..., :n_embd].copy_(weight.detach().reshape(n_groups, per_group, head_dim, n_embd))
        if bias is not None:
            heads[..., n_embd].copy_(bias.detach().reshape(n_groups, per_group, head_dim))


def layer_pairs(model: torch.nn.Module, layer: int, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(A, B)`` pairs (each ``(G, D, n)``) of one circuit of one layer."""
    return pairs_from_tensors(*layer_tensors(attention_blocks(model)[layer]), layout_of(model), circuit)


def model_pairs(model: torch.nn.Module, circuit: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the float64 ``(A, B)`` pairs of one circuit, for any variant."""
    layout = layout_of(model)
    return [pairs_from_tensors(*tensors, layout, circuit) for tensors in attention_tensors(model)]


def _copy_rows(
    weight: torch.Tensor, bias: torch.Tensor | None, rows: slice, pairs: torch.Tensor, n_embd: int
) -> None:
    """Write (heads, D, E[+1]) float64 pairs into ``c_attn`` rows (and bias) in place."""
    weight[rows].copy_(pairs[..., :n_embd].reshape(-1, n_embd).to(weight.dtype))
    if bias is not None:
        bias[rows].copy_(pairs[..., n_embd].reshape(-1).to(bias.dtype))


@torch.no_grad()
def write_layer_pairs(
    tensors: LayerTensors, layout: LayerShape, circuit: str, pair_a: torch.Tensor, pair_b: torch.Tensor
) -> None:
    """Write one layer's ``(A, B)`` pairs into its ``(c_attn.weight, c_attn.bias, c_proj.weight)``, in place.

    Exact inverse of :func:`pairs_from_tensors`; values are cast to each tensor's dtype. Tensors outside
    the circuit (and ``c_proj.bias``) are untouched.
    """
    c_attn_weight, c_attn_bias, c_proj_weight = tensors
    query, key, value = row_blocks(layout)
    if check_circuit(circuit) == "qk":
        _copy_rows(c_attn_weight, c_attn_bias, query, _unside_by_side(pair_a, layout.n_head), layout.n_embd)
        _copy_rows(c_attn_weight, c_attn_bias, key, pair_b, layout.n_embd)
    else:
        _copy_rows(c_attn_weight, c_attn_bias, value, pair_a, layout.n_embd)
        outputs = _unside_by_side(pair_b, layout.n_head)  # (H, D, E_out)
        c_proj_weight.copy_(outputs.reshape(-1, layout.n_embd).t().to(c_proj_weight.dtype))


def write_pairs_back(
    model: torch.nn.Module, circuit: str, per_layer_pairs: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Write per-layer ``(A, B)`` pairs back into the model's attention parameters, in place
    (the inverse of :func:`model_pairs`)."""
    layout = layout_of(model)
    for tensors, (pair_a, pair_b) in zip(attention_tensors(model), per_layer_pairs, strict=True):
        write_layer_pairs(tensors, layout, circuit, pair_a, pair_b)


def weight_columns(layout: LayerShape, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the weight-matrix columns of a pair's ``A`` and ``B`` (the rest are bias columns).

    A GQA query-key ``A`` holds ``H/G`` blocks ``[W_Q^h | b_Q^h]`` side by side, so with
    biases its bias columns are every ``(E+1)``-th, not only the last one.
    """
    columns = layout.n_embd + (1 if layout.bias else 0)
    heads_block = torch.arange(layout.heads_per_group * columns)
    with_bias = torch.arange(columns)
    if circuit == "qk":
        return heads_block[heads_block % columns < layout.n_embd], with_bias[: layout.n_embd]
    if circuit == "ov":
        return with_bias[: layout.n_embd], torch.arange(layout.heads_per_group * layout.n_embd)
    raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")
