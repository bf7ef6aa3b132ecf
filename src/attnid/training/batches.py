"""Token batches for training: random windows of the token stream, the fixed eval batches, and the whole
val split in consecutive windows for the final evaluation."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from attnid.model.gpt import GPT
    from attnid.training.config import TrainConfig

# Offset that gives the fixed eval batches their own seed, apart from the training batches'.
EVAL_SEED_OFFSET = 104_729


def batch_from_starts(
    data: np.ndarray, starts: torch.Tensor, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token windows data[s : s+T+1] for each start s -> inputs x (B, T) and next-token targets y (B, T)."""
    offsets = starts.numpy()[:, None] + np.arange(block_size + 1)  # (B, T+1)
    window = torch.from_numpy(data[offsets].astype(np.int64))  # (B, T+1)
    x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def random_starts(
    n_tokens: int, batch_size: int, block_size: int, generator: torch.Generator
) -> torch.Tensor:
    return torch.randint(n_tokens - block_size, (batch_size,), generator=generator)  # (B,)


class TrainBatches:
    """The training batches, drawn from a seeded generator, one ahead as nanoGPT does.

    :meth:`prefetch` draws the next batch (call it right after the forward pass: on CUDA
    the host builds it, pinned and copied with ``non_blocking``, while the device
    computes); :meth:`next` returns it, or draws one if none is waiting. The generator
    state a checkpoint needs is the one from *before* a waiting batch was drawn
    (:meth:`generator_state`), so a resumed run draws that batch again and continues
    exactly.
    """

    def __init__(self, data: np.ndarray, batch_size: int, block_size: int, device: torch.device, seed: int):
        self.data, self.batch_size, self.block_size, self.device = data, batch_size, block_size, device
        self.generator = torch.Generator().manual_seed(seed)
        self._waiting: tuple[torch.Tensor, torch.Tensor] | None = None
        self._state_before_waiting: torch.Tensor | None = None

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = random_starts(len(self.data), self.batch_size, self.block_size, self.generator)
        return batch_from_starts(self.data, starts, self.block_size, self.device)

    def prefetch(self) -> None:
        if self._waiting is None:
            self._state_before_waiting = self.generator.get_state()
            self._waiting = self._draw()

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._waiting if self._waiting is not None else self._draw()
        self._waiting = self._state_before_waiting = None
        return batch

    def generator_state(self) -> torch.Tensor:
        # a prefetched batch comes with the state before it (prefetch sets both, next clears both)
        if self._state_before_waiting is not None:
            return self._state_before_waiting
        return self.generator.get_state()

    def set_generator_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
        self._waiting = self._state_before_waiting = None


class FixedEvalBatches:
    """The same ``eval_iters`` batches per split at every eval, so eval losses differ only by the model."""

    def __init__(self, splits: dict, cfg: TrainConfig, device: torch.device):
        self.splits, self.block_size, self.device = splits, cfg.block_size, device
        generator = torch.Generator().manual_seed(cfg.seed + EVAL_SEED_OFFSET)
        self.starts = {
            name: [
                random_starts(len(data), cfg.batch_size, cfg.block_size, generator)
                for _ in range(cfg.eval_iters)
            ]
            for name, data in splits.items()
        }

    @torch.no_grad()
    def losses(self, model: GPT, autocast: Callable[[], AbstractContextManager]) -> dict[str, float]:
        was_training = model.training
        model.eval()
        out = {}
        for name, data in self.splits.items():
            total = 0.0
            for starts in self.starts[name]:
                x, y = batch_from_starts(data, starts, self.block_size, self.device)
                with autocast():
                    _, loss = model(x, y)
                total += loss.item()
            out[name] = total / len(self.starts[name])
        model.train(was_training)
        return out


def split_windows(n_tokens: int, block_size: int) -> torch.Tensor:
    """Starts of the consecutive windows that predict every token of a split once: ``0, T, 2T, ...``, as many
    as fit with their targets (``(n_tokens - 1) // T``); window ``i`` predicts tokens ``iT + 1 .. iT + T``.
    The last ``(n_tokens - 1) % T`` tokens are not predicted."""
    return torch.arange((n_tokens - 1) // block_size) * block_size  # (n_windows,)


@torch.no_grad()
def split_losses(
    losses_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: np.ndarray,
    block_size: int,
    batch_size: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
) -> list[float]:
    """The mean next-token loss over a whole split (:func:`split_windows`: every predicted token counted
    once, each with the context of its window), ``batch_size`` windows per forward pass, summed in float64
    (docs/design.md §11.5: the interventions' primary metric, ``final_val_loss_full``), for each loss
    ``losses_of(x, y)`` returns: one model's, or each of several stacked models' (the same windows)."""
    starts = split_windows(len(data), block_size)
    totals: list[float] = []
    count = 0
    for first in range(0, len(starts), batch_size):
        chunk = starts[first : first + batch_size]
        x, y = batch_from_starts(data, chunk, block_size, device)
        with autocast():
            losses = losses_of(x, y).double().tolist()
        totals = totals or [0.0] * len(losses)
        for i, value in enumerate(losses):
            totals[i] += value * y.numel()  # the batch's mean over its tokens, back to a sum
        count += y.numel()
    return [total / count for total in totals]


def split_loss(
    model: GPT,
    data: np.ndarray,
    block_size: int,
    batch_size: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
) -> float:
    """:func:`split_losses` of one model, in eval mode."""
    was_training = model.training
    model.eval()
    (loss,) = split_losses(
        lambda x, y: model(x, y)[1].reshape(1), data, block_size, batch_size, device, autocast
    )
    model.train(was_training)
    return loss
