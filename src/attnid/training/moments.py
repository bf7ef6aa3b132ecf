"""AdamW's moments across a rebalance: ``--rebalance-moments {keep,first-moment,reset}`` (docs/design.md §15).

A rebalance moves every attention pair along its orbit, ``A -> S A``, ``B -> S^{-T} B``
(docs/design.md §4, §8), and keeps the function. The gradient of any loss moves
contragrediently: with ``G_A = B Fᵀ``, ``G_B = A F`` (``F`` the loss's gradient in the
product ``Aᵀ B``, unchanged by the move),

    G_A -> S^{-T} G_A,      G_B -> S G_B,

so AdamW's first moment ``m``, a linear average of past gradients, has an exact image: the
same map (``first-moment``). Its second moment ``v`` averages squared gradient *entries*, and
``(S^{-T} g)_i^2 = Σ_kl S^{-T}_ik S^{-T}_il g_k g_l`` is a function of the squares ``g_k^2`` for
every ``g`` only when each row of ``S^{-T}`` has one nonzero entry (``S`` a scaled permutation).
A rebalance's ``S`` is not one (except on a RoPE query-key orbit, where it is diagonal), so no
rule maps ``v`` exactly and ``first-moment`` leaves it as it is, with Adam's step counter (its bias
correction): the nearest rebalance keeps ``S`` close to ``I`` (docs/design.md §4), so ``v`` stays
close to what the moved coordinates would have averaged. ``keep`` leaves both moments as they
are (the paper's rebalancing), ``reset`` drops the attention tensors' state (Adam starts over
on them, step counter included).

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


def move_element(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``T`` ``(..., D, D)`` with ``after = T before``, for factors ``(..., D, n)`` of full row rank:
    ``after before^+`` by least squares."""
    return torch.linalg.lstsq(before.transpose(-1, -2), after.transpose(-1, -2)).solution.transpose(-1, -2)


def transported_first_moment(
    element_a: torch.Tensor, element_b: torch.Tensor, moment_a: torch.Tensor, moment_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair's first moments after the move ``A -> T_a A``, ``B -> T_b B`` (``T_b = T_a^{-T}``): a gradient
    of ``A`` moves by ``T_b = S^{-T}``, one of ``B`` by ``T_a = S`` (module docstring)."""
    return element_b @ moment_a, element_a @ moment_b


def _moment_tensors(optimizer, layer_params: LayerTensors, key: str) -> LayerTensors:
    weight, bias, proj = layer_params
    state = optimizer.state
    return (state[weight][key], None if bias is None else state[bias][key], state[proj][key])


@torch.no_grad()
def transport_first_moment(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, before: list[LayerTensors]
) -> None:
    """Map AdamW's first moment of the attention tensors with the orbit move from ``before`` (a float64
    snapshot, :func:`attnid.measure.drift.attention_snapshot`, taken right before the move) to the model's
    weights now, in place; the second moment and the step counter stay (docs/design.md §15). Tensors
    without state (no step yet) are left alone."""
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
        moments = [_moment_tensors(optimizer, layer, "exp_avg") for layer in params]
        moment_a, moment_b = stacked_pairs(moments, layout, circuit)
        new_a, new_b = transported_first_moment(element_a, element_b, moment_a, moment_b)
        for layer, a, b in zip(moments, new_a.chunk(n_layer), new_b.chunk(n_layer), strict=True):
            write_layer_pairs(layer, layout, circuit, a, b)


def reset_moments(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """Drop the optimizer state of every attention parameter (``--rebalance-moments reset``)."""
    for block in attention_blocks(model):
        for param in block.attn.parameters():
            optimizer.state.pop(param, None)
