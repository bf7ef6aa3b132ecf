"""ms/step of ``attnid train --dtype float64`` against ``--dtype float32``, side by side.

Same model (nanoGPT's CPU config: 4 layers, 4 heads, E=128, block 64, batch 12, the
default config's model), same case, one thread. Every measurement is a fresh
``attnid train`` process, so no allocator or thread-pool state carries over between
the two precisions. Each precision runs twice, ``--warmup-steps`` and ``--steps``
steps; the difference of the two processes' CPU times over the difference of their
steps is the cost of one step, with start-up, data loading and the evaluations at
the first and last step cancelled out. CPU time, not wall time: on a machine shared
with other jobs it still measures the work.

    python benchmarks/precision_cost.py [--data DIR] [--case sgd] [--steps 120] [--warmup-steps 20]
                                        [--metrics both|on|off]

``--data`` is a directory prepared by ``attnid prepare``; without it one is prepared
in a temporary directory from the shipped tiny shakespeare.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = ["--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--block-size", "64", "--batch-size", "12"]
DTYPES = ("float32", "float64")


def child_cpu_seconds(command: list[str]) -> float:
    """User + system CPU seconds of one child process (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"precision_cost: {' '.join(command)} failed:\n{result.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ms_per_step(
    data: Path, work: Path, case: str, dtype: str, metrics: bool, steps: int, warmup: int
) -> float:
    seconds = {}
    for n in (warmup, steps):
        out = work / f"{case}-{dtype}-{'metrics' if metrics else 'plain'}-{n}"
        command = [
            sys.executable,
            "-m",
            "attnid",
            "train",
            "--data",
            str(data),
            "--out",
            str(out),
            "--fresh",
            "--case",
            case,
            "--dtype",
            dtype,
            "--max-iters",
            str(n),
            "--warmup-iters",
            "0",
            "--log-every",
            "10",
            "--eval-every",
            str(10 * steps),
            "--eval-iters",
            "2",
            "--threads",
            "1",
            "--progress-every",
            "1e6",
            *MODEL,
            *([] if metrics else ["--no-metrics"]),
        ]
        seconds[n] = child_cpu_seconds(command)
    return 1000.0 * (seconds[steps] - seconds[warmup]) / (steps - warmup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--case", default="sgd")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--metrics", choices=("both", "on", "off"), default="both")
    args = parser.parse_args()
    if args.steps <= args.warmup_steps:
        parser.error("--steps must exceed --warmup-steps")
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.metrics]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = args.data
        if data is None:
            data = work / "data"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "attnid",
                    "prepare",
                    "--text",
                    str(REPO / "assets" / "tinyshakespeare.txt"),
                    "--out-dir",
                    str(data),
                ],
                check=True,
                capture_output=True,
            )
        print(
            f"case {args.case}, nanoGPT CPU model, 1 thread, CPU ms/step over steps "
            f"{args.warmup_steps}..{args.steps}, one fresh process per measurement"
        )
        print(f"{'metrics':<8} {'float32':>10} {'float64':>10} {'float64/float32':>16}")
        for metrics in modes:
            cost = {
                dtype: ms_per_step(data, work, args.case, dtype, metrics, args.steps, args.warmup_steps)
                for dtype in DTYPES
            }
            print(
                f"{'on' if metrics else 'off':<8} {cost['float32']:>10.1f} {cost['float64']:>10.1f} "
                f"{cost['float64'] / cost['float32']:>16.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
