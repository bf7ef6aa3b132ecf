"""Where a build writes, and what its gathering jobs read (docs/design.md §6).

Every output of a config lies under its ``results_dir`` (results/default, results/smoke, results/paper),
so builds of different configs in one checkout never share a run directory, table, figure, log or
appendix. :func:`output_layout` names those folders and the lists the workflow's rules declare: the tables of
each stage, the files each training job declares (:func:`run_files`), the run selections ``attnid
tables`` and ``attnid figures`` are given, a training job's resources. It is a pure function of the plan
and the checked config; ``workflow/rules/common.smk`` gives its fields the names the rule files use.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from attnid.plan.quantization import QUANTIZATION_TABLES, quantization_checkpoints, quantization_settings
from attnid.plan.runs import Plan

# The tables `attnid tables` writes for every config (runs, cases, sweep, the claims).
TABLE_NAMES = (
    *(f"{name}.{ext}" for name in ("runs", "cases", "sweep") for ext in ("csv", "tex")),
    "sweep_slopes.csv",
    "claims.csv",
)
EDITS_TABLES = ("prune.csv", "prune_summary.csv", "prune.tex")


def run_files(run_dirs: Iterable[str]) -> list[str]:
    """What a training job declares: each run's metrics.csv and run.json."""
    return [f"{d}/{name}" for d in run_dirs for name in ("metrics.csv", "run.json")]


@dataclass(frozen=True)
class Layout:
    """The folders of one build and the file lists its rules declare (see :func:`output_layout`)."""

    results: str
    table_files: list[str]
    run_outputs: list[str]
    run_selection: dict[str, str]  # `attnid tables`' run lists: only this config's runs, never leftovers
    study_table_files: list[str]  # none without study sections (heads: null, variants: null)
    edits_table_files: list[str]
    intervention_outputs: list[str]  # every run the interventions' gather pairs, and the identity runs
    intervention_table_files: list[str]
    robustness_table_files: list[str]  # the robustness variants' tables (attnid.plan.rounds), where asked for
    protocol_tables: dict[str, str]  # {flag of `attnid tables`: the protocol's table claims.csv checks}
    intervention_selection: str  # what `attnid tables` and `attnid figures` read of the stage
    quantization_reports: list[str]  # one per studied checkpoint, and SmolLM2's where asked for
    quantization_table_files: list[str]
    resources: dict = field(repr=False)  # the config's `resources` section
    device: str = "cpu"

    def folder(self, name: str) -> str:
        return f"{self.results}/{name}"

    def train_resources(self, runs: int = 1) -> dict:
        """The resources of a job that trains ``runs`` runs one after another (attnid train-runs)."""
        resources = {"mem_mb": self.resources["mem_mb"], "runtime": self.resources["runtime"] * runs}
        if self.device == "cuda":
            resources["gpu"] = self.resources["gpu"]
        return resources


def output_layout(plan: Plan, config: dict) -> Layout:
    """The layout of the build of ``config`` (checked and completed by :func:`attnid.plan.plan`)."""
    results = plan.results_dir
    tables = f"{results}/tables"
    interventions = config.get("interventions") or {}
    quantization = quantization_settings(config)
    protocol = (
        ("plateau", "interventions_plateau.csv", interventions.get("plateau")),
        ("calibration", "calibration.csv", interventions.get("calibration")),
    )
    intervention_tails = (".csv", "_seeds.csv", "_along.csv", ".tex") + (
        ("_plateau.csv",) if interventions.get("plateau") else ()
    )
    return Layout(
        results=results,
        table_files=[f"{tables}/{name}" for name in TABLE_NAMES],
        run_outputs=run_files(plan.case_runs + plan.sweep_runs),
        run_selection={
            "runs": " ".join(plan.case_runs),
            "sweep_runs": f"--sweep-runs {' '.join(plan.sweep_runs)}" if plan.sweep_runs else "",
        },
        study_table_files=(
            [f"{tables}/{study}.{ext}" for study in plan.study_runs for ext in ("csv", "tex")]
            + [f"{tables}/identification_correlation.{ext}" for ext in ("csv", "tex")]
            if plan.study_runs
            else []
        ),
        edits_table_files=[f"{tables}/{name}" for name in EDITS_TABLES] if config.get("edits") else [],
        intervention_outputs=run_files(plan.intervention_runs + plan.identity_runs),
        intervention_table_files=(
            [f"{tables}/interventions{tail}" for tail in intervention_tails] if interventions else []
        ),
        robustness_table_files=(
            [f"{tables}/interventions_robustness{tail}" for tail in (".csv", "_seeds.csv")]
            if plan.robustness_variants
            else []
        ),
        protocol_tables={flag: f"{tables}/{name}" for flag, name, wanted in protocol if wanted},
        intervention_selection=(
            f"--intervention-runs {' '.join(plan.intervention_runs)}"
            f" --identity-runs {' '.join(plan.identity_runs)}"
            if interventions
            else ""
        ),
        quantization_reports=(
            [
                f"{results}/quantization/{os.path.relpath(d, f'{results}/runs')}.json"
                for d in quantization_checkpoints(config, results)
            ]
            + ([f"{results}/quantization/smollm2.json"] if quantization["smollm2"] else [])
            if quantization
            else []
        ),
        quantization_table_files=[f"{tables}/{name}" for name in QUANTIZATION_TABLES] if quantization else [],
        resources=dict(config["resources"]),
        device=config["device"],
    )
