"""ms/iter of ``attnid train`` on nanoGPT's CPU config, side by side with a bare nanoGPT-style loop.

Three measurements, same model (4 layers, 4 heads, E=128, block 64, batch 12), same
case (AdamW), same threads, run one after another in this process:

1. ``bare``: nanoGPT's inner loop and nothing else (batch from a fresh memmap,
   forward, backward, clip, AdamW step, ``loss.item()`` every 10 steps), the
   reference for "no slower than nanoGPT's own train.py";
2. ``train --no-metrics``: our full loop without ρ β τ μ;
3. ``train`` at the default ``--log-every 10`` with every metric.

It prints ms/iter for each and the two ratios the project targets:
``train/bare`` (target <= 1.0, within noise) and ``metrics/no-metrics`` (target <= 1.05).

    python benchmarks/train_speed.py --data DIR [--steps 300] [--threads 2] [--rounds 3]

``--data`` is a directory prepared by ``attnid prepare``; without it one is prepared
in a temporary directory from ``--text`` (tiny shakespeare).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnid.model import GPT, GPTConfig
from attnid.train import resolve_config, train

NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
WARMUP_STEPS = 20  # excluded from every timing: allocator and thread-pool warm-up


def bare_nanogpt_loop(data_dir: Path, steps: int) -> float:
    """ms/iter of nanoGPT's training loop, reduced to its work per step."""
    meta_vocab = int(pd.read_json(data_dir / "meta.json", typ="series")["vocab_size"])
    torch.manual_seed(1337)
    config = GPTConfig(block_size=NANOGPT_CPU["block_size"], vocab_size=meta_vocab, n_layer=NANOGPT_CPU["n_layer"],
                       n_head=NANOGPT_CPU["n_head"], n_embd=NANOGPT_CPU["n_embd"], dropout=0.0, bias=False)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3, betas=(0.9, 0.99))
    block, batch = NANOGPT_CPU["block_size"], NANOGPT_CPU["batch_size"]

    def get_batch():
        data = np.memmap(data_dir / "train.bin", dtype=np.uint16, mode="r")  # nanoGPT reopens it every batch
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block].astype(np.int64)) for i in ix])
        return x, y

    x, y = get_batch()
    start = None
    for step in range(steps + WARMUP_STEPS):
        if step == WARMUP_STEPS:
            start = time.perf_counter()
        _, loss = model(x, y)
        x, y = get_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()
    return (time.perf_counter() - start) / steps * 1000


def attnid_loop(data_dir: Path, out: Path, steps: int, threads: int, metrics: bool) -> float:
    """ms/iter of ``attnid train`` between its first and last log rows (no eval in between)."""
    total = steps + 2 * WARMUP_STEPS
    cfg = resolve_config(dict(data=str(data_dir), out=str(out), case="adamw", lr=1e-3, max_iters=total,
                              eval_every=10 * total, eval_iters=1, ckpt_every=10 * total, threads=threads,
                              metrics=metrics, device="cpu", fresh=True, progress_every=1e9, **NANOGPT_CPU))
    assert train(cfg) == 0
    rows = pd.read_csv(out / "metrics.csv").set_index("step")
    first, last = WARMUP_STEPS, WARMUP_STEPS + steps  # both are log steps (multiples of 10) with no eval
    return (rows.wall_s[last] - rows.wall_s[first]) / steps * 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="prepared data directory")
    parser.add_argument("--text", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
                        / "tinyshakespeare.txt", help="tiny shakespeare, used when --data is not given")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per measurement (multiple of 10)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; the best of each is kept")
    args = parser.parse_args(argv)
    if args.steps % 10:
        parser.error("--steps must be a multiple of 10")
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            from attnid.data import prepare

            data_dir = Path(tmp) / "data"
            prepare(args.text, data_dir)
        # interleaved rounds, best of each: other load on the machine only ever adds time
        timings = {"bare": [], "plain": [], "metrics": []}
        for _ in range(args.rounds):
            timings["bare"].append(bare_nanogpt_loop(data_dir, args.steps))
            timings["plain"].append(attnid_loop(data_dir, Path(tmp) / "plain", args.steps, args.threads, False))
            timings["metrics"].append(attnid_loop(data_dir, Path(tmp) / "metrics", args.steps, args.threads, True))
        bare, no_metrics, with_metrics = (min(timings[k]) for k in ("bare", "plain", "metrics"))

    print(f"nanoGPT CPU config {NANOGPT_CPU}, AdamW, {args.threads} threads, {args.steps} timed steps, "
          f"best of {args.rounds} interleaved rounds")
    print(f"  bare nanoGPT-style loop      {bare:8.2f} ms/iter")
    print(f"  attnid train --no-metrics    {no_metrics:8.2f} ms/iter")
    print(f"  attnid train (log-every 10)  {with_metrics:8.2f} ms/iter")
    print(f"  ratio train/bare             {no_metrics / bare:8.3f}   (target <= 1.0)")
    print(f"  ratio metrics/no-metrics     {with_metrics / no_metrics:8.3f}   (target <= 1.05)")
    return 0 if math.isfinite(with_metrics) else 1


if __name__ == "__main__":
    sys.exit(main())
