"""Reading and writing the checkpoints that ``attnid prune-biases`` and ``attnid balance`` edit.

The formats, all read without running any code from the file:

- nanoGPT ``ckpt.pt``: a dict with ``model_args`` and ``model`` (a state dict whose
  keys may carry ``torch.compile``'s ``_orig_mod.`` prefix); ours adds an ``attnid``
  section (resume state, the metric tracker's ``I_0``). ``c_attn.weight`` is ``(3E, E)``.
- Hugging Face GPT-2 folder: ``config.json`` and ``model.safetensors`` or
  ``pytorch_model.bin`` (or shards listed in a ``*.index.json``). GPT-2's ``Conv1D``
  stores ``x W + b``, so ``attn.c_attn.weight`` is ``(E, 3E)`` and
  ``attn.c_proj.weight`` is ``(E, E)``: both the transpose of nanoGPT's.
- Hugging Face Llama-family folders (Llama, Mistral, Qwen2, Gemma): :mod:`attnid.edits.hf_llama`,
  which reads them with this module's weight-file readers.

Pickled files go through :func:`load_weights_only` (``torch.load(weights_only=True)``),
which refuses any pickle that would build something other than tensors and plain
containers, so a checkpoint that carries code is rejected before that code runs.

Edits see every layer's attention in nanoGPT's layout and float64
(:class:`AttentionLayer`); writing back restores each tensor's own layout and dtype
and leaves every other tensor, and every other entry of the file, as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import atomic_path, load_weights_only, require, torch_save_atomic
from attnid.common.shapes import check_tensor_shapes

NANOGPT = "nanogpt"
HF_GPT2 = "hf-gpt2"
HF_LLAMA = "hf-llama"  # Llama, Mistral, Qwen2, Gemma folders: attnid.edits.hf_llama
SAFETENSORS_NAME = "model.safetensors"
PYTORCH_BIN_NAME = "pytorch_model.bin"
# Every layer's attention tensors, relative to the prefix that ends in "h." (see _layer_prefix)
ATTENTION_PARTS = ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias")


@dataclass
class AttentionLayer:
    """One layer's attention in nanoGPT's layout, float64: rows ``[W_Q; W_K; W_V]``, head ``h`` = rows
    ``h*D:(h+1)*D``."""

    c_attn_weight: torch.Tensor  # (3E, E)
    c_attn_bias: torch.Tensor | None  # (3E,)
    c_proj_weight: torch.Tensor  # (E_out, E_in)
    c_proj_bias: torch.Tensor | None  # (E,)


@dataclass
class Checkpoint:
    """A loaded checkpoint: its weights by stored name, and what is needed to write it back unchanged."""

    kind: str  # NANOGPT or HF_GPT2
    path: Path
    n_layer: int
    n_head: int
    n_embd: int
    tensors: dict[str, torch.Tensor]  # every weight, keyed as stored
    layer_prefix: str  # stored key of layer i's tensors: f"{layer_prefix}{i}.{part}"
    payload: dict = field(default_factory=dict)  # nanoGPT: the whole checkpoint dict; HF: config.json
    weight_files: dict[str, list[str]] = field(default_factory=dict)  # HF: file name -> its keys
    file_metadata: dict[str, dict | None] = field(default_factory=dict)  # HF safetensors header metadata

    @property
    def transposed(self) -> bool:
        return self.kind == HF_GPT2  # Conv1D stores W^T

    @property
    def vocab_size(self) -> int:
        return int(
            self.payload["model_args"]["vocab_size"] if self.kind == NANOGPT else self.payload["vocab_size"]
        )

    @property
    def block_size(self) -> int:
        return int(
            self.payload["model_args"]["block_size"] if self.kind == NANOGPT else self.payload["n_positions"]
        )

    def attention_layer(self, layer: int) -> AttentionLayer:
        """One layer's attention tensors as float64 copies in nanoGPT's layout."""
        weight, bias, proj_weight, proj_bias = (self._attention_part(layer, part) for part in ATTENTION_PARTS)
        if weight is None or proj_weight is None:  # the biases are optional, the weights are not
            missing = ATTENTION_PARTS[0] if weight is None else ATTENTION_PARTS[2]
            raise UserError(
                f"{self.path} has no {self.layer_prefix}{layer}.{missing}: cannot edit its attention"
            )
        return AttentionLayer(weight, bias, proj_weight, proj_bias)

    def _attention_part(self, layer: int, part: str) -> torch.Tensor | None:
        tensor = self.tensors.get(f"{self.layer_prefix}{layer}.{part}")
        if tensor is None:
            return None
        tensor = tensor.detach().to(torch.float64, copy=True)
        return tensor.t().contiguous() if self.transposed and tensor.dim() == 2 else tensor

    def attention_layers(self) -> list[AttentionLayer]:
        return [self.attention_layer(layer) for layer in range(self.n_layer)]

    def set_attention_layers(self, layers: list[AttentionLayer]) -> None:
        """Write edited layers back, each tensor in its stored layout and dtype."""
        for layer, edited in enumerate(layers):
            values = (edited.c_attn_weight, edited.c_attn_bias, edited.c_proj_weight, edited.c_proj_bias)
            for part, value in zip(ATTENTION_PARTS, values):
                key = f"{self.layer_prefix}{layer}.{part}"
                if key not in self.tensors:
                    if value is not None:
                        raise ValueError(f"{key} is not in the checkpoint, cannot write it")
                    continue
                if value is None:
                    raise ValueError(f"{key} is in the checkpoint but the edited layer has none")
                value = value.t() if self.transposed and value.dim() == 2 else value
                self.tensors[key] = value.to(self.tensors[key].dtype).contiguous()


# --------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------


def _layer_prefix(keys, where: Path) -> str:
    """The stored prefix of ``h.{i}.attn...`` keys: nanoGPT's ``transformer.h.``, HF's
    ``transformer.h.`` or ``h.``."""
    anchor = "h.0.attn.c_attn.weight"
    hits = [k for k in keys if k == anchor or k.endswith("." + anchor)]
    if not hits:
        raise UserError(f"{where} has no {anchor}: not a nanoGPT / GPT-2 model")
    return hits[0][: -len("0.attn.c_attn.weight")]


def _count_layers(keys, prefix: str) -> int:
    return len(
        {
            k[len(prefix) :].split(".", 1)[0]
            for k in keys
            if k.startswith(prefix) and k.endswith("attn.c_attn.weight")
        }
    )


def load_nanogpt(path: Path) -> Checkpoint:
    from attnid.model.gpt import COMPILED_PREFIX, config_from_model_args, expected_state_shapes

    checkpoint = load_weights_only(path)
    if not isinstance(checkpoint, dict) or "model_args" not in checkpoint or "model" not in checkpoint:
        raise UserError(f"{path} is not a nanoGPT checkpoint: expected a dict with 'model_args' and 'model'")
    args, tensors = checkpoint["model_args"], checkpoint["model"]
    if not isinstance(args, dict) or not isinstance(tensors, dict):
        raise UserError(f"{path} is not a nanoGPT checkpoint: 'model_args' and 'model' must be dicts")
    missing = sorted({"n_layer", "n_head", "n_embd", "block_size", "vocab_size"} - set(args))
    if missing:
        raise UserError(f"{path}: 'model_args' lacks {missing}: not a nanoGPT checkpoint")
    if not all(isinstance(tensor, torch.Tensor) for tensor in tensors.values()):
        raise UserError(f"{path} is not a nanoGPT checkpoint: 'model' holds something other than tensors")
    stored = {key.removeprefix(COMPILED_PREFIX): tensor.shape for key, tensor in tensors.items()}
    expected = expected_state_shapes(config_from_model_args(args))
    check_tensor_shapes(expected, stored, str(path), source="its model_args", required=False)
    prefix = _layer_prefix(tensors, path)
    n_layer = _count_layers(tensors, prefix)
    if n_layer != int(args["n_layer"]):
        raise UserError(
            f"{path}: model_args says n_layer={args['n_layer']} but the weights have {n_layer} layers"
        )
    return Checkpoint(
        NANOGPT,
        path,
        n_layer,
        int(args["n_head"]),
        int(args["n_embd"]),
        dict(tensors),
        prefix,
        payload=checkpoint,
    )


def _hf_weight_files(folder: Path) -> list[str]:
    for index_name in (SAFETENSORS_NAME + ".index.json", PYTORCH_BIN_NAME + ".index.json"):
        index = folder / index_name
        if index.is_file():
            try:
                return sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                raise UserError(f"{index} is not a weight index ({type(err).__name__}: {err})") from None
    for name in (SAFETENSORS_NAME, PYTORCH_BIN_NAME):
        if (folder / name).is_file():
            return [name]
    raise UserError(
        f"{folder} has no {SAFETENSORS_NAME} or {PYTORCH_BIN_NAME}: not a Hugging Face model folder"
    )


def _read_weight_file(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    if path.suffix == ".safetensors":
        safetensors = require("safetensors", f"reading {path}")
        if path.stat().st_size == 0:
            raise UserError(f"cannot read {path}: it is empty (0 bytes)")
        if not outputs.SAFETENSORS.recognises(path):
            raise UserError(f"cannot read {path}: not a safetensors file (no valid header)")
        try:
            with safetensors.safe_open(str(path), framework="pt") as handle:
                return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()
        except (safetensors.SafetensorError, OSError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(
                f"cannot read {path}: a truncated or corrupt safetensors file ({first})"
            ) from None
    state = load_weights_only(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path} is not a state dict of tensors")
    return state, None


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


def gpt2_expected_shapes(sizes: dict[str, int], prefix: str) -> tuple[dict, dict]:
    """``(attention, other)`` ``{stored name: shape}`` of a GPT-2 folder, from its config's sizes. GPT-2's
    Conv1D stores ``(in, out)``; ``prefix`` is the stored prefix of ``h.{i}.`` (:func:`_layer_prefix`)."""
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
    from attnid.common.hf_config_file import read_hf_config

    if not (folder / "config.json").exists():
        raise UserError(
            f"{folder} is a folder but not a Hugging Face model folder (no config.json); "
            f"expected a nanoGPT ckpt.pt file or a GPT-2 folder with config.json and its weights"
        )
    config = read_hf_config(folder)
    if config.get("model_type") != "gpt2":
        from attnid.edits.hf_llama import LLAMA_FAMILY

        raise UserError(
            f"{folder}: model_type {config.get('model_type')!r}; only GPT-2 folders (model_type 'gpt2') "
            f"and Llama-family folders ({', '.join(LLAMA_FAMILY)}) can be edited"
        )
    sizes = _gpt2_sizes(config, folder / "config.json")
    tensors, weight_files, metadata = {}, {}, {}
    for name in _hf_weight_files(folder):
        state, metadata[name] = _read_weight_file(folder / name)
        weight_files[name] = list(state)
        tensors.update(state)
    prefix = _layer_prefix(tensors, folder)
    n_layer = _count_layers(tensors, prefix)
    if n_layer != sizes["n_layer"]:
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
        int(config["n_head"]),
        int(config["n_embd"]),
        tensors,
        prefix,
        payload=config,
        weight_files=weight_files,
        file_metadata=metadata,
    )


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A nanoGPT ``ckpt.pt`` (a file), or a Hugging Face GPT-2 or Llama-family model (a folder with
    ``config.json``)."""
    path = Path(path)
    if path.is_dir():
        from attnid.common.hf_config_file import read_hf_config
        from attnid.edits.hf_llama import LLAMA_FAMILY, load_hf_llama  # it builds on this module

        if not (path / "config.json").exists():
            raise UserError(
                f"{path} is a folder but not a Hugging Face model folder (no config.json); expected a "
                f"nanoGPT ckpt.pt file or a GPT-2 or Llama-family folder with config.json and its weights"
            )
        if read_hf_config(path).get("model_type") in LLAMA_FAMILY:
            return load_hf_llama(path)
        return load_hf_gpt2(path)
    if path.is_file():
        return load_nanogpt(path)
    raise UserError(f"checkpoint {path} does not exist (expected a nanoGPT ckpt.pt or a Hugging Face folder)")


