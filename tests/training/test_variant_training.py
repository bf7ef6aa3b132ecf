"""GQA, RoPE and RoPE + GQA models through ``attnid train`` and ``attnid inspect``: they train,
resume exactly, and log ρ, β, τ, μ on the orbit of their own architecture (docs/design.md §8).

Tiny real runs on tiny shakespeare (2 layers, E=32, H=4, block 32, batch 8, tens of steps).
"""

from __future__ import annotations

import json
import math
import signal

import pandas as pd
import pytest
import torch
from tiny_runs import train

from attnid.cli import main
from attnid.measure import rebalancing
from attnid.measure.metrics import MetricTracker
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint
from attnid.model.layout import attention_tensors, layout_of, model_pairs, stacked_pairs, write_pairs_back
from attnid.model.moves import orbit_dimension
from attnid.theory import counts, factor_pairs
from attnid.theory.orbits import ORBITS
from attnid.theory.rope import planes, rope_plane_traces, rope_unidentified_sq_norm
from attnid.training.rundir import TIMING_COLUMNS

VARIANT_FLAGS = {
    "mha": [],
    "gqa G=2": ["--n-kv-head", "2"],
    "mqa G=1": ["--n-kv-head", "1"],
    "rope": ["--rope"],
    "rope+gqa G=2": ["--rope", "--n-kv-head", "2"],
}


def metrics(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv").drop(columns=list(TIMING_COLUMNS))


@pytest.mark.parametrize("name", ["gqa G=2", "mqa G=1", "rope+gqa G=2"])
def test_variant_trains_resumes_exactly_and_logs_its_own_orbit(prepared_data_dir, tmp_path, name):
    flags = [
        *VARIANT_FLAGS[name],
        "--case",
        "adamw",
        "--max-iters",
        "20",
        "--log-every",
        "5",
        "--eval-every",
        "10",
        "--ckpt-every",
        "10",
        "--dropout",
        "0.1",
        "--seed",
        "3",
    ]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert train(prepared_data_dir, straight, *flags) == 0
    assert train(prepared_data_dir, stopped, *flags, "--stop-after", "10") == 128 + signal.SIGTERM
    assert train(prepared_data_dir, stopped, *flags) == 0
    frame = metrics(straight)
    pd.testing.assert_frame_equal(metrics(stopped), frame, check_exact=True)

    stepped = frame[frame.step > 0]
    for column in ("beta_qk", "beta_ov", "mu_qk", "mu_ov", "tau", "tau_logits"):
        assert frame[column].notna().all() and (frame[column] >= 0).all(), column
    assert frame.beta_qk[0] == 0.0 and frame.beta_ov[0] == 0.0
    assert (stepped.rho_qk > 1e-4).all() and (stepped.rho_ov > 1e-4).all()  # AdamW leaves the orbit's normal
    assert (stepped.beta_ov > 0).all() and (frame.mu_qk > 0).all()
    # the probe's move (back to I_0 on the architecture's orbit) keeps the function to float32 round-off
    assert (frame.tau < 1e-5).all() and (frame.tau_logits < 1e-4).all()
    assert frame.rho_singular_pairs.max() == 0

    model = load_nanogpt_checkpoint(straight / "ckpt.pt")  # model_args carry the variant
    expected_kv = {"gqa G=2": 2, "mqa G=1": 1, "rope+gqa G=2": 2}[name]
    assert model.config.kv_heads == expected_kv and model.config.rope == ("rope" in name)


def test_rope_rebalancing_moves_on_the_restricted_orbit(prepared_data_dir, tmp_path):
    """Rebalancing a RoPE + GQA model restores the conserved projection of I_0 (beta ~ 0) and keeps the
    function; the full GL_D balance of the same query-key pairs would change it."""
    out = tmp_path / "rope_rebalance"
    assert (
        train(
            prepared_data_dir,
            out,
            *VARIANT_FLAGS["rope+gqa G=2"],
            "--case",
            "adamw_rebalance",
            "--lr",
            "3e-3",
            "--max-iters",
            "20",
            "--log-every",
            "5",
            "--rebalance-every",
            "10",
            "--eval-every",
            "1000",
        )
        == 0
    )
    frame = metrics(out)
    rebalanced = frame[frame.rebalanced == 1]
    assert rebalanced.step.tolist() == [10, 20]
    assert (rebalanced.tau < 1e-5).all() and (rebalanced.tau_logits < 1e-4).all()
    before, after = frame[frame.step == 15].iloc[0], frame[frame.step == 20].iloc[0]
    assert before.beta_qk > 1e-4 and after.beta_qk < 0.01 * before.beta_qk
    assert before.beta_ov > 1e-4 and after.beta_ov < 0.01 * before.beta_ov

    model = load_nanogpt_checkpoint(out / "ckpt.pt").double()
    idx = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(idx, full_logits=True)[0]
    pairs = model_pairs(model, "qk")
    full_gl = []
    for pair_a, pair_b in pairs:
        new_a, new_b, done = factor_pairs.rebalance_pairs(
            pair_a, pair_b, torch.zeros(pair_a.shape[0], 8, 8, dtype=torch.float64)
        )
        assert done.all()
        full_gl.append((new_a, new_b))
    write_pairs_back(model, "qk", full_gl)
    with torch.no_grad():
        moved = model(idx, full_logits=True)[0]
    assert float((moved - logits).abs().max() / logits.abs().max()) > 1e-3


def _rope_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            block_size=16, vocab_size=23, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, rope=True, bias=False
        )
    )
    with torch.no_grad():  # queries and keys large enough that their gradients are well above round-off
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(10)
    return model


