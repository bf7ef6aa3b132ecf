"""The three interventions on the orbit (docs/design.md §13-§15): the projected step, the gauge-fixed
parametrisation and AdamW's moments transported across a rebalance. Each identity is checked against
its residual; the training runs are tiny (2 layers, E = 32, tens of steps)."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_helpers import REPO
from tiny_runs import train
from variant_models import TINY

from attnid.measure.drift import attention_snapshot, imbalance_step_terms
from attnid.measure.metrics import MetricTracker
from attnid.model import gauge, moves
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint
from attnid.model.layout import attention_tensors, layout_of, orbit_of, stacked_pairs
from attnid.model.options import INITIAL_VALUES
from attnid.model.step_projection import remove_orbit_component
from attnid.theory import counts, whole_model
from attnid.theory.circuits import CIRCUITS
from attnid.theory.orbits import GENERAL_LINEAR, ROPE_COMMUTANT
from attnid.training import moments
from attnid.training.options import REBALANCE_MOMENTS

F64 = torch.float64
PROPERTY = settings(max_examples=40, deadline=None, database=None, derandomize=True)


def run_outputs(out) -> tuple[dict, pd.DataFrame]:
    return json.loads((out / "run.json").read_text()), pd.read_csv(out / "metrics.csv")


def tiny_model(variant: dict, bias: bool = False, seed: int = 0, dtype=F64) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **variant}, bias=bias)).to(dtype)


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 23, (3, 16), generator=gen), torch.randint(0, 23, (3, 16), generator=gen)


def adamw_step(model, optimizer) -> None:
    _, loss = model(*batch())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


VARIANTS = {
    "mha": {},
    "gqa G=2": {"n_kv_head": 2},
    "rope": {"rope": True},
    "rope+gqa G=2": {"rope": True, "n_kv_head": 2},
}


# --------------------------------------------------------------------------------------
# §13: the projected step
# --------------------------------------------------------------------------------------


@st.composite
def pairs_and_steps(draw):
    """Random pairs (P, D, n_a), (P, D, n_b) (D even, for the RoPE planes) and a random step."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    pairs, dim = draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3))
    n_a, n_b = dim + draw(st.integers(0, 4)), dim + draw(st.integers(0, 4))
    scale_a, scale_b = 10.0 ** draw(st.floats(-1, 1)), 10.0 ** draw(st.floats(-1, 1))
    pair_a = scale_a * torch.randn(pairs, dim, n_a, generator=gen, dtype=F64)
    pair_b = scale_b * torch.randn(pairs, dim, n_b, generator=gen, dtype=F64)
    step = (
        scale_a * torch.randn(pair_a.shape, generator=gen, dtype=F64),
        scale_b * torch.randn(pair_b.shape, generator=gen, dtype=F64),
    )
    return pair_a, pair_b, step


@PROPERTY
@given(pairs_and_steps(), st.sampled_from(["gl", "rope"]))
def test_a_step_orthogonal_to_the_orbit_has_no_first_order_imbalance_drift(sample, kind):
    """docs/design.md §13: the step minus its tangent projection satisfies dA Aᵀ = B dBᵀ (GL_D), so the
    first-order part L = R + Rᵀ of §7 vanishes; on the RoPE orbit P(L) = 0. The raw step's L does not."""
    pair_a, pair_b, (step_a, step_b) = sample
    orbit = GENERAL_LINEAR if kind == "gl" else ROPE_COMMUTANT
    along_a, along_b = orbit.tangent_projection(pair_a, pair_b, step_a, step_b)
    kept_a, kept_b = step_a - along_a, step_b - along_b
    scale = (pair_a.square().sum((-1, -2)) + pair_b.square().sum((-1, -2))) * (
        step_a.square().sum((-1, -2)) + step_b.square().sum((-1, -2))
    )  # (P,) ||(A, B)||^2 ||(dA, dB)||^2
    first, _ = imbalance_step_terms(pair_a, pair_b, kept_a, kept_b)
    residual = orbit.project_to_algebra(first).square().sum((-1, -2))
    assert (residual <= 1e-24 * scale).all()
    assert (
        orbit.unidentified_sq_norm(pair_a, pair_b, kept_a, kept_b)[0]
        <= 1e-24 * (kept_a.square().sum((-1, -2)) + kept_b.square().sum((-1, -2)))
    ).all()
    if kind == "gl":
        orthogonality = kept_a @ pair_a.transpose(-1, -2) - pair_b @ kept_b.transpose(-1, -2)  # R
        assert (orthogonality.square().sum((-1, -2)) <= 1e-24 * scale).all()
    raw, _ = imbalance_step_terms(pair_a, pair_b, step_a, step_b)
    assert (orbit.project_to_algebra(raw).square().sum((-1, -2)) > 1e-6 * scale).all()


