"""Runs in lockstep (attnid.model.stacked, attnid.training.lockstep, ``attnid train-runs --lockstep``): the
same runs as ``attnid train`` to float rounding, independent of which runs share the batch, resumable,
each run's fixed and frozen entries held, and refused where a run cannot be stacked."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from attnid.cli import main
from attnid.model import stacked
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint
from attnid.training.rundir import TIMING_COLUMNS

TINY = "n_layer: 1\nn_head: 2\nn_embd: 16\nblock_size: 16\nbatch_size: 6\neval_iters: 2\nmetrics: false\n"


def spec(tmp_path, case: str, seed: int, extra: str = "", steps: int = 30, lr: float = 0.01):
    path = tmp_path / "specs" / f"{case}{extra.replace(' ', '').replace(':', '')}_seed{seed}_lr{lr}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"case: {case}\nseed: {seed}\n{TINY}max_iters: {steps}\nwarmup_iters: 5\nlog_every: 5\n"
        f"eval_every: 15\nfull_val_every: 10\nlr: {lr}\n{extra}\n"
    )
    return path


def train_runs(data, specs, outs, *flags) -> int:
    return main(
        ["train-runs", "--data", str(data), "--configs", *map(str, specs), "--outs", *map(str, outs), *flags]
    )


def rows(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv").drop(columns=list(TIMING_COLUMNS))


def run_json(out) -> dict:
    return json.loads((out / "run.json").read_text())


@pytest.mark.parametrize(
    "variant",
    [{}, {"bias": True}, {"n_kv_head": 1}, {"rope": True, "n_kv_head": 2}, {"tied": False, "head_dim": 6}],
)
def test_stacked_losses_are_each_models_own(variant):
    """Each slice's loss is its own GPT's to float rounding, on every variant, and bit for bit the same
    whichever runs share the batch."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=8, vocab_size=20, n_layer=2, n_head=4, n_embd=16, dropout=0.0, **variant)
    models = [GPT(config) for _ in range(3)]
    params = stacked.stack_parameters(models)
    idx, targets = torch.randint(20, (3, 5, 8)), torch.randint(20, (3, 5, 8))
    losses = stacked.losses(config, params, idx, targets)
    alone = torch.stack([model(idx[i], targets[i])[1] for i, model in enumerate(models)])
    torch.testing.assert_close(losses, alone, rtol=1e-6, atol=1e-6)
    middle = stacked.losses(config, {k: v[1:2] for k, v in params.items()}, idx[1:2], targets[1:2])
    assert torch.equal(middle[0], losses[1])
    with pytest.raises(ValueError, match="dropout"):
        stacked.losses(GPTConfig(**{**config.__dict__, "dropout": 0.1}), params, idx, targets)


def assert_same_runs(alone, together):
    """Each lockstep run against the same spec trained alone: the same rows, losses, final whole-split loss
    and summary to float rounding; the weights close."""
    for a, b in zip(alone, together, strict=True):
        first, second = rows(a), rows(b)
        assert list(first.columns) == list(second.columns) and list(first["step"]) == list(second["step"])
        # rounding differences grow with the steps (lr 0.01): close at the first rows, within 0.2 % at 30
        pd.testing.assert_frame_equal(first.head(2), second.head(2), check_exact=False, rtol=1e-5, atol=1e-6)
        losses = [c for c in first.columns if c != "grad_norm"]  # the gradient's norm is the most sensitive
        pd.testing.assert_frame_equal(first[losses], second[losses], check_exact=False, rtol=2e-3, atol=1e-5)
        pd.testing.assert_series_equal(first["grad_norm"], second["grad_norm"], check_exact=False, rtol=1e-2)
        summary_a, summary_b = run_json(a), run_json(b)
        assert summary_b["status"] == "completed" and summary_b["steps_completed"] == 30
        assert summary_b["final_val_loss_full"] == pytest.approx(summary_a["final_val_loss_full"], rel=1e-3)
        for key in ("gauge", "frozen_mlp_entries", "trained_attention_params", "n_params"):
            assert summary_b[key] == summary_a[key]
        model_a, model_b = (load_nanogpt_checkpoint(d / "ckpt.pt") for d in (a, b))
        for (name, pa), (_, pb) in zip(
            model_a.state_dict().items(), model_b.state_dict().items(), strict=True
        ):
            torch.testing.assert_close(pb, pa, rtol=2e-2, atol=2e-3, msg=name)


