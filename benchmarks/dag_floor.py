"""A build's floor: the wall time that its training jobs' forward and backward passes alone need.

Snakemake lists every job of a full build of the config (``snakemake --dry-run --forceall
--printshellcmds``); each ``attnid train`` command (its flags, and the settings of the spec file its
``--config`` names, which attnid.plan gives: a dry run writes none) becomes that run's settings, and the
forward and backward pass of that run's model (its shape, dtype and case) is timed on one thread
(the fastest of ``--steps`` passes after a warm-up, process CPU time, once per distinct model). A job's
floor is ``max_iters`` times that: no optimizer step, evaluation, metric, checkpoint or start-up.
Summed per stage and divided by the cores the build runs on (``--cores``), it is a lower bound on
the build's wall time with its present outputs that no change to the training loop can beat (the
passes are PyTorch's own, as in nanoGPT). With ``--benchmarks DIR`` (a finished build's
``<results_dir>/benchmarks``) each stage's measured job time is printed beside its floor, as a ratio.

    python benchmarks/dag_floor.py [--configfile config/config.yaml] [--cores 2] [--steps 10]
                                   [--benchmarks results/default/benchmarks]

Run it from the repository root, where Snakemake finds the workflow. A job's stage is the first part
of its ``--out`` under the results directory (runs, interventions, calibration, studies, ...). A run at an
arm's best lr, whose spec the calibration writes, is timed at lr 1e-3 (its lr does not change what a pass
costs).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from attnid.cli.train import add_train_arguments, config_from_args
from attnid.plan import Plan, plan
from attnid.plan.runs import spec_text
from attnid.training.train import Run

# what changes the cost of a forward and backward pass; everything else (lr, seed, schedule) does not
MODEL_FIELDS = (
    "case", "n_layer", "n_head", "n_embd", "n_kv_head", "head_dim", "rope",
    "block_size", "batch_size", "bias", "dropout", "dtype",
)  # fmt: skip


def train_commands(configfile: Path | None) -> list[list[str]]:
    """The argument lists of every ``attnid train`` job of a full build (after ``attnid train``)."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--dry-run",
        "--forceall",
        "--printshellcmds",
        "--cores",
        "1",
    ]
    if configfile is not None:
        command += ["--configfile", str(configfile)]
    listing = subprocess.run(command, capture_output=True, text=True)
    if listing.returncode != 0:
        sys.exit(f"dag_floor: {' '.join(command)} failed:\n{listing.stderr.strip()[-2000:]}")
    jobs = []
    for line in listing.stdout.splitlines():
        # a job's command ends in its log's redirection (a spec file's text names the command too)
        if "attnid train " not in line or not line.endswith("2>&1"):
            continue
        words = shlex.split(line.split("attnid train ", 1)[1])
        jobs.append(words[: words.index(">")] if ">" in words else words)
    return jobs


def planned(configfile: Path | None) -> Plan:
    """The plan of the config the dry run reads (config/config.yaml without ``--configfile``)."""
    return plan(yaml.safe_load((configfile or Path("config/config.yaml")).read_text(encoding="utf-8")))


def with_written_specs(words: list[str], runs: Plan, tmp: Path) -> list[str]:
    """``words`` with the ``--config`` spec file replaced by the plan's spec of the run (``--out``), written
    into ``tmp``: a dry run writes no spec file. A run at an arm's best lr, whose lr the calibration
    chooses, takes lr 1e-3 (the pass costs the same)."""
    out = words[words.index("--out") + 1]
    spec = runs.runs[out]
    if spec.best_lr_of is not None:
        spec = replace(spec, settings=spec.settings | {"lr": 1e-3}, best_lr_of=None)
    made = tmp / "specs" / f"{len(list(tmp.glob('specs/*')))}.yaml"
    made.parent.mkdir(parents=True, exist_ok=True)
    made.write_text(spec_text(spec, str(made), out))
    config = words.index("--config") + 1
    return [*words[:config], str(made), *words[config + 1 :]]


def stage_of(out: str, results_dir: str) -> str:
    """The first part of ``out`` under ``results_dir`` (``interventions``, ``runs``, ...)."""
    parts = Path(out).relative_to(results_dir).parts
    return parts[0] if parts else Path(out).name


def pass_seconds(cfg, steps: int) -> float:
    """Seconds of one training forward and backward pass of ``cfg``'s model: the fastest of ``steps``
    (a floor: what the machine can do, not what a busy moment gives)."""
    run = Run(cfg)
    run.build()
    times = []
    for index in range(steps + 2):  # two warm-up passes
        start = time.process_time()
        run.forward_backward(cfg.lr, sync=False)
        run.optimizer.zero_grad(set_to_none=True)
        if index >= 2:
            times.append(time.process_time() - start)
    return min(times)


def measured_job_seconds(benchmarks: Path) -> dict[str, float]:
    """Per stage, the job time in a build's Snakemake benchmark files (``s``, the first column)."""
    per_stage: dict[str, float] = defaultdict(float)
    for path in benchmarks.rglob("*.tsv"):
        relative = path.relative_to(benchmarks).parts
        stage = relative[0] if len(relative) > 1 else path.stem
        rows = path.read_text().splitlines()
        if len(rows) > 1:
            per_stage[stage] += float(rows[-1].split("\t")[0])
    return dict(per_stage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, default=None)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed passes per distinct model")
    parser.add_argument("--benchmarks", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train_parser = argparse.ArgumentParser()
    add_train_arguments(train_parser)
    jobs = train_commands(args.configfile)
    floor: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    timed: dict[tuple, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        from attnid.training.data import prepare

        prepare(Path(__file__).resolve().parents[1] / "assets" / "tinyshakespeare.txt", data_dir)
        runs = planned(args.configfile)
        parsed = [train_parser.parse_args(with_written_specs(words, runs, Path(tmp))) for words in jobs]
        results_dir = os.path.commonpath([flags.out for flags in parsed]) if len(parsed) > 1 else "."
        for number, flags in enumerate(parsed):
            stage = stage_of(flags.out, results_dir)
            flags.data, flags.out, flags.threads = str(data_dir), str(Path(tmp) / f"run{number}"), 1
            cfg = config_from_args(flags)
            key = tuple(getattr(cfg, name) for name in MODEL_FIELDS)
            if key not in timed:
                timed[key] = pass_seconds(cfg, args.steps)
                shape = ", ".join(f"{name}={value}" for name, value in zip(MODEL_FIELDS, key, strict=True))
                print(f"  {1e3 * timed[key]:7.1f} ms per pass: {shape}", flush=True)
            floor[stage] += cfg.max_iters * timed[key]
            counts[stage] += 1
    measured = measured_job_seconds(args.benchmarks) if args.benchmarks is not None else {}
    print(f"\n{len(jobs)} training jobs; floor = max_iters x one forward and backward pass, one thread each")
    header = f"  {'stage':>14}  {'jobs':>4}  {'floor (s)':>9}"
    print(header + ("  measured (s)  measured/floor" if measured else ""))
    for stage in sorted(floor, key=floor.__getitem__, reverse=True):
        line = f"  {stage:>14}  {counts[stage]:4d}  {floor[stage]:9.0f}"
        if stage in measured:
            line += f"  {measured[stage]:12.0f}  {measured[stage] / floor[stage]:14.2f}"
        print(line)
    total = sum(floor.values())
    print(f"  {'all':>14}  {len(jobs):4d}  {total:9.0f}")
    print(
        f"floor of the build's wall time on {args.cores} cores: {total / args.cores / 60:.1f} min "
        "(training passes only; every other job and all overhead come on top)"
    )


if __name__ == "__main__":
    main()