@PROPERTY
@given(pairs_and_steps())
def test_the_removed_part_changes_no_product_to_first_order(sample):
    """What the projection removes is a tangent vector (M A, -Mᵀ B): the first-order change of Aᵀ B,
    dAᵀ B + Aᵀ dB, is the same for the kept step as for the optimizer's: nothing the function sees is lost."""
    pair_a, pair_b, (step_a, step_b) = sample
    along_a, along_b = GENERAL_LINEAR.tangent_projection(pair_a, pair_b, step_a, step_b)

    def first_order(d_a, d_b):
        return d_a.transpose(-1, -2) @ pair_b + pair_a.transpose(-1, -2) @ d_b

    change = first_order(step_a, step_b)
    difference = first_order(step_a - along_a, step_b - along_b) - change
    assert difference.abs().max() <= 1e-12 * change.abs().max()


def orbit_share_in_metric(pair_a, pair_b, step_a, step_b, weight_a, weight_b) -> float:
    """The share of a step on the orbit's tangent (``(M A, -Mᵀ B)``) in the metric ``<x, y> = sum w x y``,
    summed over the pairs ``(P, D, n)``: an independent least-squares projection onto the tangent basis."""
    projected = whole = 0.0
    dim = pair_a.shape[-2]
    for a, b, d_a, d_b, w_a, w_b in zip(pair_a, pair_b, step_a, step_b, weight_a, weight_b, strict=True):
        root = torch.cat([w_a.sqrt().flatten(), w_b.sqrt().flatten()])
        basis = []
        for index in range(dim * dim):
            unit = torch.zeros(dim * dim, dtype=F64)
            unit[index] = 1
            unit = unit.reshape(dim, dim)
            basis.append(torch.cat([(unit @ a).flatten(), (-unit.T @ b).flatten()]) * root)
        tangent = torch.stack(basis, dim=1)
        target = torch.cat([d_a.flatten(), d_b.flatten()]) * root
        along = tangent @ torch.linalg.lstsq(tangent, target).solution
        projected, whole = projected + float(along @ along), whole + float(target @ target)
    return projected / whole


def test_adamw_preconditioned_gradient_is_orthogonal_to_the_orbit_in_its_own_metric():
    """docs/design.md §13: with P = sqrt(v_hat) + eps, AdamW's preconditioned gradient P^-1 g is orthogonal to
    the orbit in the metric P (its inner product with a tangent vector t is gᵀ t = 0, the loss being constant
    on the orbit), though not in the Euclidean one. AdamW's actual step is not: its momentum averages
    gradients taken at earlier points, and its decoupled weight decay is not orthogonal in either metric."""
    model = tiny_model({})
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2, betas=(0.9, 0.99))
    for _ in range(5):
        adamw_step(model, optimizer)
    _, loss = model(*batch(2))
    loss.backward()
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    eps = optimizer.param_groups[0]["eps"]

    def per_tensor(make):
        return [tuple(None if t is None else make(t) for t in layer) for layer in attention_tensors(model)]

    def next_moments(t):  # AdamW's moments and preconditioner of the step it would take now
        state, count = optimizer.state[t], float(optimizer.state[t]["step"]) + 1
        first = (beta1 * state["exp_avg"] + (1 - beta1) * t.grad) / (1 - beta1**count)
        second = (beta2 * state["exp_avg_sq"] + (1 - beta2) * t.grad.square()) / (1 - beta2**count)
        return first, second.sqrt() + eps

    layout = layout_of(model)
    with torch.no_grad():
        weights = per_tensor(lambda t: t.detach())
        metric = per_tensor(lambda t: next_moments(t)[1])
        directions = {
            "gradient": per_tensor(lambda t: t.grad / next_moments(t)[1]),
            "momentum": per_tensor(lambda t: next_moments(t)[0] / next_moments(t)[1]),
            "decay": weights,
        }
        share = {}
        for circuit in CIRCUITS:
            pair_a, pair_b = stacked_pairs(weights, layout, circuit)
            weight_a, weight_b = stacked_pairs(metric, layout, circuit)
            for name, direction in directions.items():
                step_a, step_b = stacked_pairs(direction, layout, circuit)
                ones = (torch.ones_like(weight_a), torch.ones_like(weight_b))
                share[name, circuit, "P"] = orbit_share_in_metric(
                    pair_a, pair_b, step_a, step_b, weight_a, weight_b
                )
                share[name, circuit, "euclid"] = orbit_share_in_metric(pair_a, pair_b, step_a, step_b, *ones)
    for circuit in CIRCUITS:
        assert share["gradient", circuit, "P"] < 1e-20
        assert share["gradient", circuit, "euclid"] > 1e-3
        assert share["momentum", circuit, "P"] > 1e-6
        assert share["decay", circuit, "P"] > 1e-3 and share["decay", circuit, "euclid"] > 1e-3


