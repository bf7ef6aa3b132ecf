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
training thread, whatever else runs. Those waits are printed on their own too (ms per iteration):
where the wall-clock ratio is high and they are not, the training thread was slowed, not kept
waiting. ``benchmarks/train_speed.py`` runs this measurement beside its own (both ratios in one run).

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
    return {"wall": wall, "train-thread": thread + waited, "waits": waited}


CLOCKS = ("wall", "train-thread", "waits")


def in_subprocess(data: Path, steps: int, variant: str, batch_size: int, tau_every: int) -> dict:
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
            str(batch_size),
            "--tau-every",
            str(tau_every),
            "--out",
            tmp,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_round(data: Path, steps: int, short: int, batch_size: int, tau_every: int) -> dict:
    """One interleaved round: per variant and clock, ms per iteration (long run minus short run)."""
    per_iter = {}
    for name in VARIANTS:
        first = in_subprocess(data, short, name, batch_size, tau_every)
        last = in_subprocess(data, short + steps, name, batch_size, tau_every)
        per_iter[name] = {clock: 1e3 * (last[clock] - first[clock]) / steps for clock in CLOCKS}
    return per_iter


def report(rounds: list[dict], clock: str) -> dict[str, float]:
    """Print the medians of each variant per clock (``clock`` first) and the ratios; returns the ratios
    of ``clock``."""
    ratios = {}
    for shown in (clock, *(c for c in ("wall", "train-thread") if c != clock)):
        median = {name: statistics.median(r[name][shown] for r in rounds) for name in VARIANTS}
        print(f"{shown} clock:")
        for name in VARIANTS:
            values = ", ".join(f"{r[name][shown]:.1f}" for r in rounds)
            waits = statistics.median(r[name]["waits"] for r in rounds)
            print(
                f"  {name:>12}: {median[name]:8.1f}   (rounds: {values}; the training thread's waits for "
                f"the metrics {waits:.1f})"
            )
        overlap = median["overlap"] / median["no-metrics"]
        synchronous = median["synchronous"] / median["no-metrics"]
        print(f"  overlap: metrics / no-metrics        {overlap:.3f}   (target <= 1.10)")
        print(f"  synchronous: metrics / no-metrics    {synchronous:.3f}")
        if shown == clock:
            ratios = {"overlap": overlap, "synchronous": synchronous}
    return ratios


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
        rounds = [
            measure_round(data, args.steps, args.short, args.batch_size, args.tau_every)
            for _ in range(args.rounds)
        ]

    print(describe(args.batch_size, args.tau_every, args.steps, args.rounds))
    report(rounds, args.clock)
    return 0


def describe(batch_size: int, tau_every: int, steps: int, rounds: int) -> str:
    return (
        f"paper shape {PAPER_SHAPE}, batch {batch_size}, AdamW, 1 training thread, a row with every "
        f"metric at every step, tau every {tau_every} rows; {steps} timed steps, {rounds} "
        f"interleaved rounds, fresh processes (medians, ms/iter)"
    )


if __name__ == "__main__":
    sys.exit(main())
