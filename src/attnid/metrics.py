"""The four logged quantities ρ, β, τ, μ, and ``attnid inspect``.

Definitions (docs/design.md §3; the paper's extracted text does not keep its
formulas, so these are this project's, chosen to test claims E1–E3 exactly). Each
is aggregated over every factor pair of one circuit (``qk`` or ``ov``, see
:mod:`attnid.symmetry`), with a per-layer breakdown under the suffix ``_l{i}``:

- ρ, unidentified share of one optimizer step ``Δ = θ_{t+1} - θ_t``:
  ``Σ ||proj(Δ)||² / Σ ||Δ||²``, projecting onto the orbit tangent space at ``θ_t``
  (Lemma 4.1/4.6). Zero for plain gradient steps (Lemma 5.1).
- β, drift of the conserved imbalance ``I = A Aᵀ - B Bᵀ`` (Lemma 5.1):
  ``sqrt(Σ ||I_t - I_0||²) / sqrt(Σ ||A_0 A_0ᵀ||² + ||B_0 B_0ᵀ||²)``.
- τ, effect of an orbit move (rebalancing, §5) on the function: relative change of
  the probe-batch loss, and max-abs logit change over max-abs logit.
- μ, excess norm on the orbit: ``Σ (||A||² + ||B||²) / Σ 2 ||Aᵀ B||_* - 1 >= 0``.

All maths runs in float64 on the model's device, batched over every head of every
layer with one eigendecomposition call per circuit. Nothing reads global RNG state.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from attnid import symmetry
from attnid.errors import UserError
from attnid.symmetry import CIRCUITS


# --------------------------------------------------------------------------------------
# Stacking pairs of all layers into one batch
# --------------------------------------------------------------------------------------

def _stack(per_layer_pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer ``(H, D, n)`` pairs -> one ``(L*H, D, n)`` batch (all layers share a shape)."""
    return (torch.cat([a for a, _ in per_layer_pairs]), torch.cat([b for _, b in per_layer_pairs]))


def _unstack(pair_a, pair_b, n_layer: int):
    return list(zip(pair_a.chunk(n_layer), pair_b.chunk(n_layer), strict=True))


def _per_layer(values: torch.Tensor, n_layer: int) -> torch.Tensor:
    """``(L*H,)`` per-pair values -> ``(L,)`` per-layer sums."""
    return values.reshape(n_layer, -1).sum(-1)


def _ratio(numerator: float, denominator: float) -> float:
    # a zero step (or zero weights) has no unidentified part: report 0, not NaN
    return numerator / denominator if denominator > 0 else 0.0


def _device(model) -> torch.device:
    return symmetry.attention_blocks(model)[0].attn.c_attn.weight.device


def _circuit_pairs(tensors_per_layer, n_head: int, circuit: str):
    return [symmetry.pairs_from_tensors(w, b, p, n_head, circuit) for w, b, p in tensors_per_layer]


def _model_tensors(model):
    return [symmetry.layer_tensors(block) for block in symmetry.attention_blocks(model)]


def _n_head(model) -> int:
    return symmetry.attention_blocks(model)[0].attn.n_head


def excess_norm(frobenius_sq: torch.Tensor, twice_nuclear: torch.Tensor) -> float:
    """μ from summed :func:`attnid.symmetry.excess_norm_terms` (``inf`` if every product is zero)."""
    total_frob, total_nuclear = float(frobenius_sq.sum()), float(twice_nuclear.sum())
    if total_nuclear > 0:
        return total_frob / total_nuclear - 1.0
    return 0.0 if total_frob == 0 else math.inf


# --------------------------------------------------------------------------------------
# The tracker the training loop calls
# --------------------------------------------------------------------------------------

