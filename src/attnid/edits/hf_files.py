"""The files of a Hugging Face model folder, read and written inside their folders (docs/design.md §9).

A folder holds ``config.json``, its weights (``model.safetensors`` or ``pytorch_model.bin``, or shards
that a ``*.index.json`` lists in its ``weight_map``) and other files (tokenizer, generation config).
Both Hugging Face formats (:mod:`attnid.edits.hf_gpt2`, :mod:`attnid.edits.hf_llama`) read and write
them here, and only here, so one place keeps the promise that an edit reads only files inside the
input folder and writes only inside ``--out``:

- every name the folder gives (a shard in the index, a file in the listing) goes through
  :func:`attnid.common.paths.inside`: an absolute name, a ``..`` part or a symlink out of the folder
  is refused in one line naming the entry, before anything is opened;
- every file read is a regular file (no FIFO, device or socket);
- the edited folder is first written whole into a staging folder inside ``--out``, then each file is
  renamed into place: a failure (a full disk) leaves ``--out`` as it was, with no partial folder. A
  staging folder that a killed edit left behind is removed by the next edit of that ``--out`` (which
  holds its lock, :mod:`attnid.common.locks`).

Safetensors files are read with ``safetensors`` and pickled ``.bin`` files with the weights-only
loader (:func:`attnid.common.files.load_weights_only`): no code from a folder ever runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import atomic_path, load_weights_only, read_json, require, torch_save_atomic
from attnid.common.hf_config_file import read_hf_config
from attnid.common.locks import FOLDER_LOCK_NAME
from attnid.common.paths import inside, require_regular_file

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
PYTORCH_BIN_NAME = "pytorch_model.bin"
INDEX_NAMES = (SAFETENSORS_NAME + ".index.json", PYTORCH_BIN_NAME + ".index.json")
STAGING_PREFIX = ".attnid-staging-"


def is_hf_folder(path: Path) -> bool:
    """A folder with a ``config.json``, or one holding only what a killed edit left (its staging folder, its
    lock): what an edit of a Hugging Face model may write over."""
    path = Path(path)
    return (path / CONFIG_NAME).is_file() or all(
        item.name.startswith((STAGING_PREFIX, FOLDER_LOCK_NAME)) for item in path.iterdir()
    )


HF_FOLDER = outputs.Format("a Hugging Face model folder (with config.json)", is_hf_folder)


def weight_format(name: str) -> outputs.Format:
    """What an edit writes at a file of a Hugging Face folder: weights in their format, other files copied."""
    if name.endswith(".safetensors"):
        return outputs.SAFETENSORS
    return outputs.TORCH_ARCHIVE if name.endswith(".bin") else outputs.ANY


# --------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------


def read_folder_config(folder: Path) -> dict:
    """``folder``'s ``config.json`` as a JSON object, read only if it lies inside the folder."""
    if not os.path.lexists(folder / CONFIG_NAME):
        raise UserError(
            f"{folder} is a folder but not a Hugging Face model folder (no config.json); expected a "
            f"nanoGPT ckpt.pt file or a GPT-2 or Llama-family folder with config.json and its weights"
        )
    return read_hf_config(inside(folder, CONFIG_NAME, f"the folder {folder}"))


