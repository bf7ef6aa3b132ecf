"""A step kept off the orbit: the ``adamw_projected`` intervention (docs/design.md §13).

After the optimizer has stepped, the realised change of every factor pair,
``(dA, dB) = (A_{t+1} - A_t, B_{t+1} - B_t)`` (weight decay and momentum included),
loses its orthogonal projection onto the orbit's tangent at the pre-step point
``(A_t, B_t)`` (docs/design.md §2.2, §8, on the architecture's own orbit:
:func:`attnid.model.layout.orbit_of`):

    (dA, dB)  ->  (dA, dB) - proj_{T(A_t, B_t)}(dA, dB)

What is left is orthogonal to the tangent, ``dA A_tᵀ = B_t dBᵀ``, so the first-order
part of the imbalance drift, ``L = (dA A_tᵀ - B_t dBᵀ) + (dA A_tᵀ - B_t dBᵀ)ᵀ``
(docs/design.md §7), is zero: the projected optimizer conserves the imbalance to
first order, as plain SGD does (Lemma 5.1). On a RoPE query-key orbit the step loses
its plane scaling and rotation parts and ``P(L) = 0``.

The circuits' pairs use disjoint rows of the attention tensors (query/key rows for
``qk``; value rows and ``c_proj`` for ``ov``), so projecting one circuit after the
other is the projection onto the whole model's orbit tangent. ``c_proj.bias`` and
everything outside attention belong to no pair and keep their step.

The maths runs in float64 for a float64 model and in float32 otherwise: the kept step of a
float32 model is rounded to float32 when it is written back, so its ρ sits at the float32 floor
whichever precision solved for it, and the float32 solve costs about half as much
(docs/design.md §13).
"""

from __future__ import annotations

import torch

from attnid.model.layout import (
    LayerTensors,
    attention_tensors,
    layout_of,
    orbit_of,
    stacked_pairs,
    write_layer_pairs,
)
from attnid.theory.circuits import CIRCUITS


@torch.no_grad()
def remove_orbit_component(
    model: torch.nn.Module, pre: list[LayerTensors]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Take the orbit component out of the step the model's attention tensors made since ``pre``, in place.

    ``pre`` is a float64 copy of every layer's ``(c_attn.weight, c_attn.bias, c_proj.weight)`` taken right
    before ``optimizer.step()`` (:func:`attnid.measure.drift.attention_snapshot`), on the model's device.
    The maths runs there in :func:`solve_dtype`; the corrected weights are cast back to each tensor's dtype.

    Returns per circuit ``(removed_sq, step_sq)``, two 0-dim tensors (no host sync): the squared norm of
    the removed tangent component and of the optimizer's whole step, summed over pairs. Their ratio is the
    ρ the step had before the projection (docs/design.md §3.1).
    """
    layout, tensors = layout_of(model), attention_tensors(model)
    n_layer, dtype = len(tensors), solve_dtype(tensors)
    removed: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for circuit in CIRCUITS:
        pre_a, pre_b = stacked_pairs(pre, layout, circuit, dtype)  # (L*G, D, n_a), (L*G, D, n_b)
        now_a, now_b = stacked_pairs(tensors, layout, circuit, dtype)
        # float64: exact; float32: one rounding, smaller than the write-back's
        step_a, step_b = now_a - pre_a, now_b - pre_b
        along_a, along_b = orbit_of(model, circuit).tangent_projection(pre_a, pre_b, step_a, step_b)
        kept_a, kept_b = now_a - along_a, now_b - along_b
        for layer, a, b in zip(tensors, kept_a.chunk(n_layer), kept_b.chunk(n_layer), strict=True):
            write_layer_pairs(layer, layout, circuit, a, b)
        removed[circuit] = (
            along_a.square().sum() + along_b.square().sum(),
            step_a.square().sum() + step_b.square().sum(),
        )
    return removed


def solve_dtype(tensors: list[LayerTensors]) -> torch.dtype:
    """float64 when any attention weight is float64, else float32 (see the module docstring)."""
    weights = [t for layer in tensors for t in layer if t is not None]
    return torch.float64 if any(t.dtype == torch.float64 for t in weights) else torch.float32
