"""Tiny checkpoints for the alignment tests (tests/edits/): a random nanoGPT model with noisy biases, and a
planted element of every class of a model's symmetry orbit, any family (docs/design.md §17)."""

from __future__ import annotations

import torch

from attnid.edits.checkpoints import load_checkpoint, save_checkpoint
from attnid.edits.planted import random_group_element
from attnid.edits.whole_checkpoint import (
    checkpoint_copy,
    read_whole_checkpoint,
    write_whole_checkpoint,
)
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


def plant_folder(source, target, seed: int, gl: bool = False, stream: bool = False) -> None:
    """``target`` (a nanoGPT file or a Hugging Face folder, as ``source``): ``g`` times the model at
    ``source`` (:func:`random_group_element`), written in ``source``'s format and dtype."""
    checkpoint = load_checkpoint(source)
    whole = random_group_element(read_whole_checkpoint(checkpoint), seed, gl, stream)
    copy = checkpoint_copy(checkpoint)
    write_whole_checkpoint(copy, whole)
    save_checkpoint(copy, target)


def plant_orbit_element(source, target, seed: int) -> None:
    """``target``: ``g`` times the nanoGPT model at ``source``, ``g`` a random element of every class."""
    plant_folder(source, target, seed)
