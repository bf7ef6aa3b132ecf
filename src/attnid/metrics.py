"""The four logged quantities ρ, β, τ, μ, and ``attnid inspect``.

Definitions (docs/design.md §3; the paper's extracted text does not keep its
formulas, so these are this project's, chosen to test claims E1–E3 exactly). Each
is aggregated over every factor pair of one circuit (``qk`` or ``ov``; per head for
MHA, per key/value group for GQA, see :mod:`attnid.orbits`), with a per-layer
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

import argparse
import json
import math
from pathlib import Path

import torch

from attnid import orbits, symmetry
from attnid.errors import UserError
from attnid.symmetry import CIRCUITS


# --------------------------------------------------------------------------------------
# Helpers on stacked pairs (L*G, D, n): every layer's pairs of one circuit in one batch
# --------------------------------------------------------------------------------------

def _per_layer(values: torch.Tensor, n_layer: int) -> torch.Tensor:
    """``(L*G,)`` per-pair values -> ``(L,)`` per-layer sums."""
    return values.reshape(n_layer, -1).sum(-1)


def _ratio(numerator: float, denominator: float) -> float:
    # a zero step (or zero weights) has no unidentified part: report 0, not NaN
    return numerator / denominator if denominator > 0 else 0.0


def _device(model) -> torch.device:
    return symmetry.attention_blocks(model)[0].attn.c_attn.weight.device


METRICS_DEVICES = ("host", "device")


def excess_norm(frobenius_sq: torch.Tensor, minimum: torch.Tensor) -> float:
    """μ from summed :func:`attnid.orbits.excess_norm_terms` (``inf`` if every minimum is zero)."""
    total_frob, total_minimum = float(frobenius_sq.sum()), float(minimum.sum())
    if total_minimum > 0:
        return total_frob / total_minimum - 1.0
    return 0.0 if total_frob == 0 else math.inf


# --------------------------------------------------------------------------------------
# The tracker the training loop calls
# --------------------------------------------------------------------------------------

class MetricTracker:
    """Computes ρ, β, τ, μ for one training run, on the orbit of the model's own architecture.

    Each circuit's orbit is :func:`attnid.orbits.orbit_kind`'s: ``GL_D`` per head (MHA)
    or per key/value group (GQA), and for RoPE query-key pairs the restricted group
    (docs/design.md §8). It only measures; the orbit moves it measures τ across are in
    :mod:`attnid.orbits` (called by :mod:`attnid.rebalancing`). Construction records the
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

    def __init__(self, model, probe_batch: tuple[torch.Tensor, torch.Tensor], metrics_device: str = "device"):
        if metrics_device not in METRICS_DEVICES:
            raise UserError(f"metrics device must be 'host' or 'device', got {metrics_device!r}")
        self.on_host = metrics_device == "host"
        self.probe_batch = probe_batch
        self.n_layer = len(symmetry.attention_blocks(model))
        self.layout = orbits.layout_of(model)
        self.kinds = {circuit: orbits.orbit_kind(model, circuit) for circuit in CIRCUITS}
        self.initial_imbalance: dict[str, torch.Tensor] = {}  # circuit -> (L*G, D, D), conserved part
        self.beta_norm_sq: dict[str, torch.Tensor] = {}  # circuit -> (L,) Σ ||P(A0A0ᵀ)||² + ||P(B0B0ᵀ)||²
        now = self.read(model)
        for circuit, kind in self.kinds.items():
            pair_a, pair_b = orbits.stacked_pairs(now, self.layout, circuit)
            # P: projection onto the orbit's algebra (identity for GL_D), so that β compares like with like
            gram_a = orbits.project_to_algebra(kind, symmetry.gram(pair_a))
            gram_b = orbits.project_to_algebra(kind, symmetry.gram(pair_b))
            # as state_metrics computes it, so that β is exactly 0 at the start
            self.initial_imbalance[circuit] = orbits.conserved_imbalance(kind, pair_a, pair_b)
            per_pair = gram_a.square().sum((-1, -2)) + gram_b.square().sum((-1, -2))
            self.beta_norm_sq[circuit] = _per_layer(per_pair, self.n_layer)
        # (circuit, target) -> rebalance_model's target arguments, computed once: targets are fixed over a run
        self._targets: dict[tuple[str, str], dict] = {}
        # circuit -> the last orbit move (its pairs before the move and mu's minimum there; see state_metrics)
        self._last_move: dict[str, orbits.Move] = {}

    def rebalance_targets(self, target: str) -> dict[str, dict]:
        """Per circuit, the keyword arguments of :func:`attnid.orbits.rebalance_model` that move to
        ``I_0`` (``initial``) or 0 (``balanced``)."""
        if target not in orbits.REBALANCE_TARGETS:
            raise UserError(f"rebalance target must be 'initial' or 'balanced', got {target!r}")
        for circuit, initial in self.initial_imbalance.items():
            if (circuit, target) not in self._targets:
                self._targets[circuit, target] = orbits.rebalance_target(self.kinds[circuit], initial, target)
        return {circuit: self._targets[circuit, target] for circuit in CIRCUITS}

    def remember_move(self, circuit: str, move: orbits.Move) -> None:
        """Keep what an orbit move computed at the weights before it: :meth:`state_metrics` reuses
        mu's minimum when the weights are bit-identical to those (a τ probe restores them)."""
        self._last_move[circuit] = move

    def initial_imbalance_scale(self) -> dict[str, float]:
        """Per circuit, ``||I_0||_F / sqrt(Σ ||A_0A_0ᵀ||² + ||B_0B_0ᵀ||²)``: the β of an imbalance
        scaled to zero, which Figure 3's SGD + weight-decay prediction needs (run.json)."""
        return {circuit: float(self.initial_imbalance[circuit].double().square().sum().sqrt()
                               / self.beta_norm_sq[circuit].double().sum().sqrt()) for circuit in CIRCUITS}

    # ----- where the maths runs -------------------------------------------------------

    @property
    def compute_device(self) -> torch.device | None:
        """The CPU for host metrics; None: wherever the model is."""
        return torch.device("cpu") if self.on_host else None

    def _to_compute(self, tensors, copy: bool) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """Per-layer tensors moved to the host (float64; always a new tensor with ``copy``) for host
        metrics; as they are otherwise."""
        if not self.on_host:
            return tensors
        return [tuple(None if t is None else t.detach().to(device="cpu", dtype=torch.float64, copy=copy)
                      for t in layer) for layer in tensors]

    @torch.no_grad()
    def read(self, model) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """Per layer ``(c_attn.weight, c_attn.bias, c_proj.weight)`` where the maths runs: the live
        tensors (device metrics, no copy) or float64 copies on the host (one device-to-host copy each)."""
        return self._to_compute(orbits.attention_tensors(model), copy=True)

    # ----- ρ ------------------------------------------------------------------------

    @torch.no_grad()
    def snapshot(self, model) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """float64 copies of each layer's (c_attn.weight, c_attn.bias, c_proj.weight), taken before a step,
        on the host for host metrics."""
        def copy(tensor):
            return None if tensor is None else tensor.detach().to(device=self.compute_device or tensor.device,
                                                                  dtype=torch.float64, copy=True)
        return [tuple(copy(t) for t in tensors) for tensors in orbits.attention_tensors(model)]

    @torch.no_grad()
    def step_metrics(self, model, pre) -> dict[str, float]:
        """ρ per circuit (and per layer) for the step from ``pre`` (a :meth:`snapshot`) to now.

        The projection is onto the tangent space of the architecture's orbit at the
        pre-step point. Also reports ``rho_singular_pairs``: pairs whose normal equations
        were singular and were solved by pseudo-inverse (still the exact projection; see
        :func:`attnid.symmetry.tangent_solve`). ``pre`` may live on any device (the drift
        tracker's snapshot is on the model's); it is moved to where the maths runs.
        """
        now = self.read(model)
        pre = self._to_compute(pre, copy=False)
        row: dict[str, float] = {}
        singular_pairs = 0
        for circuit, kind in self.kinds.items():
            pre_a, pre_b = orbits.stacked_pairs(pre, self.layout, circuit)
            now_a, now_b = orbits.stacked_pairs(now, self.layout, circuit)
            step_a, step_b = now_a - pre_a, now_b - pre_b  # pairs are linear in the weights
            proj_sq, singular = orbits.unidentified_sq_norm(kind, pre_a, pre_b, step_a, step_b)
            proj_sq = _per_layer(proj_sq, self.n_layer)
            step_sq = _per_layer(step_a.square().sum((-1, -2)) + step_b.square().sum((-1, -2)), self.n_layer)
            proj_sq, step_sq = proj_sq.tolist(), step_sq.tolist()
            row[f"rho_{circuit}"] = _ratio(sum(proj_sq), sum(step_sq))
            for layer in range(self.n_layer):
                row[f"rho_{circuit}_l{layer}"] = _ratio(proj_sq[layer], step_sq[layer])
            singular_pairs += int(singular.sum())
        row["rho_singular_pairs"] = singular_pairs
        return row

    # ----- β and μ --------------------------------------------------------------------

    def _excess_terms(self, circuit: str, pair_a, pair_b) -> tuple[torch.Tensor, torch.Tensor]:
        """μ's two per-pair sums, reusing the last orbit move's minimum at bit-identical weights."""
        move = self._last_move.pop(circuit, None)
        if move is not None and torch.equal(move.pair_a, pair_a) and torch.equal(move.pair_b, pair_b):
            return pair_a.square().sum((-1, -2)) + pair_b.square().sum((-1, -2)), move.minimum
        return orbits.excess_norm_terms(self.kinds[circuit], pair_a, pair_b)

    @torch.no_grad()
    def state_metrics(self, model) -> dict[str, float]:
        """β and μ per circuit and per layer, at the model's current weights, on the architecture's orbit."""
        now = self.read(model)
        row: dict[str, float] = {}
        for circuit, kind in self.kinds.items():
            pair_a, pair_b = orbits.stacked_pairs(now, self.layout, circuit)
            conserved = orbits.conserved_imbalance(kind, pair_a, pair_b)
            drift = conserved - self.initial_imbalance[circuit].to(conserved.device)
            drift_sq = _per_layer(drift.square().sum((-1, -2)), self.n_layer).tolist()
            norm_sq = self.beta_norm_sq[circuit].tolist()
            row[f"beta_{circuit}"] = _ratio(math.sqrt(sum(drift_sq)), math.sqrt(sum(norm_sq)))
            for layer in range(self.n_layer):
                row[f"beta_{circuit}_l{layer}"] = _ratio(math.sqrt(drift_sq[layer]), math.sqrt(norm_sq[layer]))
            frobenius_sq, minimum = self._excess_terms(circuit, pair_a, pair_b)
            row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
            for layer, (frob, low) in enumerate(zip(frobenius_sq.chunk(self.n_layer), minimum.chunk(self.n_layer))):
                row[f"mu_{circuit}_l{layer}"] = excess_norm(frob, low)
        return row

    # ----- τ ---------------------------------------------------------------------------

    @torch.no_grad()
    def probe(self, model) -> tuple[float, torch.Tensor]:
        """Probe-batch loss and full-sequence logits, in eval mode (train/eval mode restored)."""
        x_probe, y_probe = self.probe_batch
        device = _device(model)
        was_training = model.training
        model.eval()
        try:
            logits, loss = model(x_probe.to(device), y_probe.to(device))
        finally:
            model.train(was_training)
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
        return {"initial_imbalance": {c: t.detach().cpu().clone() for c, t in self.initial_imbalance.items()},
                "beta_norm_sq": {c: t.detach().cpu().clone() for c, t in self.beta_norm_sq.items()},
                "n_layer": self.n_layer}

    def load_state_dict(self, state: dict) -> None:
        if int(state["n_layer"]) != self.n_layer:
            raise UserError(f"metric state is for {state['n_layer']} layers, the model has {self.n_layer}")
        for circuit in CIRCUITS:
            saved = state["initial_imbalance"][circuit]
            if saved.shape != self.initial_imbalance[circuit].shape:
                raise UserError(f"metric state I_0[{circuit}] has shape {tuple(saved.shape)}, "
                                f"expected {tuple(self.initial_imbalance[circuit].shape)}")
            device = self.initial_imbalance[circuit].device
            self.initial_imbalance[circuit] = saved.to(device=device, dtype=torch.float64)
            self.beta_norm_sq[circuit] = state["beta_norm_sq"][circuit].to(device=device, dtype=torch.float64)
        self._targets.clear()


