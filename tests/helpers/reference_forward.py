"""An independent nanoGPT forward from a raw state dict, to check attnid's model and edits against."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def reference_logits(sd: dict, args: dict, idx: torch.Tensor) -> torch.Tensor:
    """An independent nanoGPT forward from the raw state dict: explicit matmuls and a masked softmax."""
    E, H = args["n_embd"], args["n_head"]
    D = E // H
    B, T = idx.shape

    def get(name):
        return sd.get(name)

    def layer_norm(x, prefix):
        return F.layer_norm(x, (E,), get(prefix + ".weight"), get(prefix + ".bias"), 1e-5)

    def linear(x, prefix):
        y = x @ get(prefix + ".weight").T
        bias = get(prefix + ".bias")
        return y if bias is None else y + bias

    x = get("transformer.wte.weight")[idx] + get("transformer.wpe.weight")[:T]  # (B, T, E)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}"
        qkv = linear(layer_norm(x, p + ".ln_1"), p + ".attn.c_attn")  # (B, T, 3E)
        q, k, v = (t.reshape(B, T, H, D).permute(0, 2, 1, 3) for t in qkv.split(E, dim=2))  # (B, H, T, D)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)  # (B, H, T, T)
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (weights @ v).permute(0, 2, 1, 3).reshape(B, T, E)
        x = x + linear(y, p + ".attn.c_proj")
        h = linear(layer_norm(x, p + ".ln_2"), p + ".mlp.c_fc")
        x = x + linear(F.gelu(h), p + ".mlp.c_proj")
    x = layer_norm(x, "transformer.ln_f")
    return x @ get("lm_head.weight").T  # (B, T, V)
