"""A checkpoint as the edits see it, whatever its format, and what a format registers
(:mod:`attnid.edits.checkpoints` holds the registry).

- :class:`Checkpoint`: every stored tensor by its stored name, ``n_layer`` and the attention shape of each
  layer (:class:`attnid.theory.shape.LayerShape`), and what its format's writer needs to write it back
  unchanged.
- :class:`AttentionLayer`: one layer's attention in nanoGPT's layout and float64, which every edit
  works on.
- :class:`CheckpointFormat`: one format's loader and writer (nanoGPT ``ckpt.pt``:
  :mod:`attnid.edits.nanogpt_checkpoint`; Hugging Face GPT-2: :mod:`attnid.edits.hf_gpt2`; the Llama
  family: :mod:`attnid.edits.hf_llama`).
- :func:`check_weight_values`: what every loader's tensors must be, whatever the format: float16,
  bfloat16, float32 or float64, and finite. An int8 or complex weight is not a model these edits
  understand, and a NaN or Inf weight makes every measurement and edit meaningless.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnid.common.errors import UserError
from attnid.theory.shape import LayerShape

NANOGPT = "nanogpt"
HF_GPT2 = "hf-gpt2"
HF_LLAMA = "hf-llama"  # Llama, Mistral, Qwen2, Gemma folders: attnid.edits.hf_llama
# Every layer's attention tensors, relative to the prefix that ends in "h." (nanogpt_checkpoint.layer_prefix)
ATTENTION_PARTS = ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias")
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Causal-mask buffers that old nanoGPT and GPT-2 files store beside the weights (no model reads them back)
MASK_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")
FINITE_CHUNK = 1 << 24  # elements checked at a time: the check's scratch stays small on a large model


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

    kind: str  # NANOGPT, HF_GPT2 or HF_LLAMA: its format in the registry
    path: Path
    n_layer: int
    attention: LayerShape  # each layer's, as its loader read it from the config and the stored tensors
    tensors: dict[str, torch.Tensor]  # every weight, keyed as stored
    layer_prefix: str  # stored key of layer i's tensors: f"{layer_prefix}{i}.{part}"
    payload: dict = field(default_factory=dict)  # nanoGPT: the whole checkpoint dict; HF: config.json
    weight_files: dict[str, list[str]] = field(default_factory=dict)  # HF: file name -> its keys
    file_metadata: dict[str, dict | None] = field(default_factory=dict)  # HF safetensors header metadata
    config_changed: bool = False  # HF: config.json (payload) and the shard index are written anew

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


@dataclass(frozen=True)
class CheckpointFormat:
    """One checkpoint format: how to recognise it, its loader and its writer.

    ``claims(path, config)``: whether this format reads ``path`` (a file, or a folder with its
    ``config.json`` object as ``config``); ``load(path)``: the checkpoint, every file it reads inside
    ``path``; ``save(checkpoint, out, record)``: written in the same format, every file inside ``out``
    (``record``: the edit's report, kept where the format has room for it).
    """

    kind: str
    description: str
    claims: Callable[[Path, dict | None], bool]
    load: Callable[[Path], Checkpoint]
    save: Callable[[Checkpoint, Path, dict | None], Path]


def _is_mask_buffer(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(MASK_BUFFER_SUFFIXES) and (tensor.dim() == 4 or tensor.dim() == 0)


def check_weight_values(tensors: dict, where: Path | str) -> None:
    """Every stored tensor a weight of a float dtype (:data:`WEIGHT_DTYPES`) with finite values, keyed by a
    name; one UserError line naming the first that is not. Old causal-mask buffers are let through."""
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise UserError(f"{where}: a tensor is stored under the key {name!r}, not a name")
        if not isinstance(tensor, torch.Tensor):
            raise UserError(f"{where}: {name} is a {type(tensor).__name__}, not a tensor")
        if _is_mask_buffer(name, tensor):
            continue
        if tensor.dtype not in WEIGHT_DTYPES:
            allowed = ", ".join(str(dtype).removeprefix("torch.") for dtype in WEIGHT_DTYPES)
            raise UserError(
                f"{where}: {name} is stored as {str(tensor.dtype).removeprefix('torch.')}; the edits read "
                f"weights stored as {allowed}"
            )
        flat = tensor.detach().reshape(-1)
        bad = sum(int((~torch.isfinite(chunk)).sum()) for chunk in flat.split(FINITE_CHUNK))
        if bad:
            raise UserError(
                f"{where}: {name} has {bad:,} NaN or infinite value(s) of {flat.numel():,}: not a "
                f"usable model (a diverged run?)"
            )
