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
  change a RoPE model's function.

Each command proves its edit: logits and loss on a held-out batch before and after,
the "after" model being loaded back from the written file (nanoGPT: our
``load_nanogpt_checkpoint``; Hugging Face: ``GPT2LMHeadModel.from_pretrained``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from attnid import orbits, symmetry
from attnid.checkpoints import (NANOGPT, AttentionLayer, Checkpoint, check_output_path, load_checkpoint,
                                save_checkpoint)
from attnid.errors import UserError
from attnid.model import COMPILED_PREFIX
from attnid.symmetry import CIRCUITS

BALANCE_TARGETS = ("balanced", "initial")


# --------------------------------------------------------------------------------------
# the edits (pure functions on float64 layers in nanoGPT's layout)
# --------------------------------------------------------------------------------------

def prune_layer_biases(layer: AttentionLayer, rope: bool = False) -> tuple[AttentionLayer, int, int]:
    """Zero the key biases (not under RoPE) and fold the value biases into the output bias (where it exists).

    Returns the edited layer (a copy) and how many key and value biases were non-zero
    before. Exact: ``W_O b_V`` is added in float64.
    """
    if layer.c_attn_bias is None:
        return layer, 0, 0
    n_embd = layer.c_attn_weight.shape[1]
    bias = layer.c_attn_bias.clone()
    key, value = slice(n_embd, 2 * n_embd), slice(2 * n_embd, 3 * n_embd)
    key_nonzero = value_nonzero = 0
    if not rope:
        key_nonzero = int(bias[key].count_nonzero())
        bias[key] = 0
    out_bias = layer.c_proj_bias
    if out_bias is not None:
        value_nonzero = int(bias[value].count_nonzero())
        out_bias = out_bias + layer.c_proj_weight @ bias[value]  # b_O + sum_h W_O^h b_V^h
        bias[value] = 0
    return AttentionLayer(layer.c_attn_weight, bias, layer.c_proj_weight, out_bias), key_nonzero, value_nonzero


def _write_pair(layer: AttentionLayer, circuit: str, pair_a: torch.Tensor, pair_b: torch.Tensor) -> None:
    """Inverse of :func:`attnid.symmetry.pairs_from_tensors` for one layer, in place (float64 copies)."""
    n_embd = layer.c_attn_weight.shape[1]
    blocks = [(0, pair_a), (n_embd, pair_b)] if circuit == "qk" else [(2 * n_embd, pair_a)]
    for row0, pair in blocks:
        layer.c_attn_weight[row0:row0 + n_embd] = pair[..., :n_embd].reshape(n_embd, n_embd)  # (H, D, E) -> (E, E)
        if layer.c_attn_bias is not None:
            layer.c_attn_bias[row0:row0 + n_embd] = pair[..., n_embd].reshape(n_embd)
    if circuit == "ov":
        layer.c_proj_weight = pair_b.reshape(n_embd, -1).t().clone()  # (H, D, E_out) -> (E_in, E_out) -> W_O


def balance_layers(layers: list[AttentionLayer], n_head: int,
                   targets: dict[str, torch.Tensor] | None = None) -> int:
    """Move every pair of both circuits to imbalance 0 (or ``targets[circuit]``, ``(L*H, D, D)``), in place.

    Uses :func:`attnid.symmetry.rebalance_pairs` (paper §5). Returns the number of
    pairs left alone because their product is nearly rank-deficient.
    """
    skipped = 0
    for circuit in CIRCUITS:
        pairs = [symmetry.pairs_from_tensors(layer.c_attn_weight, layer.c_attn_bias, layer.c_proj_weight,
                                             n_head, circuit) for layer in layers]
        pair_a, pair_b = torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])  # (L*H, D, n)
        head_dim = pair_a.shape[-2]
        target = torch.zeros(pair_a.shape[0], head_dim, head_dim, dtype=pair_a.dtype) if targets is None \
            else targets[circuit].to(pair_a.dtype)
        new_a, new_b, done = symmetry.rebalance_pairs(pair_a, pair_b, target)
        skipped += int((~done).sum())
        for layer, layer_a, layer_b in zip(layers, new_a.chunk(len(layers)), new_b.chunk(len(layers)), strict=True):
            _write_pair(layer, circuit, layer_a, layer_b)
    return skipped