@pytest.mark.parametrize(
    "case, extra",
    [
        ("adamw", ""),
        ("adamw_gauge_fixed", ""),
        ("adamw_gauge_fixed", "initial_point: init"),
        ("adamw", "freeze_mlp: true"),
        ("sgd_momentum", ""),
    ],
)
def test_lockstep_trains_the_runs_train_would(prepared_data_dir, tmp_path, case, extra):
    """Every arm of the interventions (and SGD's momentum state): the same rows, losses and final
    whole-split loss as each run trained alone, to float rounding; the fixed blocks and frozen entries
    where they started; a checkpoint a lone run's rerun accepts as finished."""
    specs = [spec(tmp_path, case, seed, extra) for seed in (0, 1, 2)]
    alone = [tmp_path / "alone" / f"seed{seed}" for seed in (0, 1, 2)]
    together = [tmp_path / "together" / f"seed{seed}" for seed in (0, 1, 2)]
    assert train_runs(prepared_data_dir, specs, alone) == 0
    assert train_runs(prepared_data_dir, specs, together, "--lockstep") == 0
    assert_same_runs(alone, together)
    if case == "adamw_gauge_fixed":
        ckpt = torch.load(together[0] / "ckpt.pt", weights_only=True)
        assert ckpt["optimizer"]["state"], "the moments of every trained piece are kept"
    # the entries no step moves (fixed blocks, frozen MLP entries) end bit-identical to the lone run's,
    # which trains none of them; every trained entry differs by float rounding somewhere
    held = {"adamw_gauge_fixed": ["attn.c_attn"], "freeze_mlp: true": ["mlp.c_fc", "mlp.c_proj"]}
    expected = 2 * 2 * 8**2  # 2 G D^2 per layer: the gauge's blocks, and as many frozen MLP entries
    for names in (held.get(case, []) + held.get(extra, []),):
        if not names:
            continue
        for a, b in zip(alone, together, strict=True):
            wa, wb = (torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (a, b))
            keys = [f"transformer.h.0.{name}.weight" for name in names]
            assert sum(int((wa[k] == wb[k]).sum()) for k in keys) >= expected
    # a finished lockstep run is a finished run: `attnid train-runs` without --lockstep rewrites its outputs
    before = (together[1] / "metrics.csv").read_text()
    assert train_runs(prepared_data_dir, specs, together) == 0
    assert (together[1] / "metrics.csv").read_text() == before


@pytest.mark.parametrize(
    "case, extra",
    [("adamw_gauge_fixed", ""), ("adamw", "freeze_mlp: true"), ("sgd_momentum", ""), ("sgd_wd", "")],
)
def test_runs_at_their_own_lrs_train_as_one_group(prepared_data_dir, tmp_path, capsys, case, extra):
    """Runs that differ in their lr (and seed) train as one group, each at its own lr (its rows' lr
    column is its own schedule), each the run it is alone: in float64, where rounding cannot hide a wrong
    step, every row to 1e-9 and every weight to 1e-7 (Adam's division magnifies the rounding of an entry's
    nearly-zero gradient; a wrong lr would move the weights by about 1e-2)."""
    lrs = (0.005, 0.01, 0.02)
    extra += "\ndtype: float64"
    specs = [spec(tmp_path, case, seed, extra, lr=lr) for seed, lr in zip((0, 1, 1), lrs, strict=True)]
    alone = [tmp_path / "alone" / f"lr{lr}" for lr in lrs]
    together = [tmp_path / "together" / f"lr{lr}" for lr in lrs]
    assert train_runs(prepared_data_dir, specs, alone) == 0
    capsys.readouterr()
    assert train_runs(prepared_data_dir, specs, together, "--lockstep") == 0
    assert "lockstep group 1/1: 3 runs" in capsys.readouterr().err
    for lr, a, b in zip(lrs, alone, together, strict=True):
        first, second = rows(a), rows(b)
        pd.testing.assert_frame_equal(first, second, check_exact=False, rtol=1e-9, atol=1e-12)
        # its own schedule: the schedule of lr 1, times its lr
        pd.testing.assert_series_equal(second["lr"] / lr, rows(together[0])["lr"] / lrs[0], rtol=1e-12)
        assert run_json(b)["config"]["lr"] == lr
        model_a, model_b = (torch.load(d / "ckpt.pt", weights_only=True)["model"] for d in (a, b))
        for name, weight in model_a.items():
            torch.testing.assert_close(
                model_b[name], weight, rtol=1e-7, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}"
            )