# --------------------------------------------------------------------------------------
# attnid inspect CKPT
# --------------------------------------------------------------------------------------

def layer_counts(shape) -> dict[str, int | float]:
    """Attention parameters and unidentified ones in one layer of this shape (a counts.LayerShape).

    Per key/value group ``D²`` in the query-key product (``D`` with RoPE, Prop. 4.8;
    Cor. 4.4) and ``C²`` in the output-value product (Lemma 4.6); with biases also
    the key and value biases (§4.7).
    """
    from attnid import counts

    return {"attention_params": counts.attention_params_per_layer(shape),
            "unidentified_qk": counts.unidentified_qk_params(shape),
            "unidentified_ov": counts.unidentified_ov_params(shape),
            "unidentified_bias": counts.unidentified_bias_params(shape),
            "unidentified": counts.unidentified_params_per_layer(shape),
            "identified_fraction": 1 - counts.unidentified_params_per_layer(shape)
            / counts.attention_params_per_layer(shape)}


def _orbit_columns(model) -> dict[int, dict]:
    """Per layer: each circuit's orbit kind and dimension at the weights, and whether every one equals
    counts.py's closed form (:func:`attnid.orbits.orbit_dimension_rows`)."""
    per_layer: dict[int, dict] = {}
    for row in orbits.orbit_dimension_rows(model):
        columns = per_layer.setdefault(row["layer"], {"orbit_matches_closed_form": True})
        columns[f"orbit_{row['circuit']}"] = row["orbit"]
        columns[f"orbit_dim_{row['circuit']}"] = row["orbit_dimension"]
        columns["orbit_matches_closed_form"] &= row["orbit_dimension"] == row["closed_form"]
    return per_layer


