"""ms/iter of ``attnid train`` on nanoGPT's CPU config, side by side with a bare nanoGPT-style loop, and
the paper shape's metrics overlap: both of the project's speed ratios in one run.

Four measurements, same model (4 layers, 4 heads, E=128, block 64, batch 12), same
case (AdamW), same training threads, interleaved over ``--rounds`` rounds:

1. ``bare``: nanoGPT's inner loop and nothing else (batch from a fresh memmap,
   forward, backward, clip, AdamW step, ``loss.item()`` every 10 steps), the
   reference for "no slower than nanoGPT's own train.py";
2. ``train --no-metrics``: our full loop without ρ β τ μ;
3. ``train`` at the default ``--log-every 10`` with every metric (the drift split at every
   step included), τ on every ``--tau-every``-th row (default: the default config's), on the training
   thread (``--metrics-threads 0``, the default);
4. the same with ``--metrics-threads 1``: the metrics on a worker thread.

It prints the median ms/iter of each and the ratios the project targets: ``train/bare``
(target <= 1.0, within noise), per-iteration speed of each metrics loop relative to the bare
loop (target >= 0.95 with every metric on the training thread, as the default DAG runs them: its
two 1-thread jobs leave no core free) and ``metrics/no-metrics``.

In the same rounds it runs ``benchmarks/metrics_overlap.py``'s measurement at the paper's shape
(6 layers, 6 heads, E = 384, block 256, batch ``--paper-batch-size``, a row with every metric at
every step, τ on every ``--paper-tau-every``-th row): per-iteration time with one metrics thread
over the time without metrics (target <= 1.10). The last block prints the two target ratios side
by side, with the load average before and after (a timing taken while other work runs says as much
about that work as about the loops; rerun it on a quiet machine).

``--clock wall`` (the default) is what a user waits for; a worker thread needs a free core for it.
``--clock cpu`` is the process's CPU time (steadier on a busy machine, with ``--threads 1``; it adds
the worker's time, so it is the total work, not what the overlap saves). ``--clock thread`` is the
training thread's CPU time plus the time it waited for the metrics (run.json's
``metrics_queue_wait_s`` + ``metrics_drain_s``): the cost on the training thread whatever else runs.

    python benchmarks/train_speed.py [--data DIR] [--steps 300] [--threads 1] [--rounds 3]
                                     [--clock wall|cpu|thread] [--tau-every N]
                                     [--paper-steps 30] [--paper-short 8]
                                     [--paper-batch-size 2] [--paper-tau-every 10]

``--paper-steps 0`` leaves the paper-shape measurement out.

``--data`` is a directory prepared by ``attnid prepare``; without it one is prepared
in a temporary directory from ``--text`` (tiny shakespeare).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import metrics_overlap  # benchmarks/metrics_overlap.py, next to this file
import numpy as np
import pandas as pd
import torch
import yaml

from attnid.model.gpt import GPT, GPTConfig
from attnid.training.config import TrainConfig, resolve_config
from attnid.training.train import train

NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
WARMUP_STEPS = 20  # the short run of each pair: its set-up and warm-up cancel out of the difference


def bare_nanogpt_loop(data_dir: Path, steps: int) -> None:
    """nanoGPT's training loop, reduced to its work per step."""
    meta_vocab = int(pd.read_json(data_dir / "meta.json", typ="series")["vocab_size"])
    torch.manual_seed(1337)
    config = GPTConfig(
        block_size=NANOGPT_CPU["block_size"],
        vocab_size=meta_vocab,
        n_layer=NANOGPT_CPU["n_layer"],
        n_head=NANOGPT_CPU["n_head"],
        n_embd=NANOGPT_CPU["n_embd"],
        dropout=0.0,
        bias=False,
    )
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3, betas=(0.9, 0.99))
    block, batch = NANOGPT_CPU["block_size"], NANOGPT_CPU["batch_size"]

    def get_batch():
        data = np.memmap(data_dir / "train.bin", dtype=np.uint16, mode="r")  # nanoGPT reopens it every batch
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix])
        return x, y

    x, y = get_batch()
    for step in range(steps):
        _, loss = model(x, y)
        x, y = get_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()