def test_a_run_does_not_depend_on_the_runs_beside_it(prepared_data_dir, tmp_path):
    """Seed 1 alone in lockstep and seed 1 among 0, 1, 2: bit-identical rows and final loss."""
    specs = [spec(tmp_path, "adamw_gauge_fixed", seed) for seed in (0, 1, 2)]
    group = [tmp_path / "group" / f"seed{seed}" for seed in (0, 1, 2)]
    single = tmp_path / "single" / "seed1"
    assert train_runs(prepared_data_dir, specs, group, "--lockstep") == 0
    assert train_runs(prepared_data_dir, specs[1:2], [single], "--lockstep") == 0
    pd.testing.assert_frame_equal(rows(group[1]), rows(single), check_exact=True)
    assert run_json(group[1])["final_val_loss_full"] == run_json(single)["final_val_loss_full"]


def test_lockstep_resumes_where_it_stopped(prepared_data_dir, tmp_path, capsys):
    """stop_after: every run's checkpoint at that step and exit 143; the rerun resumes all of them
    (optimizer moments of the gauge-fixed pieces included) to the uninterrupted result, bit for bit."""
    specs = [spec(tmp_path, "adamw_gauge_fixed", seed) for seed in (0, 1)]
    straight = [tmp_path / "straight" / f"seed{seed}" for seed in (0, 1)]
    stopped = [tmp_path / "stopped" / f"seed{seed}" for seed in (0, 1)]
    assert train_runs(prepared_data_dir, specs, straight, "--lockstep") == 0
    stopping = [path.with_name("stopping_" + path.name) for path in specs]
    for path, copy in zip(specs, stopping, strict=True):
        copy.write_text(path.read_text() + "stop_after: 12\n")  # resume-free: the rerun's spec has none
    assert train_runs(prepared_data_dir, stopping, stopped, "--lockstep") == 143
    assert "checkpoints saved" in capsys.readouterr().err
    assert all((out / "ckpt.pt").exists() and not (out / "run.json").exists() for out in stopped)
    assert train_runs(prepared_data_dir, specs, stopped, "--lockstep") == 0
    assert "resuming" in capsys.readouterr().err
    for a, b in zip(straight, stopped, strict=True):
        pd.testing.assert_frame_equal(rows(a), rows(b), check_exact=True)
        assert run_json(b)["resumed_at"] == [12]


def test_diverged_runs_end_as_alone(prepared_data_dir, tmp_path):
    """An lr no run survives: each run's divergence step and status as a lone run's."""
    specs = [spec(tmp_path, "adamw", seed, "lr: 1000.0\nwarmup_iters: 0") for seed in (0, 1)]
    for path in specs:  # the spec's own lr line comes first: drop it
        path.write_text(path.read_text().replace("lr: 0.01\n", "").replace("warmup_iters: 5\n", ""))
    alone = [tmp_path / "alone" / f"seed{seed}" for seed in (0, 1)]
    together = [tmp_path / "together" / f"seed{seed}" for seed in (0, 1)]
    assert train_runs(prepared_data_dir, specs, alone) == 0
    assert train_runs(prepared_data_dir, specs, together, "--lockstep") == 0
    for a, b in zip(alone, together, strict=True):
        assert run_json(a)["status"] == "diverged"
        for key in ("status", "diverged_step", "steps_completed"):
            assert run_json(b)[key] == run_json(a)[key], key


def test_lockstep_refuses_what_it_cannot_stack(prepared_data_dir, tmp_path, capsys):
    measured = spec(tmp_path, "adamw", 0, "metrics: true")
    measured.write_text(measured.read_text().replace("metrics: false\n", ""))
    out = tmp_path / "measured"
    assert train_runs(prepared_data_dir, [measured], [out], "--lockstep") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "cannot train in lockstep" in err[-1] and "Traceback" not in "\n".join(err)
    assert not (out / "run.json").exists()
    rebalancing = spec(tmp_path, "adamw_rebalance", 0)
    assert train_runs(prepared_data_dir, [rebalancing], [tmp_path / "rebalance"], "--lockstep") == 2
    assert "moves the weights" in capsys.readouterr().err
