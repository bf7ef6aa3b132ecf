"""Pieces of nanoGPT's loop that ``attnid train`` adapts: the schedule, when the loop waits for the
device, and what runs where on CUDA.

nanoGPT's loop makes the host wait for the GPU only at log steps: a ``loss.item()``
or a ``.item()`` of the gradient norm at every step would stall the host once per
step and leave the GPU idle while the host builds the next batch. The pieces here
keep ``attnid train`` the same (:func:`get_lr` is nanoGPT's learning-rate schedule):

- :class:`LossWatch`: the training losses since the last host sync stay on the
  device; at each sync (step 1 for the first loss, the steps with a metrics.csv row,
  checkpoint saves) they are read in one transfer and checked for divergence, and the
  first bad one gives ``diverged_step`` and ``diverged_loss`` exactly as a per-step
  check would. The steps taken after it until the sync are discarded from the record
  (their rows were never written); only the model weights in a diverged run's final
  checkpoint are those of the sync step.
- :func:`resolve_metrics_device`: where the metrics' float64 linear algebra runs
  (``--metrics-device``).
- :func:`resolve_compile`: ``--compile`` (``torch.compile`` of the training forward).
- :func:`device_name` / :func:`other_gpu_warning`: a resumed run on another GPU model
  says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnid.common.errors import UserError


def get_lr(it: int, cfg: Any) -> float:  # a resolved TrainConfig, or run.json's config as a namespace
    """nanoGPT's schedule for 0-based step ``it``: linear warmup, cosine decay to min_lr, then flat."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    decay_ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


class LossWatch:
    """The training losses since the last host sync, kept on the device, and the divergence check.

    :meth:`add` keeps a step's loss tensor; :meth:`check` reads every pending loss in one
    device-to-host transfer (the first one ever becomes :attr:`first_loss`, the reference of
    the default threshold, 3 x the first loss) and returns the first bad one.
    """

    def __init__(self, diverge_threshold: float | None, first_loss: float | None = None):
        self.diverge_threshold, self.first_loss = diverge_threshold, first_loss
        self.steps: list[int] = []
        self.losses: list[torch.Tensor] = []

    @property
    def needs_first_loss(self) -> bool:
        return self.first_loss is None

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.steps.append(step)
        self.losses.append(loss.detach())

    def sync(self) -> list[tuple[int, float]]:
        """``(step, loss)`` of every pending step, read in one transfer; empties the buffer."""
        if not self.losses:
            return []
        values = torch.stack(self.losses).tolist()
        pending = list(zip(self.steps, values, strict=True))
        self.steps, self.losses = [], []
        if self.first_loss is None:
            self.first_loss = pending[0][1]
        return pending

    def threshold(self) -> float:
        if self.diverge_threshold is not None:
            return self.diverge_threshold
        assert self.first_loss is not None, "threshold() before the first loss was read (sync)"
        return 3.0 * self.first_loss

    def check(self) -> tuple[int, float] | None:
        """Sync, then the first pending ``(step, loss)`` that is NaN/inf or above the threshold, or None."""
        pending = self.sync()
        for step, loss in pending:
            if not math.isfinite(loss) or loss > self.threshold():
                return step, loss
        return None


def resolve_metrics_device(requested: str, device: torch.device) -> str:
    """``host`` or ``device`` for ``--metrics-device auto|host|device``.

    ``auto`` is ``host`` when training on CUDA: a log step's float64 ``eigh``/``svd``/``qr``
    on 64x64 head matrices is dispatched by PyTorch one matrix at a time to cuSOLVER,
    about 500 small calls per log step at the paper's size, which the host's LAPACK does
    in milliseconds. This choice follows that analysis; it has not been timed on a GPU
    (``benchmarks/gpu_check.sh`` times both). On the CPU ``auto`` is ``device`` (no copies).
    """
    if requested not in ("auto", "host", "device"):
        raise UserError(f"unknown --metrics-device {requested!r}: choose auto, host or device")
    if requested == "auto":
        return "host" if device.type == "cuda" else "device"
    return requested


def resolve_compile(requested: bool | None, device: torch.device) -> bool:
    """``--compile``: on by default for CUDA (nanoGPT's speed is with it), off on the CPU."""
    return device.type == "cuda" if requested is None else requested


def device_name(device: torch.device) -> str | None:
    """The GPU model (for the checkpoint), None on the CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def other_gpu_warning(saved: str | None, current: str | None) -> str | None:
    """One warning line when a checkpoint from one GPU model is resumed on another, else None."""
    if saved is None or current is None or saved == current:
        return None
    return (
        f"warning: the checkpoint was written on a {saved}, resuming on a {current}: the run continues, "
        f"but its numbers are not those it would have had on the {saved}"
    )