def test_the_projection_covers_the_attention_orbits_of_the_census_only():
    """docs/design.md §13 states the share of the default model's unidentified directions (the whole-model
    census, §12) that the projected step removes: the attention GL_D orbits, from the same closed forms."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["model"]
    vocab_size = len(set((REPO / "assets" / "tinyshakespeare.txt").read_text(encoding="utf-8")))
    shape = whole_model.whole_model_shape(
        n_layer=config["n_layer"],
        n_embd=config["n_embd"],
        n_head=config["n_head"],
        vocab_size=vocab_size,
        block_size=config["block_size"],
        norm_bias=config["bias"],
        qkv_bias=config["bias"],
        mlp_bias=config["bias"],
    )
    classes = whole_model.class_dims(shape)
    attention = classes["attention_qk"] + classes["attention_ov"]
    assert attention == whole_model.attention_only_unidentified(shape)
    total = whole_model.whole_model_unidentified(shape)
    assert attention < total
    design = " ".join((REPO / "docs" / "design.md").read_text().split())
    assert f"{attention:,} of the default model's {total:,} unidentified directions" in design


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_projected_adamw_step_is_off_the_orbit_in_every_variant(variant):
    """One AdamW step (weight decay on) of a float64 GPT with biases, then the projection: rho of the
    realised step on the architecture's own orbit is float64 round-off; the removed share is AdamW's rho."""
    model = tiny_model(VARIANTS[variant], bias=True)
    tracker = MetricTracker(model, probe_batch=batch())
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
    adamw_step(model, optimizer)  # off the init, so that the moments are not the first gradient's sign
    pre = attention_snapshot(model)
    adamw_step(model, optimizer)
    raw = tracker.step_metrics(model, pre)
    removed = remove_orbit_component(model, pre)
    kept = tracker.step_metrics(model, pre)
    for circuit in CIRCUITS:
        removed_sq, step_sq = (float(x) for x in removed[circuit])
        assert removed_sq / step_sq == pytest.approx(raw[f"rho_{circuit}"], rel=1e-9)
        assert raw[f"rho_{circuit}"] > 1e-4
        assert kept[f"rho_{circuit}"] < 1e-20, (circuit, kept[f"rho_{circuit}"])
        # the projected step's first-order drift on this orbit: zero to round-off (docs/design.md §13)
        orbit = orbit_of(model, circuit)
        pre_a, pre_b = stacked_pairs(pre, layout_of(model), circuit)
        now_a, now_b = stacked_pairs(attention_tensors(model), layout_of(model), circuit)
        first, second = imbalance_step_terms(pre_a, pre_b, now_a - pre_a, now_b - pre_b)
        first, second = orbit.project_to_algebra(first), orbit.project_to_algebra(second)
        assert first.norm() < 1e-9 * second.norm()


def rho_of_step(orbit, pre_a, pre_b, post_a, post_b) -> float:
    """ρ of the step from ``(pre_a, pre_b)`` to ``(post_a, post_b)`` on ``orbit`` (docs/design.md §3.1)."""
    step_a, step_b = post_a - pre_a, post_b - pre_b
    unidentified = orbit.unidentified_sq_norm(pre_a, pre_b, step_a, step_b)[0].sum()
    return float(unidentified / (step_a.square().sum() + step_b.square().sum()))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_projected_step_of_a_float32_model_is_at_the_float32_floor(variant):
    """A float32 model's projection runs in float32 (docs/design.md §13): the rho of its kept step is
    float32 round-off, as is that of the float64 projection once rounded to the float32 weights, and the
    two kept steps agree to float32 precision."""
    model32 = tiny_model(VARIANTS[variant], bias=True, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model32.optimizer_groups(0.1), lr=1e-2)
    adamw_step(model32, optimizer)
    pre = attention_snapshot(model32)
    adamw_step(model32, optimizer)
    model64 = copy.deepcopy(model32)  # the same float32 weights, for the float64 projection by hand
    remove_orbit_component(model32, pre)
    layout = layout_of(model32)
    for circuit in CIRCUITS:
        orbit = orbit_of(model64, circuit)
        pre_a, pre_b = stacked_pairs(pre, layout, circuit)
        now_a, now_b = stacked_pairs(attention_tensors(model64), layout, circuit)
        step_a, step_b = now_a - pre_a, now_b - pre_b
        along_a, along_b = orbit.tangent_projection(pre_a, pre_b, step_a, step_b)
        by_float64 = ((now_a - along_a).float().double(), (now_b - along_b).float().double())
        by_float32 = stacked_pairs(attention_tensors(model32), layout, circuit)
        assert rho_of_step(orbit, pre_a, pre_b, now_a, now_b) > 1e-4  # AdamW's step moves along the orbit
        for kept in (by_float64, by_float32):
            assert rho_of_step(orbit, pre_a, pre_b, *kept) < 1e-12, (circuit, kept is by_float32)
        for kept32, kept64, step in zip(by_float32, by_float64, (step_a, step_b), strict=True):
            assert (kept32 - kept64).norm() <= 1e-5 * step.norm()


def test_projected_adamw_conserves_the_imbalance_in_float64(prepared_data_dir, tmp_path):
    """The identity in a training run (docs/design.md §13): float64 adamw_projected has rho < 1e-20 and
    drift1/drift2 < 1e-9 on every log row, both circuits; float64 adamw on the same seed does not."""
    flags = ["--max-iters", "30", "--log-every", "10", "--eval-every", "30", "--dtype", "float64"]
    for case in ("adamw_projected", "adamw"):
        assert train(prepared_data_dir, tmp_path / case, "--case", case, *flags) == 0
    info, frame = run_outputs(tmp_path / "adamw_projected")
    _, plain = run_outputs(tmp_path / "adamw")
    assert info["dtype"] == "float64" and info["status"] == "completed"
    stepped, plain = frame[frame.step > 0], plain[plain.step > 0]
    for circuit in CIRCUITS:
        assert (stepped[f"rho_{circuit}"] < 1e-20).all()
        assert (stepped[f"drift1_{circuit}"] < 1e-9 * stepped[f"drift2_{circuit}"]).all()
        assert (stepped[f"closure_{circuit}"] < 1e-12).all()
        # what was removed is what AdamW would have moved along the orbit
        assert (stepped[f"projected_out_{circuit}"] > 1e-3).all() and (plain[f"rho_{circuit}"] > 1e-3).all()
        assert (plain[f"drift1_{circuit}"] > plain[f"drift2_{circuit}"]).all()


def test_projected_rope_gqa_run_and_no_metrics_run(prepared_data_dir, tmp_path):
    """On a RoPE + GQA model the projection is the commutant's (rho on that orbit at round-off in float64);
    with --no-metrics the projection still runs (it takes its own snapshot) and trains the same weights."""
    flags = [
        "--case",
        "adamw_projected",
        "--max-iters",
        "20",
        "--log-every",
        "10",
        "--eval-every",
        "20",
        "--dtype",
        "float64",
        "--rope",
        "--n-kv-head",
        "2",
    ]
    assert train(prepared_data_dir, tmp_path / "rope", *flags) == 0
    _, frame = run_outputs(tmp_path / "rope")
    stepped = frame[frame.step > 0]
    assert (stepped.rho_qk < 1e-20).all() and (stepped.drift1_qk < 1e-9 * stepped.drift2_qk).all()
    assert train(prepared_data_dir, tmp_path / "bare", *flags, "--no-metrics") == 0
    with_metrics = load_nanogpt_checkpoint(tmp_path / "rope" / "ckpt.pt").state_dict()
    bare = load_nanogpt_checkpoint(tmp_path / "bare" / "ckpt.pt").state_dict()
    assert all(torch.equal(with_metrics[k], bare[k]) for k in with_metrics)


# --------------------------------------------------------------------------------------
# §14: the gauge-fixed parametrisation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant, bias",
    [
        ({}, False),
        ({"n_kv_head": 2}, False),
        ({"n_kv_head": 1}, True),
        ({"head_dim": 12, "n_kv_head": 2}, True),
    ],
)
def test_gauge_fixing_drops_exactly_the_closed_form_and_keeps_the_function(variant, bias):
    """Trained attention entries drop by 2 L G D^2 = L (unidentified_qk + unidentified_ov) of counts.py
    (docs/design.md §5, §14); the fixed blocks are no optimizer parameter; the logits are unchanged."""
    stock = tiny_model(variant, bias, dtype=torch.float32)
    fixed = tiny_model(variant, bias, dtype=torch.float32)
    idx, _ = batch()
    with torch.no_grad():
        before = stock(idx, full_logits=True)[0]
    condition = gauge.fix_gauge(fixed)
    with torch.no_grad():
        after = fixed(idx, full_logits=True)[0]
    assert (after - before).abs().max() <= 1e-5 * before.abs().max()
    assert 1 <= condition < 1e3
    shape = layout_of(stock)
    per_layer = counts.unidentified_qk_params(shape) + counts.unidentified_ov_params(shape)
    closed_form = stock.config.n_layer * per_layer
    layout = layout_of(stock)
    assert (
        closed_form
        == stock.config.n_layer * gauge.fixed_entries_per_layer(layout)
        == 2 * stock.config.n_layer * layout.n_kv_head * layout.head_dim**2
    )
    assert gauge.trainable_attention_params(stock) - gauge.trainable_attention_params(fixed) == closed_form
    assert stock.get_num_params() - fixed.get_num_params() == closed_form
    optimizer = torch.optim.AdamW(fixed.optimizer_groups(0.1), lr=1e-3)
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for layer in gauge.gauge_fixed_layers(fixed):
        assert id(layer.weight) not in in_optimizer and not layer.weight.requires_grad
        assert gauge.gauge_holds(layer)
    # the state dict is nanoGPT's: the same keys and shapes as the stock model's
    shapes = {k: v.shape for k, v in stock.state_dict().items()}
    assert {k: v.shape for k, v in fixed.state_dict().items()} == shapes


def test_gauge_fixed_blocks_stay_bit_exact_and_the_rest_trains():
    """AdamW with weight decay for a few steps: every fixed block is bit-exactly what fix_gauge set (c I),
    every free entry moved, the metrics read the full matrices, and .double() keeps the views."""
    model = tiny_model({"n_kv_head": 2}, bias=True, dtype=torch.float32)
    gauge.fix_gauge(model)
    layers = gauge.gauge_fixed_layers(model)
    fixed_before = [block.clone() for layer in layers for block in layer.fixed_blocks()]
    free_before = [p.detach().clone() for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
    for _ in range(3):
        adamw_step(model, optimizer)
    fixed_after = [block for layer in layers for block in layer.fixed_blocks()]
    assert all(torch.equal(a, b) for a, b in zip(fixed_before, fixed_after, strict=True))
    free_after = [p.detach() for layer in layers for p in layer.parameters()]
    assert all((a != b).float().mean() > 0.99 for a, b in zip(free_after, free_before, strict=True))
    assert attention_tensors(model)[0][0] is layers[0].weight  # the metrics read the whole matrix
    model.double()
    layer = gauge.gauge_fixed_layers(model)[0]
    assert layer.weight.dtype == F64 and layer.query_weight.data_ptr() == layer.weight.data_ptr()
    with torch.no_grad():
        layer.weight[0, 0] += 1.0
    assert layer.query_weight[0, 0] == layer.weight[0, 0]


def test_a_deep_copy_of_a_gauge_fixed_model_keeps_its_parameters_views_of_its_weight():
    """The tau probe moves a deep copy's weights: the copy's free parameters must still be entries of the
    copy's weight (not of the original's, not clones), so the move reaches its forward."""
    model = tiny_model({}, bias=False)
    gauge.fix_gauge(model)
    clone = copy.deepcopy(model)
    layer, copied = gauge.gauge_fixed_layers(model)[0], gauge.gauge_fixed_layers(clone)[0]
    assert copied.weight.data_ptr() != layer.weight.data_ptr()
    assert copied.query_weight.data_ptr() == copied.weight.data_ptr()
    with torch.no_grad():
        copied.weight.mul_(2.0)
    assert torch.equal(copied.query_weight, 2.0 * layer.query_weight)
    x = torch.randn(2, 5, TINY["n_embd"], dtype=F64)
    assert torch.allclose(copied(x), 2.0 * layer(x))  # no bias: the forward is linear in the weight


def test_gauge_move_is_the_balanced_scaled_gauge():
    """gauge_move on random pairs: the product Aᵀ B is kept, the block is exactly c I, ||A'|| = ||B'||."""
    gen = torch.Generator().manual_seed(3)
    pair_a = torch.randn(3, 4, 10, generator=gen, dtype=F64)
    pair_b = 0.1 * torch.randn(3, 4, 7, generator=gen, dtype=F64)
    for circuit in CIRCUITS:
        gauged = pair_b if circuit == "qk" else pair_a
        starts = gauge.best_windows(gauged, 6)
        assert (starts <= 2).all()
        new_a, new_b, condition = gauge.gauge_move(pair_a, pair_b, circuit, starts)
        assert torch.allclose(
            new_a.transpose(-1, -2) @ new_b, pair_a.transpose(-1, -2) @ pair_b, rtol=0, atol=1e-12
        )
        assert torch.allclose(new_a.norm(dim=(-1, -2)), new_b.norm(dim=(-1, -2)), rtol=1e-12)
        new_gauged = new_b if circuit == "qk" else new_a
        for g, start in enumerate(starts.tolist()):
            block = new_gauged[g, :, start : start + 4]
            assert torch.equal(block, block[0, 0] * torch.eye(4, dtype=F64)) and block[0, 0] > 0
        assert (condition >= 1).all()


def test_gauge_fixed_run_same_start_loads_in_gpt_and_resumes(prepared_data_dir, tmp_path):
    """attnid train --case adamw_gauge_fixed: step 0 has adamw's val loss (same seed, same function),
    run.json counts the closed form's fewer trained entries, the checkpoint loads in the stock GPT with the
    trained function, and a stopped run resumes to the uninterrupted one's metrics."""
    flags = [
        "--max-iters",
        "20",
        "--log-every",
        "5",
        "--eval-every",
        "10",
        "--ckpt-every",
        "10",
        "--seed",
        "3",
    ]
    assert train(prepared_data_dir, tmp_path / "adamw", "--case", "adamw", *flags) == 0
    assert train(prepared_data_dir, tmp_path / "fixed", "--case", "adamw_gauge_fixed", *flags) == 0
    (plain_info, plain), (info, frame) = run_outputs(tmp_path / "adamw"), run_outputs(tmp_path / "fixed")
    assert frame.val_loss[0] == pytest.approx(plain.val_loss[0], rel=1e-6)
    assert info["gauge"]["logit_change"] < 1e-5 and info["gauge"]["condition"] >= 1
    n_layer, n_head, head_dim = 2, 4, 8
    closed_form = 2 * n_layer * n_head * head_dim**2
    assert plain_info["trained_attention_params"] - info["trained_attention_params"] == closed_form
    assert plain_info["n_params"] - info["n_params"] == closed_form
    assert info["gauge"] is not None and plain_info["gauge"] is None
    assert (frame[frame.step > 0].tau < 1e-5).all()  # the probe's orbit move keeps this model's function

    loaded = load_nanogpt_checkpoint(tmp_path / "fixed" / "ckpt.pt")
    checkpoint = torch.load(tmp_path / "fixed" / "ckpt.pt", weights_only=True)
    torch.manual_seed(3)
    trained = GPT(loaded.config)
    gauge.fix_gauge(trained)  # the same windows as the run's (same seed), then the trained weights
    trained.load_state_dict(checkpoint["model"])  # refuses a checkpoint whose blocks are not c I
    torch.manual_seed(3)
    start = GPT(loaded.config)
    gauge.fix_gauge(start)
    for layer_trained, layer_start in zip(gauge.gauge_fixed_layers(trained), gauge.gauge_fixed_layers(start)):
        assert all(
            torch.equal(a, b)
            for a, b in zip(layer_trained.fixed_blocks(), layer_start.fixed_blocks(), strict=True)
        )
    idx, _ = batch()
    trained.eval()
    with torch.no_grad():
        assert torch.equal(loaded(idx, full_logits=True)[0], trained(idx, full_logits=True)[0])

    assert (
        train(
            prepared_data_dir,
            tmp_path / "stopped",
            "--case",
            "adamw_gauge_fixed",
            *flags,
            "--stop-after",
            "10",
        )
        != 0
    )
    assert train(prepared_data_dir, tmp_path / "stopped", "--case", "adamw_gauge_fixed", *flags) == 0
    _, resumed = run_outputs(tmp_path / "stopped")
    timing = ["tokens_per_s", "wall_s"]
    pd.testing.assert_frame_equal(resumed.drop(columns=timing), frame.drop(columns=timing))