@torch.no_grad()
def inspect_model(model) -> dict:
    """Per layer: μ and the conserved imbalance norm of both circuits on the architecture's own orbit,
    the orbit dimension used, and the identification counts of :mod:`attnid.counts` for the layer's
    shape (MHA, GQA, RoPE, a head width of its own)."""
    layout = orbits.layout_of(model)
    kinds = {c: orbits.orbit_kind(model, c) for c in CIRCUITS}
    layers = []
    per_circuit = {c: orbits.model_pairs(model, c) for c in CIRCUITS}
    counted = layer_counts(orbits.layer_shape(model))
    dimensions = _orbit_columns(model)
    totals = {c: [torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)] for c in CIRCUITS}
    for layer in range(len(symmetry.attention_blocks(model))):
        row = {"layer": layer, "heads": layout.n_head, "kv_heads": layout.n_kv_head, "head_dim": layout.head_dim,
               "rope": layout.rope}
        for circuit in CIRCUITS:
            pair_a, pair_b = per_circuit[circuit][layer]
            frobenius_sq, minimum = orbits.excess_norm_terms(kinds[circuit], pair_a, pair_b)
            totals[circuit][0] += frobenius_sq.sum().cpu()
            totals[circuit][1] += minimum.sum().cpu()
            row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
            conserved = orbits.conserved_imbalance(kinds[circuit], pair_a, pair_b)
            row[f"imbalance_norm_{circuit}"] = float(conserved.square().sum().sqrt())
        row.update(counted)
        row.update(dimensions[layer])
        layers.append(row)
    summary = {f"mu_{c}": excess_norm(*totals[c]) for c in CIRCUITS}
    for circuit in CIRCUITS:  # sqrt of the sum over layers of ||I||_F^2
        summary[f"imbalance_norm_{circuit}"] = math.sqrt(sum(r[f"imbalance_norm_{circuit}"] ** 2 for r in layers))
    summary["attention_params"] = sum(r["attention_params"] for r in layers)
    summary["unidentified"] = sum(r["unidentified"] for r in layers)
    summary["identified_fraction"] = 1 - summary["unidentified"] / summary["attention_params"]
    summary["orbit_matches_closed_form"] = all(r["orbit_matches_closed_form"] for r in layers)
    return {"n_layer": len(layers), "n_head": layout.n_head, "n_kv_head": layout.n_kv_head,
            "head_dim": layout.head_dim, "rope": layout.rope, "n_embd": layout.n_embd, "bias": layout.bias,
            "layers": layers, "total": summary}


