"""Orbit moves of a training run (the rebalancing cases) and τ measured across them (claim E3; docs/design.md §3, §4, §8).

``rebalance`` moves every attention pair to its target imbalance in place (the
rebalancing cases' periodic step); ``tau_probe`` makes the same move on the live
weights and restores them bit-identically, so runs without rebalancing log τ too.
This module only measures: the moves, on the orbit of the model's own architecture,
are :func:`attnid.model.moves.rebalance_model`; the probe and τ are the
:class:`attnid.measure.metrics.MetricTracker`'s.
"""

from __future__ import annotations

import torch

from attnid.model import moves
from attnid.theory.circuits import CIRCUITS


@torch.no_grad()
def rebalance(model, tracker, target: str = "initial") -> dict[str, float]:
    """Move every pair along its orbit to imbalance ``I_0`` (``initial``) or 0 (``balanced``), in place.

    Returns ``{'tau', 'tau_logits', 'skipped_pairs'}``: τ measured on the tracker's probe
    batch across the move. The optimizer state is not touched.
    """
    targets = tracker.rebalance_targets(target)
    before = tracker.probe(model)
    skipped = 0
    for circuit in CIRCUITS:
        move = moves.rebalance_model(model, circuit, targets[circuit], compute_device=tracker.compute_device)
        tracker.remember_move(circuit, move)  # a τ probe restores these weights: μ reuses the move's SVD
        skipped += move.skipped
    return tracker.tau(before, tracker.probe(model)) | {"skipped_pairs": skipped}


@torch.no_grad()
def tau_probe(model, tracker, target: str = "initial") -> dict[str, float]:
    """:func:`rebalance` without side effects: the model's weights are bit-identical afterwards."""
    with moves.kept_attention_weights(model):
        return rebalance(model, tracker, target)