def test_gauge_fixed_refuses_what_it_cannot_fix(tmp_path):
    model = tiny_model({"rope": True}, dtype=torch.float32)
    with pytest.raises(Exception, match="does not support --rope"):
        gauge.fix_gauge(model)
    stock = tiny_model({})
    gauge.fix_gauge(stock)
    other = tiny_model({}, seed=5)
    with pytest.raises(RuntimeError, match="a fixed block differs from this model's"):
        stock.load_state_dict(other.state_dict())


# --------------------------------------------------------------------------------------
# §14: the gauge arm's controls (the 2 x 2 of starting point and frozen blocks, and the MLP control)
# --------------------------------------------------------------------------------------


def test_the_controls_start_where_they_should():
    """The from-gauge-point arm starts at the gauge arm's weights, bit for bit; the at-initial-values arm at
    adamw's, bit for bit, with the same windows fixed as the gauge arm."""
    stock = tiny_model({"n_kv_head": 2}, bias=True, dtype=torch.float32)
    gauged = tiny_model({"n_kv_head": 2}, bias=True, dtype=torch.float32)
    moved = tiny_model({"n_kv_head": 2}, bias=True, dtype=torch.float32)
    at_init = tiny_model({"n_kv_head": 2}, bias=True, dtype=torch.float32)
    gauge.fix_gauge(gauged)
    gauge.move_to_gauge_point(moved)
    condition = gauge.fix_gauge(at_init, at=INITIAL_VALUES)
    for key, value in gauged.state_dict().items():
        assert torch.equal(moved.state_dict()[key], value), key
    for key, value in stock.state_dict().items():
        assert torch.equal(at_init.state_dict()[key], value), key
    assert not gauge.gauge_fixed_layers(moved)  # nothing fixed
    for fixed, initial in zip(
        gauge.gauge_fixed_layers(gauged), gauge.gauge_fixed_layers(at_init), strict=True
    ):
        assert fixed.windows == initial.windows  # the same blocks, fixed at another point of the orbit
        assert not gauge.gauge_holds(initial)  # the initial blocks are not c I ...
        for block in initial.fixed_blocks():  # ... but invertible, so they fix the gauge as well
            assert torch.linalg.matrix_rank(block.double()) == block.shape[0]
    assert 1 <= condition < 1e3


