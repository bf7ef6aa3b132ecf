"""The checkpoint formats the edits read and write, in one registry: every edit (``attnid inspect``,
``prune-biases``, ``balance``) loads through :func:`load_checkpoint` and saves through
:func:`save_checkpoint`.

Each format registers one loader and one writer (:class:`~attnid.edits.checkpoint_types.CheckpointFormat`):

- nanoGPT ``ckpt.pt`` (a file): :mod:`attnid.edits.nanogpt_checkpoint`;
- Hugging Face GPT-2 (a folder, ``model_type`` ``gpt2``): :mod:`attnid.edits.hf_gpt2`;
- Hugging Face Llama family (Llama, Mistral, Qwen2, Gemma folders): :mod:`attnid.edits.hf_llama`.

What holds for every format is checked here, once: the path is a regular file or a folder (no FIFO,
device, socket or symlink loop), a folder's ``config.json`` lies inside it, and every stored tensor is a
float16, bfloat16, float32 or float64 weight with finite values
(:func:`~attnid.edits.checkpoint_types.check_weight_values`). The Hugging Face formats read and write
their folders through :mod:`attnid.edits.hf_files`, which keeps every file read inside the input folder
and every file written inside ``--out``.

Pickled files are read with ``torch.load(weights_only=True)``, which refuses any pickle that would build
something other than tensors and plain containers, so a checkpoint that carries code is rejected before
that code runs. Edits see every layer's attention in nanoGPT's layout and float64
(:class:`~attnid.edits.checkpoint_types.AttentionLayer`); writing back restores each tensor's own layout
and dtype and leaves every other tensor, and every other entry of the file, as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnid.common.errors import UserError
from attnid.common.paths import require_regular_file
from attnid.edits.checkpoint_types import (
    HF_GPT2,
    HF_LLAMA,
    NANOGPT,
    AttentionLayer,
    Checkpoint,
    CheckpointFormat,
    check_weight_values,
)
from attnid.edits.hf_files import HF_FOLDER, read_folder_config, weight_format
from attnid.edits.hf_gpt2 import HF_GPT2_FORMAT
from attnid.edits.hf_llama import HF_LLAMA_FORMAT, LLAMA_FAMILY
from attnid.edits.nanogpt_checkpoint import NANOGPT_FORMAT

# the names the edits and the command line use from here
__all__ = [
    "FORMATS",
    "HF_FOLDER",
    "HF_GPT2",
    "HF_LLAMA",
    "NANOGPT",
    "AttentionLayer",
    "Checkpoint",
    "checkpoint_format",
    "load_checkpoint",
    "save_checkpoint",
    "weight_format",
]

FORMATS: dict[str, CheckpointFormat] = {
    fmt.kind: fmt for fmt in (NANOGPT_FORMAT, HF_GPT2_FORMAT, HF_LLAMA_FORMAT)
}


def checkpoint_format(path: Path) -> CheckpointFormat:
    """The registered format that reads ``path`` (a file, or a folder judged by its ``config.json``)."""
    require_regular_file(path, "checkpoint")
    if not path.is_dir():
        if not os.path.lexists(path):
            raise UserError(
                f"checkpoint {path} does not exist (expected a nanoGPT ckpt.pt or a Hugging Face folder)"
            )
        config = None
    else:
        config = read_folder_config(path)
    for fmt in FORMATS.values():
        if fmt.claims(path, config):
            return fmt
    model_type = config.get("model_type") if config is not None else None
    raise UserError(
        f"{path}: model_type {model_type!r}; only GPT-2 folders (model_type 'gpt2') and Llama-family "
        f"folders ({', '.join(LLAMA_FAMILY)}) can be edited"
    )


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A nanoGPT ``ckpt.pt`` (a file), or a Hugging Face GPT-2 or Llama-family model (a folder with
    ``config.json``), read by its registered loader and checked (module docstring)."""
    path = Path(path)
    checkpoint = checkpoint_format(path).load(path)
    check_weight_values(checkpoint.tensors, path)
    return checkpoint


def save_checkpoint(checkpoint: Checkpoint, out: str | os.PathLike, record: dict | None = None) -> Path:
    """Write ``checkpoint`` in its own format to ``out`` (a file for nanoGPT, a folder for HF).

    ``record`` (plain values) is kept as ``attnid_edits`` in a nanoGPT checkpoint,
    a list that grows with each edit; HF folders get no extra file.
    """
    return FORMATS[checkpoint.kind].save(checkpoint, Path(out), record)
