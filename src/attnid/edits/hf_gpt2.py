"""The Hugging Face GPT-2 folder format: its loader and writer (registered in
:mod:`attnid.edits.checkpoints`).

``config.json`` and ``model.safetensors`` or ``pytorch_model.bin`` (or shards listed in a
``*.index.json``), read and written by :mod:`attnid.edits.hf_files`. GPT-2's ``Conv1D`` stores
``x W + b``, so ``attn.c_attn.weight`` is ``(E, 3E)`` and ``attn.c_proj.weight`` is ``(E, E)``: both
the transpose of nanoGPT's (:attr:`attnid.edits.checkpoint_types.Checkpoint.transposed`).
"""

from __future__ import annotations

from pathlib import Path

from attnid.common.errors import UserError
from attnid.common.shapes import check_tensor_shapes
from attnid.edits.checkpoint_types import HF_GPT2, Checkpoint, CheckpointFormat
from attnid.edits.hf_files import read_folder_config, read_weights, rewritten_folder_files, save_hf_folder
from attnid.edits.nanogpt_checkpoint import count_layers, layer_prefix
from attnid.theory.shape import LayerShape, layer_shape

GPT2_SIZES = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")


def _gpt2_sizes(config: dict, where: Path) -> dict[str, int]:
    """The sizes of a GPT-2 ``config.json`` that the weights' shapes follow, each a positive integer."""
    sizes: dict[str, int] = {}
    for name in GPT2_SIZES:
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{where}: {name} is {value!r}; a GPT-2 config.json needs a positive integer")
        sizes[name] = value
    if sizes["n_embd"] % sizes["n_head"]:
        raise UserError(f"{where}: n_embd {sizes['n_embd']} is not a multiple of n_head {sizes['n_head']}")
    inner = config.get("n_inner")
    usable = isinstance(inner, int) and not isinstance(inner, bool) and inner > 0
    sizes["n_inner"] = inner if isinstance(inner, int) and usable else 4 * sizes["n_embd"]  # None means 4E
    return sizes


def gpt2_attention(n_embd: int, n_head: int) -> LayerShape:
    """GPT-2's attention: ``H`` heads of ``D = E/H``, every projection with its bias, no RoPE."""
    return layer_shape(n_embd, n_head, bias=True)


def gpt2_expected_shapes(sizes: dict[str, int], prefix: str) -> tuple[dict, dict]:
    """``(attention, other)`` ``{stored name: shape}`` of a GPT-2 folder, from its config's sizes. GPT-2's
    Conv1D stores ``(in, out)``; ``prefix`` is the stored prefix of ``h.{i}.`` (:func:`layer_prefix`)."""
    E, inner, base = sizes["n_embd"], sizes["n_inner"], prefix[: -len("h.")]
    attention: dict[str, tuple[int, ...]] = {}
    other: dict[str, tuple[int, ...]] = {
        f"{base}wte.weight": (sizes["vocab_size"], E),
        f"{base}wpe.weight": (sizes["n_positions"], E),
        f"{base}ln_f.weight": (E,),
        f"{base}ln_f.bias": (E,),
    }
    for layer in range(sizes["n_layer"]):
        block = f"{prefix}{layer}."
        attention |= {
            block + "attn.c_attn.weight": (E, 3 * E),
            block + "attn.c_attn.bias": (3 * E,),
            block + "attn.c_proj.weight": (E, E),
            block + "attn.c_proj.bias": (E,),
        }
        other |= {block + f"{norm}.{part}": (E,) for norm in ("ln_1", "ln_2") for part in ("weight", "bias")}
        other |= {
            block + "mlp.c_fc.weight": (E, inner),
            block + "mlp.c_fc.bias": (inner,),
            block + "mlp.c_proj.weight": (inner, E),
            block + "mlp.c_proj.bias": (E,),
        }
    return attention, other


def load_hf_gpt2(folder: Path) -> Checkpoint:
    folder = Path(folder)
    config = read_folder_config(folder)
    if config.get("model_type") != "gpt2":
        raise UserError(f"{folder}: model_type {config.get('model_type')!r} is not a GPT-2 folder's 'gpt2'")
    sizes = _gpt2_sizes(config, folder / "config.json")
    tensors, weight_files, metadata = read_weights(folder)
    prefix = layer_prefix(tensors, folder)
    n_layer = count_layers(tensors, prefix)
    if n_layer != sizes["n_layer"]:  # before any shape is derived from a declared size
        raise UserError(
            f"{folder}: config.json says n_layer={config.get('n_layer')} "
            f"but the weights have {n_layer} layers"
        )
    # before from_pretrained: every attention tensor with config.json's shape, the others where stored
    attention, other = gpt2_expected_shapes(sizes, prefix)
    stored = {key: tensor.shape for key, tensor in tensors.items()}
    check_tensor_shapes(attention, stored, str(folder), source="config.json")
    check_tensor_shapes(other, stored, str(folder), source="config.json", required=False)
    return Checkpoint(
        HF_GPT2,
        folder,
        n_layer,
        gpt2_attention(sizes["n_embd"], sizes["n_head"]),
        tensors,
        prefix,
        payload=config,
        weight_files=weight_files,
        file_metadata=metadata,
    )


def save_hf_gpt2(checkpoint: Checkpoint, out: Path, record: dict | None = None) -> Path:
    """The folder with the edited weights in the input's files; ``record`` is not stored (HF folders get
    no file of ours)."""
    replaced = (
        rewritten_folder_files(
            checkpoint.path, checkpoint.payload, checkpoint.tensors, checkpoint.weight_files
        )
        if checkpoint.config_changed
        else None
    )
    return save_hf_folder(
        checkpoint.path, out, checkpoint.tensors, checkpoint.weight_files, checkpoint.file_metadata, replaced
    )


HF_GPT2_FORMAT = CheckpointFormat(
    HF_GPT2,
    "a Hugging Face GPT-2 folder (model_type 'gpt2')",
    claims=lambda path, config: config is not None and config.get("model_type") == "gpt2",
    load=load_hf_gpt2,
    save=save_hf_gpt2,
)