def _closed_form(model) -> int:
    shape = layout_of(model)
    return model.config.n_layer * (
        counts.unidentified_qk_params(shape) + counts.unidentified_ov_params(shape)
    )


def test_the_controls_freeze_the_closed_form_and_frozen_entries_never_move():
    """At initial values: 2 L G D^2 fewer trained attention entries; the MLP control: as many MLP entries,
    drawn from the seed. AdamW with weight decay for a few steps moves none of them, and the rest trains."""
    stock = tiny_model({"n_kv_head": 2}, dtype=torch.float32)
    at_init = tiny_model({"n_kv_head": 2}, dtype=torch.float32)
    gauge.fix_gauge(at_init, at=INITIAL_VALUES)
    closed_form = _closed_form(stock)
    assert gauge.trainable_attention_params(stock) - gauge.trainable_attention_params(at_init) == closed_form
    mlp = tiny_model({"n_kv_head": 2}, dtype=torch.float32)
    frozen = gauge.freeze_random_mlp_entries(mlp, seed=0)
    assert frozen.count == closed_form
    again = gauge.freeze_random_mlp_entries(tiny_model({"n_kv_head": 2}, dtype=torch.float32), seed=0)
    other = gauge.freeze_random_mlp_entries(tiny_model({"n_kv_head": 2}, dtype=torch.float32), seed=1)
    masks = [mask for _, mask, _ in frozen.frozen]
    assert all(torch.equal(a, b) for a, (_, b, _) in zip(masks, again.frozen, strict=True))  # fixed by seed
    assert not all(torch.equal(a, b) for a, (_, b, _) in zip(masks, other.frozen, strict=True))
    assert gauge.trainable_attention_params(mlp) == gauge.trainable_attention_params(stock)  # not attention

    blocks = [b.clone() for layer in gauge.gauge_fixed_layers(at_init) for b in layer.fixed_blocks()]
    mlp_before = [(param.detach().clone(), mask) for param, mask, _ in frozen.frozen]
    for model in (at_init, mlp):
        optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
        if model is mlp:
            optimizer.register_step_post_hook(lambda *_: frozen.restore())
        for _ in range(3):
            adamw_step(model, optimizer)
    after = [b for layer in gauge.gauge_fixed_layers(at_init) for b in layer.fixed_blocks()]
    assert all(torch.equal(a, b) for a, b in zip(blocks, after, strict=True))
    for (before, mask), (param, _, _) in zip(mlp_before, frozen.frozen, strict=True):
        assert torch.equal(param.detach()[mask], before[mask])
        assert (param.detach()[~mask] != before[~mask]).float().mean() > 0.99
        state = optimizer.state[param]  # the frozen entries' gradient was zero: no moments either
        assert not state["exp_avg"][mask].any() and not state["exp_avg_sq"][mask].any()