def test_rope_rho_beta_mu_use_the_restricted_orbit():
    """On a RoPE model: rho_qk is the restricted tangent's share (below the full GL_D share of the same step),
    beta_qk the drift of the plane traces, mu_qk the excess over sum_p 2 sqrt(|A_p|^2 |B_p|^2)."""
    model = _rope_model()
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randint(0, 23, (4, 16), generator=gen), torch.randint(0, 23, (4, 16), generator=gen))
    tracker = MetricTracker(model, batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    pre = tracker.snapshot(model)
    optimizer.zero_grad()
    model(*batch)[1].backward()
    optimizer.step()
    row = tracker.step_metrics(model, pre) | tracker.state_metrics(model)

    layout = layout_of(model)
    pre_a, pre_b = stacked_pairs(pre, layout, "qk")
    now_a, now_b = stacked_pairs(attention_tensors(model), layout, "qk")
    step_sq = (now_a - pre_a).square().sum() + (now_b - pre_b).square().sum()
    rope_sq, _ = rope_unidentified_sq_norm(pre_a, pre_b, now_a - pre_a, now_b - pre_b)
    gl_sq, _ = factor_pairs.unidentified_sq_norm(pre_a, pre_b, now_a - pre_a, now_b - pre_b)
    assert row["rho_qk"] == pytest.approx(float(rope_sq.sum() / step_sq), rel=1e-12)
    assert 1e-6 < row["rho_qk"] < 0.5 * float(gl_sq.sum() / step_sq)

    traces = rope_plane_traces(factor_pairs.imbalance(now_a, now_b) - factor_pairs.imbalance(pre_a, pre_b))
    norm = (
        ORBITS["rope"].project_to_algebra(factor_pairs.gram(pre_a)).square().sum()
        + ORBITS["rope"].project_to_algebra(factor_pairs.gram(pre_b)).square().sum()
    ).sqrt()
    # the projected drift: plane blocks (t_p / 2) I_2, Frobenius norm sqrt(sum_p t_p^2 / 2)
    assert row["beta_qk"] == pytest.approx(float((traces.square().sum() / 2).sqrt() / norm), rel=1e-10)

    planes_a = planes(now_a).square().sum((-1, -2))
    planes_b = planes(now_b).square().sum((-1, -2))
    expected_mu = float((planes_a + planes_b).sum() / (2 * (planes_a * planes_b).sqrt()).sum() - 1)
    assert row["mu_qk"] == pytest.approx(expected_mu, rel=1e-10)
    assert rebalancing.rebalancing_move(model, tracker, "balanced")["tau"] < 1e-5
    assert tracker.state_metrics(model)["mu_qk"] < 1e-5


# ------------------------------------------------------------------------------ attnid inspect


def _checkpoint(tmp_path, name: str, variant: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=23, n_layer=2, n_head=4, n_embd=32, bias=True, **variant))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    path = tmp_path / f"{name.replace(' ', '_').replace('+', '_')}.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "model_args": model.config.model_args(),
            "iter_num": 0,
            "best_val_loss": 1e9,
            "config": {},
        },
        path,
    )
    return model, path


