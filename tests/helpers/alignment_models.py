"""Tiny nanoGPT checkpoints for the alignment tests (tests/edits/): a random model with noisy biases, and a
planted element of every class of its symmetry orbit (docs/design.md §17)."""

from __future__ import annotations

import torch

from attnid.edits.alignment import permute_heads, permute_mlp
from attnid.edits.checkpoints import load_checkpoint
from attnid.edits.orbit_moves import move_query_key, move_value_output
from attnid.edits.orthogonal import haar_orthogonal
from attnid.edits.whole_checkpoint import checkpoint_copy, read_whole_checkpoint, write_whole_checkpoint
from attnid.model.gpt import GPT, GPTConfig

N_LAYER, N_HEAD, N_EMBD = 2, 4, 32


def save_model(path, seed: int, n_head: int = N_HEAD, bias: bool = True, **variant):
    torch.manual_seed(seed)
    config = GPTConfig(
        block_size=32, vocab_size=65, n_layer=N_LAYER, n_head=n_head, n_embd=N_EMBD, dropout=0.0
    )
    config.bias = bias
    for key, value in variant.items():
        setattr(config, key, value)
    model = GPT(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.3)
    state = {k: v.to(torch.float64) for k, v in model.state_dict().items()}
    torch.save({"model_args": config.model_args(), "model": state}, path)
    return path


def plant_orbit_element(source, target, seed: int) -> None:
    """``target``: ``g`` times the model at ``source``, ``g`` a random element of every class."""
    generator = torch.Generator().manual_seed(seed)
    checkpoint = load_checkpoint(source)
    whole = read_whole_checkpoint(checkpoint)
    d = N_EMBD // N_HEAD
    for layer in range(N_LAYER):
        permute_heads(whole, layer, torch.randperm(N_HEAD, generator=generator).tolist())
        hidden = whole.params[f"h{layer}.mlp.w_fc"].shape[0]
        permute_mlp(whole, layer, torch.randperm(hidden, generator=generator).tolist())
    for move in (move_value_output, move_query_key):
        moves = [torch.stack([haar_orthogonal(d, generator) for _ in range(N_HEAD)]) for _ in range(N_LAYER)]
        whole = move(whole, moves)
    copy = checkpoint_copy(checkpoint)
    write_whole_checkpoint(copy, whole)
    torch.save(dict(copy.payload, model=copy.tensors), target)