def test_the_control_runs_train_and_record_what_they_froze(prepared_data_dir, tmp_path):
    """attnid train: --initial-point gauge starts adamw at the gauge point (step-0 val loss unchanged,
    nothing fixed); adamw_gauge_fixed --initial-point init starts exactly at adamw's (the same step-0 row) and
    its checkpoint keeps the initial blocks; --freeze-mlp keeps its entries at their initial values through
    training with metrics (the tau probe copies the model), and a stopped run resumes to the same rows."""
    flags = ["--max-iters", "10", "--log-every", "5", "--eval-every", "5", "--ckpt-every", "5", "--seed", "2"]
    runs = {
        "adamw": ["--case", "adamw"],
        "moved": ["--case", "adamw", "--initial-point", "gauge"],
        "at_init": ["--case", "adamw_gauge_fixed", "--initial-point", "init"],
        "mlp": ["--case", "adamw", "--freeze-mlp"],
    }
    for name, case in runs.items():
        assert train(prepared_data_dir, tmp_path / name, *case, *flags) == 0, name
    info = {name: run_outputs(tmp_path / name) for name in runs}
    plain_info, plain = info["adamw"]
    closed_form = 2 * 2 * 4 * 8**2  # L = 2, G = H = 4, D = 8
    moved_info, moved = info["moved"]
    assert moved.val_loss[0] == pytest.approx(plain.val_loss[0], rel=1e-6)
    assert moved_info["gauge"]["fixed"] is False and moved_info["gauge"]["initial_point"] == "gauge"
    assert moved_info["trained_attention_params"] == plain_info["trained_attention_params"]
    at_info, at_init = info["at_init"]
    assert at_init.val_loss[0] == plain.val_loss[0] and at_info["gauge"]["logit_change"] == 0.0
    assert plain_info["trained_attention_params"] - at_info["trained_attention_params"] == closed_form
    mlp_info, _ = info["mlp"]
    assert mlp_info["frozen_mlp_entries"] == closed_form and plain_info["frozen_mlp_entries"] is None

    config = load_nanogpt_checkpoint(tmp_path / "adamw" / "ckpt.pt").config
    torch.manual_seed(2)
    initial = GPT(config)
    frozen = gauge.freeze_random_mlp_entries(initial, seed=2)
    trained = torch.load(tmp_path / "mlp" / "ckpt.pt", weights_only=True)["model"]
    names = {id(param): name for name, param in initial.named_parameters()}
    for param, mask, values in frozen.frozen:
        assert torch.equal(trained[names[id(param)]][mask], values)
        assert not torch.equal(trained[names[id(param)]], param.detach())
    trained_at_init = torch.load(tmp_path / "at_init" / "ckpt.pt", weights_only=True)["model"]
    torch.manual_seed(2)
    fixed = GPT(initial.config)
    gauge.fix_gauge(fixed, at=INITIAL_VALUES)
    fixed.load_state_dict(trained_at_init)  # refuses blocks that are not the initial ones

    stopped = tmp_path / "stopped"
    assert train(prepared_data_dir, stopped, *runs["mlp"], *flags, "--stop-after", "5") != 0
    assert train(prepared_data_dir, stopped, *runs["mlp"], *flags) == 0
    timing = ["tokens_per_s", "wall_s"]
    pd.testing.assert_frame_equal(
        run_outputs(stopped)[1].drop(columns=timing), info["mlp"][1].drop(columns=timing)
    )


