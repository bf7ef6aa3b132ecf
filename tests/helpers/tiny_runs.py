"""The tiny training run the unit tests share: ``attnid train`` of a 2-layer, 4-head, E = 32 model
with small batches, so that a test runs the real command line in seconds."""

from __future__ import annotations

from pathlib import Path

from attnid.cli import main

TINY_TRAIN_FLAGS = [
    "--n-layer", "2", "--n-head", "4", "--n-embd", "32", "--block-size", "32", "--batch-size", "8",
    "--eval-iters", "2", "--progress-every", "1000",
]  # fmt: skip


def train(data_dir: str | Path, out: str | Path, *flags: object) -> int:
    """``attnid train`` of the tiny model on ``data_dir`` into ``out``; ``flags`` come after the shared
    ones, so a test's flag overrides them. Returns the exit code."""
    return main(["train", "--data", str(data_dir), "--out", str(out), *TINY_TRAIN_FLAGS, *map(str, flags)])
