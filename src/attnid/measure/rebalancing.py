"""Orbit moves of a training run (the rebalancing cases) and τ measured across them (claim E3;
docs/design.md §3, §4, §8).

``rebalance`` moves every attention pair to its target imbalance in place (the
rebalancing cases' periodic step); ``tau_probe`` makes the same move on the live
weights and restores them bit-identically, so runs without rebalancing log τ too.
This module only measures: the moves, on the orbit of the model's own architecture,
are :func:`attnid.model.moves.rebalance_model`; the probe and τ are the
:class:`attnid.measure.metrics.MetricTracker`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnid.model import moves

if TYPE_CHECKING:
    from attnid.measure.metrics import MetricTracker
from attnid.theory.circuits import CIRCUITS

# The probe of a run that does not rebalance moves every pair to its nearest balanced point (docs/design.md
# §3.3): the minimum-norm representative that μ measures, in closed form (one SVD per pair), and a move as
# large as the pair's whole imbalance, so τ tests the symmetry at full size whatever the run conserves.
PROBE_TARGET = "balanced"


@torch.no_grad()
def move_and_measure(
    model: torch.nn.Module, tracker: MetricTracker, target: str = "initial", pairs: dict | None = None
) -> tuple[dict[str, float], dict[str, moves.Move]]:
    """Move every pair along its orbit to imbalance ``I_0`` (``initial``) or 0 (``balanced``), in place, and
    measure τ across the move on the tracker's probe batch.

    Returns ``({'tau', 'tau_logits', 'skipped_pairs', 'move_qk', 'move_ov'}, {circuit: the Move})``, with
    ``move_<circuit>`` the move's relative Frobenius distance (docs/design.md §3.5). ``pairs``: per circuit
    the :class:`attnid.measure.products.CircuitPairs` of the model's weights where the maths runs, when the
    caller has them. The optimizer state is not touched.
    """
    targets = tracker.rebalance_targets(target)
    before = tracker.probe(model)
    skipped, done = 0, {}
    for circuit in CIRCUITS:
        given = None if pairs is None else (pairs[circuit].pair_a, pairs[circuit].pair_b)
        done[circuit] = moves.rebalance_model(
            model, circuit, targets[circuit], compute_device=tracker.compute_device, pairs=given
        )
        skipped += done[circuit].skipped
    moved = {f"move_{circuit}": move.relative_move for circuit, move in done.items()}
    return tracker.tau(before, tracker.probe(model)) | {"skipped_pairs": skipped} | moved, done


@torch.no_grad()
def rebalance(model: torch.nn.Module, tracker: MetricTracker, target: str = "initial") -> dict[str, float]:
    """:func:`move_and_measure`, and the tracker remembers each move (μ at the weights it moved from reuses
    the move's orbit minimum, :meth:`attnid.measure.metrics.MetricTracker.state_metrics`).

    Returns ``{'tau', 'tau_logits', 'skipped_pairs', 'move_qk', 'move_ov'}``."""
    row, done = move_and_measure(model, tracker, target)
    for circuit, move in done.items():
        tracker.remember_move(circuit, move)  # a τ probe restores these weights: μ reuses the move's SVD
    return row


@torch.no_grad()
def tau_probe(model: torch.nn.Module, tracker: MetricTracker, target: str = PROBE_TARGET) -> dict[str, float]:
    """:func:`rebalance` without side effects: the model's weights are bit-identical afterwards."""
    with moves.kept_attention_weights(model):
        return rebalance(model, tracker, target)


@torch.no_grad()
def tau_probe_on_copy(
    probe_model: torch.nn.Module,
    weights: list[torch.Tensor],
    tracker: MetricTracker,
    target: str = PROBE_TARGET,
    pairs: dict | None = None,
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """τ of a probe rebalance of a model whose parameters and buffers (in ``named_parameters``,
    ``named_buffers`` order) are ``weights``, made on ``probe_model``, a copy of that model: the model
    itself is never touched (so the probe can run while it trains on). The same numbers as
    :func:`tau_probe` on the model.

    Returns the τ columns and, per circuit, μ's per-pair orbit minimum at ``weights`` (the move's)."""
    for live, kept in zip([*probe_model.parameters(), *probe_model.buffers()], weights, strict=True):
        live.copy_(kept)
    row, done = move_and_measure(probe_model, tracker, target, pairs)
    return row, {circuit: move.minimum for circuit, move in done.items()}


def model_weights(model: torch.nn.Module, copy: bool) -> list[torch.Tensor]:
    """The model's parameters and buffers in :func:`tau_probe_on_copy`'s order (copies with ``copy``)."""
    tensors = [*model.parameters(), *model.buffers()]
    return [t.detach().clone() if copy else t.detach() for t in tensors]