def test_the_control_options_refuse_what_they_cannot_do(tmp_path, capsys):
    from attnid.cli import main

    data = tmp_path / "data"
    for flags, message in (
        (["--initial-point", "somewhere"], "unknown --initial-point 'somewhere'"),
        (["--initial-point", "gauge", "--rope"], "does not support --rope"),
        (["--arm", "Bad-Name"], "--arm 'Bad-Name'"),
    ):
        assert main(["train", "--data", str(data), "--out", str(tmp_path / "out"), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


# --------------------------------------------------------------------------------------
# §15: AdamW's moments across a rebalance
# --------------------------------------------------------------------------------------


def _gradients(model) -> dict[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    _, loss = model(*batch())
    loss.backward()
    return {p: p.grad.detach().clone() for p in model.parameters()}


@pytest.mark.parametrize("variant", ["mha", "gqa G=2", "rope"])
def test_transported_first_moment_is_the_gradient_at_the_moved_weights(variant):
    """docs/design.md §15: with m = the gradient at θ, transport across a rebalance gives the gradient at the
    moved weights θ' (G_A -> S^{-T} G_A, G_B -> S G_B) to float64 round-off; the second moment and the step
    counter are left exactly as they were."""
    model = tiny_model(VARIANTS[variant], bias=True)
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
    adamw_step(model, optimizer)
    adamw_step(model, optimizer)
    grads = _gradients(model)
    for param, grad in grads.items():
        optimizer.state[param]["exp_avg"].copy_(grad)
    kept = {
        param: (state["exp_avg_sq"].clone(), state["step"].clone())
        for param, state in optimizer.state.items()
    }
    before = attention_snapshot(model)
    for circuit in CIRCUITS:
        moves.rebalance_model(model, circuit, None)  # balanced: a large move
    moments.transport_first_moment(optimizer, model, before)
    moved = _gradients(model)
    for block in model.transformer.h:
        for param in (block.attn.c_attn.weight, block.attn.c_attn.bias, block.attn.c_proj.weight):
            transported, expected = optimizer.state[param]["exp_avg"], moved[param]
            assert (transported - expected).abs().max() <= 1e-10 * expected.abs().max()
            assert (transported - grads[param]).abs().max() > 1e-3 * expected.abs().max()  # it did move
    for param, (second, step) in kept.items():
        assert torch.equal(optimizer.state[param]["exp_avg_sq"], second)
        assert torch.equal(optimizer.state[param]["step"], step)


def test_the_second_moment_has_an_exact_image_only_under_a_scaled_permutation():
    """docs/design.md §15: (T g)_i^2 is a function of the squares g_k^2 for every g only when each row of T
    has one nonzero entry. Two gradients with the same squares and different cross terms (g, and g with one
    row's sign flipped) move to different squares under a generic T, to equal ones under a monomial T."""
    gen = torch.Generator().manual_seed(3)
    grad = torch.randn(4, 6, generator=gen, dtype=F64)
    flipped = grad.clone()
    flipped[0] = -flipped[0]
    assert torch.equal(grad.square(), flipped.square())
    generic = GENERAL_LINEAR.random_element((), 4, gen)
    assert ((generic @ grad).square() - (generic @ flipped).square()).abs().max() > 1e-2
    diagonal = torch.diag(torch.rand(4, generator=gen, dtype=F64) + 0.5)
    permutation = torch.eye(4, dtype=F64)[[2, 0, 3, 1]]
    for monomial in (diagonal, permutation @ diagonal):
        torch.testing.assert_close((monomial @ grad).square(), (monomial @ flipped).square(), rtol=0, atol=0)
        torch.testing.assert_close(
            (monomial @ grad).square(), monomial.square() @ grad.square(), rtol=1e-15, atol=0
        )


def test_move_element_reads_the_group_element_off_a_move():
    gen = torch.Generator().manual_seed(0)
    pair = torch.randn(2, 4, 9, generator=gen, dtype=F64)
    element = GENERAL_LINEAR.random_element((2,), 4, gen)
    assert torch.allclose(moments.move_element(pair, element @ pair), element, atol=1e-12)
    identity = torch.eye(4, dtype=F64).expand(2, 4, 4)
    assert torch.allclose(moments.move_element(pair, pair), identity, atol=1e-13)


def test_rebalance_moments_options_in_training(prepared_data_dir, tmp_path):
    """keep, first-moment and reset all keep the function across each rebalance (tau < 1e-5); they give three
    different trajectories after the first rebalance and the same one before it."""
    flags = [
        "--case",
        "adamw_rebalance",
        "--max-iters",
        "20",
        "--log-every",
        "5",
        "--rebalance-every",
        "10",
        "--eval-every",
        "20",
    ]
    frames = {}
    for option in REBALANCE_MOMENTS:
        assert train(prepared_data_dir, tmp_path / option, *flags, "--rebalance-moments", option) == 0
        info, frames[option] = run_outputs(tmp_path / option)
        assert info["config"]["rebalance_moments"] == option
        rebalanced = frames[option][frames[option].rebalanced == 1]
        assert rebalanced.step.tolist() == [10, 20] and (rebalanced.tau < 1e-5).all()
    for option in ("first-moment", "reset"):
        same = frames[option].step <= 10
        pd.testing.assert_series_equal(frames[option].train_loss[same], frames["keep"].train_loss[same])
        assert frames[option].train_loss.iloc[-1] != frames["keep"].train_loss.iloc[-1]


def test_replaced_option_in_a_config_file_says_what_to_use(tmp_path):
    from attnid.common.errors import UserError
    from attnid.training.config import read_config_file

    path = tmp_path / "old.yaml"
    path.write_text("reset_optimizer_state: true\n")
    with pytest.raises(UserError, match="--rebalance-moments reset"):
        read_config_file(path)