def pair_summary(layers: list[AttentionLayer], n_head: int) -> dict[str, float]:
    """``mu_qk``, ``mu_ov`` (excess norm on the orbit) and ``attn_norm``: the Frobenius norm of every
    pair entry (W_Q, W_K, W_V, W_O and the q/k/v biases), which balancing minimises."""
    from attnid.metrics import excess_norm

    row, total_sq = {}, 0.0
    for circuit in CIRCUITS:
        pairs = [symmetry.pairs_from_tensors(layer.c_attn_weight, layer.c_attn_bias, layer.c_proj_weight,
                                             n_head, circuit) for layer in layers]
        frobenius_sq, twice_nuclear = symmetry.excess_norm_terms(torch.cat([a for a, _ in pairs]),
                                                                 torch.cat([b for _, b in pairs]))
        row[f"mu_{circuit}"] = excess_norm(frobenius_sq, twice_nuclear)
        total_sq += float(frobenius_sq.sum())
    row["attn_norm"] = math.sqrt(total_sq)
    return row


def redundant_bias_count(checkpoint: Checkpoint, rope: bool = False) -> dict[str, int | float]:
    """Biases that pruning makes redundant, from the closed forms of :mod:`attnid.counts` (§4.7)."""
    from attnid import counts

    first = checkpoint.attention_layer(0)
    shape = counts.layer_shape(checkpoint.n_embd, checkpoint.n_head, rope=rope, bias=first.c_attn_bias is not None,
                               out_bias=first.c_proj_bias is not None)
    folded = counts.unidentified_value_bias_params(shape) if shape.out_bias else 0  # fold only into a b_O
    per_layer = counts.unidentified_key_bias_params(shape) + folded
    attention = checkpoint.n_layer * counts.attention_params_per_layer(shape)
    return {"redundant_params": checkpoint.n_layer * per_layer, "attention_params": attention,
            "redundant_share": checkpoint.n_layer * per_layer / attention}


# --------------------------------------------------------------------------------------
# variants this module does not edit
# --------------------------------------------------------------------------------------

def attention_variant(checkpoint: Checkpoint) -> tuple[bool, bool]:
    """``(rope, resized)`` from a nanoGPT checkpoint's ``model_args`` (GPT-2 folders have neither).

    ``resized``: grouped key/value heads (``n_kv_head != n_head``) or ``head_dim != E/H``,
    whose ``c_attn`` is not the ``(3E, E)`` block these edits slice.
    """
    if checkpoint.kind != NANOGPT:
        return False, False
    args = checkpoint.payload["model_args"]
    kv_heads, head_dim = args.get("n_kv_head"), args.get("head_dim")
    resized = (kv_heads is not None and int(kv_heads) != checkpoint.n_head) or \
        (head_dim is not None and int(head_dim) * checkpoint.n_head != checkpoint.n_embd)
    return bool(args.get("rope", False)), resized


def check_plain_layout(checkpoint: Checkpoint, command: str, allow_rope: bool, allow_resized: bool = False) -> bool:
    rope, resized = attention_variant(checkpoint)
    if resized and not allow_resized:
        raise UserError(f"{checkpoint.path} has grouped key/value heads or a head_dim other than n_embd/n_head; "
                        f"{command} edits the (3E, E) attention layout of nanoGPT and GPT-2 only")
    if rope and not allow_rope:
        raise UserError(f"{checkpoint.path} uses RoPE, whose orbits are smaller (docs/design.md §8); "
                        f"{command} moves pairs in the full GL_D orbit and would change the function")
    return rope


# --------------------------------------------------------------------------------------
# the commands
# --------------------------------------------------------------------------------------

def add_edit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path,
                        help="nanoGPT ckpt.pt, or a Hugging Face GPT-2 folder (config.json + model.safetensors "
                             "or pytorch_model.bin)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the edited copy, in the same format")
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    from attnid.heldout import add_heldout_arguments

    add_heldout_arguments(parser)


def add_prune_biases_arguments(parser: argparse.ArgumentParser) -> None:
    add_edit_arguments(parser)


