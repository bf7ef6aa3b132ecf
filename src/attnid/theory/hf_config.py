"""Attention and whole-model shapes from a Hugging Face ``config.json``'s settings, for ``attnid counts
--hf-config``, ``attnid census --hf-config`` and the checkpoint loaders (which read the file:
:mod:`attnid.common.hf_config_file`).

Maps the fields of GPT-2, Llama, Mistral, Qwen2, Gemma and Falcon configs onto the
architecture fields of :mod:`attnid.theory.counts` (``n_layer``, ``n_embd`` = E,
``n_head`` = H, ``n_kv_head`` = G, ``head_dim`` = D, ``rope``, ``bias`` for the
q/k/v projections, ``out_bias`` for the output projection), so a downloaded model's
counts come out as the same row as ``architectures.yaml`` would give it (:mod:`attnid.theory.architectures`).

Which model types use RoPE and which biases they carry is not in the config's
numbers but in the modelling code of each type; the table :data:`MODEL_TYPES`
records it (with the config flags that switch it, e.g. Llama's ``attention_bias``).
"""

from __future__ import annotations

from typing import Any

from attnid.common.errors import UserError

# model_type -> (rope, q/k/v bias, output bias) when the config has no flag saying otherwise
MODEL_TYPES: dict[str, tuple[bool, bool, bool]] = {
    "gpt2": (False, True, True),  # Conv1D c_attn / c_proj, both with biases
    "llama": (True, False, False),  # attention_bias switches q, k, v and o biases together
    "mistral": (True, False, False),
    "qwen2": (True, True, False),  # q_proj, k_proj, v_proj with bias; o_proj without
    "gemma": (True, False, False),
    "gemma2": (True, False, False),
    "falcon": (True, False, False),  # 'bias' switches every linear; 'alibi' replaces RoPE
}

# model_type -> (norm, norm has a bias, MLP, MLP bias by default, lm_head tied by default) for the
# whole-model count (attnid.theory.whole_model); the config's tie_word_embeddings / mlp_bias / bias override.
WHOLE_MODEL_TYPES: dict[str, tuple[str, bool, str, bool, bool]] = {
    "gpt2": ("layernorm", True, "gelu", True, True),
    "llama": ("rmsnorm", False, "swiglu", False, False),
    "mistral": ("rmsnorm", False, "swiglu", False, False),
    "qwen2": ("rmsnorm", False, "swiglu", False, False),
    "gemma": ("rmsnorm", False, "geglu", False, True),  # gain 1 + w is still a free gain
    "falcon": ("layernorm", True, "gelu", False, True),
}
EPS_NAMES = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps")  # the norms' epsilon, first found wins
# Why a model type's whole model is not counted (its attention still is).
WHOLE_MODEL_NOT_COVERED = {
    "gemma2": "Gemma-2 normalises each block's output too (sandwich norms) and soft-caps its logits",
}

# (our field, the config's names for it, first found wins)
FIELD_NAMES = {
    "n_embd": ("n_embd", "hidden_size", "d_model"),
    "n_head": ("n_head", "num_attention_heads"),
    "n_layer": ("n_layer", "num_hidden_layers"),
}


def _field(config: dict, ours: str, where: str) -> int:
    for name in FIELD_NAMES[ours]:
        if config.get(name) is not None:
            return config[name]
    raise UserError(
        f"{where} lacks {' / '.join(FIELD_NAMES[ours])} (needed for {ours}): cannot count its attention"
    )


def _kv_heads(config: dict, model_type: str, n_head: int, where: str) -> int:
    """G: Falcon states it three ways (``new_decoder_architecture`` + ``num_kv_heads``,
    ``multi_query``, or neither = one key/value head per query head); the others by
    ``num_key_value_heads`` (absent = plain multi-head attention)."""
    if model_type == "falcon":
        if config.get("new_decoder_architecture"):
            if config.get("num_kv_heads") is None:
                raise UserError(f"{where} has new_decoder_architecture but lacks num_kv_heads")
            return config["num_kv_heads"]
        return 1 if config.get("multi_query", True) else n_head
    kv_heads = config.get("num_key_value_heads")
    return n_head if kv_heads is None else kv_heads