INSPECT_VARIANTS = {
    "mha": {},
    "gqa G=2": dict(n_kv_head=2),
    "rope": dict(rope=True),
    "rope+gqa G=2": dict(rope=True, n_kv_head=2),
    "rope+mqa D=6": dict(rope=True, n_kv_head=1, head_dim=6),
}


@pytest.mark.parametrize("name", list(INSPECT_VARIANTS))
def test_inspect_orbit_dimensions_equal_the_closed_form(tmp_path, capsys, name):
    model, path = _checkpoint(tmp_path, name, INSPECT_VARIANTS[name])
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    config = model.config
    g, d = config.kv_heads, config.per_head_dim
    shape = counts.layer_shape(32, 4, config.n_kv_head, config.head_dim, rope=config.rope, bias=True)
    for row in report["layers"]:
        assert row["orbit_qk"] == ("rope" if config.rope else "gl") and row["orbit_ov"] == "gl"
        assert row["orbit_dim_qk"] == row["unidentified_qk"] == counts.unidentified_qk_params(shape)
        assert row["orbit_dim_ov"] == row["unidentified_ov"] == g * d * d
        assert row["orbit_dim_qk"] == (g * d if config.rope else g * d * d)
        assert row["orbit_matches_closed_form"] and (row["kv_heads"], row["head_dim"]) == (g, d)
        assert row["mu_qk"] > 0 and row["imbalance_norm_qk"] > 0
    assert report["total"]["orbit_matches_closed_form"]
    assert main(["inspect", str(path)]) == 0
    table = capsys.readouterr().out
    assert "MISMATCH" not in table and f"n_kv_head={g}" in table


