"""Orbit moves of a training model, with τ measured across them (claim E3; docs/design.md §3, §4).

``rebalance`` moves every attention pair to its target imbalance in place (the
rebalancing cases' periodic step); ``tau_probe`` makes the same move on the live
weights and restores them bit-identically, so runs without rebalancing log τ too.
The move itself is :func:`attnid.symmetry.rebalance_model`; the measuring is the
:class:`attnid.metrics.MetricTracker`'s.
"""

from __future__ import annotations

import torch

from attnid import symmetry


@torch.no_grad()
def rebalance(model, tracker, target: str = "initial") -> dict[str, float]:
    """Move every pair along its orbit to imbalance ``I_0`` (``initial``) or 0 (``balanced``), in place.

    Returns ``{'tau', 'tau_logits', 'skipped_pairs'}``: τ measured on the tracker's probe
    batch across the move. The optimizer state is not touched.
    """
    targets = tracker.rebalance_targets(target)
    before = tracker.probe(model)
    skipped, products = symmetry.rebalance_model(model, targets)
    tracker.remember_products(products)  # a τ probe restores these weights: μ reuses their SVD
    return tracker.tau(before, tracker.probe(model)) | {"skipped_pairs": skipped}


@torch.no_grad()
def tau_probe(model, tracker, target: str = "initial") -> dict[str, float]:
    """:func:`rebalance` without side effects: the model's weights are bit-identical afterwards."""
    with symmetry.kept_attention_weights(model):
        return rebalance(model, tracker, target)
