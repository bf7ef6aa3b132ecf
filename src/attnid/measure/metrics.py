"""The four logged quantities ρ, β, τ, μ (``attnid inspect`` reads μ: :mod:`attnid.measure.inspect`).

Definitions (docs/design.md §3; the paper's extracted text does not keep its
formulas, so these are this project's, chosen to test claims E1–E3 exactly). Each
is aggregated over every factor pair of one circuit (``qk`` or ``ov``; per head for
MHA, per key/value group for GQA, see :mod:`attnid.model.layout`), with a per-layer
breakdown under the suffix ``_l{i}``, and always on the orbit of the model's own
architecture (docs/design.md §8): ``GL_D``, or for RoPE query-key pairs the
subgroup of per-plane scalings and rotations.

- ρ, unidentified share of one optimizer step ``Δ = θ_{t+1} - θ_t``:
  ``Σ ||proj(Δ)||² / Σ ||Δ||²``, projecting onto the orbit tangent space at ``θ_t``
  (Lemma 4.1/4.6). Zero for plain gradient steps (Lemma 5.1).
- β, drift of the conserved imbalance ``P(I)``, ``I = A Aᵀ - B Bᵀ`` (Lemma 5.1), with
  ``P`` the projection onto the orbit's Lie algebra (the identity for ``GL_D``; for
  RoPE the per-plane trace of ``I``'s 2x2 diagonal blocks):
  ``sqrt(Σ ||P(I_t) - P(I_0)||²) / sqrt(Σ ||P(A_0 A_0ᵀ)||² + ||P(B_0 B_0ᵀ)||²)``.
- τ, effect of an orbit move (rebalancing, §5) on the function: relative change of
  the probe-batch loss, and max-abs logit change over max-abs logit.
- μ, excess norm on the orbit: ``Σ (||A||² + ||B||²) / Σ min_orbit (||A||² + ||B||²) - 1 >= 0``;
  the minimum is ``2 ||Aᵀ B||_*`` on ``GL_D`` and ``Σ_p 2 sqrt(||A_p||² ||B_p||²)`` over
  the RoPE planes ``p``.

All maths runs in float64, batched over every pair of every layer with one
eigendecomposition call per circuit, either on the model's device or on the host
(``metrics_device="host"``: each read copies the attention tensors to the CPU first;
the probe forward passes of τ stay on the model's device). Nothing reads global RNG state.
"""

from __future__ import annotations

import math

import torch

from attnid.common.errors import UserError
from attnid.measure.options import METRICS_DEVICES
from attnid.measure.products import CircuitPairs, CircuitStep, read_pairs, steps_between
from attnid.model import moves
from attnid.model.layout import (
    LayerTensors,
    attention_blocks,
    attention_tensors,
    layout_of,
    orbit_of,
    stacked_pairs,
)
from attnid.model.options import REBALANCE_TARGETS
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS
from attnid.theory.orbits import RebalanceTarget

# --------------------------------------------------------------------------------------
# Helpers on stacked pairs (L*G, D, n): every layer's pairs of one circuit in one batch
# --------------------------------------------------------------------------------------


def _per_layer(values: torch.Tensor, n_layer: int) -> torch.Tensor:
    """``(L*G,)`` per-pair values -> ``(L,)`` per-layer sums."""
    return values.reshape(n_layer, -1).sum(-1)


def _share(numerator: float, denominator: float) -> float:
    # a zero step (or zero weights) has no unidentified part: report 0, not NaN
    return numerator / denominator if denominator > 0 else 0.0


def _device(model: torch.nn.Module) -> torch.device:
    return attention_blocks(model)[0].attn.c_attn.weight.device


def excess_norm(frobenius_sq: torch.Tensor, minimum: torch.Tensor) -> float:
    """μ from summed :meth:`attnid.theory.orbits.Orbit.excess_norm_terms` (``inf`` if every minimum
    is zero)."""
    total_frob, total_minimum = float(frobenius_sq.sum()), float(minimum.sum())
    if total_minimum > 0:
        return total_frob / total_minimum - 1.0
    return 0.0 if total_frob == 0 else math.inf


# --------------------------------------------------------------------------------------
# The tracker the training loop calls
# --------------------------------------------------------------------------------------


