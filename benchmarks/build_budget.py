"""A build's job time against its budget: the sum of the ``s`` column of Snakemake's benchmark files.

Every training and table job of the workflow names a benchmark file under ``<results_dir>/benchmarks``
(``benchmark:`` in workflow/rules/*.smk): ``runs/<case>/seed<N>.tsv``, ``sweep/...``, ``studies/...``,
``edits/...``, ``interventions/<arm>[/seed<N>].tsv``, ``calibration/<arm>/lr<lr>[/seed<N>].tsv``,
``quantization/...``, and the theory's ``verify.tsv`` and ``census.tsv`` at the top. A file's stage is the
first folder of its path (the theory's files: ``theory``). The job time is the sum of the ``s`` column
(seconds of wall time of each job; the training jobs are CPU-bound and run on one thread each, so on a busy
machine it is the CPU time the build asks for, whatever the number of cores runs it: docs/experiments.md,
"The stage's share of the default build").

    python benchmarks/build_budget.py RESULTS_DIR [--budget 7200] [--column s|cpu_time] [--report-only]

prints the job time per stage (jobs, seconds, share) and in all against the budget, and exits 1 when the
build is over its budget (``--report-only``: always 0 after the table; 2 for a folder without benchmark
files).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

DEFAULT_BUDGET_S = 7200.0
# benchmark files at the top of the folder, by their name: the theory stage's (workflow/rules/theory.smk)
TOP_LEVEL_STAGES = {"verify": "theory", "census": "theory"}


def stage_of(relative: Path) -> str:
    """The stage of a benchmark file, from its path below the benchmarks folder."""
    if len(relative.parts) > 1:
        return relative.parts[0]
    return TOP_LEVEL_STAGES.get(relative.stem, relative.stem)


def file_seconds(path: Path, column: str = "s") -> float:
    """The sum of a benchmark file's ``column`` (one row per repeat of its job)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if rows and column not in rows[0]:
        raise ValueError(f"{path}: no '{column}' column; is it a Snakemake benchmark file?")
    return sum(float(row[column]) for row in rows)


def stage_seconds(benchmarks: Path, column: str = "s") -> dict[str, tuple[int, float]]:
    """{stage: (jobs, seconds)} over every ``*.tsv`` under ``benchmarks``."""
    jobs: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    for path in sorted(benchmarks.rglob("*.tsv")):
        stage = stage_of(path.relative_to(benchmarks))
        jobs[stage] += 1
        seconds[stage] += file_seconds(path, column)
    return {stage: (jobs[stage], seconds[stage]) for stage in jobs}


def budget_table(per_stage: dict[str, tuple[int, float]], budget: float) -> str:
    """The printed table: each stage by job time, then the sum against the budget."""
    total = sum(seconds for _, seconds in per_stage.values())
    lines = [f"  {'stage':>14}  {'jobs':>5}  {'job time (s)':>12}  {'share':>6}"]
    for stage, (jobs, seconds) in sorted(per_stage.items(), key=lambda item: -item[1][1]):
        share = seconds / total if total else 0.0
        lines.append(f"  {stage:>14}  {jobs:5d}  {seconds:12.0f}  {share:6.1%}")
    count = sum(jobs for jobs, _ in per_stage.values())
    lines.append(f"  {'all':>14}  {count:5d}  {total:12.0f}  {'100%' if total else '':>6}")
    verdict = "within" if total <= budget else "OVER"
    lines.append(
        f"job time {total:.0f} s ({total / 60:.1f} min) of a budget of {budget:.0f} s: {verdict} budget "
        f"({total / budget:.0%})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="a build's results folder (its benchmarks/ is read)")
    parser.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds of job time (default %(default)g)"
    )
    parser.add_argument(
        "--column",
        default="s",
        choices=("s", "cpu_time"),
        help="s: each job's wall time (default, the budget's measure on a quiet machine); cpu_time: its "
        "CPU seconds, which other work on a busy machine does not inflate",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="exit 0 over budget too (default: exit 1 over budget)"
    )
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error("--budget must be positive")
    benchmarks = args.results_dir / "benchmarks"
    try:
        per_stage = stage_seconds(benchmarks, args.column) if benchmarks.is_dir() else {}
    except (OSError, ValueError) as err:
        print(f"build_budget: {err}", file=sys.stderr)
        return 2
    if not per_stage:
        print(f"build_budget: no benchmark files under {benchmarks}: run the build first", file=sys.stderr)
        return 2
    print(budget_table(per_stage, args.budget))
    total = sum(seconds for _, seconds in per_stage.values())
    return 0 if total <= args.budget or args.report_only else 1


if __name__ == "__main__":
    sys.exit(main())