def test_inspect_flags_an_orbit_dimension_below_the_closed_form(tmp_path, capsys):
    """Zero one RoPE plane of a group's queries and key: the orbit loses that plane's two directions."""
    model, _ = _checkpoint(tmp_path, "rope+gqa", dict(rope=True, n_kv_head=2))
    d = model.config.per_head_dim
    with torch.no_grad():
        c_attn = model.transformer.h[1].attn.c_attn
        for row in (0, d // 2):
            for head in (0, 1, 4):  # query heads 0, 1 and key head 0 (rows 4*D.. of c_attn)
                c_attn.weight[head * d + row] = 0
                c_attn.bias[head * d + row] = 0
    path = tmp_path / "degenerate.pt"
    torch.save({"model": model.state_dict(), "model_args": model.config.model_args()}, path)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["orbit_matches_closed_form"] for r in report["layers"]] == [True, False]
    assert report["layers"][1]["orbit_dim_qk"] == report["layers"][1]["unidentified_qk"] - 2
    assert main(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "MISMATCH" in lines[3] and "MISMATCH" not in lines[2]
    assert lines[4].split()[0] == "total" and lines[4].endswith("MISMATCH")


# ------------------------------------------------------------------------------ flags


def test_variant_flags_reach_the_model_and_the_resume_key(prepared_data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    flags = [
        "--case",
        "sgd",
        "--max-iters",
        "4",
        "--log-every",
        "2",
        "--eval-every",
        "1000",
        "--ckpt-every",
        "2",
    ]
    assert (
        train(
            prepared_data_dir,
            out,
            *flags,
            "--rope",
            "--n-kv-head",
            "2",
            "--head-dim",
            "6",
            "--stop-after",
            "2",
        )
        == 128 + signal.SIGTERM
    )
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert {k: checkpoint["model_args"][k] for k in ("n_kv_head", "rope", "head_dim")} == {
        "n_kv_head": 2,
        "rope": True,
        "head_dim": 6,
    }
    capsys.readouterr()
    assert train(prepared_data_dir, out, *flags, "--rope", "--n-kv-head", "1", "--head-dim", "6") == 2
    assert "n_kv_head" in capsys.readouterr().err  # another variant cannot resume it
    assert train(prepared_data_dir, out, *flags, "--rope", "--n-kv-head", "2", "--head-dim", "6") == 0

    stock = tmp_path / "stock"  # G = H and D = E/H are the stock model: nanoGPT's model_args
    assert train(prepared_data_dir, stock, *flags, "--n-kv-head", "4", "--head-dim", "8") == 0
    assert set(torch.load(stock / "ckpt.pt", weights_only=True)["model_args"]) == {
        "block_size",
        "vocab_size",
        "n_layer",
        "n_head",
        "n_embd",
        "dropout",
        "bias",
    }


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--n-kv-head", "3"], "--n-kv-head 3 must divide --n-head 4"),
        (["--n-kv-head", "0"], "--n-kv-head must be positive"),
        (["--rope", "--head-dim", "5"], "--rope needs an even head width"),
        (["--n-embd", "30"], "--n-embd 30 is not a multiple of --n-head 4"),
    ],
)
def test_bad_variant_flags_are_one_line(tmp_path, capsys, flags, expected):
    assert (
        main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--n-head", "4", *flags]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_head_dim_flag_trains_a_wide_single_head(prepared_data_dir, tmp_path):
    """--head-dim sets D apart from E/H (the §4.10 single head): the run's orbit is GL_D with D^2 per
    layer."""
    out = tmp_path / "one_head"
    assert (
        main(
            [
                "train",
                "--data",
                str(prepared_data_dir),
                "--out",
                str(out),
                "--n-layer",
                "1",
                "--n-head",
                "1",
                "--head-dim",
                "24",
                "--n-embd",
                "32",
                "--block-size",
                "16",
                "--batch-size",
                "4",
                "--eval-iters",
                "1",
                "--max-iters",
                "4",
                "--log-every",
                "2",
                "--eval-every",
                "1000",
                "--progress-every",
                "1000",
            ]
        )
        == 0
    )
    model = load_nanogpt_checkpoint(out / "ckpt.pt")
    assert model.config.per_head_dim == 24
    assert orbit_dimension(model, 0, "qk") == 24 * 24
    assert math.isfinite(metrics(out).mu_qk.iloc[-1])


# ------------------------------------------------------------------------------ the drift split


def _drift_run(variant: dict, case: str, steps: int = 20):
    """float64 run of a tiny variant with a DriftTracker around every step; also the raw (unprojected)
    first-order terms of the query-key pairs, summed."""
    from attnid.measure.drift import DriftTracker, imbalance_step_terms

    torch.manual_seed(0)
    model = GPT(
        GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=4, n_embd=16, bias=True, **variant)
    ).double()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(10)
    decay = 0.1 if case == "sgd_wd" else 0.0
    optimizer = torch.optim.SGD(model.optimizer_groups(decay), lr=0.5)
    tracker = DriftTracker(model, coupled_weight_decay=decay if case == "sgd_wd" else None)
    layout, raw_first = layout_of(model), 0.0
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        batch = (torch.randint(0, 11, (4, 8), generator=gen), torch.randint(0, 11, (4, 8), generator=gen))
        model(*batch)[1].backward()
        pre = tracker.before_step(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tracker.after_step(model, lr=0.5)
        pre_a, pre_b = stacked_pairs(pre, layout, "qk")
        now_a, now_b = stacked_pairs(attention_tensors(model), layout, "qk")
        raw_first = raw_first + imbalance_step_terms(pre_a, pre_b, now_a - pre_a, now_b - pre_b)[0]
    return tracker.row(model), raw_first


def test_rope_gqa_sgd_drift_is_second_order_only_after_the_projection():
    """Plain SGD on a RoPE + GQA model: the gradient is orthogonal to the restricted orbit, so the
    projected first-order drift vanishes (closure exact), while the unprojected one does not: the full I
    is not conserved."""
    row, raw_first = _drift_run(dict(rope=True, n_kv_head=2), "sgd")
    for circuit in ("qk", "ov"):
        assert row[f"closure_{circuit}"] < 1e-12
        assert row[f"drift2_{circuit}"] > 1e-8
        assert row[f"drift1_{circuit}"] < 1e-9 * row[f"drift2_{circuit}"] + 1e-15
    assert float(raw_first.norm()) > 1e-4


@pytest.mark.parametrize(
    "variant", [dict(n_kv_head=2), dict(rope=True, n_kv_head=1)], ids=["gqa", "rope+mqa"]
)
def test_coupled_decay_prediction_with_side_by_side_query_biases(variant):
    """SGD + L2 on a GQA model with biases: the prediction -2 eta lambda I_w uses every query block's
    weight columns (and is projected for RoPE), and matches the measured first-order drift."""
    row, _ = _drift_run(variant, "sgd_wd")
    for circuit in ("qk", "ov"):
        assert row[f"drift1_pred_{circuit}"] > 1e-4
        assert row[f"drift1_pred_relerr_{circuit}"] < 1e-6
