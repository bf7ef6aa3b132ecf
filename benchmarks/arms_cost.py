"""Cost per step of each intervention arm as a ratio to ``adamw``, side by side in one process.

Every arm is an ``attnid train`` run (:class:`attnid.training.train.Run`, the loop the
pipeline runs) at the default config's model (4 layers, 4 heads, E = 128, block 64,
batch 12), float32, with every metric at ``--log-every 10`` (``--no-metrics``: training
only). The arms take turns: one *round* is ``--steps`` training steps of each arm, in
turn, timed as process CPU time (other jobs on a shared machine inflate wall time
unevenly). Per round the arm's time is divided by ``adamw``'s of the same round, and the
script prints the median over rounds of that ratio with its spread (interquartile range)
and the median ms/step. Targets: ``adamw_projected`` <= 1.15 (docs/design.md §13).

The rebalancing arms rebalance every ``--steps`` steps here (the pipeline: every 200), so that
every round holds one rebalance; they skip the τ probe of the other log steps, so they can cost
less than ``adamw``. The last line is ``rebalance_first_moment`` over ``rebalance_keep`` per round:
what transporting AdamW's first moment adds to a rebalance (docs/design.md §15).

    python benchmarks/arms_cost.py [--rounds 7] [--steps 40] [--threads 1] [--no-metrics] [--data DIR]

``--data`` is a directory prepared by ``attnid prepare``; without it one is prepared in a
temporary directory from the shipped tiny shakespeare.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnid.training.config import resolve_config
from attnid.training.train import Run

DEFAULT_MODEL = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
# arm name -> (case, extra settings): the interventions study's arms and their baseline
ARMS = {
    "adamw": ("adamw", {}),
    "adamw_projected": ("adamw_projected", {}),
    "adamw_gauge_fixed": ("adamw_gauge_fixed", {}),
    "rebalance_keep": ("adamw_rebalance", {"rebalance_moments": "keep"}),
    "rebalance_first_moment": ("adamw_rebalance", {"rebalance_moments": "first-moment"}),
}
CLOCK = time.process_time


def make_run(data_dir: Path, out: Path, case: str, extra: dict, args) -> Run:
    cfg = resolve_config(
        dict(
            data=str(data_dir),
            out=str(out),
            case=case,
            max_iters=10**6,
            eval_every=10**6,
            ckpt_every=10**6,
            log_every=10,
            rebalance_every=args.steps,
            threads=args.threads,
            metrics=args.metrics,
            progress_every=1e9,
            **DEFAULT_MODEL,
            **extra,
        )
    )
    run = Run(cfg)
    run.build()
    run.start_clocks()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40, help="steps per arm per round (a multiple of 10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            from attnid.training.data import prepare

            data_dir = Path(tmp) / "data"
            prepare(Path(__file__).resolve().parents[1] / "assets" / "tinyshakespeare.txt", data_dir)
        runs = {
            arm: make_run(data_dir, Path(tmp) / arm, case, extra, args) for arm, (case, extra) in ARMS.items()
        }
        torch.set_num_threads(args.threads)
        seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for round_index in range(args.rounds + 1):  # round 0 warms up
            for arm, run in runs.items():
                start = CLOCK()
                for _ in range(args.steps):
                    run.train_step()
                if round_index > 0:
                    seconds[arm].append(CLOCK() - start)
    print(
        f"{DEFAULT_MODEL} float32, metrics={'on (log every 10)' if args.metrics else 'off'}, "
        f"threads={args.threads}, {args.rounds} rounds of {args.steps} steps per arm, interleaved "
        f"(process CPU time; medians)"
    )
    print(f"  {'arm':>20}  {'ms/step':>8}  {'ratio to adamw':>14}  {'IQR of ratio':>13}")
    for arm, times in seconds.items():
        ratios = [t / base for t, base in zip(times, seconds["adamw"], strict=True)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        ms_per_step = 1e3 * statistics.median(times) / args.steps
        print(
            f"  {arm:>20}  {ms_per_step:8.2f}  {statistics.median(ratios):14.3f}"
            f"  {quartiles[0]:6.3f}-{quartiles[2]:.3f}"
        )
    transport = [
        t / k for t, k in zip(seconds["rebalance_first_moment"], seconds["rebalance_keep"], strict=True)
    ]
    print(
        f"  rebalance_first_moment / rebalance_keep (one rebalance per {args.steps} steps): "
        f"{statistics.median(transport):.3f}"
    )


if __name__ == "__main__":
    main()
