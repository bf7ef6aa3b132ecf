"""The drift of the conserved imbalance, split exactly into a first- and a second-order part.

For one factor pair ``(A, B)`` (:mod:`attnid.theory.factor_pairs`) the imbalance
``I = A Aᵀ - B Bᵀ`` is conserved by gradient flow (Lemma 5.1); a discrete optimizer
step changes it. For one step with realised change ``(dA, dB)``
(``A_{t+1} = A_t + dA``: whatever the optimizer did, weight decay included, a
rebalancing move of the paper's §5 excluded) the change is, as an algebraic identity,

    I_{t+1} - I_t = L_t + Q_t
    L_t = dA A_tᵀ + A_t dAᵀ - dB B_tᵀ - B_t dBᵀ      (first order in the step)
    Q_t = dA dAᵀ - dB dBᵀ                            (second order in the step)

(docs/design.md §7). Summing from a reference point, ``D1 = Σ_s L_s`` and
``D2 = Σ_s Q_s`` give ``I_t - I_ref = D1 + D2`` up to float64 round-off (the
*closure*), whatever precision the model trains in: every weight is read as float64,
where the difference of two float32 (or bfloat16) numbers is exact in all but
extreme cases of magnitude, so the closure only measures the float64 products.

What the split predicts, with no fitting:

- plain SGD, clipping included: the gradient of a function of ``Aᵀ B`` satisfies
  ``G_A Aᵀ = B G_Bᵀ`` (it is orthogonal to the orbit, Lemma 5.1), so ``L_t = 0``
  and all of SGD's drift is the discretisation term ``D2`` (claim E1, exact at any
  learning rate; ``L_t`` shows only round-off of the realised step);
- SGD with coupled L2 decay ``λ`` (``dA = -η (G_A + λ A)``): ``L_t = -2 η_t λ I_t``,
  computable from the run's own ``I_t`` (:func:`coupled_decay_first_order`);
- momentum and AdamW: ``L_t ≠ 0`` at first order in ``η``: the optimizer itself
  moves the weights along the orbit (claim E2).

:class:`DriftTracker` accumulates ``D1``, ``D2`` (and the L2 prediction) for every
pair of both circuits (per head, or per key/value group with GQA: :mod:`attnid.model.layout`),
step by step, in float64. For the query-key pairs of a RoPE model only the projection
``P(I)`` of ``I`` onto the restricted orbit's algebra is conserved (per rotation plane
the trace of ``I``'s 2x2 diagonal block; docs/design.md §8), so there every term is
projected: ``P(I_t) - P(I_ref) = P(D1) + P(D2)``, ``P`` being linear. All
functions here are pure and batched over stacked pairs ``(P, D, n)``.
"""

from __future__ import annotations

import math

import torch

from attnid.common.errors import UserError
from attnid.measure.products import CircuitPairs, CircuitStep, read_pairs, steps_between
from attnid.model.layout import (
    LayerTensors,
    attention_blocks,
    attention_tensors,
    layout_of,
    orbit_of,
    stacked_pairs,
)
from attnid.model.layout import weight_columns as pair_weight_columns
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS

STATE_FORMAT = 1

Snapshot = list[LayerTensors]


# --------------------------------------------------------------------------------------
# Pure functions on stacked pairs (P, D, n), float64
# --------------------------------------------------------------------------------------


def imbalance_step_terms(
    pair_a: torch.Tensor, pair_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, Q)``, each ``(..., D, D)``: the exact split of one step's change of ``I = A Aᵀ - B Bᵀ``.

    ``(A, B)`` is the pair before the step and ``(dA, dB)`` the realised step, so that
    ``I(A + dA, B + dB) - I(A, B) = L + Q`` with the first-order part
    ``L = dA Aᵀ + A dAᵀ - dB Bᵀ - B dBᵀ`` (zero for a gradient step, Lemma 5.1) and the
    second-order part ``Q = dA dAᵀ - dB dBᵀ`` (docs/design.md §7).
    """
    (cross_a, step_gram_a), (cross_b, step_gram_b) = (
        factor_pairs.step_products(step_a, pair_a),
        factor_pairs.step_products(step_b, pair_b),
    )
    return imbalance_step_terms_from_products(cross_a, cross_b, step_gram_a, step_gram_b)


def imbalance_step_terms_from_products(
    cross_a: torch.Tensor, cross_b: torch.Tensor, step_gram_a: torch.Tensor, step_gram_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`imbalance_step_terms` from ``dA Aᵀ``, ``dB Bᵀ``, ``dA dAᵀ`` and ``dB dBᵀ``."""
    half_first = cross_a - cross_b  # dA Aᵀ - dB Bᵀ
    return half_first + half_first.transpose(-1, -2), step_gram_a - step_gram_b