def weight_file_names(folder: Path) -> list[str]:
    """The weight files of ``folder``: the shards its index lists (each checked to lie inside the
    folder), else ``model.safetensors`` or ``pytorch_model.bin``."""
    for index_name in INDEX_NAMES:
        if not os.path.lexists(folder / index_name):
            continue
        index_path = inside(folder, index_name, f"the folder {folder}")
        index = read_json(index_path, "weight index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"weight index {index_path} has no weight_map object of tensor: file")
        for entry in weight_map.values():  # every entry, before any is opened
            inside(folder, entry, f"weight index {index_path}")
        names = sorted(set(weight_map.values()))
        return names
    for name in (SAFETENSORS_NAME, PYTORCH_BIN_NAME):
        if os.path.lexists(folder / name):
            inside(folder, name, f"the folder {folder}")
            return [name]
    raise UserError(
        f"{folder} has no {SAFETENSORS_NAME} or {PYTORCH_BIN_NAME}: not a Hugging Face model folder"
    )


def read_weight_file(folder: Path, name: str) -> tuple[dict[str, torch.Tensor], dict | None]:
    """The tensors (and safetensors header metadata) of the weight file ``name`` inside ``folder``."""
    path = inside(folder, name, f"the folder {folder}")
    require_regular_file(path, "weight file")
    if not path.is_file():
        raise UserError(f"weight file {path} does not exist (named by the folder's weight index)")
    if path.suffix == ".safetensors":
        safetensors = require("safetensors", f"reading {path}")
        if path.stat().st_size == 0:
            raise UserError(f"cannot read {path}: it is empty (0 bytes)")
        if not outputs.SAFETENSORS.recognises(path):
            raise UserError(f"cannot read {path}: not a safetensors file (no valid header)")
        try:
            with safetensors.safe_open(str(path), framework="pt") as handle:
                return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()
        except (safetensors.SafetensorError, OSError, TypeError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(
                f"cannot read {path}: a truncated or corrupt safetensors file ({first})"
            ) from None
    state = load_weights_only(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path} is not a state dict of tensors")
    return state, None


WeightFiles = tuple[dict[str, torch.Tensor], dict[str, list[str]], dict[str, dict | None]]


def check_folder_files(folder: Path) -> None:
    """Every file of ``folder`` (what an edit copies to ``--out``) lies inside it and is a regular file:
    checked when the folder is read, before any work, not when it is written."""
    for item in sorted(folder.iterdir()):
        if not item.is_dir():  # folders are not copied
            require_regular_file(inside(folder, item.name, f"the folder {folder}"), "file")


def read_weights(folder: Path) -> WeightFiles:
    """Every tensor of ``folder``'s weight files, the keys of each file, and each file's header metadata."""
    check_folder_files(folder)
    tensors: dict[str, torch.Tensor] = {}
    weight_files: dict[str, list[str]] = {}
    metadata: dict[str, dict | None] = {}
    for name in weight_file_names(folder):
        state, metadata[name] = read_weight_file(folder, name)
        weight_files[name] = list(state)
        tensors.update(state)
    return tensors, weight_files, metadata


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------


def save_hf_folder(
    source: Path,
    out: Path,
    tensors: dict[str, torch.Tensor],
    weight_files: dict[str, list[str]],
    file_metadata: dict[str, dict | None],
    replaced: dict[str, bytes] | None = None,
) -> Path:
    """Write the folder ``source`` with its weights taken from ``tensors`` to ``out``: each weight file with
    the same keys (and header metadata), the files named in ``replaced`` with that content, every other file
    of ``source`` copied. Staged inside ``out``, then renamed into place (module docstring)."""
    replaced = dict(replaced or {})
    if os.path.lexists(out) and not out.is_dir():
        raise UserError(f"--out {out} is a file; a Hugging Face model is written as a folder")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(STAGING_PREFIX + "*"):  # left by a killed edit; this one holds --out's lock
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        names = []
        for name, keys in weight_files.items():
            target = inside(staging, name, f"the weights of {source}")
            state = {k: tensors[k].contiguous() for k in keys}
            _write_weights(target, name, state, file_metadata.get(name))
            names.append(name)
        # config.json, generation_config.json, tokenizer files, the shard index: unchanged unless replaced
        for item in sorted(source.iterdir()):
            if item.name in weight_files or item.is_dir() or item.name.startswith(STAGING_PREFIX):
                continue
            path = inside(source, item.name, f"the folder {source}")
            require_regular_file(path, "file")
            with atomic_path(staging / item.name, weight_format(item.name)) as tmp:
                if item.name in replaced:
                    tmp.write_bytes(replaced.pop(item.name))
                else:
                    shutil.copyfile(path, tmp)
            names.append(item.name)
        for name, content in replaced.items():
            with atomic_path(inside(staging, name, "the edit"), weight_format(name)) as tmp:
                tmp.write_bytes(content)
            names.append(name)
        for name in names:  # renames within one folder: no space needed, nothing left half-written
            target = inside(out, name, f"--out {out}")
            outputs.guard(target, weight_format(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, target)
            outputs.written(target)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return out


def rewritten_folder_files(
    source: Path, config: dict, tensors: dict[str, torch.Tensor], weight_files: dict[str, list[str]]
) -> dict[str, bytes]:
    """``config.json`` from ``config`` and, where the folder has one, its shard index with the weight map of
    ``weight_files`` and the byte count of ``tensors``: what an edit that changes the config (a dtype, an
    untied ``lm_head``) writes instead of copying them."""
    replaced = {CONFIG_NAME: json_bytes(config)}
    for index_name in INDEX_NAMES:
        if not (source / index_name).is_file():
            continue
        index = read_json(inside(source, index_name, str(source)), "weight index")
        weight_map = {key: name for name, keys in weight_files.items() for key in keys}
        updated = {**index, "weight_map": weight_map}
        if isinstance(index.get("metadata"), dict) and "total_size" in index["metadata"]:
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            updated["metadata"] = {**index["metadata"], "total_size": total}
        if updated != index:
            replaced[index_name] = json_bytes(updated)
    return replaced


def json_bytes(value: dict) -> bytes:
    """A JSON file's bytes as Hugging Face writes them (indented, a final newline)."""
    return (json.dumps(value, indent=2, sort_keys=False, default=str) + "\n").encode("utf-8")


def _write_weights(target: Path, name: str, state: dict[str, torch.Tensor], metadata: dict | None) -> None:
    if not name.endswith(".safetensors"):
        torch_save_atomic(target, state)
        return
    save_file = require("safetensors.torch", f"writing {target}").save_file
    with atomic_path(target, weight_format(name)) as tmp:
        try:
            save_file(state, str(tmp), metadata=metadata or {"format": "pt"})
        except Exception as err:  # noqa: BLE001 - safetensors reports a full disk as its own error
            if isinstance(err, OSError) or type(err).__name__ != "SafetensorError":
                raise
            raise UserError(f"cannot write {name}: {err} (is the disk full?)") from None