class MetricTracker:
    """Computes ρ, β, τ, μ for one training run, on the orbit of the model's own architecture.

    Each circuit's orbit is :func:`attnid.model.layout.orbit_of`'s: ``GL_D`` per head (MHA)
    or per key/value group (GQA), and for RoPE query-key pairs the restricted group
    (docs/design.md §8). It only measures; the orbit moves it measures τ across are in
    :mod:`attnid.model.moves` (called by :mod:`attnid.measure.rebalancing`). Construction records the
    conserved ``I_0`` of every pair of both circuits and the β normaliser;
    :meth:`state_dict` / :meth:`load_state_dict` carry them through a checkpoint so a
    resumed run continues bit-identically.

    ``metrics_device`` says where the linear algebra runs: ``"device"`` reads the live
    tensors where the model is, ``"host"`` copies them to the CPU (float64) at each read
    and keeps ``I_0`` there, so that on CUDA the hundreds of small eigen- and singular
    value solves of a log step run on the job's CPU threads instead of as one small
    cuSOLVER call each. The numbers are the same either way (to round-off; bit for bit
    on a CPU).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        probe_batch: tuple[torch.Tensor, torch.Tensor],
        metrics_device: str = "device",
    ):
        if metrics_device not in METRICS_DEVICES:
            raise UserError(f"metrics device must be 'host' or 'device', got {metrics_device!r}")
        self.on_host = metrics_device == "host"
        self.probe_batch = probe_batch
        self.n_layer = len(attention_blocks(model))
        self.layout = layout_of(model)
        self.orbits = {circuit: orbit_of(model, circuit) for circuit in CIRCUITS}
        self.initial_imbalance: dict[str, torch.Tensor] = {}  # circuit -> (L*G, D, D), conserved part
        self.beta_norm_sq: dict[str, torch.Tensor] = {}  # circuit -> (L,) Σ ||P(A0A0ᵀ)||² + ||P(B0B0ᵀ)||²
        now = self.read(model)
        for circuit, orbit in self.orbits.items():
            pair_a, pair_b = stacked_pairs(now, self.layout, circuit)
            # P: projection onto the orbit's algebra (identity for GL_D), so that β compares like with like
            gram_a = orbit.project_to_algebra(factor_pairs.gram(pair_a))
            gram_b = orbit.project_to_algebra(factor_pairs.gram(pair_b))
            # as state_metrics computes it, so that β is exactly 0 at the start
            self.initial_imbalance[circuit] = orbit.conserved_imbalance(pair_a, pair_b)
            per_pair = gram_a.square().sum((-1, -2)) + gram_b.square().sum((-1, -2))
            self.beta_norm_sq[circuit] = _per_layer(per_pair, self.n_layer)
        # (circuit, target) -> rebalance_model's prepared target, computed once: targets are fixed over a run
        self._targets: dict[tuple[str, str], RebalanceTarget] = {}
        # circuit -> the last orbit move (its pairs before the move and mu's minimum there; see state_metrics)
        self._last_move: dict[str, moves.Move] = {}

    def rebalance_targets(self, target: str) -> dict[str, RebalanceTarget]:
        """Per circuit, the prepared target of :func:`attnid.model.moves.rebalance_model` that moves to
        ``I_0`` (``initial``) or 0 (``balanced``)."""
        if target not in REBALANCE_TARGETS:
            raise UserError(f"rebalance target must be 'initial' or 'balanced', got {target!r}")
        for circuit, initial in self.initial_imbalance.items():
            if (circuit, target) not in self._targets:
                self._targets[circuit, target] = moves.prepared_target(self.orbits[circuit], initial, target)
        return {circuit: self._targets[circuit, target] for circuit in CIRCUITS}

    def remember_move(self, circuit: str, move: moves.Move) -> None:
        """Keep what an orbit move computed at the weights before it: :meth:`state_metrics` reuses
        mu's minimum when the weights are bit-identical to those (a τ probe restores them)."""
        self._last_move[circuit] = move

    def initial_imbalance_scale(self) -> dict[str, float]:
        """Per circuit, ``||I_0||_F / sqrt(Σ ||A_0A_0ᵀ||² + ||B_0B_0ᵀ||²)``: the β of an imbalance
        scaled to zero, which Figure 3's SGD + weight-decay prediction needs (run.json)."""
        return {
            circuit: float(
                self.initial_imbalance[circuit].double().square().sum().sqrt()
                / self.beta_norm_sq[circuit].double().sum().sqrt()
            )
            for circuit in CIRCUITS
        }

    # ----- where the maths runs -------------------------------------------------------

    @property
    def compute_device(self) -> torch.device | None:
        """The CPU for host metrics; None: wherever the model is."""
        return torch.device("cpu") if self.on_host else None

    def _to_compute(self, tensors: list[LayerTensors], copy: bool) -> list[LayerTensors]:
        """Per-layer tensors moved to the host (float64; always a new tensor with ``copy``) for host
        metrics; as they are otherwise."""
        if not self.on_host:
            return tensors

        def to_host(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(device="cpu", dtype=torch.float64, copy=copy)

        return [
            (to_host(weight), None if bias is None else to_host(bias), to_host(proj))
            for weight, bias, proj in tensors
        ]

    @torch.no_grad()
    def read(self, model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """Per layer ``(c_attn.weight, c_attn.bias, c_proj.weight)`` where the maths runs: the live
        tensors (device metrics, no copy) or float64 copies on the host (one device-to-host copy each)."""
        return self._to_compute(attention_tensors(model), copy=True)

    # ----- ρ ------------------------------------------------------------------------

    @torch.no_grad()
    def snapshot(
        self, model: torch.nn.Module
    ) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """float64 copies of each layer's (c_attn.weight, c_attn.bias, c_proj.weight), taken before a step,
        on the host for host metrics."""

        def copy(tensor):
            return (
                None
                if tensor is None
                else tensor.detach().to(
                    device=self.compute_device or tensor.device, dtype=torch.float64, copy=True
                )
            )

        return [tuple(copy(t) for t in tensors) for tensors in attention_tensors(model)]

    @torch.no_grad()
    def step_metrics(self, model: torch.nn.Module, pre: list[LayerTensors]) -> dict[str, float]:
        """ρ per circuit (and per layer) for the step from ``pre`` (a :meth:`snapshot`) to now.

        The projection is onto the tangent space of the architecture's orbit at the
        pre-step point. Also reports ``rho_singular_pairs``: pairs whose normal equations
        were singular and were solved by pseudo-inverse (still the exact projection; see
        :func:`attnid.theory.factor_pairs.tangent_solve`). ``pre`` may live on any device (the drift
        tracker's snapshot is on the model's); it is moved to where the maths runs.
        """
        now = read_pairs(self.read(model), self.layout)
        before = read_pairs(self._to_compute(pre, copy=False), self.layout)
        return self.step_row(steps_between(before, now))

    @torch.no_grad()
    def step_row(self, steps: dict[str, CircuitStep]) -> dict[str, float]:
        """:meth:`step_metrics` from each circuit's :class:`attnid.measure.products.CircuitStep`
        (pre-step Grams and the step's cross products, shared with the drift split)."""
        row: dict[str, float] = {}
        singular_pairs = 0
        for circuit, orbit in self.orbits.items():
            step = steps[circuit]
            # the pre-step Grams from the post-step ones (which beta and mu need): no D x n products here
            proj_sq, singular = orbit.unidentified_sq_norm_from_products(
                *step.pre_grams, step.cross_a, step.cross_b
            )
            proj_per_layer = _per_layer(proj_sq, self.n_layer).tolist()
            step_per_layer = _per_layer(step.step_sq_norm(), self.n_layer).tolist()
            row[f"rho_{circuit}"] = _share(sum(proj_per_layer), sum(step_per_layer))
            for layer in range(self.n_layer):
                row[f"rho_{circuit}_l{layer}"] = _share(proj_per_layer[layer], step_per_layer[layer])
            singular_pairs += int(singular.sum())
        row["rho_singular_pairs"] = singular_pairs
        return row

    # ----- β and μ --------------------------------------------------------------------

    @torch.no_grad()
    def state_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """β and μ per circuit and per layer, at the model's current weights, on the architecture's orbit.

        μ's orbit minimum is the last orbit move's (:meth:`remember_move`) when the weights are
        bit-identical to those it moved from (a τ probe restores them)."""
        points = read_pairs(self.read(model), self.layout)
        minima = {}
        for circuit, point in points.items():
            move = self._last_move.pop(circuit, None)
            if (
                move is not None
                and torch.equal(move.pair_a, point.pair_a)
                and torch.equal(move.pair_b, point.pair_b)
            ):
                minima[circuit] = move.minimum
        return self.state_row(points, minima)

    @torch.no_grad()
    def state_row(
        self, points: dict[str, CircuitPairs], minima: dict[str, torch.Tensor] | None = None
    ) -> dict[str, float]:
        """:meth:`state_metrics` from each circuit's :class:`attnid.measure.products.CircuitPairs`;
        ``minima``: per circuit μ's per-pair orbit minimum when an orbit move at these weights computed it."""
        minima = minima or {}
        row: dict[str, float] = {}
        for circuit, orbit in self.orbits.items():
            point = points[circuit]
            conserved = orbit.conserved_imbalance_from_grams(*point.grams)
            drift = conserved - self.initial_imbalance[circuit].to(conserved.device)
            drift_sq = _per_layer(drift.square().sum((-1, -2)), self.n_layer).tolist()
            norm_sq = self.beta_norm_sq[circuit].tolist()
            row[f"beta_{circuit}"] = _share(math.sqrt(sum(drift_sq)), math.sqrt(sum(norm_sq)))
            for layer in range(self.n_layer):
                row[f"beta_{circuit}_l{layer}"] = _share(
                    math.sqrt(drift_sq[layer]), math.sqrt(norm_sq[layer])
                )
            if circuit in minima:
                frobenius_sq = factor_pairs.trace(point.gram_a) + factor_pairs.trace(point.gram_b)
                minimum = minima[circuit].to(frobenius_sq.device)
            else:
                frobenius_sq, minimum = orbit.excess_norm_terms(point.pair_a, point.pair_b, point.grams)
            row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
            for layer, (frob, low) in enumerate(
                zip(frobenius_sq.chunk(self.n_layer), minimum.chunk(self.n_layer))
            ):
                row[f"mu_{circuit}_l{layer}"] = excess_norm(frob, low)
        return row

    # ----- τ ---------------------------------------------------------------------------

    @torch.no_grad()
    def probe(self, model: torch.nn.Module) -> tuple[float, torch.Tensor]:
        """Probe-batch loss and full-sequence logits, in eval mode (train/eval mode restored)."""
        x_probe, y_probe = self.probe_batch
        device = _device(model)
        was_training = model.training
        if was_training:  # a probe copy stays in eval mode: no walk over its modules
            model.eval()
        try:
            logits, loss = model(x_probe.to(device), y_probe.to(device))
        finally:
            if was_training:
                model.train()
        return float(loss), logits.detach()

    @staticmethod
    def tau(before: tuple[float, torch.Tensor], after: tuple[float, torch.Tensor]) -> dict[str, float]:
        """τ across an orbit move from two :meth:`probe` results: relative loss change and
        max-abs logit change over max-abs logit."""
        (loss_before, logits_before), (loss_after, logits_after) = before, after
        tau = abs(loss_after - loss_before) / abs(loss_before) if loss_before != 0 else abs(loss_after)
        scale = float(logits_before.abs().max())
        change = float((logits_after - logits_before).abs().max())
        return {"tau": tau, "tau_logits": change / scale if scale > 0 else change}

    # ----- checkpointing ------------------------------------------------------------------

    def state_dict(self) -> dict:
        """``I_0`` and the β normalisers, as CPU tensors."""
        return {
            "initial_imbalance": {c: t.detach().cpu().clone() for c, t in self.initial_imbalance.items()},
            "beta_norm_sq": {c: t.detach().cpu().clone() for c, t in self.beta_norm_sq.items()},
            "n_layer": self.n_layer,
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["n_layer"]) != self.n_layer:
            raise UserError(f"metric state is for {state['n_layer']} layers, the model has {self.n_layer}")
        for circuit in CIRCUITS:
            saved = state["initial_imbalance"][circuit]
            if saved.shape != self.initial_imbalance[circuit].shape:
                raise UserError(
                    f"metric state I_0[{circuit}] has shape {tuple(saved.shape)}, "
                    f"expected {tuple(self.initial_imbalance[circuit].shape)}"
                )
            device = self.initial_imbalance[circuit].device
            self.initial_imbalance[circuit] = saved.to(device=device, dtype=torch.float64)
            self.beta_norm_sq[circuit] = state["beta_norm_sq"][circuit].to(device=device, dtype=torch.float64)
        self._targets.clear()
