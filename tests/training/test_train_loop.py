"""The training loop's device discipline, checked on the CPU: metrics on the host or the device give the
same numbers, no host sync on steps without a row, divergence found between syncs, prefetch keeps resume
exact, --compile keeps nanoGPT's checkpoint keys, the GPU slot and the device name."""

from __future__ import annotations

import copy
import functools
import json
import math
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
import torch
from tiny_runs import train

import attnid
from attnid.measure import rebalancing
from attnid.measure.metrics import MetricTracker
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint
from attnid.training import gpu_slots, runtime
from attnid.training.rundir import TIMING_COLUMNS
from attnid.training.train import Run

SOURCE = Path(attnid.__file__).resolve().parent


def run_json(out) -> dict:
    return json.loads((out / "run.json").read_text())


def metrics_without_timing(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv").drop(columns=list(TIMING_COLUMNS))


# --------------------------------------------------------------------------------------
# --metrics-device: host and device give the same metrics
# --------------------------------------------------------------------------------------


def _variant_gpt(**variant) -> GPT:
    torch.manual_seed(3)
    model = GPT(GPTConfig(block_size=8, vocab_size=13, n_layer=2, n_head=4, n_embd=16, bias=True, **variant))
    with torch.no_grad():  # nonzero biases exercise the bias columns
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    return model


def _assert_rows_match(host: dict, device: dict) -> None:
    assert host.keys() == device.keys()
    for key, value in device.items():
        assert math.isclose(host[key], value, rel_tol=1e-12, abs_tol=1e-12), (key, host[key], value)


@pytest.mark.parametrize("variant", [{}, {"n_kv_head": 2, "rope": True}], ids=["mha", "rope_gqa"])
def test_metrics_on_the_host_equal_metrics_on_the_device(variant):
    model = _variant_gpt(**variant)
    gen = torch.Generator().manual_seed(5)
    batch = torch.randint(0, 13, (4, 8), generator=gen), torch.randint(0, 13, (4, 8), generator=gen)
    host = MetricTracker(model, batch, metrics_device="host")
    device = MetricTracker(model, batch, metrics_device="device")
    live = model.transformer.h[0].attn.c_attn.weight
    # the host path really copies, the device path reads the live tensors
    assert (
        host.read(model)[0][0].data_ptr() != live.data_ptr() and host.read(model)[0][0].dtype == torch.float64
    )
    assert device.read(model)[0][0].data_ptr() == live.data_ptr()
    assert host.compute_device == torch.device("cpu") and device.compute_device is None

    pre_host, pre_device = host.snapshot(model), device.snapshot(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _, loss = model(*batch)
    loss.backward()
    optimizer.step()
    _assert_rows_match(host.step_metrics(model, pre_host), device.step_metrics(model, pre_device))
    _assert_rows_match(host.step_metrics(model, pre_device), device.step_metrics(model, pre_device))
    _assert_rows_match(host.state_metrics(model), device.state_metrics(model))
    _assert_rows_match(rebalancing.tau_probe(model, host), rebalancing.tau_probe(model, device))

    moved_on_host, moved_on_device = copy.deepcopy(model), copy.deepcopy(model)
    on_host = rebalancing.rebalancing_move(moved_on_host, host)
    _assert_rows_match(on_host, rebalancing.rebalancing_move(moved_on_device, device))
    for (name, a), b in zip(moved_on_host.named_parameters(), moved_on_device.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-12), name
    _assert_rows_match(host.state_metrics(moved_on_host), device.state_metrics(moved_on_device))


def test_metrics_device_and_compile_defaults():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (
        runtime.resolve_metrics_device("auto", cuda) == "host"
        and runtime.resolve_metrics_device("auto", cpu) == "device"
    )
    assert (
        runtime.resolve_metrics_device("device", cuda) == "device"
        and runtime.resolve_metrics_device("host", cpu) == "host"
    )
    assert (
        runtime.resolve_compile(None, cuda)
        and not runtime.resolve_compile(None, cpu)
        and runtime.resolve_compile(True, cpu)
    )


def test_bad_metrics_device_is_one_line(prepared_data_dir, tmp_path, capsys):
    assert train(prepared_data_dir, tmp_path / "r", "--metrics-device", "gpu") == 2
    assert "--metrics-device" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# no host sync on steps without a row
# --------------------------------------------------------------------------------------

SYNCING = ("item", "tolist", "cpu", "numpy", "__float__", "__bool__", "__format__")


def _counted_caller() -> str | None:
    """``file:line`` of the code that called the patched tensor method, if it is attnid's (not the host-side
    batch construction in batches.py)."""
    frame = sys._getframe(2)
    path = Path(frame.f_code.co_filename).resolve()
    if SOURCE not in path.parents or path.name == "batches.py":
        return None
    return f"{path.name}:{frame.f_lineno}"


def _targets_cpu(args, kwargs) -> bool:
    targets = [kwargs.get("device")] + [a for a in args if isinstance(a, (str, torch.device))]
    return any(t is not None and torch.device(t).type == "cpu" for t in targets)


@pytest.mark.parametrize("metrics_device", ["device", "host"])
def test_no_host_sync_on_steps_without_a_row(prepared_data_dir, tmp_path, monkeypatch, metrics_device):
    """20 steps, a row every 10: steps 2-9 and 11-19 never make the host wait for the device."""
    calls: dict[int, list[str]] = defaultdict(list)
    current = {"step": 0}

    def counting(name, original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if name != "to" or _targets_cpu(args, kwargs):
                caller = _counted_caller()
                if caller is not None:
                    calls[current["step"]].append(f"{name} from {caller}")
            return original(self, *args, **kwargs)

        return wrapper

    for name in (*SYNCING, "to"):
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    train_step = Run.train_step

    def numbered_train_step(self):
        current["step"] = self.step + 1
        return train_step(self)

    monkeypatch.setattr(Run, "train_step", numbered_train_step)
    assert (
        train(
            prepared_data_dir,
            tmp_path / "run",
            "--case",
            "adamw",
            "--max-iters",
            "20",
            "--log-every",
            "10",
            "--eval-every",
            "100",
            "--ckpt-every",
            "100",
            "--metrics-device",
            metrics_device,
        )
        == 0
    )
    silent = [step for step in [*range(2, 10), *range(11, 20)] if calls[step]]
    assert not silent, {step: calls[step] for step in silent}
    assert len(calls[1]) == 1 and calls[1][0].startswith("tolist from loop.py"), calls[1]  # the first loss
    assert len(calls[10]) > 0 and len(calls[20]) > 0
    assert run_json(tmp_path / "run")["metrics_device"] == metrics_device


# --------------------------------------------------------------------------------------
# divergence between syncs, resume with prefetch
# --------------------------------------------------------------------------------------


def test_divergence_between_syncs_is_found_at_the_step_it_happened(prepared_data_dir, tmp_path):
    """A loss that blows up between two rows: the same diverged_step, diverged_loss, steps and rows as
    with a sync at every step."""
    flags = [
        "--case",
        "sgd_momentum",
        "--lr",
        "4",
        "--max-iters",
        "80",
        "--eval-every",
        "20",
        "--warmup-iters",
        "0",
    ]
    assert train(prepared_data_dir, tmp_path / "every", *flags, "--log-every", "1") == 0
    assert train(prepared_data_dir, tmp_path / "tenth", *flags, "--log-every", "10") == 0
    every, tenth = run_json(tmp_path / "every"), run_json(tmp_path / "tenth")
    assert every["status"] == tenth["status"] == "diverged"
    assert every["diverged_step"] % 10 not in (0, 1), "pick flags that diverge between two syncs"
    for key in ("diverged_step", "diverged_loss", "steps_completed"):
        assert tenth[key] == every[key], key
    rows_every = pd.read_csv(tmp_path / "every" / "metrics.csv").set_index("step")
    rows_tenth = pd.read_csv(tmp_path / "tenth" / "metrics.csv").set_index("step")
    assert rows_tenth.index.max() < tenth["diverged_step"]
    assert rows_tenth.train_loss.dropna().equals(
        rows_every.train_loss.loc[rows_tenth.train_loss.dropna().index]
    )


def test_prefetched_batches_are_the_batches_drawn_in_turn_and_resume_redraws_the_waiting_one():
    import numpy as np

    from attnid.training.batches import TrainBatches

    data = np.arange(1000, dtype=np.uint16)
    plain = TrainBatches(data, 4, 8, torch.device("cpu"), seed=3)
    expected = [plain.next() for _ in range(5)]
    ahead = TrainBatches(data, 4, 8, torch.device("cpu"), seed=3)
    drawn = []
    for index in range(5):
        drawn.append(ahead.next())
        ahead.prefetch()  # what the loop does right after the forward pass
        if index == 2:  # a checkpoint here: the state from before the waiting batch was drawn
            resumed = TrainBatches(data, 4, 8, torch.device("cpu"), seed=99)
            resumed.set_generator_state(ahead.generator_state())
            assert torch.equal(resumed.next()[0], expected[3][0])
    for (x, y), (x_expected, y_expected) in zip(drawn, expected):
        assert torch.equal(x, x_expected) and torch.equal(y, y_expected)
    assert torch.equal(drawn[0][1][:, :-1], drawn[0][0][:, 1:])  # targets are the inputs shifted by one


def test_resume_between_rows_is_exact_with_prefetch(prepared_data_dir, tmp_path):
    """Stopped at step 13 (no row there: a prefetched batch and unread losses are pending) and resumed."""
    flags = [
        "--case",
        "adamw",
        "--dropout",
        "0.1",
        "--max-iters",
        "30",
        "--log-every",
        "10",
        "--eval-every",
        "10",
        "--ckpt-every",
        "100",
        "--seed",
        "11",
    ]
    assert train(prepared_data_dir, tmp_path / "straight", *flags) == 0
    stopped = tmp_path / "stopped"
    assert train(prepared_data_dir, stopped, *flags, "--stop-after", "13") == 128 + signal.SIGTERM
    assert train(prepared_data_dir, stopped, *flags) == 0
    assert run_json(stopped)["resumed_at"] == [13]
    pd.testing.assert_frame_equal(
        metrics_without_timing(stopped), metrics_without_timing(tmp_path / "straight"), check_exact=True
    )


# --------------------------------------------------------------------------------------
# --compile, the GPU slot, the device name
# --------------------------------------------------------------------------------------


def test_compiled_training_saves_nanogpt_keys(prepared_data_dir, tmp_path, monkeypatch):
    """--compile trains through torch.compile (eager backend here: the wiring, not inductor) and the
    checkpoint holds the plain module's keys, which nanoGPT's loader and ours read."""
    compiled = []
    real_compile = torch.compile

    def eager_compile(model, **kwargs):
        compiled.append(model)
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    out = tmp_path / "compiled"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "adamw",
            "--compile",
            "--max-iters",
            "10",
            "--log-every",
            "5",
            "--eval-every",
            "10",
        )
        == 0
    )
    assert len(compiled) == 1 and run_json(out)["compiled"] is True
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert not [key for key in checkpoint["model"] if "_orig_mod" in key]
    assert load_nanogpt_checkpoint(out / "ckpt.pt").get_num_params() > 0
    assert pd.read_csv(out / "metrics.csv").rho_qk.notna().sum() == 2


@pytest.mark.parametrize(("device", "acquires"), [("cpu", False), ("auto", True)])
def test_train_takes_a_gpu_slot_unless_on_the_cpu(prepared_data_dir, tmp_path, monkeypatch, device, acquires):
    taken = []
    monkeypatch.setattr(gpu_slots, "acquire_gpu_slot", lambda: taken.append(True))
    assert (
        train(prepared_data_dir, tmp_path / "r", "--device", device, "--max-iters", "2", "--no-metrics") == 0
    )
    assert bool(taken) == acquires


def test_resume_on_another_gpu_model_prints_one_warning(prepared_data_dir, tmp_path, monkeypatch, capsys):
    """The device name travels in the checkpoint (faked here: on the CPU it is None and nothing is said)."""
    flags = ["--max-iters", "6", "--log-every", "3", "--no-metrics"]
    out = tmp_path / "requeued"
    monkeypatch.setattr(runtime, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    assert train(prepared_data_dir, out, *flags, "--stop-after", "3") == 128 + signal.SIGTERM
    assert torch.load(out / "ckpt.pt", weights_only=True)["attnid"]["device_name"] == "NVIDIA A100-SXM4-80GB"
    capsys.readouterr()
    monkeypatch.setattr(runtime, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert train(prepared_data_dir, out, *flags) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "A100" in warnings[0] and "H100" in warnings[0]


def test_resume_on_another_gpu_model_warns():
    assert runtime.other_gpu_warning("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB") is None
    assert runtime.other_gpu_warning(None, None) is None and runtime.device_name(torch.device("cpu")) is None
    warning = runtime.other_gpu_warning("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
    assert warning.startswith("warning:") and "A100" in warning and "H100" in warning and "\n" not in warning
