"""Orbit moves of a training run (the rebalancing cases) and τ measured across them (claim E3;
docs/design.md §3, §4, §8).

:func:`rebalancing_move` moves every attention pair to its target imbalance in place (the move of the
rebalancing cases' periodic step); :func:`tau_probe` makes the same move on the live weights and restores
them bit-identically, so runs without rebalancing log τ too. The metrics pipeline makes it in two parts with
the same numbers: the move's maths (:func:`plan_moves`, any thread) and its measurement on a
:class:`ProbeCopy` of the model (:func:`measure_moves`; docs/design.md §3.6). The names (docs/design.md
§4): to *rebalance* is to move pairs along their orbit to a target imbalance
(:meth:`attnid.theory.orbits.Orbit.rebalance`); to *balance* (``attnid balance``) is to rebalance a
checkpoint once, to zero imbalance or to ``I_0``. This module only measures: the moves, on the orbit of the
model's own architecture, are :func:`attnid.model.moves.rebalance_model`; the probe and τ are the
:class:`attnid.measure.metrics.MetricTracker`'s.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from attnid.model import moves
from attnid.model.layout import LayerTensors, attention_tensors, layout_of, stacked_pairs
from attnid.theory.circuits import CIRCUITS

if TYPE_CHECKING:
    from attnid.measure.metrics import MetricTracker

# The probe of a run that does not rebalance moves every pair to its nearest balanced point (docs/design.md
# §3.3): the minimum-norm representative that μ measures, in closed form (one SVD per pair), and a move as
# large as the pair's whole imbalance, so τ tests the symmetry at full size whatever the run conserves.
PROBE_TARGET = "balanced"


def plan_moves(
    tracker: MetricTracker, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], target: str = "initial"
) -> dict[str, moves.Move]:
    """Per circuit, the move of its stacked float64 pairs ``(A, B)`` (where the tracker's maths runs) to
    imbalance ``I_0`` (``initial``) or 0 (``balanced``): maths only, nothing written, so it may run on any
    thread (:func:`attnid.model.moves.move_pairs`)."""
    targets = tracker.rebalance_targets(target)
    return {
        circuit: moves.move_pairs(tracker.orbits[circuit], *pairs[circuit], targets[circuit])
        for circuit in CIRCUITS
    }


@torch.no_grad()
def measure_moves(
    model: torch.nn.Module, tracker: MetricTracker, done: dict[str, moves.Move]
) -> dict[str, float]:
    """Write the moves into ``model`` (in place) and measure τ across them on the tracker's probe batch.

    Returns ``{'tau', 'tau_logits', 'skipped_pairs', 'move_qk', 'move_ov'}``, with ``move_<circuit>`` the
    move's relative Frobenius distance (docs/design.md §3.5)."""
    before = tracker.probe(model)
    for circuit, move in done.items():
        moves.write_move(model, circuit, move)
    skipped = sum(move.skipped for move in done.values())
    moved = {f"move_{circuit}": move.relative_move for circuit, move in done.items()}
    return tracker.tau(before, tracker.probe(model)) | {"skipped_pairs": skipped} | moved


@torch.no_grad()
def move_and_measure(
    model: torch.nn.Module, tracker: MetricTracker, target: str = "initial"
) -> tuple[dict[str, float], dict[str, moves.Move]]:
    """Move every pair along its orbit to imbalance ``I_0`` (``initial``) or 0 (``balanced``), in place, and
    measure τ across the move on the tracker's probe batch (:func:`plan_moves`, :func:`measure_moves`).

    Returns ``({'tau', 'tau_logits', 'skipped_pairs', 'move_qk', 'move_ov'}, {circuit: the Move})``. The
    optimizer state is not touched."""
    tensors, layout, device = attention_tensors(model), layout_of(model), tracker.compute_device
    pairs = {}
    for circuit in CIRCUITS:
        pair_a, pair_b = stacked_pairs(tensors, layout, circuit)
        pairs[circuit] = (pair_a, pair_b) if device is None else (pair_a.to(device), pair_b.to(device))
    done = plan_moves(tracker, pairs, target)
    return measure_moves(model, tracker, done), done


@torch.no_grad()
def rebalancing_move(
    model: torch.nn.Module, tracker: MetricTracker, target: str = "initial"
) -> dict[str, float]:
    """:func:`move_and_measure`, and the tracker remembers each move (μ at the weights it moved from reuses
    the move's orbit minimum, :meth:`attnid.measure.metrics.MetricTracker.state_metrics`).

    Returns ``{'tau', 'tau_logits', 'skipped_pairs', 'move_qk', 'move_ov'}``."""
    row, done = move_and_measure(model, tracker, target)
    for circuit, move in done.items():
        tracker.remember_move(circuit, move)  # a τ probe restores these weights: μ reuses the move's SVD
    return row


@torch.no_grad()
def tau_probe(model: torch.nn.Module, tracker: MetricTracker, target: str = PROBE_TARGET) -> dict[str, float]:
    """:func:`rebalancing_move` without side effects: the model's weights are bit-identical afterwards."""
    with moves.kept_attention_weights(model):
        return rebalancing_move(model, tracker, target)


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]


class ProbeCopy:
    """The copy of a model that τ's probes move and measure, so the model itself is never touched and the
    probe can run while it trains on (docs/design.md §3.3): the same numbers as :func:`tau_probe` on the
    model.

    A probe needs the model's weights at one step: its attention tensors (the metrics copy them at every
    step anyway) are copied in (:meth:`load`); every other parameter and buffer is *taken*, not copied: the
    model's own tensors when the probe runs before the next step, clones otherwise (:meth:`others`). The
    copy stays in eval mode. Tensors that share storage with an attention tensor (the free entries of a
    gauge-fixed layer, views of its weight) are loaded with it."""

    def __init__(self, model: torch.nn.Module):
        self.model = copy.deepcopy(model).requires_grad_(False).eval()
        attention = {
            tensor.untyped_storage().data_ptr()
            for layer in attention_tensors(self.model)
            for tensor in layer
            if tensor is not None
        }
        self._others = [
            index
            for index, tensor in enumerate(_weights(self.model))
            if tensor.untyped_storage().data_ptr() not in attention
        ]

    def others(self, model: torch.nn.Module, copy: bool) -> list[torch.Tensor]:
        """The model's parameters and buffers outside its attention tensors (clones with ``copy``), for
        :meth:`load`."""
        weights = _weights(model)
        return [weights[i].detach().clone() if copy else weights[i].detach() for i in self._others]

    @torch.no_grad()
    def load(self, others: list[torch.Tensor], attention: list[LayerTensors]) -> None:
        """Make the copy the model at one step: ``others`` from :meth:`others` (taken as they are) and the
        per-layer attention tensors ``attention`` (copied in: the moves write into the copy's own)."""
        weights = _weights(self.model)
        for index, tensor in zip(self._others, others, strict=True):
            weights[index].data = tensor
        for own, given in zip(attention_tensors(self.model), attention, strict=True):
            for own_tensor, given_tensor in zip(own, given, strict=True):
                if own_tensor is not None and given_tensor is not None:  # both or neither (a bias)
                    own_tensor.copy_(given_tensor)

    def measure(
        self,
        others: list[torch.Tensor],
        attention: list[LayerTensors],
        tracker: MetricTracker,
        done: dict[str, moves.Move],
    ) -> dict[str, float]:
        """τ of the moves ``done`` (from :func:`plan_moves` at these weights) of the model whose weights are
        ``others`` and ``attention`` (:meth:`load`): :func:`measure_moves` on the copy."""
        self.load(others, attention)
        return measure_moves(self.model, tracker, done)
