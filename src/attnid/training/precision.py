"""The training precision of ``attnid train --dtype {bf16,float32,float64}``.

- ``float64``: model, optimizer state and metrics all in float64 (``model.to(float64)``;
  token ids stay int64). Round-off sits at ~1e-16, so identities such as ``ρ = 0`` for
  plain SGD (Lemma 5.1) show as ~1e-30 instead of float32's ~1e-9.
- ``float32``: true float32: no autocast, and on CUDA TF32 off (TF32 matmuls keep only
  10 mantissa bits, which would put the round-off floor near 1e-3).
- ``bf16``: float32 weights with CUDA autocast to bfloat16 and TF32 on, nanoGPT's
  default. On a GPU without bfloat16 it becomes ``fp16`` with a
  ``torch.amp.GradScaler``, as nanoGPT does.

Default: ``float32`` on CPU, ``bf16`` on CUDA. ``bf16`` on CPU is refused: CPU
autocast would be slower than float32 on most CPUs and would not reproduce the GPU's
numerics, so it would measure nothing the other two settings do not.

Whatever the training precision, metric maths runs in float64 and the τ probe's
forward passes run with TF32 off (:func:`no_tf32`), so measurements are never
limited by TF32's 10-bit mantissa. The TF32 switches used are the legacy
``allow_tf32`` flags, the ones the rest of the package sets: torch refuses to read
them once its newer ``fp32_precision`` API has been mixed in.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TypeVar

import torch

from attnid.common.errors import UserError
from attnid.training.options import DTYPES

# What a resolved dtype can be: the requested ones, and fp16 where a GPU lacks bfloat16
RESOLVED_DTYPES = DTYPES + ("fp16",)
# Data-centre GPUs with full-rate float64 (compute capability): P100, V100, A100, H100/H200.
# Consumer and workstation GPUs run float64 at 1/32 to 1/64 of their float32 rate.
FAST_FLOAT64_CAPABILITIES = frozenset({(6, 0), (7, 0), (8, 0), (9, 0)})
_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _device_type(device: torch.device | str) -> str:
    return torch.device(device).type


def resolve_dtype(requested: str | None, device: torch.device | str) -> str:
    """The precision a run on ``device`` uses: ``bf16``, ``fp16``, ``float32`` or ``float64``.

    ``None`` or ``"auto"``: ``bf16`` on CUDA, ``float32`` elsewhere. ``bf16`` on a
    CUDA GPU without bfloat16 support resolves to ``fp16`` (with a gradient scaler,
    :func:`grad_scaler`). Raises :class:`~attnid.common.errors.UserError` for an unknown
    name, and for ``bf16`` off CUDA.
    """
    device_type = _device_type(device)
    if requested in (None, "auto"):
        requested = "bf16" if device_type == "cuda" else "float32"
    if requested not in DTYPES:
        raise UserError(f"unknown --dtype {requested!r}: choose one of {', '.join(DTYPES)}")
    if requested == "bf16":
        if device_type != "cuda":
            raise UserError(
                f"--dtype bf16 needs a CUDA GPU (this run is on {device_type}): "
                f"use --dtype float32 (the default there) or float64"
            )
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            return "fp16"
    return requested


def _check(dtype: str) -> None:
    if dtype not in RESOLVED_DTYPES:
        raise ValueError(f"unresolved dtype {dtype!r}; expected one of {RESOLVED_DTYPES} (see resolve_dtype)")


def parameter_dtype(dtype: str) -> torch.dtype:
    """The dtype of the weights and optimizer state: float64 for ``float64``, float32 otherwise."""
    _check(dtype)
    return _TORCH_DTYPES.get(dtype, torch.float32)


ModelT = TypeVar("ModelT", bound=torch.nn.Module)


def apply_model_dtype(model: ModelT, dtype: str) -> ModelT:
    """Cast the model's parameters to :func:`parameter_dtype` in place (before the optimizer is made);
    returns it.

    ``Module.to`` keeps parameter identity, so weight tying (``wte`` = ``lm_head``) survives.
    """
    return model.to(parameter_dtype(dtype))


def autocast_context(dtype: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context for forward passes: CUDA autocast for ``bf16``/``fp16``, nothing for float32/float64."""
    _check(dtype)
    if dtype in _AUTOCAST_DTYPES:
        return torch.autocast(device_type=_device_type(device), dtype=_AUTOCAST_DTYPES[dtype])
    return contextlib.nullcontext()


def grad_scaler(dtype: str, device: torch.device | str) -> torch.amp.GradScaler:
    """nanoGPT's gradient scaler: active for ``fp16`` only, a pass-through otherwise.

    The loop then runs ``scaler.scale(loss).backward()``, ``scaler.unscale_(optimizer)``
    before clipping, ``scaler.step(optimizer)`` and ``scaler.update()``; when inactive
    these are ``loss.backward()`` and ``optimizer.step()``.
    """
    _check(dtype)
    return torch.amp.GradScaler(_device_type(device), enabled=dtype == "fp16")


def set_tf32(enabled: bool) -> None:
    """Switch TF32 for CUDA matmuls and cuDNN (no effect on CPU computations)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def configure_tf32(dtype: str) -> None:
    """The precision policy's TF32 setting for training: on for ``bf16``/``fp16``, off for float32 and
    float64."""
    _check(dtype)
    set_tf32(dtype in _AUTOCAST_DTYPES)


def trains_with_tf32(dtype: str, device: torch.device | str) -> bool:
    """Whether training in ``dtype`` on ``device`` runs with TF32 on (:func:`configure_tf32`)."""
    _check(dtype)
    return dtype in _AUTOCAST_DTYPES and _device_type(device) == "cuda"


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """TF32 off inside, the previous setting restored after (metric maths and the τ probe run in it)."""
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    set_tf32(False)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def describe(dtype: str) -> str:
    """A few words for the run's log line."""
    _check(dtype)
    return {
        "bf16": "bf16 autocast, TF32",
        "fp16": "fp16 autocast + grad scaler, TF32",
        "float32": "float32",
        "float64": "float64",
    }[dtype]


def slow_float64_warning(device: torch.device | str) -> str | None:
    """The warning for a CUDA GPU whose float64 runs far below its float32 rate, or None."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability in FAST_FLOAT64_CAPABILITIES:
        return None
    name = torch.cuda.get_device_name(device)
    return (
        f"warning: {name} (compute capability {capability[0]}.{capability[1]}) runs float64 at a small "
        f"fraction of its float32 speed; --dtype float64 will be slow (full-rate float64: P100, V100, "
        f"A100, H100)"
    )


def warn_if_slow_float64(device: torch.device | str) -> bool:
    """Print :func:`slow_float64_warning` as one line on stderr if it applies; returns whether it did."""
    message = slow_float64_warning(device)
    if message is not None:
        print(f"attnid train: {message}", file=sys.stderr, flush=True)
    return message is not None
