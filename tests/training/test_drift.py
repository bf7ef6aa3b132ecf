"""The exact drift split I_t - I_ref = D1 + D2 (attnid.measure.drift) on tiny nanoGPTs, optimizers
driven directly."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from attnid.common.errors import UserError
from attnid.measure import rebalancing
from attnid.measure.drift import (
    DriftTracker,
    attention_snapshot,
    coupled_decay_first_order,
    imbalance_step_terms,
    stacked_pairs,
)
from attnid.measure.metrics import MetricTracker
from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import layout_of
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS

VOCAB, BLOCK, WEIGHT_DECAY = 11, 8, 0.1
CASES = ("sgd", "sgd_wd", "sgd_momentum", "adamw")


def tiny_gpt(dtype=torch.float64, n_layer: int = 2, bias: bool = False, sharpen: float = 1.0) -> GPT:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_embd=16, bias=bias)
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):  # nanoGPT zero-inits biases; nonzero ones exercise the bias columns
                param.normal_(0, 0.1)
        for block in model.transformer.h:  # sharper attention: larger query-key gradients
            block.attn.c_attn.weight.mul_(sharpen)
    return model.to(dtype)


def make_optimizer(case: str, model: GPT, lr: float | None = None) -> torch.optim.Optimizer:
    if case == "sgd":
        return torch.optim.SGD(model.optimizer_groups(0.0), lr=lr or 0.5)
    if case == "sgd_wd":
        return torch.optim.SGD(model.optimizer_groups(WEIGHT_DECAY), lr=lr or 0.5)
    if case == "sgd_momentum":
        return torch.optim.SGD(model.optimizer_groups(0.0), lr=lr or 0.1, momentum=0.9)
    return torch.optim.AdamW(model.optimizer_groups(WEIGHT_DECAY), lr=lr or 1e-3)


def batches(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield (
            torch.randint(0, VOCAB, (4, BLOCK), generator=gen),
            torch.randint(0, VOCAB, (4, BLOCK), generator=gen),
        )


def train(
    model, optimizer, tracker: DriftTracker, data, steps: int, clip: float = 1.0, on_step=None
) -> list[float]:
    """``steps`` optimizer steps with the tracker around each; returns the pre-clip gradient norms."""
    grad_norms = []
    for _ in range(steps):
        _, loss = model(*next(data))
        loss.backward()
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        pre = tracker.before_step(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tracker.after_step(model, lr=optimizer.param_groups[0]["lr"])
        if on_step is not None:
            on_step(pre)
    return grad_norms


def tracked_run(case: str, dtype, steps: int = 30, **model_kwargs):
    model = tiny_gpt(dtype, **model_kwargs)
    optimizer = make_optimizer(case, model)
    tracker = DriftTracker(model, coupled_weight_decay=WEIGHT_DECAY if case == "sgd_wd" else None)
    train(model, optimizer, tracker, batches(), steps)
    return model, tracker


# ----- the identity itself ----------------------------------------------------------------


def test_step_terms_are_the_exact_change_and_first_order_vanishes_for_a_gradient():
    gen = torch.Generator().manual_seed(3)
    pair_a, pair_b = (torch.randn(5, 4, 7, generator=gen, dtype=torch.float64) for _ in range(2))
    step_a, step_b = (0.3 * torch.randn(5, 4, 7, generator=gen, dtype=torch.float64) for _ in range(2))
    first, second = imbalance_step_terms(pair_a, pair_b, step_a, step_b)
    change = factor_pairs.imbalance(pair_a + step_a, pair_b + step_b) - factor_pairs.imbalance(pair_a, pair_b)
    assert torch.allclose(first + second, change, rtol=0, atol=1e-13)
    assert first.norm() > 1 and second.norm() > 0.1  # a generic step has both parts

    # any loss of A^T B: its gradient is orthogonal to the orbit, so L = 0 (Lemma 5.1)
    pair_a.requires_grad_(True), pair_b.requires_grad_(True)
    torch.sin(pair_a.transpose(-1, -2) @ pair_b).sum().backward()
    grad_first, _ = imbalance_step_terms(pair_a.detach(), pair_b.detach(), -pair_a.grad, -pair_b.grad)
    assert grad_first.abs().max() < 1e-13 * pair_a.grad.norm() * pair_a.norm()


def test_coupled_decay_prediction_uses_the_decaying_columns_only():
    gen = torch.Generator().manual_seed(4)
    pair_a, pair_b = (torch.randn(3, 4, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    step_a, step_b = -0.01 * 0.1 * pair_a, -0.01 * 0.1 * pair_b  # decay alone, lr 0.01, lambda 0.1
    first, _ = imbalance_step_terms(pair_a, pair_b, step_a, step_b)
    assert torch.allclose(coupled_decay_first_order(pair_a, pair_b, 0.01, 0.1), first, rtol=0, atol=1e-15)
    masked_a, masked_b = step_a.clone(), step_b.clone()
    masked_a[..., -1] = masked_b[..., -1] = 0  # non-decaying (bias) columns
    first_masked, _ = imbalance_step_terms(pair_a, pair_b, masked_a, masked_b)
    predicted = coupled_decay_first_order(
        pair_a, pair_b, 0.01, 0.1, weight_columns=(torch.arange(5), torch.arange(5))
    )
    assert torch.allclose(predicted, first_masked, rtol=0, atol=1e-15)
    assert not torch.allclose(predicted, first, rtol=0, atol=1e-6)


# ----- (a) closure, whatever the optimizer and training precision ----------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", CASES)
def test_closure_is_float64_round_off(case, dtype):
    model, tracker = tracked_run(case, dtype)
    row = tracker.row(model)
    for circuit in CIRCUITS:
        assert row[f"closure_{circuit}"] < 1e-12, (case, circuit, row[f"closure_{circuit}"])
        assert row[f"drift1_{circuit}"] + row[f"drift2_{circuit}"] > 1e-9  # something drifted to be closed


def test_row_has_per_layer_columns_and_starts_at_zero():
    model = tiny_gpt()
    tracker = DriftTracker(model)
    row = tracker.row(model)
    expected = {f"{name}_{c}" for name in ("drift1", "drift2", "closure") for c in CIRCUITS}
    expected |= {
        f"{name}_{c}_l{layer}" for name in ("drift1", "drift2") for c in CIRCUITS for layer in (0, 1)
    }
    assert set(row) == expected
    assert all(value == 0.0 for value in row.values())


# ----- (b) plain SGD: all drift is second order (E1 as an identity) ----------------------


def test_plain_sgd_with_clipping_has_no_first_order_drift():
    model = tiny_gpt(sharpen=10.0)
    optimizer = make_optimizer("sgd", model, lr=0.5)
    tracker = DriftTracker(model)
    rho_tracker = MetricTracker(model, probe_batch=next(batches(9)))
    step_ratios, rhos = [], []

    def per_step(pre):
        for circuit in CIRCUITS:
            pre_a, pre_b = stacked_pairs(pre, layout_of(model), circuit)
            now_a, now_b = stacked_pairs(attention_snapshot(model), layout_of(model), circuit)
            step_a, step_b = now_a - pre_a, now_b - pre_b
            first, _ = imbalance_step_terms(pre_a, pre_b, step_a, step_b)
            # L relative to its size for a generic step of this length: round-off of the realised step
            scale = step_a.norm() * pre_a.norm() + step_b.norm() * pre_b.norm()
            step_ratios.append(float(first.norm() / scale))
        row = rho_tracker.step_metrics(model, pre)
        rhos.extend(row[f"rho_{circuit}"] for circuit in CIRCUITS)

    grad_norms = train(model, optimizer, tracker, batches(), 30, clip=0.5, on_step=per_step)
    assert max(grad_norms) > 0.5  # clipping was active
    assert max(step_ratios) < 1e-12
    assert max(rhos) < 1e-20
    row = tracker.row(model)
    for circuit in CIRCUITS:
        assert row[f"drift2_{circuit}"] > 1e-8
        assert row[f"drift1_{circuit}"] / row[f"drift2_{circuit}"] < 1e-9


# ----- (c) SGD with coupled L2 decay: the first-order drift is -2 eta lambda I ---------------


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_sgd_wd_first_order_drift_equals_its_prediction(bias):
    model, tracker = tracked_run("sgd_wd", torch.float64, bias=bias)
    row = tracker.row(model)
    for circuit in CIRCUITS:
        assert row[f"drift1_pred_{circuit}"] > 1e-3
        assert row[f"drift1_pred_relerr_{circuit}"] < 1e-6
        assert row[f"drift1_{circuit}"] == pytest.approx(row[f"drift1_pred_{circuit}"], rel=1e-6)


def test_sgd_wd_prediction_from_the_full_imbalance_misses_the_undecayed_biases():
    """Biases do not decay (nanoGPT's groups): -2 eta lambda I with I's bias columns is off by their
    outer products."""
    model = tiny_gpt(bias=True)
    optimizer = make_optimizer("sgd_wd", model)
    tracker = DriftTracker(model, coupled_weight_decay=WEIGHT_DECAY)
    full_prediction = {c: 0.0 for c in CIRCUITS}

    def add_full_prediction(pre):
        for circuit in CIRCUITS:
            full_prediction[circuit] = full_prediction[circuit] + coupled_decay_first_order(
                *stacked_pairs(pre, layout_of(model), circuit), optimizer.param_groups[0]["lr"], WEIGHT_DECAY
            )

    train(model, optimizer, tracker, batches(), 10, on_step=add_full_prediction)
    for circuit in CIRCUITS:
        error = (tracker.first[circuit] - full_prediction[circuit]).norm() / full_prediction[circuit].norm()
        assert error > 1e-3
        assert tracker.row(model)[f"drift1_pred_relerr_{circuit}"] < 1e-6


# ----- (d) AdamW moves along the orbit at first order (E2) --------------------------------


def test_adamw_drift_is_first_order():
    model, tracker = tracked_run("adamw", torch.float64)
    row = tracker.row(model)
    for circuit in CIRCUITS:
        assert row[f"drift1_{circuit}"] / row[f"drift2_{circuit}"] > 10


# ----- (e) checkpointing, and rebalancing resets the reference -------------------------------


def test_state_dict_round_trip_continues_identically():
    model = tiny_gpt()
    optimizer = make_optimizer("sgd_wd", model)
    tracker = DriftTracker(model, coupled_weight_decay=WEIGHT_DECAY)
    data = batches()
    train(model, optimizer, tracker, data, 10)

    buffer = io.BytesIO()
    torch.save(tracker.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    tensors = [
        t
        for key in ("norm_sq", "reference", "first", "second", "predicted_first")
        for t in state[key].values()
    ]
    assert all(t.device.type == "cpu" and t.dtype == torch.float64 for t in tensors)

    resumed_model = copy.deepcopy(model)
    resumed_optimizer = make_optimizer("sgd_wd", resumed_model)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed = DriftTracker(resumed_model, coupled_weight_decay=WEIGHT_DECAY)  # its own reference: now
    resumed.load_state_dict(state)
    later = [next(data) for _ in range(10)]
    train(model, optimizer, tracker, iter(later), 10)
    train(resumed_model, resumed_optimizer, resumed, iter(later), 10)
    assert tracker.row(model) == resumed.row(resumed_model)


def test_load_state_dict_refuses_another_run():
    state = DriftTracker(tiny_gpt(n_layer=2)).state_dict()
    with pytest.raises(UserError, match="layers"):
        DriftTracker(tiny_gpt(n_layer=1)).load_state_dict(state)
    with pytest.raises(UserError, match="weight decay"):
        DriftTracker(tiny_gpt(), coupled_weight_decay=WEIGHT_DECAY).load_state_dict(state)


def test_after_step_needs_before_step():
    model = tiny_gpt()
    with pytest.raises(RuntimeError, match="before_step"):
        DriftTracker(model).after_step(model)


def test_reset_reference_after_a_rebalance_keeps_the_closure():
    model = tiny_gpt()
    optimizer = make_optimizer("adamw", model)
    tracker = DriftTracker(model)
    rebalancer = MetricTracker(model, probe_batch=next(batches(9)))
    data = batches()
    train(model, optimizer, tracker, data, 10)
    rebalancing.rebalancing_move(model, rebalancer, target="balanced")  # an orbit move: not an optimizer step
    moved = tracker.row(model)
    tracker.reset_reference(model)
    assert all(tracker.row(model)[f"drift1_{c}"] == 0.0 for c in CIRCUITS)
    train(model, optimizer, tracker, data, 10)
    row = tracker.row(model)
    for circuit in CIRCUITS:
        assert moved[f"closure_{circuit}"] > 1e-3  # without the reset the move would count as drift
        assert row[f"closure_{circuit}"] < 1e-12
        assert row[f"drift1_{circuit}"] > 1e-6
