"""Hugging Face Llama-family folders (Llama, Mistral, Qwen2, Gemma): read, cut into factor pairs, write back.

The tensors (transformers' ``modeling_llama`` and the models that copy its attention;
``nn.Linear`` stores ``out x in``), per layer ``i`` under ``model.layers.{i}.self_attn.``:

- ``q_proj.weight`` ``(H D, E)``, ``k_proj.weight`` and ``v_proj.weight`` ``(G D, E)``, rows
  ``h D:(h+1) D`` are head ``h``; query head ``h`` reads key/value head ``h // (H/G)``
  (``repeat_kv``); ``o_proj.weight`` ``(E, H D)``, input columns grouped by head.
- ``D`` is the config's ``head_dim`` where it sets one (Gemma), else ``E/H``; ``G`` is
  ``num_key_value_heads`` (absent: ``G = H``).
- Biases: Qwen2 has q/k/v biases and none on ``o_proj``; Llama's ``attention_bias`` switches
  all four; Mistral and Gemma have none. What is stored must agree with what the config says.
- RoPE is ``x cos + rotate_half(x) sin``, and ``rotate_half`` pairs coordinates ``(p, p + D/2)``
  of each head: exactly the half-split planes of :mod:`attnid.theory.rope`. The query-key pairs'
  own orbit is therefore the RoPE commutant, the output-value pairs' ``GL_D`` (docs/design.md §8).

Stacking ``[q_proj; k_proj; v_proj]`` gives nanoGPT's grouped ``c_attn`` rows ``[W_Q; W_K; W_V]``
and ``o_proj`` is nanoGPT's ``c_proj``, so a layer of these folders (an :class:`AttentionLayer`) is
cut into pairs, balanced and pruned by the same code as every other model
(:mod:`attnid.model.layout`, :mod:`attnid.edits.operations`). Weights are read by
:mod:`attnid.edits.hf_files` (safetensors or weights-only ``pytorch_model.bin``, sharded with an
index or not, every file inside the folder). Written back, each attention tensor keeps its stored dtype
(or the one ``--dtype`` asks for), every other tensor and file is copied, and the shards keep their
names and keys. The format's loader and writer are registered in :mod:`attnid.edits.checkpoints`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnid.common.errors import UserError
from attnid.edits.checkpoint_types import HF_LLAMA, AttentionLayer, Checkpoint, CheckpointFormat
from attnid.edits.hf_files import read_folder_config, read_weights, rewritten_folder_files, save_hf_folder
from attnid.edits.options import STORED_DTYPE_NAMES
from attnid.model.layout import row_blocks
from attnid.theory import counts
from attnid.theory.hf_config import architecture_from_hf_config

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "gemma")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
ANCHOR = "layers.0.self_attn.q_proj.weight"
# --dtype: the stored dtype a folder can be rewritten in (a bfloat16 or float16 weight is exact in float32)
STORED_DTYPES = {name: getattr(torch, name) for name in STORED_DTYPE_NAMES}
# config.json's name for the stored dtype: "dtype" (transformers 5) or "torch_dtype" (4.x)
CONFIG_DTYPE_KEYS = ("dtype", "torch_dtype")


@dataclass
class LlamaCheckpoint(Checkpoint):
    """A Llama-family folder: a :class:`Checkpoint` (weights by stored name, shard layout, ``config.json`` as
    ``payload``) whose attention layers are the stacked projections (see the module docstring)."""

    rewritten_dtype: str | None = None  # set by set_stored_dtype (--dtype)

    @property
    def block_size(self) -> int:
        return int(self.payload["max_position_embeddings"])

    @property
    def model_type(self) -> str:
        return str(self.payload["model_type"])

    def key(self, layer: int, projection: str, part: str) -> str:
        return f"{self.layer_prefix}{layer}.self_attn.{projection}.{part}"

    def _float64(self, layer: int, projection: str, part: str) -> torch.Tensor | None:
        tensor = self.tensors.get(self.key(layer, projection, part))
        return None if tensor is None else tensor.detach().to(torch.float64, copy=True)

    def _float64_weight(self, layer: int, projection: str) -> torch.Tensor:
        # _check_tensors found every attention weight with config.json's shape: each one is there
        weight = self._float64(layer, projection, "weight")
        assert weight is not None, self.key(layer, projection, "weight")
        return weight

    def attention_layer(self, layer: int) -> AttentionLayer:
        """One layer as float64 copies in nanoGPT's grouped layout: ``c_attn_weight`` ``(H D + 2 G D, E)``."""
        weights = [self._float64_weight(layer, p) for p in PROJECTIONS[:3]]
        biases = [self._float64(layer, p, "bias") for p in PROJECTIONS[:3]]
        present = [b for b in biases if b is not None]  # q, k and v together or none (_check_tensors)
        bias = torch.cat(present) if present else None  # (H D + 2 G D,)
        return AttentionLayer(
            torch.cat(weights),
            bias,
            self._float64_weight(layer, "o_proj"),
            self._float64(layer, "o_proj", "bias"),
        )

    def set_attention_layers(self, layers: list[AttentionLayer]) -> None:
        """Write edited layers back into q/k/v/o_proj, each tensor in its stored dtype."""
        rows = row_blocks(self.attention)  # W_Q, W_K, W_V rows of c_attn
        for layer, edited in enumerate(layers):
            values = {("o_proj", "weight"): edited.c_proj_weight, ("o_proj", "bias"): edited.c_proj_bias}
            for projection, block in zip(PROJECTIONS[:3], rows):
                values[projection, "weight"] = edited.c_attn_weight[block]
                values[projection, "bias"] = None if edited.c_attn_bias is None else edited.c_attn_bias[block]
            for (projection, part), value in values.items():
                key = self.key(layer, projection, part)
                if (key in self.tensors) != (value is not None):
                    raise ValueError(f"{key}: the edited layer and the checkpoint disagree on its presence")
                if value is not None:
                    self.tensors[key] = value.to(self.tensors[key].dtype).contiguous()

    def stored_dtype(self) -> str:
        """The dtype the attention weights are stored in (``bfloat16``, ``float32``, ...)."""
        return str(self.tensors[self.key(0, "q_proj", "weight")].dtype).removeprefix("torch.")


