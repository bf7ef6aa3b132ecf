"""AdamW's moments across a rebalance: ``--rebalance-moments {keep,transport,reset}`` (docs/design.md §15).

A rebalance moves every attention pair along its orbit, ``A -> S A``, ``B -> S^{-T} B``
(docs/design.md §4, §8), and keeps the function. The gradient of any loss moves
contragrediently: with ``G_A = B Fᵀ``, ``G_B = A F`` (``F`` the loss's gradient in the
product ``Aᵀ B``, unchanged by the move),

    G_A -> S^{-T} G_A,      G_B -> S G_B,

so a first moment ``m`` (an average of past gradients) is mapped the same way
(``transport``): it then points where those gradients would point at the moved
weights. The second moment ``v`` (an average of squared gradient *entries*) has no
exact image, because ``(S^{-T} g)_i^2 = Σ_kl S^{-T}_ik S^{-T}_il g_k g_l`` needs the
cross terms ``E[g_k g_l]`` that Adam does not keep. ``transport`` maps it by the
entrywise square of the same matrix, ``v -> (S^{-T} ∘ S^{-T}) v``: exact when ``S`` is
diagonal (every move on a RoPE query-key orbit is a per-plane scaling), and otherwise
the value for uncorrelated gradient entries; it is non-negative as ``v`` must be. The
step counter (Adam's bias correction) is kept. ``keep`` leaves both moments as they
are (the paper's rebalancing), ``reset`` drops the attention tensors' state (Adam
starts over on them).

``S`` is read off the move itself, ``S = A' A^+`` and ``S^{-T} = B' B^+`` (least
squares; a pair the move left alone gives ``I``), so this works for any orbit's move.
"""

from __future__ import annotations

import torch

from attnid.model.layout import (
    LayerTensors,
    attention_blocks,
    attention_tensors,
    layout_of,
    stacked_pairs,
    write_layer_pairs,
)
from attnid.theory.circuits import CIRCUITS

# AdamW's state entries: the first moment moves like a gradient, the second like its entrywise square
MOMENT_POWERS = {"exp_avg": 1, "exp_avg_sq": 2}


def move_element(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``T`` ``(..., D, D)`` with ``after = T before``, for factors ``(..., D, n)`` of full row rank:
    ``after before^+`` by least squares."""
    return torch.linalg.lstsq(before.transpose(-1, -2), after.transpose(-1, -2)).solution.transpose(-1, -2)


def transported_pair(
    element_a: torch.Tensor,
    element_b: torch.Tensor,
    moment_a: torch.Tensor,
    moment_b: torch.Tensor,
    power: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair's moments after the move ``A -> T_a A``, ``B -> T_b B`` (``T_b = T_a^{-T}``): the ``A`` side
    moves by ``T_b = S^{-T}``, the ``B`` side by ``T_a = S`` (module docstring); ``power`` 2 takes the
    entrywise square of each matrix (the second moment)."""
    map_a, map_b = (element_b, element_a) if power == 1 else (element_b.square(), element_a.square())
    return map_a @ moment_a, map_b @ moment_b


def _moment_tensors(optimizer, layer_params: LayerTensors, key: str) -> LayerTensors:
    weight, bias, proj = layer_params
    state = optimizer.state
    return (state[weight][key], None if bias is None else state[bias][key], state[proj][key])


@torch.no_grad()
def transport_moments(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, before: list[LayerTensors]
) -> None:
    """Map AdamW's moments of the attention tensors with the orbit move from ``before`` (a float64 snapshot,
    :func:`attnid.measure.drift.attention_snapshot`, taken right before the move) to the model's weights now,
    in place (docs/design.md §15). Tensors without state (no step yet) are left alone."""
    layout, params = layout_of(model), attention_tensors(model)
    if not all(
        tensor in optimizer.state and "exp_avg" in optimizer.state[tensor]
        for layer in params
        for tensor in layer
        if tensor is not None
    ):
        return
    n_layer = len(params)
    for circuit in CIRCUITS:
        pre_a, pre_b = stacked_pairs(before, layout, circuit)  # (L*G, D, n)
        post_a, post_b = stacked_pairs(params, layout, circuit)
        element_a, element_b = move_element(pre_a, post_a), move_element(pre_b, post_b)
        for key, power in MOMENT_POWERS.items():
            moments = [_moment_tensors(optimizer, layer, key) for layer in params]
            moment_a, moment_b = stacked_pairs(moments, layout, circuit)
            new_a, new_b = transported_pair(element_a, element_b, moment_a, moment_b, power)
            for layer, a, b in zip(moments, new_a.chunk(n_layer), new_b.chunk(n_layer), strict=True):
                write_layer_pairs(layer, layout, circuit, a, b)


def reset_moments(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """Drop the optimizer state of every attention parameter (``--rebalance-moments reset``)."""
    for block in attention_blocks(model):
        for param in block.attn.parameters():
            optimizer.state.pop(param, None)
