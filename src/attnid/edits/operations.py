"""Function-preserving checkpoint edits: ``attnid prune-biases`` and ``attnid balance`` (docs/design.md §9).

- **Bias pruning** (§4.7, claim T4): a key bias adds ``q_i . b_K`` to every score
  of query ``i``, a per-row constant that softmax cancels, so every key bias is set
  to 0. Attention rows sum to one, so the value biases reach the output only as the
  constant ``sum_h W_O^h b_V^h = W_O b_V``: it is folded into the output bias,
  ``b_O' = b_O + W_O b_V``, and ``b_V`` set to 0. Both are exact. Under RoPE the key
  bias term varies with the key position and is kept; without an output bias there
  is nothing to fold into, and the value biases are kept.
- **Balancing** (paper §5, docs/design.md §4): every query-key and output-value
  factor pair is moved along its orbit to ``A A^T = B B^T`` (Lemma 4.1/4.6: the
  product ``A^T B``, hence the function, is unchanged), the point of least
  attention weight norm on the orbit (``mu = 0``); ``--target initial`` moves it
  to the imbalance ``I_0`` that ``attnid train`` recorded at initialisation. Grouped-query
  and RoPE checkpoints of ``attnid train`` are balanced on their own, smaller orbits
  (docs/design.md §8) by the move the rebalancing runs make; a full ``GL_D`` move would
  change a RoPE model's function. Llama-family folders (:mod:`attnid.edits.hf_llama`) are
  cut by their own grouped layout (:func:`checkpoint_layout`) and balanced on their own
  orbits by the same :func:`balance_layers`.

Each command proves its edit: logits and loss on a held-out batch before and after,
the "after" model being loaded back from the written file (nanoGPT: our
``load_nanogpt_checkpoint``; Hugging Face: ``GPT2LMHeadModel`` or ``AutoModelForCausalLM``
``.from_pretrained``, computing in float32).
"""

from __future__ import annotations

import math

import torch

from attnid.common.errors import UserError
from attnid.edits.checkpoints import HF_LLAMA, NANOGPT, AttentionLayer, Checkpoint
from attnid.edits.hf_llama import LlamaCheckpoint
from attnid.model.gpt import COMPILED_PREFIX
from attnid.model.layout import (
    AttentionLayout,
    LayerTensors,
    model_pairs,
    orbit_of,
    row_blocks,
    stacked_pairs,
    write_layer_pairs,
)
from attnid.model.moves import rebalance_model
from attnid.theory import counts
from attnid.theory.circuits import CIRCUITS

# --------------------------------------------------------------------------------------
# the edits (pure functions on float64 layers in nanoGPT's layout, grouped for GQA)
# --------------------------------------------------------------------------------------


def prune_layer_biases(layer: AttentionLayer, layout: AttentionLayout) -> tuple[AttentionLayer, int, int]:
    """Zero the key biases (not under RoPE) and fold the value biases into the output bias (where it exists).

    ``layout`` says how ``c_attn`` is cut (:func:`checkpoint_layout`; grouped rows for GQA). Returns the
    edited layer (a copy) and how many key and value biases were non-zero before. Exact: ``W_O b_V`` is
    added in float64, each group's value bias once per query head that reads it.
    """
    if layer.c_attn_bias is None:
        return layer, 0, 0
    bias = layer.c_attn_bias.clone()
    _, key, value = row_blocks(layout)
    key_nonzero = value_nonzero = 0
    if not layout.rope:
        key_nonzero = int(bias[key].count_nonzero())
        bias[key] = 0
    out_bias = layer.c_proj_bias
    if out_bias is not None:
        value_nonzero = int(bias[value].count_nonzero())
        per_group = bias[value].reshape(layout.n_kv_head, 1, layout.head_dim)  # (G, 1, D)
        per_head = per_group.expand(-1, layout.heads_per_group, -1).reshape(-1)  # (H*D,): b_V^{g(h)} per head
        out_bias = out_bias + layer.c_proj_weight @ per_head  # b_O + sum_h W_O^h b_V^{g(h)}
        bias[value] = 0
    return (
        AttentionLayer(layer.c_attn_weight, bias, layer.c_proj_weight, out_bias),
        key_nonzero,
        value_nonzero,
    )