# --------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------


def _llama_layer_prefix(keys, folder: Path) -> str:
    """The stored prefix of ``layers.{i}.self_attn`` keys: ``model.layers.`` (``*ForCausalLM``) or
    ``layers.``."""
    hits = sorted(k for k in keys if k == ANCHOR or k.endswith("." + ANCHOR))
    if not hits:
        raise UserError(f"{folder} has no {ANCHOR} tensor: not a Llama-family model's weights")
    return hits[0][: -len("0.self_attn.q_proj.weight")]


def _check_rotary(config: dict, where: str) -> None:
    """Only full-width rotation has the half-split planes this module assumes for every coordinate."""
    for settings in (config, config.get("rope_parameters") or {}, config.get("rope_scaling") or {}):
        factor = settings.get("partial_rotary_factor") if isinstance(settings, dict) else None
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float)):
            raise UserError(f"{where}: partial_rotary_factor={factor!r}; expected a number")
        if factor is not None and float(factor) != 1.0:
            raise UserError(
                f"{where}: partial_rotary_factor={factor}; only RoPE over the whole head is supported"
            )


def _check_tensors(checkpoint: LlamaCheckpoint, spec: dict, where: Path) -> None:
    """Every layer's projections present with the config's shapes; biases as the config says."""
    attention = checkpoint.attention
    e, h, g, d = attention.n_embd, attention.n_head, attention.n_kv_head, attention.head_dim
    expected = {"q_proj": (h * d, e), "k_proj": (g * d, e), "v_proj": (g * d, e), "o_proj": (e, h * d)}
    bias_expected = {
        "q_proj": spec["bias"],
        "k_proj": spec["bias"],
        "v_proj": spec["bias"],
        "o_proj": spec["out_bias"],
    }
    for layer in range(checkpoint.n_layer):
        for projection, shape in expected.items():
            key = checkpoint.key(layer, projection, "weight")
            tensor = checkpoint.tensors.get(key)
            if tensor is None:
                raise UserError(f"{where}: the weights lack {key}")
            if tuple(tensor.shape) != shape or not tensor.is_floating_point():
                raise UserError(
                    f"{where}: {key} is {tuple(tensor.shape)} {tensor.dtype}; config.json "
                    f"(E={e}, H={h}, G={g}, head_dim={d}) needs a floating {shape}"
                )
            bias_key = checkpoint.key(layer, projection, "bias")
            if (bias_key in checkpoint.tensors) != bias_expected[projection]:
                stored = "has" if bias_key in checkpoint.tensors else "lacks"
                raise UserError(
                    f"{where}: the weights {stored} {bias_key}, but config.json says the "
                    f"{projection} bias is {'on' if bias_expected[projection] else 'off'}"
                )
            if bias_key in checkpoint.tensors and tuple(checkpoint.tensors[bias_key].shape) != shape[:1]:
                raise UserError(
                    f"{where}: {bias_key} is {tuple(checkpoint.tensors[bias_key].shape)}, "
                    f"expected {shape[:1]}"
                )


