"""Runs in lockstep against the same runs one after another: process CPU time per run-step, side by side.

The interventions stage's runs (config/config.yaml ``interventions:``: its model, batch and lr; ``--arm``
picks the arm, default the gauge-fixed one) are set up as ``attnid train`` sets them up
(:class:`attnid.training.train.Run`), ``--runs`` of them with seeds 0, 1, ...; one *round* trains each run
``--steps`` steps alone (the loop ``attnid train`` runs), then all of them ``--steps`` steps in lockstep
(:class:`attnid.training.lockstep.Lockstep`), each timed as process CPU time. Printed: the median over
rounds of lockstep's time over the lone runs' (the target: <= 0.6 at 20 runs, what the stage's per-arm
jobs need to fit the build's budget), and both in ms per run-step. Steps only: no rows, no evaluation.

    python benchmarks/lockstep_speed.py [--runs 20] [--steps 100] [--rounds 5] [--arm adamw_gauge_fixed]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from attnid.training.config import resolve_config
from attnid.training.lockstep import Lockstep
from attnid.training.train import Run

REPO = Path(__file__).resolve().parents[1]
CLOCK = time.process_time
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "lr", "warmup_iters")
# the stage's arms (config/config.yaml) as attnid interventions-table names them
ARMS = {
    "adamw": {"case": "adamw"},
    "adamw_gauge_fixed": {"case": "adamw_gauge_fixed"},
    "adamw_gauge_fixed_at_init": {"case": "adamw_gauge_fixed", "initial_point": "init"},
    "adamw_from_gauge_point": {"case": "adamw", "initial_point": "gauge"},
    "adamw_frozen_mlp": {"case": "adamw", "freeze_mlp": True},
}


def make_runs(data_dir: Path, out: Path, arm: str, count: int, steps: int) -> list[Run]:
    stage = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["interventions"]
    runs = []
    for seed in range(count):
        settings = {key: stage[key] for key in MODEL_KEYS} | ARMS[arm]
        cfg = resolve_config(
            dict(
                data=str(data_dir),
                out=str(out / f"seed{seed}"),
                seed=seed,
                max_iters=10**6,
                log_every=10**6,
                eval_every=10**6,
                ckpt_every=10**6,
                metrics=False,
                progress_every=1e9,
                threads=1,
            )
            | settings
        )
        run = Run(cfg)
        run.build()
        run.start_clocks()
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arm", default="adamw_gauge_fixed", choices=list(ARMS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        from attnid.training.data import prepare

        data_dir = Path(tmp) / "data"
        prepare(REPO / "assets" / "tinyshakespeare.txt", data_dir)
        alone_runs = make_runs(data_dir, Path(tmp) / "alone", args.arm, args.runs, args.steps)
        together = Lockstep(make_runs(data_dir, Path(tmp) / "together", args.arm, args.runs, args.steps))
        alone_s, together_s = [], []
        for round_index in range(args.rounds + 1):  # round 0 warms up
            start = CLOCK()
            for run in alone_runs:
                for _ in range(args.steps):
                    run.train_step()
            middle = CLOCK()
            for _ in range(args.steps):
                together.train_step()
            if round_index > 0:
                alone_s.append(middle - start)
                together_s.append(CLOCK() - middle)
    ratios = [t / a for t, a in zip(together_s, alone_s, strict=True)]
    per = 1e3 / (args.runs * args.steps)
    print(
        f"{args.arm}, {args.runs} runs x {args.steps} steps, {args.rounds} rounds "
        "(process CPU time, medians): "
        f"alone {statistics.median(alone_s) * per:.2f} ms per run-step, lockstep "
        f"{statistics.median(together_s) * per:.2f}; lockstep / alone {statistics.median(ratios):.3f} "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f}; target <= 0.6)"
    )


if __name__ == "__main__":
    main()