def checkpoint_layout(checkpoint: Checkpoint) -> AttentionLayout:
    """How the edits cut a checkpoint's attention into pairs (docs/design.md §9): a Llama-family folder's
    own grouped layout (:mod:`attnid.edits.hf_llama`); for nanoGPT and GPT-2 the ``(3E, E)`` multi-head
    block (``G = H``, ``D = E/H``), with RoPE where ``model_args`` say so."""
    if isinstance(checkpoint, LlamaCheckpoint):
        return checkpoint.layout
    first = checkpoint.attention_layer(0)
    n_embd = first.c_attn_weight.shape[1]
    rope, _ = attention_variant(checkpoint)
    return AttentionLayout(
        n_embd,
        checkpoint.n_head,
        checkpoint.n_head,
        n_embd // checkpoint.n_head,
        rope=rope,
        bias=first.c_attn_bias is not None,
    )


def checkpoint_shape(checkpoint: Checkpoint) -> counts.LayerShape:
    """counts.py's shape of one attention layer of the checkpoint (the closed forms' input): from
    ``config.json`` for a Llama-family folder (as ``attnid counts --hf-config`` reads it), else from
    :func:`checkpoint_layout` and whether ``c_proj`` has a bias."""
    if isinstance(checkpoint, LlamaCheckpoint):
        return checkpoint.shape
    layout = checkpoint_layout(checkpoint)
    return counts.layer_shape(
        layout.n_embd,
        layout.n_head,
        rope=layout.rope,
        bias=layout.bias,
        out_bias=checkpoint.attention_layer(0).c_proj_bias is not None,
    )


def layer_tensors_of(layers: list[AttentionLayer]) -> list[LayerTensors]:
    """Per layer ``(c_attn.weight, c_attn.bias, c_proj.weight)``: what :mod:`attnid.model.layout` cuts
    pairs from."""
    return [(layer.c_attn_weight, layer.c_attn_bias, layer.c_proj_weight) for layer in layers]


def balance_layers(
    layers: list[AttentionLayer], layout: AttentionLayout, targets: dict[str, torch.Tensor] | None = None
) -> int:
    """Move every pair of both circuits to imbalance 0 (or ``targets[circuit]``, ``(L*G, D, D)``), in place.

    Each circuit on its own orbit (:func:`attnid.model.layout.orbit_of` of ``layout``: ``GL_D``, or the RoPE
    commutant for RoPE query-key pairs; paper §5, docs/design.md §4, §8). Returns the number of pairs left
    alone because their product is nearly rank-deficient.
    """
    skipped, tensors = 0, layer_tensors_of(layers)
    for circuit in CIRCUITS:
        orbit = orbit_of(layout, circuit)
        pair_a, pair_b = stacked_pairs(tensors, layout, circuit)  # (L*G, D, n)
        target = None if targets is None else orbit.rebalance_target(targets[circuit].to(pair_a.dtype))
        moved = orbit.rebalance(pair_a, pair_b, target)
        skipped += int((~moved.done).sum())
        n_layer = len(layers)
        for layer, layer_a, layer_b in zip(
            tensors, moved.pair_a.chunk(n_layer), moved.pair_b.chunk(n_layer), strict=True
        ):
            write_layer_pairs(layer, layout, circuit, layer_a, layer_b)
    return skipped