def default_tau_every() -> int:
    """The default config's ``training.tau_every`` (what the default DAG's runs probe τ with)."""
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    return int(config["training"].get("tau_every", TrainConfig.tau_every))


def attnid_loop(
    data_dir: Path,
    out: Path,
    steps: int,
    threads: int,
    metrics: bool,
    metrics_threads: int = 0,
    tau_every: int = TrainConfig.tau_every,
) -> float:
    """``attnid train`` for ``steps`` steps (eval only at step 0 and the end, no checkpoint before the end);
    returns the seconds the training thread waited for the metrics."""
    cfg = resolve_config(
        dict(
            data=str(data_dir),
            out=str(out),
            case="adamw",
            lr=1e-3,
            max_iters=steps,
            eval_every=10 * steps,
            eval_iters=1,
            ckpt_every=10 * steps,
            threads=threads,
            metrics=metrics,
            metrics_threads=metrics_threads,
            tau_every=tau_every,
            device="cpu",
            fresh=True,
            progress_every=1e9,
            **NANOGPT_CPU,
        )
    )
    assert train(cfg) == 0
    info = json.loads((out / "run.json").read_text())
    return (info.get("metrics_queue_wait_s") or 0.0) + (info.get("metrics_drain_s") or 0.0)


def ms_per_iter(run, steps: int, clock_name: str) -> float:
    """Time per step as the difference of a long and a short run: set-up, eval and saving cancel out."""
    clock = {"cpu": time.process_time, "wall": time.perf_counter, "thread": time.thread_time}[clock_name]
    timings = []
    for n in (WARMUP_STEPS, WARMUP_STEPS + steps):
        start = clock()
        waited = run(n) or 0.0
        timings.append(clock() - start + (waited if clock_name == "thread" else 0.0))
    return (timings[1] - timings[0]) / steps * 1000


MEASUREMENTS = ("bare", "plain", "metrics", "overlap")