def decaying_imbalance(
    pair_a: torch.Tensor, pair_b: torch.Tensor, weight_columns: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """``A_w A_wᵀ - B_w B_wᵀ`` from the pair's weight-matrix columns (indices into ``A``'s and
    ``B``'s columns).

    In nanoGPT's parameter groups (:meth:`attnid.model.gpt.GPT.optimizer_groups`) weight
    matrices decay and biases do not; which columns of a pair are biases is
    :func:`attnid.model.layout.weight_columns` (the last one of each head's block). Without
    biases this is the imbalance ``I`` itself.
    """
    columns_a, columns_b = weight_columns
    return factor_pairs.imbalance(
        pair_a[..., columns_a.to(pair_a.device)], pair_b[..., columns_b.to(pair_b.device)]
    )


def coupled_decay_first_order(
    pair_a: torch.Tensor,
    pair_b: torch.Tensor,
    lr: float,
    weight_decay: float,
    weight_columns: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The first-order part ``L`` of one step of SGD with coupled L2 decay, predicted: ``-2 η λ I_w``.

    With ``dA = -η (c G_A + λ Ã)``, ``dB = -η (c G_B + λ B̃)`` (``c``: the clipping
    factor; ``Ã``: ``A`` with its non-decaying columns zeroed), the gradient part of
    ``L`` vanishes (``G_A Aᵀ = B G_Bᵀ``, Lemma 5.1) and ``Ã Aᵀ = A_w A_wᵀ``, so
    ``L = -2 η λ (A_w A_wᵀ - B_w B_wᵀ)`` exactly (docs/design.md §7). When every
    column decays (no biases) that is ``-2 η λ I``. ``weight_columns=None``: all columns.
    """
    if weight_columns is None:
        current = factor_pairs.imbalance(pair_a, pair_b)
    else:
        current = decaying_imbalance(pair_a, pair_b, weight_columns)
    return (-2.0 * lr * weight_decay) * current


# --------------------------------------------------------------------------------------
# Reading a model's pairs
# --------------------------------------------------------------------------------------


@torch.no_grad()
def attention_snapshot(model: torch.nn.Module) -> Snapshot:
    """float64 copies of each layer's ``(c_attn.weight, c_attn.bias, c_proj.weight)``.

    The same format as :meth:`attnid.measure.metrics.MetricTracker.snapshot`, so one snapshot
    taken before ``optimizer.step()`` serves both ρ and the drift split.
    """

    def copy(tensor):
        return None if tensor is None else tensor.detach().to(torch.float64, copy=True)

    return [tuple(copy(t) for t in tensors) for tensors in attention_tensors(model)]


def _per_layer_sq(values: torch.Tensor, n_layer: int) -> torch.Tensor:
    """``(L*G, D, D)`` -> ``(L,)``: per layer, the sum over its pairs of ``||.||_F²``."""
    return values.square().sum((-1, -2)).reshape(n_layer, -1).sum(-1)


def _relative(numerator: float, denominator: float) -> float:
    if denominator > 0:
        return numerator / denominator
    return 0.0 if numerator == 0 else math.inf


# --------------------------------------------------------------------------------------
# The tracker the training loop calls
# --------------------------------------------------------------------------------------


class DriftTracker:
    """Accumulates ``D1 = Σ L_s`` and ``D2 = Σ Q_s`` for every pair of both circuits (docs/design.md §7).

    Per optimizer step: :meth:`before_step` (a float64 copy of the attention weights)
    right before ``optimizer.step()``, :meth:`after_step` right after it, before any
    rebalancing move. After a rebalance, :meth:`reset_reference` makes the current
    imbalance the new reference ``I_ref`` and zeroes the sums. :meth:`row` reports,
    normalised by β's ``N0 = sqrt(Σ ||A_0 A_0ᵀ||² + ||B_0 B_0ᵀ||²)`` of the weights at
    construction:

    - ``drift1_{qk,ov}`` = ``sqrt(Σ ||D1||_F²) / N0``, ``drift2_*`` likewise for ``D2``,
      and per layer ``drift1_qk_l0`` ... (normalised by that layer's share of ``N0``);
    - ``closure_*`` = ``||I_t - I_ref - D1 - D2|| / N0``: float64 round-off;
    - with ``coupled_weight_decay=λ`` (SGD with coupled L2 decay, no momentum):
      ``drift1_pred_*`` = ``||P|| / N0`` for ``P = Σ_s -2 η_s λ I_{w,s}`` from the
      run's own pre-step weights (:func:`coupled_decay_first_order`), and
      ``drift1_pred_relerr_*`` = ``||D1 - P|| / ||P||``.

    The prediction assumes nanoGPT's parameter groups: weight matrices decay, biases
    do not, so ``I_w`` is built from the weight columns only; it is then exact with
    biases too (with the full ``I`` it would miss ``-2 η λ (b_Q b_Qᵀ - b_K b_Kᵀ)`` per
    query-key pair and ``-2 η λ b_V b_Vᵀ`` per output-value pair).

    All state is float64 on the model's device; :meth:`state_dict` holds CPU tensors
    only, so a checkpoint loads with ``torch.load(weights_only=True)`` and a resumed
    run continues bit-identically.
    """

    def __init__(self, model: torch.nn.Module, coupled_weight_decay: float | None = None):
        self.n_layer = len(attention_blocks(model))
        self.layout = layout_of(model)
        self.orbits = {circuit: orbit_of(model, circuit) for circuit in CIRCUITS}
        self.coupled_weight_decay = None if coupled_weight_decay is None else float(coupled_weight_decay)
        self.norm_sq: dict[str, torch.Tensor] = {}  # circuit -> (L,) Σ ||P(A0A0ᵀ)||² + ||P(B0B0ᵀ)||²
        now = attention_tensors(model)
        for circuit, orbit in self.orbits.items():
            pair_a, pair_b = stacked_pairs(now, self.layout, circuit)
            grams = [orbit.project_to_algebra(factor_pairs.gram(pair)) for pair in (pair_a, pair_b)]
            self.norm_sq[circuit] = _per_layer_sq(grams[0], self.n_layer) + _per_layer_sq(
                grams[1], self.n_layer
            )
        self._pre: Snapshot | None = None
        self.reset_reference(model)

    @torch.no_grad()
    def reset_reference(self, model: torch.nn.Module) -> None:
        """Make the model's current imbalance ``I_ref`` and zero ``D1``, ``D2`` and the prediction
        (after a rebalance)."""
        now = attention_tensors(model)
        self.reference: dict[str, torch.Tensor] = {}  # circuit -> (L*G, D, D)
        for circuit, orbit in self.orbits.items():
            self.reference[circuit] = orbit.conserved_imbalance(*stacked_pairs(now, self.layout, circuit))
        self.first = {c: torch.zeros_like(ref) for c, ref in self.reference.items()}
        self.second = {c: torch.zeros_like(ref) for c, ref in self.reference.items()}
        self.predicted_first = (
            {c: torch.zeros_like(ref) for c, ref in self.reference.items()}
            if self.coupled_weight_decay is not None
            else None
        )

    def before_step(self, model: torch.nn.Module) -> Snapshot:
        """Take (and return) the float64 pre-step snapshot; call right before ``optimizer.step()``.

        The returned snapshot is also what :meth:`attnid.measure.metrics.MetricTracker.step_metrics` needs.
        """
        self._pre = attention_snapshot(model)
        return self._pre

    @torch.no_grad()
    def after_step(self, model: torch.nn.Module, lr: float | None = None) -> None:
        """Add this step's ``L`` and ``Q`` (and, with coupled decay, its predicted ``L`` at rate ``lr``)."""
        if self._pre is None:
            raise RuntimeError("DriftTracker.after_step called without before_step")
        pre, self._pre = self._pre, None
        now = read_pairs(attention_tensors(model), self.layout)
        self.add_step(steps_between(read_pairs(pre, self.layout), now), lr)

    @torch.no_grad()
    def add_step(self, steps: dict[str, CircuitStep], lr: float | None = None) -> None:
        """:meth:`after_step` from the step's :class:`attnid.measure.products.CircuitStep` per circuit."""
        if self.predicted_first is not None and lr is None:
            raise ValueError("DriftTracker with coupled_weight_decay needs the step's lr in after_step")
        for circuit, orbit in self.orbits.items():
            step = steps[circuit]
            first, second = imbalance_step_terms_from_products(
                step.cross_a, step.cross_b, step.step_gram_a, step.step_gram_b
            )
            # on a RoPE query-key orbit only the projection is conserved (docs/design.md §8); P is linear,
            # so the projected terms still add up to the projected change
            self.first[circuit] += orbit.project_to_algebra(first)
            self.second[circuit] += orbit.project_to_algebra(second)
            if self.predicted_first is not None:
                # lr is checked above; the decay is set whenever there is a prediction (__init__)
                assert lr is not None and self.coupled_weight_decay is not None
                columns = pair_weight_columns(self.layout, circuit)
                predicted = coupled_decay_first_order(
                    step.pre.pair_a, step.pre.pair_b, lr, self.coupled_weight_decay, weight_columns=columns
                )
                self.predicted_first[circuit] += orbit.project_to_algebra(predicted)

    @torch.no_grad()
    def row(self, model: torch.nn.Module) -> dict[str, float]:
        """The drift columns at the model's current weights (one sync; call on log steps)."""
        return self.row_at(read_pairs(attention_tensors(model), self.layout))

    @torch.no_grad()
    def row_at(self, points: dict[str, CircuitPairs]) -> dict[str, float]:
        """:meth:`row` at the weights whose :class:`attnid.measure.products.CircuitPairs` are ``points``."""
        row: dict[str, float] = {}
        for circuit, orbit in self.orbits.items():
            current = orbit.conserved_imbalance_from_grams(*points[circuit].grams)
            norm_sq = self.norm_sq[circuit].tolist()
            total_norm = math.sqrt(sum(norm_sq))
            for name, accumulated in (("drift1", self.first[circuit]), ("drift2", self.second[circuit])):
                per_layer = _per_layer_sq(accumulated, self.n_layer).tolist()
                row[f"{name}_{circuit}"] = _relative(math.sqrt(sum(per_layer)), total_norm)
                for layer in range(self.n_layer):
                    row[f"{name}_{circuit}_l{layer}"] = _relative(
                        math.sqrt(per_layer[layer]), math.sqrt(norm_sq[layer])
                    )
            residual = current - self.reference[circuit] - self.first[circuit] - self.second[circuit]
            row[f"closure_{circuit}"] = _relative(float(residual.square().sum().sqrt()), total_norm)
            if self.predicted_first is not None:
                predicted = self.predicted_first[circuit]
                predicted_norm = float(predicted.square().sum().sqrt())
                row[f"drift1_pred_{circuit}"] = _relative(predicted_norm, total_norm)
                error = float((self.first[circuit] - predicted).square().sum().sqrt())
                row[f"drift1_pred_relerr_{circuit}"] = _relative(error, predicted_norm)
        return row

    # ----- checkpointing ------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything a resumed run needs, as CPU float64 tensors and plain numbers."""

        def cpu(tensors):
            return None if tensors is None else {c: t.detach().cpu().clone() for c, t in tensors.items()}

        return {
            "format": STATE_FORMAT,
            "n_layer": self.n_layer,
            "coupled_weight_decay": self.coupled_weight_decay,
            "norm_sq": cpu(self.norm_sq),
            "reference": cpu(self.reference),
            "first": cpu(self.first),
            "second": cpu(self.second),
            "predicted_first": cpu(self.predicted_first),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != STATE_FORMAT or int(state["n_layer"]) != self.n_layer:
            raise UserError(
                f"drift state (format {state.get('format')}, {state.get('n_layer')} layers) does not "
                f"fit this run (format {STATE_FORMAT}, {self.n_layer} layers)"
            )
        if state["coupled_weight_decay"] != self.coupled_weight_decay:
            raise UserError(
                f"drift state has coupled weight decay {state['coupled_weight_decay']}, this run "
                f"{self.coupled_weight_decay}: resume with the same case and --weight-decay"
            )
        device = self.reference[CIRCUITS[0]].device
        loaded = {}
        for key in ("norm_sq", "reference", "first", "second", "predicted_first"):
            if state[key] is None:
                continue
            expected = getattr(self, key)
            for circuit in CIRCUITS:
                if state[key][circuit].shape != expected[circuit].shape:
                    raise UserError(
                        f"drift state {key}[{circuit}] has shape {tuple(state[key][circuit].shape)}, "
                        f"expected {tuple(expected[circuit].shape)}"
                    )
            loaded[key] = {c: state[key][c].to(device=device, dtype=torch.float64) for c in CIRCUITS}
        for key, tensors in loaded.items():
            setattr(self, key, tensors)
        self._pre = None