def store_layers(checkpoint: Checkpoint, layers: list[AttentionLayer]) -> float:
    """Write edited float64 layers into the checkpoint in its stored dtype; the relative Frobenius error that
    rounding to that dtype causes, over every attention tensor (the part of the edit that is not exact)."""
    checkpoint.set_attention_layers(layers)
    error_sq = total_sq = 0.0
    for exact, stored in zip(layers, checkpoint.attention_layers(), strict=True):
        for exact_tensor, stored_tensor in zip(vars(exact).values(), vars(stored).values()):
            if exact_tensor is not None:
                error_sq += float((stored_tensor - exact_tensor).square().sum())
                total_sq += float(exact_tensor.square().sum())
    return math.sqrt(error_sq / total_sq) if total_sq > 0 else 0.0


def _summary(pairs_of_circuit) -> dict[str, float]:
    """``mu_qk``, ``mu_ov`` (excess norm on each circuit's orbit) and ``attn_norm``: the Frobenius norm of
    every pair entry (W_Q, W_K, W_V, W_O and the q/k/v biases; a GQA group's shared key or value counted
    once), which balancing minimises. ``pairs_of_circuit(circuit) -> (orbit, A, B)``, stacked pairs."""
    from attnid.measure.metrics import excess_norm

    row, total_sq = {}, 0.0
    for circuit in CIRCUITS:
        orbit, pair_a, pair_b = pairs_of_circuit(circuit)
        frobenius_sq, minimum = orbit.excess_norm_terms(pair_a, pair_b)
        row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
        total_sq += float(frobenius_sq.sum())
    row["attn_norm"] = math.sqrt(total_sq)
    return row


def pair_summary(layers: list[AttentionLayer], layout: AttentionLayout) -> dict[str, float]:
    """:func:`_summary` of layers cut by ``layout``, each circuit on its own orbit."""
    tensors = layer_tensors_of(layers)
    return _summary(lambda circuit: (orbit_of(layout, circuit), *stacked_pairs(tensors, layout, circuit)))


def redundant_bias_count(checkpoint: Checkpoint) -> dict[str, int | float]:
    """Biases that pruning removes, from the closed forms of :mod:`attnid.theory.counts` (§4.7): the
    unidentified key biases (none under RoPE) and, only where an output bias absorbs them, the value biases;
    and the ones it keeps: RoPE key biases (identified), value biases without an output bias."""
    shape = checkpoint_shape(checkpoint)
    folded = counts.unidentified_value_bias_params(shape) if shape.out_bias else 0  # fold only into a b_O
    per_layer = counts.unidentified_key_bias_params(shape) + folded
    attention = checkpoint.n_layer * counts.attention_params_per_layer(shape)
    key_biases, value_biases = shape.n_kv_head * shape.head_dim, shape.n_kv_head * shape.value_dim
    return {
        "redundant_params": checkpoint.n_layer * per_layer,
        "attention_params": attention,
        "redundant_share": checkpoint.n_layer * per_layer / attention,
        "unidentified_bias_params": checkpoint.n_layer * counts.unidentified_bias_params(shape),
        "key_biases_kept": checkpoint.n_layer * key_biases if shape.bias and shape.rope else 0,
        "value_biases_kept": checkpoint.n_layer * value_biases if shape.bias and not shape.out_bias else 0,
    }


# --------------------------------------------------------------------------------------
# variants this module does not edit
# --------------------------------------------------------------------------------------


def attention_variant(checkpoint: Checkpoint) -> tuple[bool, bool]:
    """``(rope, resized)`` from a nanoGPT checkpoint's ``model_args`` (GPT-2 folders have neither).

    ``resized``: grouped key/value heads (``n_kv_head != n_head``) or ``head_dim != E/H``,
    whose ``c_attn`` is not the ``(3E, E)`` block these edits slice.
    """
    if checkpoint.kind == HF_LLAMA:
        return True, False  # always RoPE; its grouped rows are cut by its own layout (checkpoint_layout)
    if checkpoint.kind != NANOGPT:
        return False, False
    args = checkpoint.payload["model_args"]
    kv_heads, head_dim = args.get("n_kv_head"), args.get("head_dim")
    resized = (kv_heads is not None and int(kv_heads) != checkpoint.n_head) or (
        head_dim is not None and int(head_dim) * checkpoint.n_head != checkpoint.n_embd
    )
    return bool(args.get("rope", False)), resized