def measure(name: str, data_dir: Path, steps: int, threads: int, clock_name: str, tau_every: int) -> float:
    """ms/iter of one loop, in this process."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "bare": lambda n: bare_nanogpt_loop(data_dir, n),
            "plain": lambda n: attnid_loop(data_dir, Path(tmp) / "plain", n, threads, metrics=False),
            "metrics": lambda n: attnid_loop(
                data_dir, Path(tmp) / "metrics", n, threads, metrics=True, tau_every=tau_every
            ),
            "overlap": lambda n: attnid_loop(
                data_dir,
                Path(tmp) / "overlap",
                n,
                threads,
                metrics=True,
                metrics_threads=1,
                tau_every=tau_every,
            ),
        }
        return ms_per_iter(runs[name], steps, clock_name)


def measure_in_subprocess(name: str, data_dir: Path, args) -> float:
    command = [
        sys.executable,
        __file__,
        "--measure",
        name,
        "--data",
        str(data_dir),
        "--steps",
        str(args.steps),
        "--threads",
        str(args.threads),
        "--clock",
        args.clock,
        "--tau-every",
        str(args.tau_every),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="prepared data directory")
    parser.add_argument(
        "--text",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "assets" / "tinyshakespeare.txt",
        help="tiny shakespeare, used when --data is not given",
    )
    parser.add_argument("--steps", type=int, default=300, help="timed steps per measurement (multiple of 10)")
    parser.add_argument("--threads", type=int, default=1, help="training threads (the default config's: 1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians are reported")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu", "thread"),
        default="wall",
        help="wall clock, process CPU time, or the training thread's CPU time plus its waits",
    )
    parser.add_argument(
        "--tau-every",
        type=int,
        default=default_tau_every(),
        help="default shape: tau on every N-th row (default: the default config's, %(default)s)",
    )
    parser.add_argument(
        "--paper-steps",
        type=int,
        default=30,
        help="paper shape: timed steps of the overlap (0: leave it out)",
    )
    parser.add_argument("--paper-short", type=int, default=8, help="paper shape: steps of the short run")
    parser.add_argument("--paper-batch-size", type=int, default=2)
    parser.add_argument("--paper-tau-every", type=int, default=10, help="paper shape: tau on every N-th row")
    parser.add_argument(
        "--measure", choices=MEASUREMENTS, help=argparse.SUPPRESS
    )  # one measurement (internal)
    args = parser.parse_args(argv)
    if args.steps % 10:
        parser.error("--steps must be a multiple of 10")
    if args.measure:
        print(measure(args.measure, args.data, args.steps, args.threads, args.clock, args.tau_every))
        return 0

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            from attnid.training.data import prepare

            data_dir = Path(tmp) / "data"
            prepare(args.text, data_dir)
        # interleaved rounds, medians. Each measurement runs in a fresh process: timed one after
        # another in one process, whichever loop comes first was measured up to 20 % faster (allocator
        # and cache state), not the loops' cost.
        timings = {name: [] for name in MEASUREMENTS}
        paper_rounds = []
        for _ in range(args.rounds):
            for name in MEASUREMENTS:
                timings[name].append(measure_in_subprocess(name, data_dir, args))
            if args.paper_steps:
                paper_rounds.append(
                    metrics_overlap.measure_round(
                        data_dir,
                        args.paper_steps,
                        args.paper_short,
                        args.paper_batch_size,
                        args.paper_tau_every,
                    )
                )
        bare, no_metrics, with_metrics, overlap = (statistics.median(timings[k]) for k in MEASUREMENTS)
    load_after = os.getloadavg()

    print(
        f"nanoGPT CPU config {NANOGPT_CPU}, AdamW, {args.threads} training thread(s), {args.steps} timed "
        f"steps, median of {args.rounds} interleaved rounds, each measurement in a fresh process, "
        f"{args.clock} clock"
    )
    labels = {
        "bare": "bare nanoGPT-style loop",
        "plain": "attnid train --no-metrics",
        "metrics": "all metrics, training thread",
        "overlap": "all metrics, 1 metrics thread",
    }
    for name in MEASUREMENTS:
        spread = ", ".join(f"{t:.2f}" for t in timings[name])
        print(f"  {labels[name]:<30} {statistics.median(timings[name]):8.2f} ms/iter   ({spread})")
    print(f"  ratio train/bare                     {no_metrics / bare:8.3f}   (target <= 1.0)")
    speed = bare / with_metrics
    print(f"  speed, all metrics / bare            {speed:8.3f}   (training thread, target >= 0.95)")
    print(f"  speed, all metrics / bare, overlap   {bare / overlap:8.3f}   (1 metrics thread)")
    print(f"  ratio metrics/no-metrics             {with_metrics / no_metrics:8.3f}")
    print(f"  ratio metrics/no-metrics, overlap    {overlap / no_metrics:8.3f}")
    paper = {}
    if paper_rounds:
        print()
        print(
            metrics_overlap.describe(
                args.paper_batch_size, args.paper_tau_every, args.paper_steps, len(paper_rounds)
            )
        )
        paper = metrics_overlap.report(paper_rounds, "wall" if args.clock == "wall" else "train-thread")
    print()
    print(
        f"both ratios, {args.clock} clock, {args.rounds} interleaved rounds; load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} cores:"
    )
    print(f"  default shape, all metrics on the training thread, speed / bare   {speed:6.3f}   (>= 0.95)")
    if paper:
        ratio = paper["overlap"]
        print(f"  paper shape, metrics every step, 1 metrics thread, time / none  {ratio:6.3f}   (<= 1.10)")
    return 0 if math.isfinite(with_metrics) else 1


if __name__ == "__main__":
    sys.exit(main())
