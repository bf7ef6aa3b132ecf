"""The --dtype policy (attnid.training.precision), on CPU; CUDA properties are stubbed where a decision
depends on them."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from attnid.common.errors import UserError
from attnid.model.gpt import GPT, GPTConfig
from attnid.training import precision


@pytest.fixture(autouse=True)
def _restore_tf32():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


# ----- resolve_dtype -------------------------------------------------------------------------


def test_defaults_are_float32_on_cpu_and_bf16_on_cuda(monkeypatch):
    assert precision.resolve_dtype(None, "cpu") == "float32"
    assert precision.resolve_dtype("auto", torch.device("cpu")) == "float32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.resolve_dtype(None, "cuda") == "bf16"
    assert precision.resolve_dtype("float64", "cuda:0") == "float64"
    assert precision.resolve_dtype("float32", "cuda") == "float32"


def test_bf16_falls_back_to_fp16_on_a_gpu_without_bfloat16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert precision.resolve_dtype("bf16", "cuda") == "fp16"
    assert precision.resolve_dtype(None, "cuda") == "fp16"


def test_bf16_on_cpu_and_unknown_names_are_one_line_user_errors():
    with pytest.raises(UserError, match="needs a CUDA GPU") as err:
        precision.resolve_dtype("bf16", "cpu")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="unknown --dtype 'float16'"):
        precision.resolve_dtype("float16", "cpu")


def test_unresolved_names_are_refused_by_the_helpers():
    with pytest.raises(ValueError, match="unresolved"):
        precision.autocast_context("auto", "cpu")
    with pytest.raises(ValueError, match="unresolved"):
        precision.configure_tf32("half")


# ----- model dtype, autocast, scaler ------------------------------------------------------------


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16, bias=True))


def test_float64_casts_every_parameter_and_keeps_weight_tying():
    model = precision.apply_model_dtype(tiny_model(), "float64")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.transformer.wte.weight is model.lm_head.weight
    tokens = torch.randint(0, 11, (2, 8))  # data stays int64
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _, loss = model(tokens, tokens)
    loss.backward()
    optimizer.step()
    assert loss.dtype == torch.float64
    assert {s["momentum_buffer"].dtype for s in optimizer.state.values()} == {torch.float64}


@pytest.mark.parametrize("dtype", ["float32", "bf16", "fp16"])
def test_other_precisions_keep_float32_weights(dtype):
    model = precision.apply_model_dtype(tiny_model().to(torch.float64), dtype)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_autocast_only_for_the_reduced_precisions():
    for dtype in ("float32", "float64"):
        assert isinstance(precision.autocast_context(dtype, "cpu"), contextlib.nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available": the context is still built
        for dtype, expected in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            context = precision.autocast_context(dtype, "cuda")
            assert isinstance(context, torch.autocast)
            assert context.fast_dtype == expected and context.device == "cuda"


@pytest.mark.parametrize("dtype", ["float32", "float64", "bf16"])
def test_grad_scaler_is_a_pass_through_except_for_fp16(dtype):
    scaler = precision.grad_scaler(dtype, "cpu")
    assert not scaler.is_enabled()
    loss = torch.tensor(2.0, requires_grad=True)
    assert scaler.scale(loss) is loss


def test_describe_names_every_resolved_dtype():
    assert {precision.describe(d) for d in precision.RESOLVED_DTYPES} == {
        "bf16 autocast, TF32",
        "fp16 autocast + grad scaler, TF32",
        "float32",
        "float64",
    }


# ----- TF32 ----------------------------------------------------------------------------------


def test_configure_tf32_follows_the_policy():
    precision.configure_tf32("bf16")
    assert tf32_flags() == (True, True)
    precision.configure_tf32("float32")
    assert tf32_flags() == (False, False)
    precision.configure_tf32("fp16")
    assert tf32_flags() == (True, True)
    precision.configure_tf32("float64")
    assert tf32_flags() == (False, False)


def test_no_tf32_switches_off_and_restores_even_on_error():
    precision.set_tf32(True)
    with precision.no_tf32():
        assert tf32_flags() == (False, False)
    assert tf32_flags() == (True, True)
    with pytest.raises(KeyError):
        with precision.no_tf32():
            raise KeyError("inside")
    assert tf32_flags() == (True, True)
    precision.set_tf32(False)
    with precision.no_tf32():
        pass
    assert tf32_flags() == (False, False)


# ----- slow float64 warning --------------------------------------------------------------------


def fake_gpu(monkeypatch, capability, name):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize(
    "capability, name, slow",
    [
        ((8, 6), "NVIDIA GeForce RTX 3090", True),
        ((8, 9), "NVIDIA L4", True),
        ((7, 5), "Tesla T4", True),
        ((8, 0), "NVIDIA A100-SXM4-80GB", False),
        ((9, 0), "NVIDIA H100 80GB HBM3", False),
        ((7, 0), "Tesla V100-SXM2-16GB", False),
        ((6, 0), "Tesla P100-PCIE-16GB", False),
    ],
)
def test_slow_float64_warning_is_one_line_on_consumer_gpus(monkeypatch, capsys, capability, name, slow):
    fake_gpu(monkeypatch, capability, name)
    assert precision.warn_if_slow_float64("cuda") is slow
    err = capsys.readouterr().err
    if slow:
        assert err.count("\n") == 1 and name in err and "float64" in err
    else:
        assert err == ""


def test_no_float64_warning_on_cpu(monkeypatch, capsys):
    fake_gpu(monkeypatch, (8, 6), "never asked")
    assert precision.warn_if_slow_float64(torch.device("cpu")) is False
    assert capsys.readouterr().err == ""
