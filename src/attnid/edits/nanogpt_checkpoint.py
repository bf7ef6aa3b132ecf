"""The nanoGPT ``ckpt.pt`` format: its loader and writer (registered in :mod:`attnid.edits.checkpoints`).

A dict with ``model_args`` and ``model`` (a state dict whose keys may carry ``torch.compile``'s
``_orig_mod.`` prefix); ours adds an ``attnid`` section (resume state, the metric tracker's ``I_0``).
``c_attn.weight`` is ``(3E, E)``. The file is read with the weights-only loader
(:func:`attnid.common.files.load_weights_only`), so a checkpoint that carries code is refused before
that code runs; ``model_args`` are typed and bounded, and the declared layers counted against the stored
ones, before any shape is derived from them (:func:`attnid.model.gpt.config_from_model_args`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import torch

from attnid.common.errors import UserError
from attnid.common.files import load_weights_only, torch_save_atomic
from attnid.common.shapes import check_tensor_shapes
from attnid.edits.checkpoint_types import NANOGPT, Checkpoint, CheckpointFormat
from attnid.model.gpt import COMPILED_PREFIX, config_from_model_args, expected_state_shapes


def layer_prefix(keys: Iterable[str], where: Path) -> str:
    """The stored prefix of ``h.{i}.attn...`` keys: nanoGPT's ``transformer.h.``, HF's
    ``transformer.h.`` or ``h.``."""
    anchor = "h.0.attn.c_attn.weight"
    hits = [k for k in keys if k == anchor or k.endswith("." + anchor)]
    if not hits:
        raise UserError(f"{where} has no {anchor}: not a nanoGPT / GPT-2 model")
    return hits[0][: -len("0.attn.c_attn.weight")]


def count_layers(keys: Iterable[str], prefix: str) -> int:
    """Layers stored under ``prefix``: the distinct ``i`` of ``{prefix}{i}...attn.c_attn.weight``."""
    return len(
        {
            k[len(prefix) :].split(".", 1)[0]
            for k in keys
            if k.startswith(prefix) and k.endswith("attn.c_attn.weight")
        }
    )


def load_nanogpt(path: Path) -> Checkpoint:
    checkpoint = load_weights_only(path)
    if not isinstance(checkpoint, dict) or "model_args" not in checkpoint or "model" not in checkpoint:
        raise UserError(f"{path} is not a nanoGPT checkpoint: expected a dict with 'model_args' and 'model'")
    args, tensors = checkpoint["model_args"], checkpoint["model"]
    if not isinstance(args, dict) or not isinstance(tensors, dict):
        raise UserError(f"{path} is not a nanoGPT checkpoint: 'model_args' and 'model' must be dicts")
    bad_key = next((key for key in tensors if not isinstance(key, str)), None)
    if bad_key is not None:
        raise UserError(f"{path}: 'model' stores a tensor under the key {bad_key!r}, not a name")
    if not all(isinstance(tensor, torch.Tensor) for tensor in tensors.values()):
        raise UserError(f"{path} is not a nanoGPT checkpoint: 'model' holds something other than tensors")
    config = config_from_model_args(args, str(path))
    shapes = {key.removeprefix(COMPILED_PREFIX): tensor.shape for key, tensor in tensors.items()}
    n_layer = count_layers(shapes, layer_prefix(shapes, path))
    if n_layer != config.n_layer:  # before any shape is derived from a declared size (1e9 layers)
        raise UserError(
            f"{path}: model_args says n_layer={config.n_layer} but the weights have {n_layer} layers"
        )
    expected = expected_state_shapes(config)
    check_tensor_shapes(expected, shapes, str(path), source="its model_args", required=False)
    prefix = layer_prefix(tensors, path)
    # the biases as stored (a file may lack what its model_args declare): what an edit finds to edit
    attention = replace(
        config.attention,
        bias=f"{prefix}0.attn.c_attn.bias" in tensors,
        out_bias=f"{prefix}0.attn.c_proj.bias" in tensors,
    )
    return Checkpoint(NANOGPT, path, n_layer, attention, dict(tensors), prefix, payload=checkpoint)


def save_nanogpt(checkpoint: Checkpoint, out: Path, record: dict | None = None) -> Path:
    """``out``: the checkpoint dict with the edited weights; ``record`` appended to its ``attnid_edits``
    list (one entry per edit)."""
    payload = dict(checkpoint.payload, model=checkpoint.tensors)
    if record is not None:
        earlier = payload.get("attnid_edits")
        payload["attnid_edits"] = (list(earlier) if isinstance(earlier, list) else []) + [record]
    torch_save_atomic(out, payload)
    return out


NANOGPT_FORMAT = CheckpointFormat(
    NANOGPT,
    "a nanoGPT ckpt.pt file",
    claims=lambda path, config: config is None,  # a file: every checkpoint file is read as nanoGPT's
    load=load_nanogpt,
    save=save_nanogpt,
)
