"""MetricTracker (ρ, β, τ, μ) on a tiny nanoGPT, and ``attnid inspect``."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from attnid.cli import main
from attnid.measure import rebalancing
from attnid.measure.inspect import inspect_model
from attnid.measure.metrics import MetricTracker
from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import model_pairs, write_pairs_back
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS

VOCAB, BLOCK = 13, 8


def tiny_gpt(dtype=torch.float64, bias: bool = True, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=3, n_embd=12, bias=bias))
    with torch.no_grad():  # nanoGPT zero-inits biases; nonzero ones exercise the bias columns
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    return model.to(dtype)


def probe(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (4, BLOCK), generator=gen), torch.randint(
        0, VOCAB, (4, BLOCK), generator=gen
    )


def optimizer_step(model, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(*batch)
    loss.backward()
    optimizer.step()


def test_beta_is_zero_at_construction_and_mu_is_positive():
    model = tiny_gpt()
    tracker = MetricTracker(model, probe())
    row = tracker.state_metrics(model)
    betas = {k: v for k, v in row.items() if k.startswith("beta_")}
    assert set(betas) == {"beta_qk", "beta_ov", "beta_qk_l0", "beta_qk_l1", "beta_ov_l0", "beta_ov_l1"}
    assert all(v == 0.0 for v in betas.values())
    assert all(row[k] > 1e-3 for k in row if k.startswith("mu_"))  # random init is far from balanced


def test_rho_is_zero_for_sgd_and_positive_for_adamw():
    """Lemma 5.1 / claim E1–E2, in float64 so that round-off does not hide the zero."""
    batch = probe(2)
    sgd_model, adam_model = tiny_gpt(), tiny_gpt()
    with torch.no_grad():  # sharper attention -> larger query/key gradients, further above round-off
        for model in (sgd_model, adam_model):
            for block in model.transformer.h:
                block.attn.c_attn.weight.mul_(10)
    rows = {}
    for name, model, optimizer in [
        ("sgd", sgd_model, torch.optim.SGD(sgd_model.parameters(), lr=0.1)),
        ("adamw", adam_model, torch.optim.AdamW(adam_model.parameters(), lr=1e-3, weight_decay=0.1)),
    ]:
        tracker = MetricTracker(model, batch)
        for _ in range(2):
            pre = tracker.snapshot(model)
            optimizer_step(model, optimizer, batch)
            rows[name] = tracker.step_metrics(model, pre)
    rho_keys = ["rho_qk", "rho_ov", "rho_qk_l0", "rho_qk_l1", "rho_ov_l0", "rho_ov_l1"]
    assert rows["sgd"]["rho_qk"] < 1e-20 and rows["sgd"]["rho_ov"] < 1e-20, rows["sgd"]
    # per layer, a step of relative size |Δ|/|θ| ~ 1e-6 cannot be measured below the float64
    # floor (1e-16 |θ| / |Δ|)^2 ~ 1e-20 of the subtraction θ_{t+1} - θ_t
    assert all(rows["sgd"][k] < 1e-18 for k in rho_keys), rows["sgd"]
    assert all(rows["adamw"][k] > 1e-4 for k in rho_keys), rows["adamw"]
    assert rows["sgd"]["rho_singular_pairs"] == 0


def test_rho_is_one_for_a_pure_orbit_move():
    model = tiny_gpt()
    tracker = MetricTracker(model, probe())
    pre = tracker.snapshot(model)
    gen = torch.Generator().manual_seed(4)
    for circuit in CIRCUITS:
        moved = []
        for pair_a, pair_b in model_pairs(model, circuit):
            generator = 1e-3 * torch.randn(3, 4, 4, generator=gen, dtype=torch.float64)
            step_a, step_b = factor_pairs.tangent_step(pair_a, pair_b, generator)
            moved.append((pair_a + step_a, pair_b + step_b))
        write_pairs_back(model, circuit, moved)
    row = tracker.step_metrics(model, pre)
    assert abs(row["rho_qk"] - 1) < 1e-10 and abs(row["rho_ov"] - 1) < 1e-10


@pytest.mark.parametrize("dtype, loss_tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_rebalancing_keeps_the_loss_and_resets_the_conserved_quantity(dtype, loss_tol):
    model = tiny_gpt(dtype)
    batch = probe()
    tracker = MetricTracker(model, batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.1)
    for step in range(5):
        optimizer_step(model, optimizer, probe(10 + step))
    drifted = tracker.state_metrics(model)
    assert drifted["beta_qk"] > 1e-3 and drifted["beta_ov"] > 1e-3
    with torch.no_grad():
        _, loss_before = model.eval()(*batch)
    info = rebalancing.rebalancing_move(model, tracker, target="initial")
    with torch.no_grad():
        _, loss_after = model(*batch)
    assert info["skipped_pairs"] == 0
    assert info["tau"] < loss_tol and info["tau_logits"] < 10 * loss_tol
    assert abs(float(loss_after) - float(loss_before)) <= loss_tol * abs(float(loss_before))
    restored = tracker.state_metrics(model)
    beta_tol = 1e-10 if dtype == torch.float64 else 1e-5  # float32 storage of the rebalanced weights
    assert restored["beta_qk"] < beta_tol and restored["beta_ov"] < beta_tol

    info = rebalancing.rebalancing_move(model, tracker, target="balanced")
    assert info["tau"] < loss_tol
    balanced = tracker.state_metrics(model)
    mu_tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert all(balanced[k] < mu_tol for k in balanced if k.startswith("mu_")), balanced


def test_tau_probe_leaves_the_model_untouched_and_matches_a_real_rebalance():
    model = tiny_gpt(torch.float32)
    tracker = MetricTracker(model, probe())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for step in range(3):
        optimizer_step(model, optimizer, probe(20 + step))
    model.train()
    before = copy.deepcopy(model.state_dict())
    direct = tracker.state_metrics(model)
    info = rebalancing.tau_probe(model, tracker, target="initial")
    after_probe = tracker.state_metrics(model)  # mu reuses the probe's singular values at the same weights
    assert after_probe.keys() == direct.keys()
    assert all(after_probe[k] == pytest.approx(direct[k], rel=1e-12, abs=1e-15) for k in direct)
    assert model.training  # train/eval mode restored
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    copy_model = copy.deepcopy(model)
    assert rebalancing.rebalancing_move(copy_model, tracker, target="initial") == info
    assert any(not torch.equal(v, before[k]) for k, v in copy_model.state_dict().items())


def test_state_dict_round_trip_gives_identical_metrics(tmp_path):
    model = tiny_gpt(torch.float32)
    batch = probe()
    tracker = MetricTracker(model, batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(3):
        optimizer_step(model, optimizer, probe(30 + step))
    path = tmp_path / "tracker.pt"
    torch.save(tracker.state_dict(), path)
    resumed = MetricTracker(model, batch)  # would record the *current* imbalance as I_0 ...
    assert resumed.state_metrics(model)["beta_qk"] == 0.0
    resumed.load_state_dict(torch.load(path, weights_only=True))  # ... until the saved I_0 is loaded
    assert resumed.state_metrics(model) == tracker.state_metrics(model)
    assert tracker.state_metrics(model)["beta_qk"] > 0
    assert all(t.device.type == "cpu" for t in tracker.state_dict()["initial_imbalance"].values())


def test_bias_free_model_and_metric_keys():
    model = tiny_gpt(torch.float32, bias=False)
    tracker = MetricTracker(model, probe())
    pre = tracker.snapshot(model)
    optimizer_step(model, torch.optim.SGD(model.parameters(), lr=0.1), probe(3))
    step = tracker.step_metrics(model, pre)
    assert {f"rho_{c}_l{i}" for c in ("qk", "ov") for i in (0, 1)} <= set(step)
    assert step["rho_qk"] < 1e-3  # float32 SGD: only round-off is unidentified
    assert rebalancing.rebalancing_move(model, tracker, "balanced")["tau"] < 1e-5


# ------------------------------------------------------------------------------ attnid inspect


def save_nanogpt_checkpoint(model: GPT, path, compiled_prefix: bool = False) -> None:
    state = model.state_dict()
    if compiled_prefix:
        state = {f"_orig_mod.{k}": v for k, v in state.items()}
    torch.save(
        {
            "model": state,
            "model_args": model.config.model_args(),
            "iter_num": 0,
            "best_val_loss": 1e9,
            "config": {},
        },
        path,
    )


def test_inspect_reports_per_layer_mu_imbalance_and_counts(tmp_path, capsys):
    model = tiny_gpt(torch.float32)
    path = tmp_path / "ckpt.pt"
    save_nanogpt_checkpoint(model, path, compiled_prefix=True)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = MetricTracker(model, probe()).state_metrics(model)
    assert report["n_layer"] == 2 and len(report["layers"]) == 2
    for layer, row in enumerate(report["layers"]):
        for circuit in ("qk", "ov"):
            assert row[f"mu_{circuit}"] == pytest.approx(expected[f"mu_{circuit}_l{layer}"], rel=1e-12)
            pair_a, pair_b = model_pairs(model, circuit)[layer]
            norm = torch.linalg.matrix_norm(factor_pairs.imbalance(pair_a, pair_b)).square().sum().sqrt()
            assert row[f"imbalance_norm_{circuit}"] == pytest.approx(float(norm), rel=1e-12)
        # E=12, H=3, D=4 with biases: the design notes' Jacobian check gives 120 of 624
        assert (row["unidentified"], row["attention_params"]) == (120, 624)
        assert (
            row["unidentified_qk"] + row["unidentified_ov"] + row["unidentified_bias"] == row["unidentified"]
        )
    assert report["total"]["mu_qk"] == pytest.approx(expected["mu_qk"], rel=1e-12)

    assert inspect_model(model)["total"]["identified_fraction"] == pytest.approx(1 - 240 / 1248)


def test_inspect_table_has_a_labelled_total_row_and_a_legend(tmp_path, capsys):
    """The total row is labelled and each of its numbers sits under its own header (the whole model's 240
    unidentified parameters under ``unid``, its biases' under ``unid bias``); every header is explained."""
    model = tiny_gpt(torch.float32)
    path = tmp_path / "ckpt.pt"
    save_nanogpt_checkpoint(model, path)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[1]
    # headers are right-aligned over their column: cut each row at the header's column ends
    ends = [m.end() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [m.group() for m in re.finditer(r"\S+(?: \S+)*", header)]

    def row(line: str) -> dict[str, str]:
        starts = [0] + ends[:-1]
        return {name: line[a:b].strip() for name, a, b in zip(names, starts, ends)}

    layers = [row(line) for line in lines[2:4]]
    total = row(lines[4])
    assert [r["layer"] for r in layers] == ["0", "1"] and total["layer"] == "total"
    assert total["unid"] == "240" and total["attn params"] == "1248"
    bias = sum(layer["unidentified_bias"] for layer in report["layers"])
    assert total["unid bias"] == str(bias) and 0 < bias < 240
    assert total["unid qk"] == str(sum(layer["unidentified_qk"] for layer in report["layers"]))
    assert total["mu_qk"] == f"{report['total']['mu_qk']:.4g}"
    assert total["dim = closed form"] == "yes" and all(r["dim = closed form"] == "yes" for r in layers)
    explained = {  # "  mu_qk, mu_ov  what they are" -> mu_qk, mu_ov
        name.strip()
        for entry in lines[lines.index("columns:") + 1 :]
        for name in entry.strip().split("  ")[0].split(",")
    }
    assert set(names[2:]) | {"total"} <= explained  # layer and heads explain themselves


@pytest.mark.parametrize("content", [None, b"not a checkpoint", "dict"])
def test_inspect_bad_file_is_one_line_error(tmp_path, capsys, content):
    path = tmp_path / "ckpt.pt"
    if content == "dict":
        torch.save({"weights": torch.zeros(3)}, path)
    elif content is not None:
        path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnid inspect: error:") and len(err.strip().splitlines()) == 1


class Wrapper(torch.nn.Module):
    """Stands in for DistributedDataParallel: the model sits under ``.module``."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, *args):
        return self.module(*args)


def test_tracker_sees_through_a_ddp_style_wrapper():
    model = tiny_gpt(torch.float32)
    wrapped = Wrapper(copy.deepcopy(model))
    batch = probe()
    plain, through = MetricTracker(model, batch), MetricTracker(wrapped, batch)
    assert through.state_metrics(wrapped) == plain.state_metrics(model)
    assert rebalancing.rebalancing_move(wrapped, through, "balanced") == rebalancing.rebalancing_move(
        model, plain, "balanced"
    )
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in wrapped.module.state_dict().items())
