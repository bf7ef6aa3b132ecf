"""A whole model on its orbit: the orbit's dimension at the model's weights, and moves along it.

Every move keeps the model's function (up to round-off) because it acts on each factor pair
by its architecture's own symmetry group (:func:`attnid.model.layout.orbit_of`;
docs/design.md §4, §8):

- :func:`rebalance_model`: every pair of one circuit moved to a target conserved imbalance
  (the rebalancing cases' periodic step, ``attnid balance``): the maths, :func:`move_pairs`, then
  :func:`write_move`; the τ probe makes the two apart (the maths on the metrics thread, the move
  written into a copy of the model);
- :func:`kept_attention_weights`: a context that restores the attention tensors bit for bit,
  so that a move inside it is a probe only.

:func:`orbit_dimension` measures the orbit's dimension at a model's weights (the rank of the
tangent map), to compare with :mod:`attnid.theory.counts`' closed forms (``attnid inspect``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attnid.model.layout import (
    ModelOrConfig,
    attention_blocks,
    attention_tensors,
    layer_pairs,
    layout_of,
    model_pairs,
    orbit_of,
    stacked_pairs,
    write_pairs_back,
)
from attnid.model.options import REBALANCE_TARGETS
from attnid.theory import counts
from attnid.theory.circuits import CIRCUITS
from attnid.theory.orbits import Orbit, RebalanceTarget
from attnid.theory.shape import check_closed_form_domain

# --------------------------------------------------------------------------------------
# Orbit dimension (compare with counts.py's closed forms)
# --------------------------------------------------------------------------------------


def orbit_dimension(model_or_config: ModelOrConfig, layer: int, circuit: str) -> int:
    """Dimension of the orbit of one layer's pairs of one circuit under the architecture's group.

    For a model, the rank of the tangent map at its weights; for a GPTConfig, the
    generic value. Equals counts.unidentified_qk_params / unidentified_ov_params of
    :func:`attnid.model.layout.layout_of`'s shape (``H D^2`` MHA, ``G D^2`` GQA, ``G D`` RoPE
    query-key; ``G D^2`` output-value) at any point where the Gram matrices are nonsingular.
    """
    orbit = orbit_of(model_or_config, circuit)
    if hasattr(model_or_config, "transformer") or hasattr(model_or_config, "module"):
        return orbit.tangent_rank(*layer_pairs(model_or_config, layer, circuit))
    layout = layout_of(model_or_config)
    if not 0 <= layer < model_or_config.n_layer:
        raise ValueError(f"layer {layer} out of range for n_layer={model_or_config.n_layer}")
    columns = layout.n_embd + (1 if layout.bias else 0)
    if circuit == "qk":
        n_a, n_b = layout.heads_per_group * columns, columns
    else:
        n_a, n_b = columns, layout.heads_per_group * layout.n_embd
    return layout.n_kv_head * orbit.generic_dimension(layout.head_dim, n_a, n_b)


def orbit_dimension_rows(model: torch.nn.Module) -> list[dict]:
    """Per layer and circuit: the orbit's name, its dimension at the model's weights and
    counts.py's closed form for the layer shape (for ``attnid inspect``)."""
    shape = check_closed_form_domain(layout_of(model))
    closed_form = {"qk": counts.unidentified_qk_params(shape), "ov": counts.unidentified_ov_params(shape)}
    return [
        {
            "layer": layer,
            "circuit": circuit,
            "orbit": orbit_of(model, circuit).name,
            "orbit_dimension": orbit_dimension(model, layer, circuit),
            "closed_form": closed_form[circuit],
        }
        for layer in range(len(attention_blocks(model)))
        for circuit in CIRCUITS
    ]


# --------------------------------------------------------------------------------------
# Whole-model moves (rebalancing, and the tau probe's move-and-restore)
# --------------------------------------------------------------------------------------


def initial_conserved(model: torch.nn.Module, circuit: str) -> torch.Tensor:
    """The conserved imbalance of every pair of one circuit, stacked ``(L, G, D, D)``:
    the target that :func:`rebalance_model` restores (beta's reference ``I_0``)."""
    orbit = orbit_of(model, circuit)
    return torch.stack([orbit.conserved_imbalance(a, b) for a, b in model_pairs(model, circuit)])