def add_balance_arguments(parser: argparse.ArgumentParser) -> None:
    add_edit_arguments(parser)
    parser.add_argument("--target", choices=BALANCE_TARGETS, default="balanced",
                        help="imbalance to move every pair to: 0 ('balanced', mu = 0) or the I_0 that "
                             "attnid train stored ('initial') (default: %(default)s)")


def _initial_imbalance(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    attnid_state = checkpoint.payload.get("attnid") if checkpoint.kind == NANOGPT else None
    tracker = attnid_state.get("tracker") if isinstance(attnid_state, dict) else None
    if not isinstance(tracker, dict) or "initial_imbalance" not in tracker:
        raise UserError(f"--target initial needs the initial imbalance I_0 that attnid train stores in its checkpoints; "
                        f"{checkpoint.path} has none: use --target balanced")
    initial = tracker["initial_imbalance"]
    head_dim = checkpoint.n_embd // checkpoint.n_head
    expected = (checkpoint.n_layer * checkpoint.n_head, head_dim, head_dim)
    for circuit in CIRCUITS:
        if tuple(initial[circuit].shape) != expected:
            raise UserError(f"{checkpoint.path}: stored I_0[{circuit}] has shape {tuple(initial[circuit].shape)}, "
                            f"the model needs {expected}")
    return initial


def _edit_and_prove(args, command: str, edit, allow_rope: bool, allow_resized: bool = False) -> dict:
    """Load, measure, edit (``edit(checkpoint, rope) -> report fields``), save, reload, measure; the report."""
    from attnid.heldout import compare, evaluate, heldout_batch, load_for_eval

    check_output_path(args.checkpoint, args.out)
    checkpoint = load_checkpoint(args.checkpoint)
    rope = check_plain_layout(checkpoint, command, allow_rope, allow_resized)
    batch, token_source = heldout_batch(checkpoint, args)
    loss_before, logits_before = evaluate(load_for_eval(checkpoint), batch)
    report = {"command": command, "input": str(args.checkpoint), "output": str(args.out), "format": checkpoint.kind,
              "n_layer": checkpoint.n_layer, "n_head": checkpoint.n_head, "n_embd": checkpoint.n_embd,
              "bias": checkpoint.attention_layer(0).c_attn_bias is not None}
    report.update(edit(checkpoint, rope))
    save_checkpoint(checkpoint, args.out, record={k: v for k, v in report.items() if k not in ("input", "output")})
    loss_after, logits_after = evaluate(load_for_eval(load_checkpoint(args.out)), batch)
    report.update({"tokens": token_source, "sequences": int(batch.shape[0]), "length": int(batch.shape[1] - 1)})
    report.update(compare(loss_before, logits_before, loss_after, logits_after))
    return report


def _finish(report: dict, json_path: Path | None, lines: list[str]) -> int:
    from attnid.files import write_json_atomic

    lines += [f"held-out batch: {report['sequences']} x {report['length']} tokens ({report['tokens']})",
              f"loss {report['loss_before']:.6f} -> {report['loss_after']:.6f} (change {report['loss_change']:+.3g}); "
              f"max relative logit change {report['max_rel_logit_change']:.3g}",
              f"wrote {report['output']}"]
    print("\n".join(lines))
    if json_path is not None:
        write_json_atomic(json_path, report)
    return 0


def run_prune_biases(args) -> int:
    def edit(checkpoint: Checkpoint, rope: bool) -> dict:
        edited = [prune_layer_biases(layer, rope) for layer in checkpoint.attention_layers()]
        checkpoint.set_attention_layers([layer for layer, _, _ in edited])
        return {**redundant_bias_count(checkpoint, rope), "rope": rope,
                "nonzero_key_biases_zeroed": sum(k for _, k, _ in edited),
                "nonzero_value_biases_folded": sum(v for _, _, v in edited)}

    report = _edit_and_prove(args, "prune-biases", edit, allow_rope=True)
    lines = [f"{report['format']} model, {report['n_layer']} layers x {report['n_head']} heads, E={report['n_embd']}, "
             f"attention biases: {'yes' if report['bias'] else 'none (nothing to prune)'}",
             f"redundant biases set to 0: {report['redundant_params']:,} of {report['attention_params']:,} attention "
             f"parameters ({100 * report['redundant_share']:.3f} %); non-zero before: "
             f"{report['nonzero_key_biases_zeroed']:,} key, {report['nonzero_value_biases_folded']:,} value"]
    return _finish(report, args.json, lines)


def _float64_model(checkpoint: Checkpoint):
    from attnid.model import model_from_checkpoint

    return model_from_checkpoint(dict(checkpoint.payload, model=checkpoint.tensors)).double().eval()


def orbit_summary(model) -> dict[str, float]:
    """:func:`pair_summary` for any architecture: ``mu_qk``, ``mu_ov`` on the model's own orbit and ``attn_norm``,
    the Frobenius norm of every pair entry (a GQA group's shared key or value counted once)."""
    from attnid.metrics import excess_norm

    row, total_sq = {}, 0.0
    for circuit in CIRCUITS:
        kind = orbits.orbit_kind(model, circuit)
        pair_a, pair_b = (torch.cat(part) for part in zip(*orbits.model_pairs(model, circuit)))
        frobenius_sq, minimum = orbits.excess_norm_terms(kind, pair_a, pair_b)
        row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
        total_sq += float(frobenius_sq.sum())
    row["attn_norm"] = math.sqrt(total_sq)
    return row


def balance_on_own_orbit(checkpoint: Checkpoint, target: str) -> dict:
    """Balance a grouped-query, RoPE or own-head-width checkpoint of ``attnid train`` on its architecture's own
    orbit (docs/design.md §8): :func:`attnid.orbits.rebalance_model`, the move the rebalancing runs make, on a
    float64 copy of the model; the attention tensors are written back in their stored dtype."""
    if target != "balanced":
        raise UserError(f"{checkpoint.path} has grouped key/value heads or RoPE: balance it with --target balanced "
                        f"(--target initial is for plain multi-head checkpoints)")
    model = _float64_model(checkpoint)
    before = orbit_summary(model)
    skipped = sum(orbits.rebalance_model(model, circuit).skipped for circuit in CIRCUITS)
    moved = model.state_dict()
    for key, stored in checkpoint.tensors.items():
        name = key.removeprefix(COMPILED_PREFIX)
        if ".attn." in name and name in moved:
            checkpoint.tensors[key] = moved[name].to(stored.dtype).contiguous()
    after = orbit_summary(_float64_model(checkpoint))  # as stored (its dtype)
    return {"target": target, "orbit": "own", "skipped_pairs": skipped, **{f"{k}_before": v for k, v in before.items()},
            **{f"{k}_after": v for k, v in after.items()}}


def run_balance(args) -> int:
    def edit(checkpoint: Checkpoint, rope: bool) -> dict:
        if rope or attention_variant(checkpoint)[1]:
            return balance_on_own_orbit(checkpoint, args.target)
        targets = _initial_imbalance(checkpoint) if args.target == "initial" else None
        layers = checkpoint.attention_layers()
        before = pair_summary(layers, checkpoint.n_head)
        skipped = balance_layers(layers, checkpoint.n_head, targets)
        checkpoint.set_attention_layers(layers)
        after = pair_summary(checkpoint.attention_layers(), checkpoint.n_head)  # as stored (its dtype)
        return {"target": args.target, "skipped_pairs": skipped, **{f"{k}_before": v for k, v in before.items()},
                **{f"{k}_after": v for k, v in after.items()}}

    report = _edit_and_prove(args, "balance", edit, allow_rope=True, allow_resized=True)
    lines = [f"{report['format']} model, {report['n_layer']} layers x {report['n_head']} heads, E={report['n_embd']}; "
             f"target {report['target']}, {report['skipped_pairs']} pair(s) skipped (near rank-deficient)",
             f"mu_qk {report['mu_qk_before']:.4g} -> {report['mu_qk_after']:.4g}; "
             f"mu_ov {report['mu_ov_before']:.4g} -> {report['mu_ov_after']:.4g}",
             f"attention weight norm {report['attn_norm_before']:.6g} -> {report['attn_norm_after']:.6g}"]
    return _finish(report, args.json, lines)

