"""Cost per step of each intervention arm as a ratio to ``adamw``, side by side in one process.

Every arm is an ``attnid train`` run (:class:`attnid.training.train.Run`, the loop the
pipeline runs) at the default config's model (4 layers, 4 heads, E = 128, block 64,
batch 12), float32, with every metric at ``--log-every 10`` (``--no-metrics``: training
only). The arms take turns: one *round* is ``--steps`` training steps of each arm, in
turn, timed as process CPU time (other jobs on a shared machine inflate wall time
unevenly). Per round the arm's time is divided by ``adamw``'s of the same round, and the
script prints the median over rounds of that ratio with its spread (interquartile range)
and the median ms/step. Targets: ``adamw_projected`` <= 1.15 (docs/design.md §13).

The arms are named as ``attnid interventions-table`` names them (its ``cost_ratio`` column reads
this file): the gauge arm's controls (docs/design.md §14) and ``adamw_lr2x`` (adamw at twice
the lr, which costs what adamw costs: its ratio shows the measurement's own spread). The
rebalancing arms rebalance every ``--steps`` steps here (the pipeline: every 200), so that
every round holds one rebalance; they skip the τ probe of the other log steps, so they can cost
less than ``adamw``. The last line is ``adamw_rebalance_first_moment`` over ``adamw_rebalance``
per round: what transporting AdamW's first moment adds to a rebalance (docs/design.md §15).

The result is written to ``--out`` (default: benchmarks/arms_cost.csv, the kept copy the
pipeline's interventions table reads) with the machine (platform, CPU model, torch version)
and the date it was measured on; ``--out ''`` writes nothing. Measure on a quiet machine:

    python benchmarks/arms_cost.py [--rounds 7] [--steps 40] [--threads 1] [--no-metrics] [--data DIR]
        [--out benchmarks/arms_cost.csv]

``--data`` is a directory prepared by ``attnid prepare``; without it one is prepared in a
temporary directory from the shipped tiny shakespeare.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import torch

from attnid.common.files import write_csv_atomic
from attnid.training.config import resolve_config
from attnid.training.train import Run

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
ADAMW_LR = 1e-3  # config/config.yaml's adamw
# arm name (as attnid interventions-table names it) -> (case, extra settings): the study's arms and baseline
ARMS = {
    "adamw": ("adamw", {}),
    "adamw_projected": ("adamw_projected", {}),
    "adamw_gauge_fixed": ("adamw_gauge_fixed", {}),
    "adamw_gauge_fixed_at_init": ("adamw_gauge_fixed", {"initial_point": "init"}),
    "adamw_from_gauge_point": ("adamw", {"initial_point": "gauge"}),
    "adamw_frozen_mlp": ("adamw", {"freeze_mlp": True}),
    "adamw_lr2x": ("adamw", {"lr": 2 * ADAMW_LR}),
    "adamw_rebalance": ("adamw_rebalance", {"rebalance_moments": "keep"}),
    "adamw_rebalance_first_moment": ("adamw_rebalance", {"rebalance_moments": "first-moment"}),
}
CLOCK = time.process_time
KEPT = REPO / "benchmarks" / "arms_cost.csv"


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
            **({"lr": ADAMW_LR} | extra),
        )
    )
    run = Run(cfg)
    run.build()
    run.start_clocks()
    return run


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; else what platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cost_table(seconds: dict[str, list[float]], steps: int, settings: dict) -> pd.DataFrame:
    """One row per arm: median ms per step, the median over rounds of its time over adamw's in the same
    round and that ratio's quartiles, then ``settings`` (the measurement and the machine) on every row."""
    rows = []
    for arm, times in seconds.items():
        ratios = [t / base for t, base in zip(times, seconds["adamw"], strict=True)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        rows.append(
            {
                "arm": arm,
                "case": ARMS[arm][0],
                "ms_per_step": 1e3 * statistics.median(times) / steps,
                "ratio_to_adamw": statistics.median(ratios),
                "ratio_q1": quartiles[0],
                "ratio_q3": quartiles[2],
            }
            | settings
        )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40, help="steps per arm per round (a multiple of 10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument(
        "--out", default=str(KEPT), help="the CSV to write ('' for none; default: %(default)s)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            from attnid.training.data import prepare

            data_dir = Path(tmp) / "data"
            prepare(REPO / "assets" / "tinyshakespeare.txt", data_dir)
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
    settings = {
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "metrics": args.metrics,
        "threads": args.threads,
        "clock": "process CPU time",
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "date": datetime.now(UTC).date().isoformat(),
    }
    table = cost_table(seconds, args.steps, settings)
    print(
        f"{DEFAULT_MODEL} float32, metrics={'on (log every 10)' if args.metrics else 'off'}, "
        f"threads={args.threads}, {args.rounds} rounds of {args.steps} steps per arm, interleaved "
        f"(process CPU time; medians); {settings['cpu']}, torch {settings['torch']}"
    )
    print(f"  {'arm':>26}  {'ms/step':>8}  {'ratio to adamw':>14}  {'IQR of ratio':>13}")
    for row in table.to_dict("records"):
        print(
            f"  {row['arm']:>26}  {row['ms_per_step']:8.2f}  {row['ratio_to_adamw']:14.3f}"
            f"  {row['ratio_q1']:6.3f}-{row['ratio_q3']:.3f}"
        )
    transport = [
        t / k
        for t, k in zip(seconds["adamw_rebalance_first_moment"], seconds["adamw_rebalance"], strict=True)
    ]
    print(
        f"  adamw_rebalance_first_moment / adamw_rebalance (one rebalance per {args.steps} steps): "
        f"{statistics.median(transport):.3f}"
    )
    if args.out:
        write_csv_atomic(args.out, table)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