def _rope_and_biases(config: dict, model_type: str) -> tuple[bool, bool, bool]:
    rope, bias, out_bias = MODEL_TYPES[model_type]
    if model_type == "falcon":
        rope = not config.get("alibi", False)
        bias = out_bias = bool(config.get("bias", False))
    elif model_type != "gpt2" and config.get("attention_bias") is not None:
        bias = out_bias = bool(config["attention_bias"])
    if config.get("qkv_bias") is not None:
        bias = bool(config["qkv_bias"])
    return rope, bias, out_bias


def architecture_from_hf_config(config: dict, source: str = "config.json") -> dict:
    """An ``architectures.yaml``-style entry (see :mod:`attnid.theory.architectures`) for one HF config.

    Raises a one-line UserError naming the field it could not find or the model type
    it does not know.
    """
    model_type = config.get("model_type")
    if model_type is None:
        raise UserError(
            f"{source} lacks model_type: cannot tell the attention layout (known: {', '.join(MODEL_TYPES)})"
        )
    if model_type not in MODEL_TYPES:
        raise UserError(
            f"{source}: model_type {model_type!r} is not one of {', '.join(MODEL_TYPES)}; "
            f"whether it uses RoPE and attention biases is not in its config"
        )
    n_head = _field(config, "n_head", source)
    spec: dict[str, Any] = {
        "n_layer": _field(config, "n_layer", source),
        "n_embd": _field(config, "n_embd", source),
        "n_head": n_head,
        "n_kv_head": _kv_heads(config, model_type, n_head, source),
    }
    if config.get("head_dim") is not None:
        spec["head_dim"] = config["head_dim"]
    for name, value in spec.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{source}: the field giving {name} must be a positive integer, got {value!r}")
    spec["rope"], spec["bias"], spec["out_bias"] = _rope_and_biases(config, model_type)
    spec.update(_whole_model_fields(config, model_type, spec))
    spec["source"] = source
    return spec


def _whole_model_fields(config: dict, model_type: str, spec: dict) -> dict:
    """vocab_size, block_size, norm, mlp, mlp_hidden, tied, ... for attnid.theory.whole_model, or
    ``{"whole_model_note": why}`` for a model the whole-model census does not cover."""
    if model_type in WHOLE_MODEL_NOT_COVERED:
        return {"whole_model_note": WHOLE_MODEL_NOT_COVERED[model_type]}
    if model_type == "falcon" and (config.get("alibi") or config.get("new_decoder_architecture")):
        return {"whole_model_note": "Falcon with ALiBi or with two norms per parallel block is not covered"}
    if config.get("vocab_size") is None:
        return {"whole_model_note": "the config lacks vocab_size"}
    norm, norm_bias, mlp, mlp_bias, tied = WHOLE_MODEL_TYPES[model_type]
    n_embd = spec["n_embd"]
    fields = {
        "vocab_size": config["vocab_size"],
        "norm": norm,
        "norm_bias": norm_bias,
        "mlp": mlp,
        "tied": bool(config.get("tie_word_embeddings", tied)),
        "mlp_hidden": config.get("n_inner") or config.get("intermediate_size") or 4 * n_embd,
        "norm_eps": next((config[key] for key in EPS_NAMES if config.get(key) is not None), 1e-5),
    }
    if model_type == "gpt2":
        fields["block_size"] = config.get("n_positions", config.get("n_ctx", 1024))
    if model_type == "falcon":
        fields["mlp_bias"] = bool(config.get("bias", False))
        fields["block"] = "parallel" if config.get("parallel_attn", True) else "sequential"
    else:
        fields["mlp_bias"] = bool(config.get("mlp_bias", mlp_bias))
    return fields


def hf_model_name(config: dict, folder_name: str) -> str:
    """The name of the model a config describes: its ``_name_or_path``, else the name of the folder it was
    read from, else its model type."""
    return str(config.get("_name_or_path") or folder_name or config.get("model_type") or "model")