def format_inspection(report: dict) -> str:
    columns = [("layer", "{}"), ("heads", "{}"), ("mu_qk", "{:.4g}"), ("mu_ov", "{:.4g}"),
               ("imbalance_norm_qk", "{:.4g}"), ("imbalance_norm_ov", "{:.4g}"),
               ("attention_params", "{}"), ("orbit_qk", "{}"), ("orbit_dim_qk", "{}"), ("unidentified_qk", "{}"),
               ("orbit_dim_ov", "{}"), ("unidentified_ov", "{}"), ("unidentified_bias", "{}"),
               ("identified_fraction", "{:.6f}")]
    headers = ["layer", "heads", "mu_qk", "mu_ov", "|I_qk|_F", "|I_ov|_F", "attn params",
               "orbit qk", "dim qk", "unid qk", "dim ov", "unid ov", "unid bias", "identified"]
    cells = [[fmt.format(row[key]) for key, fmt in columns] + [("" if row["orbit_matches_closed_form"] else "MISMATCH")]
             for row in report["layers"]]
    headers.append("dim = closed form")
    total = report["total"]
    cells.append(["all", "", f"{total['mu_qk']:.4g}", f"{total['mu_ov']:.4g}",
                  f"{total['imbalance_norm_qk']:.4g}", f"{total['imbalance_norm_ov']:.4g}",
                  str(total["attention_params"]), "", "", "", "", "", str(total["unidentified"]),
                  f"{total['identified_fraction']:.6f}", "yes" if total["orbit_matches_closed_form"] else "NO"])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = [f"n_layer={report['n_layer']} n_head={report['n_head']} n_kv_head={report['n_kv_head']} "
             f"head_dim={report['head_dim']} rope={report['rope']} n_embd={report['n_embd']} bias={report['bias']}",
             "  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="nanoGPT-format ckpt.pt (ours or nanoGPT's, compiled or not)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")


def run_inspect(args) -> int:
    from attnid.model import load_nanogpt_checkpoint

    try:
        model = load_nanogpt_checkpoint(args.checkpoint)
    except (KeyError, AttributeError, TypeError, ValueError) as err:
        raise UserError(f"{args.checkpoint} is not a usable nanoGPT checkpoint ({type(err).__name__}: {err})") from None
    try:
        report = inspect_model(model)
    except ValueError as err:  # a shape counts.py has no closed form for (e.g. heads wider than E)
        raise UserError(f"{args.checkpoint}: {err}") from None
    print(json.dumps(report, indent=2) if args.json else format_inspection(report))
    return 0