def check_plain_layout(
    checkpoint: Checkpoint, command: str, allow_rope: bool, allow_resized: bool = False
) -> bool:
    rope, resized = attention_variant(checkpoint)
    if resized and not allow_resized:
        raise UserError(
            f"{checkpoint.path} has grouped key/value heads or a head_dim other than n_embd/n_head; "
            f"{command} edits the (3E, E) attention layout of nanoGPT and GPT-2 only"
        )
    if rope and not allow_rope:
        raise UserError(
            f"{checkpoint.path} uses RoPE, whose orbits are smaller (docs/design.md §8); "
            f"{command} moves pairs in the full GL_D orbit and would change the function"
        )
    return rope


# --------------------------------------------------------------------------------------
# the commands
# --------------------------------------------------------------------------------------


def stored_initial_imbalance(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    attnid_state = checkpoint.payload.get("attnid") if checkpoint.kind == NANOGPT else None
    tracker = attnid_state.get("tracker") if isinstance(attnid_state, dict) else None
    if not isinstance(tracker, dict) or "initial_imbalance" not in tracker:
        raise UserError(
            f"--target initial needs the initial imbalance I_0 that attnid train stores in its checkpoints; "
            f"{checkpoint.path} has none: use --target balanced"
        )
    initial = tracker["initial_imbalance"]
    head_dim = checkpoint.n_embd // checkpoint.n_head
    expected = (checkpoint.n_layer * checkpoint.n_head, head_dim, head_dim)
    for circuit in CIRCUITS:
        if tuple(initial[circuit].shape) != expected:
            raise UserError(
                f"{checkpoint.path}: stored I_0[{circuit}] has shape {tuple(initial[circuit].shape)}, "
                f"the model needs {expected}"
            )
    return initial


def _float64_model(checkpoint: Checkpoint):
    from attnid.model.gpt import model_from_checkpoint

    return model_from_checkpoint(dict(checkpoint.payload, model=checkpoint.tensors)).double().eval()


def orbit_summary(model: torch.nn.Module) -> dict[str, float]:
    """:func:`_summary` of any architecture, each circuit on the model's own orbit."""
    return _summary(
        lambda circuit: (
            orbit_of(model, circuit),
            *(torch.cat(part) for part in zip(*model_pairs(model, circuit))),
        )
    )


def balance_on_own_orbit(checkpoint: Checkpoint, target: str) -> dict:
    """Balance a grouped-query, RoPE or own-head-width checkpoint of ``attnid train`` on its
    architecture's own orbit (docs/design.md §8): :func:`attnid.model.moves.rebalance_model`, the move
    the rebalancing runs make, on a float64 copy of the model; the attention tensors are written back
    in their stored dtype."""
    if target != "balanced":
        raise UserError(
            f"{checkpoint.path} has grouped key/value heads or RoPE: balance it with --target balanced "
            f"(--target initial is for plain multi-head checkpoints)"
        )
    model = _float64_model(checkpoint)
    before = orbit_summary(model)
    skipped = sum(rebalance_model(model, circuit).skipped for circuit in CIRCUITS)
    moved = model.state_dict()
    for key, stored in checkpoint.tensors.items():
        name = key.removeprefix(COMPILED_PREFIX)
        if ".attn." in name and name in moved:
            checkpoint.tensors[key] = moved[name].to(stored.dtype).contiguous()
    after = orbit_summary(_float64_model(checkpoint))  # as stored (its dtype)
    return {
        "target": target,
        "orbit": "own",
        "skipped_pairs": skipped,
        **{f"{k}_before": v for k, v in before.items()},
        **{f"{k}_after": v for k, v in after.items()},
    }
