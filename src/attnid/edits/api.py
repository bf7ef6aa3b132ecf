"""``attnid inspect``, ``prune-biases`` and ``balance`` as Python functions (docs/api.md).

On a Hugging Face model in memory (GPT-2, or the Llama family: Llama, Mistral, Qwen2, Gemma), edited in
place; or on a :class:`~attnid.edits.checkpoints.Checkpoint` (``load_checkpoint`` of a nanoGPT ``ckpt.pt``
or of a model folder), which is what the command line runs them on. The edits keep
the model's function exactly in float64 (docs/design.md §9); each returns its report, the fields of the
command's ``--json`` that describe the edit.

    report = inspect(model)          # per layer: mu, conserved imbalance, orbit dimension, counts
    prune_biases(model)              # key biases to 0, value biases folded into the output bias
    balance(model)                   # every pair to its minimum-norm representative (mu = 0)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnid.edits.checkpoints import HF_GPT2, HF_LLAMA, Checkpoint
from attnid.edits.hf_llama import LLAMA_FAMILY, LlamaCheckpoint
from attnid.edits.operations import (
    attention_variant,
    balance_layers,
    balance_on_own_orbit,
    checkpoint_layout,
    checkpoint_shape,
    layer_tensors_of,
    pair_summary,
    prune_layer_biases,
    redundant_bias_count,
    store_layers,
    stored_initial_imbalance,
)
from attnid.edits.options import BALANCE_TARGETS
from attnid.measure.inspect import inspect_layers
from attnid.theory.hf_config import architecture_from_hf_config

if TYPE_CHECKING:
    from torch import nn

# the stored name of layer 0's first attention tensor, after the model's own prefix ("transformer.h.")
_LAYER0 = {HF_GPT2: "0.attn.c_attn.weight", HF_LLAMA: "0.self_attn.q_proj.weight"}


# --------------------------------------------------------------------------------------
# on a checkpoint (what the command line runs)
# --------------------------------------------------------------------------------------


def inspect_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """``attnid inspect``'s report of a checkpoint's stored attention tensors (:func:`inspect_layers`)."""
    return inspect_layers(
        checkpoint_layout(checkpoint),
        checkpoint_shape(checkpoint),
        layer_tensors_of(checkpoint.attention_layers()),
    )


def prune_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """Zero the key biases (not under RoPE) and fold the value biases into the output bias (where there is
    one), in the checkpoint's tensors; the counts (§4.7 of the paper) and the rounding to the stored dtype."""
    layout = checkpoint_layout(checkpoint)
    edited = [prune_layer_biases(layer, layout) for layer in checkpoint.attention_layers()]
    rounding = store_layers(checkpoint, [layer for layer, _, _ in edited])
    return {
        **redundant_bias_count(checkpoint),
        "rope": layout.rope,
        "write_back_rel_error": rounding,
        "nonzero_key_biases_zeroed": sum(k for _, k, _ in edited),
        "nonzero_value_biases_folded": sum(v for _, _, v in edited),
    }


def balance_checkpoint(checkpoint: Checkpoint, target: str = "balanced") -> dict[str, Any]:
    """Move every attention pair to imbalance 0 (``"balanced"``: μ = 0) or to the ``I_0`` that ``attnid
    train`` stored (``"initial"``), each on its architecture's own orbit (docs/design.md §4, §8), in the
    checkpoint's tensors; μ and the attention norm before and after."""
    if target not in BALANCE_TARGETS:
        raise ValueError(f"target {target!r}: choose {' or '.join(BALANCE_TARGETS)}")
    rope, resized = attention_variant(checkpoint)
    if checkpoint.kind != HF_LLAMA and (rope or resized):
        return balance_on_own_orbit(checkpoint, target)
    targets = stored_initial_imbalance(checkpoint) if target == "initial" else None
    layout, layers = checkpoint_layout(checkpoint), checkpoint.attention_layers()
    before = pair_summary(layers, layout)
    skipped = balance_layers(layers, layout, targets)
    rounding = store_layers(checkpoint, layers)
    after = pair_summary(checkpoint.attention_layers(), layout)  # as stored (its dtype)
    return {
        "target": target,
        "orbit": "own",
        "skipped_pairs": skipped,
        "write_back_rel_error": rounding,
        **{f"{k}_before": v for k, v in before.items()},
        **{f"{k}_after": v for k, v in after.items()},
    }


# --------------------------------------------------------------------------------------
# on a Hugging Face model in memory
# --------------------------------------------------------------------------------------


def checkpoint_of_model(model: nn.Module) -> Checkpoint:
    """A ``transformers`` GPT-2 or Llama-family model as a :class:`Checkpoint` of its own tensors (its
    ``state_dict``, shared, not copied) and its config; :func:`write_back` puts an edit into the model."""
    config: dict[str, Any] = model.config.to_dict()  # type: ignore[union-attr, operator]  # transformers'
    where = Path(f"<{type(model).__name__} in memory>")
    kind = HF_GPT2 if config.get("model_type") == "gpt2" else HF_LLAMA
    if kind == HF_LLAMA and config.get("model_type") not in LLAMA_FAMILY:
        raise ValueError(f"model_type {config.get('model_type')!r}: not gpt2 or {', '.join(LLAMA_FAMILY)}")
    tensors = dict(model.state_dict())
    first = next((key for key in tensors if key.endswith(_LAYER0[kind])), None)
    if first is None:
        raise ValueError(f"{where}: no {_LAYER0[kind]} among its tensors")
    prefix = first[: -len(_LAYER0[kind])]
    spec = architecture_from_hf_config(config, str(where))  # as attnid counts --hf-config reads it
    sizes = (spec["n_layer"], spec["n_head"], spec["n_embd"])
    if kind == HF_GPT2:
        return Checkpoint(kind, where, *sizes, tensors, prefix, payload=config)
    head_dim = spec.get("head_dim", spec["n_embd"] // spec["n_head"])
    return LlamaCheckpoint(
        kind, where, *sizes, tensors, prefix, payload=config, n_kv_head=spec["n_kv_head"], head_dim=head_dim
    )


@torch.no_grad()
def write_back(checkpoint: Checkpoint, model: nn.Module) -> None:
    """Copy the checkpoint's (edited) tensors into the model's parameters, in place."""
    model.load_state_dict(checkpoint.tensors)


def inspect(model: nn.Module) -> dict[str, Any]:
    """``attnid inspect`` of a model in memory: per layer μ and the conserved imbalance on the architecture's
    own orbit, the orbit's dimension next to the closed form, the identification counts; the totals.
    :func:`attnid.measure.inspect.format_inspection` prints it as the command does."""
    return inspect_checkpoint(checkpoint_of_model(model))


def prune_biases(model: nn.Module) -> dict[str, Any]:
    """``attnid prune-biases`` on a model in memory, in place (its function unchanged); the report."""
    checkpoint = checkpoint_of_model(model)
    report = prune_checkpoint(checkpoint)
    write_back(checkpoint, model)
    return report


def balance(model: nn.Module, target: str = "balanced") -> dict[str, Any]:
    """``attnid balance`` on a model in memory, in place (its function unchanged); the report."""
    checkpoint = checkpoint_of_model(model)
    report = balance_checkpoint(checkpoint, target)
    write_back(checkpoint, model)
    return report