def load_hf_llama(folder: str | Path) -> LlamaCheckpoint:
    """A Llama, Mistral, Qwen2 or Gemma folder (``config.json`` and its weights), read without building
    the model."""
    folder = Path(folder)
    config = read_folder_config(folder)
    where = str(folder / "config.json")
    if config.get("model_type") not in LLAMA_FAMILY:
        raise UserError(
            f"{where}: model_type {config.get('model_type')!r} is not one of {', '.join(LLAMA_FAMILY)}"
        )
    spec = architecture_from_hf_config(config, where)  # the same reading as attnid counts --hf-config
    _check_rotary(config, where)
    for name in ("max_position_embeddings", "vocab_size"):
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{where}: {name} is {value!r}; expected a positive integer")
    n_embd, n_head = spec["n_embd"], spec["n_head"]
    if "head_dim" not in spec and n_embd % n_head:
        raise UserError(
            f"{where}: hidden_size {n_embd} is not a multiple of num_attention_heads {n_head} "
            f"and head_dim is not set"
        )
    if n_head % spec["n_kv_head"]:
        raise UserError(
            f"{where}: num_key_value_heads {spec['n_kv_head']} does not divide num_attention_heads {n_head}"
        )
    tensors, weight_files, metadata = read_weights(folder)
    prefix = _llama_layer_prefix(tensors, folder)
    n_layer = len(
        {
            k[len(prefix) :].split(".", 1)[0]
            for k in tensors
            if k.startswith(prefix) and k.endswith("self_attn.q_proj.weight")
        }
    )
    if n_layer != spec["n_layer"]:
        raise UserError(
            f"{where} says num_hidden_layers={spec['n_layer']} but the weights have {n_layer} layers"
        )
    try:
        attention = counts.architecture_shape(spec)  # counts.py's validation (e.g. heads wider than E)
    except ValueError as err:
        raise UserError(f"{where}: {err}") from None
    checkpoint = LlamaCheckpoint(
        HF_LLAMA,
        folder,
        n_layer,
        attention,
        tensors,
        prefix,
        payload=config,
        weight_files=weight_files,
        file_metadata=metadata,
    )
    _check_tensors(checkpoint, spec, folder)
    return checkpoint


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------


def set_stored_dtype(checkpoint: LlamaCheckpoint, dtype: str) -> None:
    """Store every floating tensor as ``dtype`` (``--dtype``) and say so in ``config.json``.

    For a bfloat16 or float16 folder this is exact for the weights that are not edited; the edited
    ones are then rounded to ``dtype`` instead of the input's coarser dtype.
    """
    if dtype not in STORED_DTYPES:
        raise UserError(f"--dtype {dtype!r}: choose one of {', '.join(STORED_DTYPES)}")
    for key, tensor in checkpoint.tensors.items():
        if tensor.is_floating_point():
            checkpoint.tensors[key] = tensor.to(STORED_DTYPES[dtype])
    named = {key: dtype for key in CONFIG_DTYPE_KEYS if key in checkpoint.payload}
    checkpoint.payload = {**checkpoint.payload, **named}
    checkpoint.rewritten_dtype = dtype


def save_hf_llama(checkpoint: Checkpoint, out: Path, record: dict | None = None) -> Path:
    """Write the folder to ``out``: the input's shard files with the same keys (and header metadata), every
    other file copied; ``config.json`` and the shard index rewritten only where ``--dtype`` changed them.
    ``record`` is not stored (HF folders get no file of ours)."""
    assert isinstance(checkpoint, LlamaCheckpoint)  # the one class load_hf_llama makes of this kind
    replaced: dict[str, bytes] = {}
    if checkpoint.rewritten_dtype is not None or checkpoint.config_changed:
        replaced = rewritten_folder_files(
            checkpoint.path, checkpoint.payload, checkpoint.tensors, checkpoint.weight_files
        )
    return save_hf_folder(
        checkpoint.path,
        Path(out),
        checkpoint.tensors,
        checkpoint.weight_files,
        checkpoint.file_metadata,
        replaced,
    )


HF_LLAMA_FORMAT = CheckpointFormat(
    HF_LLAMA,
    f"a Hugging Face Llama-family folder (model_type {', '.join(LLAMA_FAMILY)})",
    claims=lambda path, config: config is not None and config.get("model_type") in LLAMA_FAMILY,
    load=load_hf_llama,
    save=save_hf_llama,
)
