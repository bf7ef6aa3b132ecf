"""Per-iteration time of ``attnid train`` with metrics at every step / without metrics, at the paper's shape.

The paper's model (6 layers, 6 heads, E=384, block 256) with a small batch so that it trains on a
CPU, AdamW, one training thread (``--threads 1``), a row with every metric at every step
(``--log-every 1``, τ on every ``--tau-every``-th row as in config/paper.yaml), measured three ways:

1. ``--no-metrics``: losses only (a row, and its loss read, at every step all the same);
2. ``--metrics-threads 1``: the metrics on one worker thread while training goes on;
3. ``--metrics-threads 0``: the metrics on the training thread (the synchronous path).

Each measurement is a fresh process, timed as the difference of a long and a short run, so that
start-up, evaluation and the final drain of the metrics queue cancel out. Rounds interleave the three;
it prints the medians and the ratios

    overlap: metrics / no-metrics      target <= 1.10
    synchronous: metrics / no-metrics

Both clocks are printed, ``--clock`` first. The wall clock (the default) is what the overlap is for;
it needs a core for the worker. On a machine shared with other work, the ``train-thread`` clock
counts the training thread's CPU time plus the time it waited for the metrics
(``metrics_queue_wait_s`` and ``metrics_drain_s`` of run.json): the cost the metrics put on the
training thread, whatever else runs.

    python benchmarks/metrics_overlap.py [--data DIR] [--batch-size 2] [--steps 30] [--short 8] [--rounds 3]
                                         [--tau-every 10] [--clock wall|train-thread]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAPER_SHAPE = dict(n_layer=6, n_head=6, n_embd=384, block_size=256)
VARIANTS = {
    "no-metrics": dict(metrics=False),
    "overlap": dict(metrics=True, metrics_threads=1),
    "synchronous": dict(metrics=True, metrics_threads=0),
}


def one_run(data: Path, out: Path, steps: int, batch_size: int, tau_every: int, variant: str) -> dict:
    """Train ``steps`` steps in this process; wall and training-thread seconds, and the metrics waits."""
    from attnid.training.config import resolve_config
    from attnid.training.train import train

    cfg = resolve_config(
        dict(
            data=str(data),
            out=str(out),
            case="adamw",
            lr=1e-3,
            max_iters=steps,
            log_every=1,
            eval_every=100 * steps,
            eval_iters=1,
            ckpt_every=100 * steps,
            threads=1,
            device="cpu",
            fresh=True,
            progress_every=1e9,
            tau_every=tau_every,
            batch_size=batch_size,
            dropout=0.0,
            **PAPER_SHAPE,
            **VARIANTS[variant],
        )
    )
    wall, thread = time.perf_counter(), time.thread_time()
    assert train(cfg) == 0
    wall, thread = time.perf_counter() - wall, time.thread_time() - thread
    info = json.loads((out / "run.json").read_text())
    waited = (info.get("metrics_queue_wait_s") or 0.0) + (info.get("metrics_drain_s") or 0.0)
    return {"wall": wall, "train-thread": thread + waited}


def in_subprocess(args, data: Path, steps: int, variant: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            __file__,
            "--one-run",
            variant,
            "--data",
            str(data),
            "--steps",
            str(steps),
            "--batch-size",
            str(args.batch_size),
            "--tau-every",
            str(args.tau_every),
            "--out",
            tmp,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="prepared data directory (default: prepared here)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps: the long run's extra steps")
    parser.add_argument("--short", type=int, default=8, help="steps of the short run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--tau-every", type=int, default=10)
    parser.add_argument("--clock", choices=("wall", "train-thread"), default="wall")
    parser.add_argument("--one-run", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_run:
        timings = one_run(args.data, args.out, args.steps, args.batch_size, args.tau_every, args.one_run)
        print(json.dumps(timings))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            from attnid.training.data import prepare

            data = Path(tmp) / "data"
            prepare(Path(__file__).resolve().parents[1] / "assets" / "tinyshakespeare.txt", data)
        per_iter = {name: {"wall": [], "train-thread": []} for name in VARIANTS}
        for _ in range(args.rounds):
            for name in VARIANTS:
                short = in_subprocess(args, data, args.short, name)
                long = in_subprocess(args, data, args.short + args.steps, name)
                for clock in ("wall", "train-thread"):
                    per_iter[name][clock].append(1e3 * (long[clock] - short[clock]) / args.steps)

    print(
        f"paper shape {PAPER_SHAPE}, batch {args.batch_size}, AdamW, 1 training thread, a row with every "
        f"metric at every step, tau every {args.tau_every} rows; {args.steps} timed steps, {args.rounds} "
        f"interleaved rounds, fresh processes (medians, ms/iter)"
    )
    for clock in (args.clock, *(c for c in ("wall", "train-thread") if c != args.clock)):
        median = {name: statistics.median(per_iter[name][clock]) for name in VARIANTS}
        print(f"{clock} clock:")
        for name in VARIANTS:
            values = per_iter[name][clock]
            print(f"  {name:>12}: {median[name]:8.1f}   (rounds: {', '.join(f'{v:.1f}' for v in values)})")
        overlap = median["overlap"] / median["no-metrics"]
        print(f"  overlap: metrics / no-metrics        {overlap:.3f}   (target <= 1.10)")
        print(f"  synchronous: metrics / no-metrics    {median['synchronous'] / median['no-metrics']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