def is_hf_folder(path: Path) -> bool:
    """A folder with a ``config.json``: what an edit of a Hugging Face model may write over."""
    return (Path(path) / "config.json").is_file()


HF_FOLDER = outputs.Format("a Hugging Face model folder (with config.json)", is_hf_folder)


def weight_format(name: str) -> outputs.Format:
    """What an edit writes at a file of a Hugging Face folder: weights in their format, other files copied."""
    if name.endswith(".safetensors"):
        return outputs.SAFETENSORS
    return outputs.TORCH_ARCHIVE if name.endswith(".bin") else outputs.ANY


# --------------------------------------------------------------------------------------
# saving
# --------------------------------------------------------------------------------------


def save_checkpoint(checkpoint: Checkpoint, out: str | os.PathLike, record: dict | None = None) -> Path:
    """Write ``checkpoint`` in its own format to ``out`` (a file for nanoGPT, a folder for HF).

    ``record`` (plain values) is kept as ``attnid_edits`` in a nanoGPT checkpoint,
    a list that grows with each edit; HF folders get no extra file.
    """
    out = Path(out)
    if checkpoint.kind == NANOGPT:
        payload = dict(checkpoint.payload, model=checkpoint.tensors)
        if record is not None:
            payload["attnid_edits"] = list(payload.get("attnid_edits", [])) + [record]
        torch_save_atomic(out, payload)
        return out
    if checkpoint.kind == HF_LLAMA:
        from attnid.edits.hf_llama import LlamaCheckpoint, save_hf_llama

        assert isinstance(checkpoint, LlamaCheckpoint)  # the one class load_hf_llama makes of that kind
        return save_hf_llama(checkpoint, out)
    return _save_hf(checkpoint, out)


def _save_hf(checkpoint: Checkpoint, out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; a Hugging Face model is written as a folder")
    out.mkdir(parents=True, exist_ok=True)
    for name, keys in checkpoint.weight_files.items():
        state = {k: checkpoint.tensors[k].contiguous() for k in keys}
        with atomic_path(out / name, weight_format(name)) as tmp:
            if name.endswith(".safetensors"):
                save_file = require("safetensors.torch", f"writing {out / name}").save_file
                save_file(state, str(tmp), metadata=checkpoint.file_metadata.get(name) or {"format": "pt"})
            else:
                torch.save(state, tmp)
    # config.json, generation_config.json, tokenizer files, the shard index: unchanged
    for item in sorted(checkpoint.path.iterdir()):
        if item.is_file() and item.name not in checkpoint.weight_files:
            with atomic_path(out / item.name, weight_format(item.name)) as tmp:
                shutil.copyfile(item, tmp)
    return out
