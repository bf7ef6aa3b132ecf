"""A checkpoint's whole model in the census's names and float64, and back (docs/design.md §16).

The moves of ``attnid rotate`` act on every tensor of a model (embeddings, norms, attention, MLP,
``lm_head``), not on attention alone as :class:`~attnid.edits.checkpoint_types.AttentionLayer` does. They
see a :class:`WholeCheckpoint`: the census's parameter names and layout
(:func:`attnid.theory.census.whole_model_parameter_shapes`: ``wte``, ``h{l}.ln_1.weight``,
``h{l}.attn.w_q`` ``(H D, E)``, ``h{l}.mlp.w_down`` ``(E, F)``, ``lm_head``, ...; every matrix out x in)
and its :class:`~attnid.theory.whole_model.WholeModelShape`, whose classes say which move is a symmetry.

Each format maps these names to its stored tensors (:func:`stored_parts`): nanoGPT's fused ``c_attn`` rows,
GPT-2's transposed ``Conv1D``, the Llama family's projections. Gemma stores its RMSNorm gain as ``gain - 1``
(``gain_offset``). :func:`write_whole_checkpoint` puts the moved tensors back in the stored layout and dtype;
an untied ``lm_head`` becomes a new tensor, written into the file that holds the embedding, and the
config says the model is untied (nanoGPT: ``model_args['tied']``; Hugging Face:
``tie_word_embeddings``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

import torch

from attnid.common.errors import UserError
from attnid.edits.checkpoint_types import HF_GPT2, HF_LLAMA, NANOGPT, Checkpoint
from attnid.model.gpt import COMPILED_PREFIX, config_from_model_args
from attnid.theory import whole_model as theory
from attnid.theory.architectures import shape_from_architecture
from attnid.theory.census import shape_of_gpt_config, whole_model_parameter_shapes
from attnid.theory.hf_config import architecture_from_hf_config

LM_HEAD = "lm_head"
AnyCheckpoint = TypeVar("AnyCheckpoint", bound=Checkpoint)  # a checkpoint of any format's class
# Hugging Face Llama-family module names of each census name (per layer, under the layer prefix)
LLAMA_PARTS = {
    "ln_1.weight": "input_layernorm.weight",
    "ln_2.weight": "post_attention_layernorm.weight",
    **{f"attn.{kind}_{p}": f"self_attn.{p}_proj.{part}" for p in "qkvo" for kind, part in (("w", "weight"),)},
    **{f"attn.b_{p}": f"self_attn.{p}_proj.bias" for p in "qkvo"},
    **{
        f"mlp.{k}_{p}": f"mlp.{p}_proj.{part}"
        for p in ("gate", "up", "down")
        for k, part in (("w", "weight"),)
    },
    **{f"mlp.b_{p}": f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")},
}
# nanoGPT and GPT-2 module names of each census name, but q/k/v (row blocks of c_attn)
GPT_PARTS = {
    **{f"{norm}.{part}": f"{norm}.{part}" for norm in ("ln_1", "ln_2") for part in ("weight", "bias")},
    "attn.w_o": "attn.c_proj.weight",
    "attn.b_o": "attn.c_proj.bias",
    "mlp.w_fc": "mlp.c_fc.weight",
    "mlp.b_fc": "mlp.c_fc.bias",
    "mlp.w_down": "mlp.c_proj.weight",
    "mlp.b_down": "mlp.c_proj.bias",
}


@dataclass(frozen=True)
class StoredPart:
    """Where a census tensor is stored: ``key``, transposed (GPT-2's ``Conv1D`` stores ``W^T``), and the
    row block of the (un-transposed) stored matrix it is (``c_attn``'s ``W_Q``, ``W_K``, ``W_V``)."""

    key: str
    transposed: bool = False
    rows: tuple[int, int] | None = None


@dataclass
class WholeCheckpoint:
    """A checkpoint's every parameter in the census's names, float64 copies, with the model's shape."""

    shape: theory.WholeModelShape
    params: dict[str, torch.Tensor]
    gain_offset: float = 0.0  # the stored norm weight is gain - gain_offset (Gemma's RMSNorm: 1)
    rope_base: float = 10_000.0

    def clone(self) -> WholeCheckpoint:
        """A copy whose parameters can be moved in place without touching this one's."""
        params = {name: tensor.clone() for name, tensor in self.params.items()}
        return WholeCheckpoint(self.shape, params, self.gain_offset, self.rope_base)


def whole_model_shape_of(checkpoint: Checkpoint) -> theory.WholeModelShape:
    """The census's shape of a checkpoint, from its config (nanoGPT: ``model_args``; HF: ``config.json``)."""
    if checkpoint.kind == NANOGPT:
        config = config_from_model_args(checkpoint.payload["model_args"], str(checkpoint.path))
        return shape_of_gpt_config(config, in_domain=False)
    spec = architecture_from_hf_config(checkpoint.payload, str(checkpoint.path / "config.json"))
    if "whole_model_note" in spec:
        raise UserError(f"{checkpoint.path}: {spec['whole_model_note']}")
    return shape_from_architecture(str(checkpoint.path), spec, in_domain=False)


def _bases(checkpoint: Checkpoint) -> tuple[str, str]:
    """``(model prefix, top prefix)``: where ``wte``/``ln_f`` and where ``lm_head`` are stored."""
    layers = "layers." if checkpoint.kind == HF_LLAMA else "h."
    model = checkpoint.layer_prefix[: -len(layers)]
    if checkpoint.kind == HF_LLAMA:
        return model, model[: -len("model.")] if model.endswith("model.") else model
    top = model[: -len("transformer.")] if model.endswith("transformer.") else model
    return model, top


def stored_parts(checkpoint: Checkpoint, shape: theory.WholeModelShape) -> dict[str, StoredPart]:
    """Every census parameter of ``shape`` with where ``checkpoint``'s format stores it."""
    model, top = _bases(checkpoint)
    attention = shape.attention
    q_rows = attention.n_head * attention.head_dim
    kv_rows = attention.n_kv_head * attention.head_dim
    blocks = {
        "q": (0, q_rows),
        "k": (q_rows, q_rows + kv_rows),
        "v": (q_rows + kv_rows, q_rows + 2 * kv_rows),
    }
    llama = checkpoint.kind == HF_LLAMA
    transposed = checkpoint.kind == HF_GPT2
    parts: dict[str, StoredPart] = {}
    for name, size in whole_model_parameter_shapes(shape).items():
        if name in ("wte", "wpe"):
            stored = model + ("embed_tokens.weight" if llama else f"{name}.weight")
            parts[name] = StoredPart(stored)
        elif name.startswith("ln_f."):
            parts[name] = StoredPart(model + ("norm." if llama else "ln_f.") + name.split(".")[1])
        elif name == LM_HEAD:
            parts[name] = StoredPart(top + "lm_head.weight")
        else:
            layer, local = name[1:].split(".", 1)
            prefix = f"{checkpoint.layer_prefix}{layer}."
            if llama:
                parts[name] = StoredPart(prefix + LLAMA_PARTS[local])
            elif local[:-1] in ("attn.w_", "attn.b_") and local[-1] in "qkv":
                fused = "attn.c_attn.weight" if local.startswith("attn.w") else "attn.c_attn.bias"
                parts[name] = StoredPart(prefix + fused, transposed and len(size) == 2, blocks[local[-1]])
            else:
                parts[name] = StoredPart(prefix + GPT_PARTS[local], transposed and len(size) == 2)
    return parts


def _stored_key(checkpoint: Checkpoint, key: str) -> str:
    """``key`` as the checkpoint stores it (a compiled nanoGPT model prefixes every key)."""
    if key not in checkpoint.tensors and COMPILED_PREFIX + key in checkpoint.tensors:
        return COMPILED_PREFIX + key
    return key


def stored_params(
    checkpoint: Checkpoint, shape: theory.WholeModelShape
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each census parameter of ``shape`` as a float64 copy of ``checkpoint``'s stored tensor, one at a
    time (Gemma's gains with their offset added back)."""
    gain_offset = _gain_offset(checkpoint)
    for name, part in stored_parts(checkpoint, shape).items():
        key = _stored_key(checkpoint, part.key)
        tensor = checkpoint.tensors.get(key)
        if tensor is None:
            raise UserError(f"{checkpoint.path} has no {part.key}, which its config says the model has")
        matrix = tensor.detach()
        matrix = matrix.t() if part.transposed else matrix
        matrix = matrix if part.rows is None else matrix[part.rows[0] : part.rows[1]]
        value = matrix.to(torch.float64, memory_format=torch.contiguous_format, copy=True)
        if _is_norm_gain(name):
            value += gain_offset
        yield name, value


def _gain_offset(checkpoint: Checkpoint) -> float:
    return 1.0 if checkpoint.payload.get("model_type") == "gemma" else 0.0


def read_whole_checkpoint(checkpoint: Checkpoint) -> WholeCheckpoint:
    """Every parameter of ``checkpoint`` as a float64 copy in the census's names and layout."""
    shape = whole_model_shape_of(checkpoint)
    params = dict(stored_params(checkpoint, shape))
    gain_offset = _gain_offset(checkpoint)
    rope = checkpoint.payload.get("rope_parameters")
    base = checkpoint.payload.get("rope_theta") or (
        rope.get("rope_theta") if isinstance(rope, dict) else None
    )
    return WholeCheckpoint(shape, params, gain_offset, float(base or 10_000.0))


def write_whole_checkpoint(checkpoint: Checkpoint, whole: WholeCheckpoint) -> None:
    """Put ``whole``'s parameters into ``checkpoint.tensors``, each in its stored layout and dtype (a new
    ``lm_head`` in the embedding's dtype and file); mark an untied model as untied in its config."""
    before = whole_model_shape_of(checkpoint)
    parts = stored_parts(checkpoint, whole.shape)
    staged: dict[str, tuple[torch.Tensor, bool]] = {}  # stored key -> (matrix out x in, stored transposed)
    for name, value in whole.params.items():
        part = parts[name]
        key = _stored_key(checkpoint, part.key)
        if _is_norm_gain(name):
            value = value - whole.gain_offset
        if part.rows is None:
            staged[key] = (value, part.transposed)
            continue
        if key not in staged:
            stored = checkpoint.tensors[key].detach().to(torch.float64)
            staged[key] = ((stored.t() if part.transposed else stored).clone(), part.transposed)
        staged[key][0][part.rows[0] : part.rows[1]] = value
    embedding_key = _stored_key(checkpoint, parts["wte"].key)
    for key, (value, transposed) in staged.items():
        if key not in checkpoint.tensors:  # the untied lm_head of a folder: beside the embedding
            _add_key(checkpoint, key, embedding_key)
        dtype = checkpoint.tensors.get(key, checkpoint.tensors[embedding_key]).dtype
        checkpoint.tensors[key] = (value.t() if transposed else value).to(dtype).contiguous()
    if (
        checkpoint.kind == NANOGPT and whole.shape.tied
    ):  # its state dict stores the tied head under its own key
        head_key = _stored_key(checkpoint, _bases(checkpoint)[1] + "lm_head.weight")
        if head_key in checkpoint.tensors and head_key != embedding_key:
            checkpoint.tensors[head_key] = checkpoint.tensors[
                embedding_key
            ]  # the one tensor, as nanoGPT ties it
    if before.tied and not whole.shape.tied:
        _untie_config(checkpoint)


def _is_norm_gain(name: str) -> bool:
    return name.endswith(".weight") and (name.startswith("ln_f.") or ".ln_" in name)


def _add_key(checkpoint: Checkpoint, key: str, beside: str) -> None:
    """Record a new tensor in the weight file that holds ``beside`` (Hugging Face folders)."""
    for keys in checkpoint.weight_files.values():
        if beside in keys:
            keys.append(key)
            return


def _untie_config(checkpoint: Checkpoint) -> None:
    if checkpoint.kind == NANOGPT:
        checkpoint.payload = {
            **checkpoint.payload,
            "model_args": {**checkpoint.payload["model_args"], "tied": False},
        }
    else:
        checkpoint.payload = {**checkpoint.payload, "tie_word_embeddings": False}
        checkpoint.config_changed = True


def untied(whole: WholeCheckpoint) -> WholeCheckpoint:
    """The same model with ``lm_head`` its own copy of ``wte`` (no move yet: the function is the same)."""
    if not whole.shape.tied:
        return whole
    params = {**whole.params, LM_HEAD: whole.params["wte"].clone()}
    return replace(whole, shape=replace(whole.shape, tied=False), params=params)


def checkpoint_copy(checkpoint: AnyCheckpoint) -> AnyCheckpoint:
    """A copy whose tensor dict, config and weight-file lists can be changed without touching
    ``checkpoint`` (the tensors themselves are shared until replaced)."""
    return replace(
        checkpoint,
        tensors=dict(checkpoint.tensors),
        payload=dict(checkpoint.payload),
        weight_files={name: list(keys) for name, keys in checkpoint.weight_files.items()},
    )