def prepared_target(orbit: Orbit, initial: torch.Tensor, target: str) -> RebalanceTarget:
    """The prepared target of :func:`rebalance_model` for a run's rebalancing target (docs/design.md §4):
    ``"initial"`` restores ``initial`` (the pairs' conserved imbalance at step 0, Lemma 5.1), ``"balanced"``
    moves to zero. Prepared once per run (for ``GL_D``, an eigendecomposition)."""
    if target not in REBALANCE_TARGETS:
        raise ValueError(f"rebalance target must be 'initial' or 'balanced', got {target!r}")
    return orbit.rebalance_target(initial if target == "initial" else None)


@dataclass
class Move:
    """What :func:`move_pairs` computes for one circuit: pairs left alone, how far the factors moved, the
    stacked pairs ``(L*G, D, n)`` *before* the move with mu's per-pair orbit minimum there (so a caller that
    measures mu at those weights again, as the tau probe does, can skip the SVD) and the moved pairs, which
    :func:`write_move` puts into a model."""

    skipped: int
    pair_a: torch.Tensor
    pair_b: torch.Tensor
    minimum: torch.Tensor
    relative_move: float  # sqrt(sum ||A' - A||^2 + ||B' - B||^2) / sqrt(sum ||A||^2 + ||B||^2) over the pairs
    moved_a: torch.Tensor
    moved_b: torch.Tensor


@torch.no_grad()
def move_pairs(
    orbit: Orbit, pair_a: torch.Tensor, pair_b: torch.Tensor, target: RebalanceTarget = None
) -> Move:
    """Every stacked pair ``(L*G, D, n)`` of one circuit moved along ``orbit`` to the prepared ``target``
    (None: balanced; docs/design.md §4, §8): the maths of :func:`rebalance_model`, no model written, so it can
    run on any thread while a copy of the model waits for the moved pairs (the tau probe)."""
    moved = orbit.rebalance(pair_a, pair_b, target)
    distance_sq = (moved.pair_a - pair_a).square().sum() + (moved.pair_b - pair_b).square().sum()
    norm_sq = pair_a.square().sum() + pair_b.square().sum()
    relative = float((distance_sq / norm_sq).sqrt()) if float(norm_sq) > 0 else 0.0
    return Move(int((~moved.done).sum()), pair_a, pair_b, moved.minimum, relative, moved.pair_a, moved.pair_b)


@torch.no_grad()
def write_move(model: torch.nn.Module, circuit: str, move: Move) -> None:
    """Write a :class:`Move`'s moved pairs of ``circuit`` into the model's attention tensors, in place."""
    n_layer = len(attention_blocks(model))
    write_pairs_back(
        model, circuit, list(zip(move.moved_a.chunk(n_layer), move.moved_b.chunk(n_layer), strict=True))
    )


@torch.no_grad()
def rebalance_model(
    model: torch.nn.Module,
    circuit: str,
    target: RebalanceTarget = None,
    compute_device: torch.device | None = None,
    pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Move:
    """Move every pair of one circuit along the architecture's own orbit, in place (docs/design.md §4, §8).

    ``target`` is a prepared target (:func:`prepared_target`, or the orbit's ``rebalance_target``
    of an ``(L*G, D, D)`` imbalance); None = balanced. The function of the model is unchanged up
    to round-off. ``Move.skipped`` counts pairs left alone because they are too close to
    degenerate. ``compute_device`` (e.g. the CPU for a CUDA model) is where the pairs are copied
    to and the maths runs; the moved pairs are written back to the model. ``pairs``: the circuit's stacked
    float64 pairs ``(L*G, D, n)`` at the model's weights, where the maths runs, when the caller has them.
    """
    if pairs is not None:
        pair_a, pair_b = pairs
    else:
        pair_a, pair_b = stacked_pairs(attention_tensors(model), layout_of(model), circuit)
        if compute_device is not None:
            pair_a, pair_b = pair_a.to(compute_device, copy=True), pair_b.to(compute_device, copy=True)
    move = move_pairs(orbit_of(model, circuit), pair_a, pair_b, target)
    write_move(model, circuit, move)
    return move


@contextlib.contextmanager
def kept_attention_weights(model: torch.nn.Module) -> Iterator[None]:
    """Restore the attention tensors bit-identically on exit: an orbit move inside is a probe only.

    Saves and restores just the attention tensors, not a deep copy of the model (slow,
    and fragile for compiled models).
    """
    tensors = attention_tensors(model)
    saved = [tuple(None if t is None else t.detach().clone() for t in layer) for layer in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for live, kept in zip(tensors, saved):
                for live_tensor, kept_tensor in zip(live, kept):
                    if live_tensor is not None and kept_tensor is not None:  # both or neither
                        live_tensor.copy_(kept_tensor)