class MetricTracker:
    """Computes ρ, β, τ, μ for one training run of a nanoGPT-layout model.

    It only measures; the orbit moves it measures τ across are in
    :mod:`attnid.orbit`. Construction records ``I_0`` for every pair of both
    circuits and the β normaliser; :meth:`state_dict` / :meth:`load_state_dict` carry them through a
    checkpoint so a resumed run continues bit-identically.
    """

    def __init__(self, model, probe_batch: tuple[torch.Tensor, torch.Tensor]):
        self.probe_batch = probe_batch
        self.n_layer = len(symmetry.attention_blocks(model))
        self.initial_imbalance: dict[str, torch.Tensor] = {}  # circuit -> (L*H, D, D)
        self.beta_norm_sq: dict[str, torch.Tensor] = {}  # circuit -> (L,) Σ ||A0A0ᵀ||² + ||B0B0ᵀ||²
        for circuit in CIRCUITS:
            pair_a, pair_b = _stack(symmetry.model_pairs(model, circuit))
            gram_a, gram_b = symmetry.gram(pair_a), symmetry.gram(pair_b)
            self.initial_imbalance[circuit] = gram_a - gram_b
            per_pair = gram_a.square().sum((-1, -2)) + gram_b.square().sum((-1, -2))
            self.beta_norm_sq[circuit] = _per_layer(per_pair, self.n_layer)
        # (circuit, target) -> eigh of the rebalancing target, computed once: targets are fixed over a run
        self._target_eigh: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
        # circuit -> (A, B, 2 * nuclear norms) at the weights before the last orbit move (see state_metrics)
        self._nuclear_memo: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def rebalance_targets(self, target: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per circuit, the eigh of the rebalancing target: ``I_0`` (``initial``) or 0 (``balanced``),
        for :func:`attnid.symmetry.rebalance_model`."""
        if target not in ("initial", "balanced"):
            raise UserError(f"rebalance target must be 'initial' or 'balanced', got {target!r}")
        for circuit, initial in self.initial_imbalance.items():
            if (circuit, target) not in self._target_eigh:
                self._target_eigh[circuit, target] = symmetry.target_eigh(initial, target)
        return {circuit: self._target_eigh[circuit, target] for circuit in CIRCUITS}

    def remember_products(self, products: dict) -> None:
        """Keep the product singular values an orbit move computed (``rebalance_model``'s second
        result): :meth:`state_metrics` reuses them for μ when the weights are bit-identical."""
        self._nuclear_memo.update(products)

    def initial_imbalance_scale(self) -> dict[str, float]:
        """Per circuit, ``||I_0||_F / sqrt(Σ ||A_0A_0ᵀ||² + ||B_0B_0ᵀ||²)``: the β of an imbalance
        scaled to zero, which Figure 3's SGD + weight-decay prediction needs (run.json)."""
        return {circuit: float(self.initial_imbalance[circuit].double().square().sum().sqrt()
                               / self.beta_norm_sq[circuit].double().sum().sqrt()) for circuit in CIRCUITS}

    # ----- ρ ------------------------------------------------------------------------

    @staticmethod
    @torch.no_grad()
    def snapshot(model) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """float64 copies of each layer's (c_attn.weight, c_attn.bias, c_proj.weight), taken before a step."""
        def copy(tensor):
            return None if tensor is None else tensor.detach().to(torch.float64, copy=True)
        return [tuple(copy(t) for t in tensors) for tensors in _model_tensors(model)]

    @torch.no_grad()
    def step_metrics(self, model, pre) -> dict[str, float]:
        """ρ per circuit (and per layer) for the step from ``pre`` (a :meth:`snapshot`) to now.

        The projection is onto the tangent space at the pre-step point. Also reports
        ``rho_singular_pairs``: pairs whose Sylvester system was singular and was
        solved by pseudo-inverse (still the exact projection; see
        :func:`attnid.symmetry.tangent_solve`).
        """
        n_head = _n_head(model)
        now = _model_tensors(model)
        row: dict[str, float] = {}
        singular_pairs = 0
        for circuit in CIRCUITS:
            pre_a, pre_b = _stack(_circuit_pairs(pre, n_head, circuit))
            now_a, now_b = _stack(_circuit_pairs(now, n_head, circuit))
            step_a, step_b = now_a - pre_a, now_b - pre_b  # pairs are linear in the weights
            proj_sq, singular = symmetry.unidentified_sq_norm(pre_a, pre_b, step_a, step_b)
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

    @torch.no_grad()
    def state_metrics(self, model) -> dict[str, float]:
        """β and μ per circuit and per layer, at the model's current weights."""
        device = _device(model)
        row: dict[str, float] = {}
        for circuit in CIRCUITS:
            pair_a, pair_b = _stack(symmetry.model_pairs(model, circuit))
            drift = symmetry.imbalance(pair_a, pair_b) - self.initial_imbalance[circuit].to(device)
            drift_sq = _per_layer(drift.square().sum((-1, -2)), self.n_layer).tolist()
            norm_sq = self.beta_norm_sq[circuit].tolist()
            row[f"beta_{circuit}"] = _ratio(math.sqrt(sum(drift_sq)), math.sqrt(sum(norm_sq)))
            for layer in range(self.n_layer):
                row[f"beta_{circuit}_l{layer}"] = _ratio(math.sqrt(drift_sq[layer]), math.sqrt(norm_sq[layer]))
            memo = self._nuclear_memo.pop(circuit, None)
            if memo is not None and torch.equal(memo[0], pair_a) and torch.equal(memo[1], pair_b):
                # the product's singular values at these bit-identical weights, from the last orbit move
                frobenius_sq = pair_a.square().sum((-1, -2)) + pair_b.square().sum((-1, -2))
                twice_nuclear = memo[2]
            else:
                frobenius_sq, twice_nuclear = symmetry.excess_norm_terms(pair_a, pair_b)
            row[f"mu_{circuit}"] = excess_norm(frobenius_sq, twice_nuclear)
            for layer, (frob, nuc) in enumerate(zip(frobenius_sq.chunk(self.n_layer),
                                                    twice_nuclear.chunk(self.n_layer))):
                row[f"mu_{circuit}_l{layer}"] = excess_norm(frob, nuc)
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
        self._target_eigh.clear()


# --------------------------------------------------------------------------------------
# attnid inspect CKPT
# --------------------------------------------------------------------------------------

def layer_counts(n_embd: int, n_head: int, bias: bool) -> dict[str, int | float]:
    """Attention parameters and unidentified ones in one nanoGPT layer, from :mod:`attnid.counts`.

    ``D²`` per head in each of the query-key (Cor. 4.4) and output-value (Lemma 4.6)
    products; with biases also the key and value biases (§4.7).
    """
    from attnid import counts

    shape = counts.layer_shape(n_embd, n_head, bias=bias)
    return {"attention_params": counts.attention_params_per_layer(shape),
            "unidentified_qk": counts.unidentified_qk_params(shape),
            "unidentified_ov": counts.unidentified_ov_params(shape),
            "unidentified_bias": counts.unidentified_bias_params(shape),
            "unidentified": counts.unidentified_params_per_layer(shape),
            "identified_fraction": 1 - counts.unidentified_params_per_layer(shape)
            / counts.attention_params_per_layer(shape)}


@torch.no_grad()
def inspect_model(model) -> dict:
    """Per-layer μ, imbalance norm ‖I‖_F and identification counts of both circuits of a nanoGPT model."""
    n_head = _n_head(model)
    n_embd = symmetry.attention_blocks(model)[0].attn.c_attn.weight.shape[1]
    has_bias = symmetry.attention_blocks(model)[0].attn.c_attn.bias is not None
    layers = []
    per_circuit = {c: symmetry.model_pairs(model, c) for c in CIRCUITS}
    totals = {c: [torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)] for c in CIRCUITS}
    for layer in range(len(symmetry.attention_blocks(model))):
        row = {"layer": layer, "heads": n_head, "head_dim": n_embd // n_head}
        for circuit in CIRCUITS:
            pair_a, pair_b = per_circuit[circuit][layer]
            frobenius_sq, twice_nuclear = symmetry.excess_norm_terms(pair_a, pair_b)
            totals[circuit][0] += frobenius_sq.sum().cpu()
            totals[circuit][1] += twice_nuclear.sum().cpu()
            row[f"mu_{circuit}"] = excess_norm(frobenius_sq, twice_nuclear)
            row[f"imbalance_norm_{circuit}"] = float(symmetry.imbalance(pair_a, pair_b).square().sum().sqrt())
        row.update(layer_counts(n_embd, n_head, has_bias))
        layers.append(row)
    summary = {f"mu_{c}": excess_norm(*totals[c]) for c in CIRCUITS}
    for circuit in CIRCUITS:  # sqrt of the sum over layers of ||I||_F^2
        summary[f"imbalance_norm_{circuit}"] = math.sqrt(sum(r[f"imbalance_norm_{circuit}"] ** 2 for r in layers))
    summary["attention_params"] = sum(r["attention_params"] for r in layers)
    summary["unidentified"] = sum(r["unidentified"] for r in layers)
    summary["identified_fraction"] = 1 - summary["unidentified"] / summary["attention_params"]
    return {"n_layer": len(layers), "n_head": n_head, "n_embd": n_embd, "bias": has_bias,
            "layers": layers, "total": summary}


def format_inspection(report: dict) -> str:
    columns = [("layer", "{}"), ("heads", "{}"), ("mu_qk", "{:.4g}"), ("mu_ov", "{:.4g}"),
               ("imbalance_norm_qk", "{:.4g}"), ("imbalance_norm_ov", "{:.4g}"),
               ("attention_params", "{}"), ("unidentified_qk", "{}"), ("unidentified_ov", "{}"),
               ("unidentified_bias", "{}"), ("identified_fraction", "{:.6f}")]
    headers = ["layer", "heads", "mu_qk", "mu_ov", "|I_qk|_F", "|I_ov|_F", "attn params",
               "unid qk", "unid ov", "unid bias", "identified"]
    cells = [[fmt.format(row[key]) for key, fmt in columns] for row in report["layers"]]
    total = report["total"]
    cells.append(["all", "", f"{total['mu_qk']:.4g}", f"{total['mu_ov']:.4g}",
                  f"{total['imbalance_norm_qk']:.4g}", f"{total['imbalance_norm_ov']:.4g}",
                  str(total["attention_params"]), "", "", str(total["unidentified"]),
                  f"{total['identified_fraction']:.6f}"])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = [f"n_layer={report['n_layer']} n_head={report['n_head']} n_embd={report['n_embd']} bias={report['bias']}",
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
    report = inspect_model(model)
    print(json.dumps(report, indent=2) if args.json else format_inspection(report))
    return 0
