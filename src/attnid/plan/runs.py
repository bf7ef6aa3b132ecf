"""What a pipeline config trains: every run directory and its settings (docs/design.md §6).

:func:`plan` reads and checks a config (:func:`attnid.plan.config.read_config`) and lays out every
training run of every stage, in the config's order:

* ``runs/<case>/seed<N>``: each case and seed, with the model, training and case sections' settings;
* ``sweep/<case>/lr<lr>/seed<N>``: each sweep point, the case's settings with the sweep's on top;
* ``studies/<study>/<point>/seed<N>``: each study point (:mod:`attnid.plan.studies`), copied from an
  earlier study run with the same settings instead of trained again (the variants' ``mha`` is the heads
  sweep's point at the model's ``H``);
* ``edits/<case>/seed<N>``: the edited case, with biases;
* ``interventions/<arm>/seed<N>`` and ``interventions/identity/seed<N>`` (:mod:`attnid.plan.interventions`),
  where an arm's run that is exactly a case run is that case run.

Each run is a :class:`RunSpec`: its case and its settings, each a field of
:class:`attnid.training.config.TrainConfig`. Every run is checked as ``attnid train`` would check it
(:func:`attnid.training.config.resolve_config`), so a setting the command refuses is a config error
before any job starts. The workflow writes each trained run's spec to
``<results_dir>/specs/<run directory>.yaml`` (:func:`write_spec_files`), the file its job's
``attnid train --config`` reads.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnid.common.errors import UserError
from attnid.common.files import write_text_atomic
from attnid.plan.config import read_config
from attnid.plan.errors import ConfigError
from attnid.plan.interventions import (
    BASELINE_CASE,
    IDENTITY_CASE,
    arm_overrides,
    identity_overrides,
    intervention_arms,
)
from attnid.plan.studies import STUDY_CASE, study_points, study_run_settings
from attnid.training.config import option_type, resolve_config, resume_free_keys
from attnid.training.rundir import METRICS_FILE, RUN_FILE

# Where a run's spec file lies, under the results folder: specs/<run directory>.yaml.
SPECS_DIR = "specs"
# Keys of a sweep section that are its grid, not settings of its runs.
SWEEP_GRID_KEYS = ("lrs", "seeds")
# Keys of the edits section that are not settings of its runs.
EDITS_GRID_KEYS = ("case", "seeds")
SPEC_HEADER = (
    "# The settings of one training run, written by the workflow from the pipeline config\n"
    "# (attnid.plan; docs/design.md §6): edit the config, not this file.\n"
    "# Read by: attnid train --config {spec} --out {run_dir}\n"
)


def lr_label(lr: float) -> str:
    """The learning rate as it appears in a sweep path: 0.001, 1e-06, 1000000."""
    return f"{float(lr):.10g}"


def setting_value(name: str, value: Any) -> Any:
    """A setting as its TrainConfig field types it (a config's ``max_iters: 1.0e3`` is the integer 1000)."""
    kind = option_type(name)
    return value if kind is bool or value is None else kind(value)


@dataclass(frozen=True)
class RunSpec:
    """One training run: its case and its settings (TrainConfig field -> value, in the order the config's
    sections give them), and where it comes from."""

    case: str
    settings: dict[str, Any]
    origin: str  # the config key that asks for it, for error messages: "sweep/sgd", "heads/h4"
    copied_from: str | None = field(default=None, compare=False)  # the run directory it is a copy of

    def options(self) -> dict[str, Any]:
        """What ``attnid train --config`` reads: the case, then the settings."""
        return {"case": self.case, **self.settings}

    def same_run(self, other: RunSpec) -> bool:
        """Whether the two train exactly the same (their settings compared as mappings)."""
        return self.case == other.case and self.settings == other.settings


@dataclass
class Plan:
    """Every run directory of a config and its :class:`RunSpec`, and the directories of each stage."""

    results_dir: str
    runs: dict[str, RunSpec] = field(default_factory=dict)  # every run the build trains or copies
    case_runs: list[str] = field(default_factory=list)
    sweep_runs: list[str] = field(default_factory=list)
    study_runs: dict[str, list[str]] = field(default_factory=dict)  # study -> its runs
    edit_runs: list[str] = field(default_factory=list)
    arms: list[str] = field(default_factory=list)  # the interventions' arm names, the baseline first
    intervention_runs: list[str] = field(default_factory=list)  # every run the interventions' gather pairs
    identity_runs: list[str] = field(default_factory=list)

    def trained(self) -> dict[str, RunSpec]:
        """The runs a training job makes (not the copies)."""
        return {run_dir: spec for run_dir, spec in self.runs.items() if spec.copied_from is None}

    def copied(self) -> dict[str, str]:
        """{run directory: the run directory it is copied from}."""
        return {run_dir: spec.copied_from for run_dir, spec in self.runs.items() if spec.copied_from}

    @property
    def specs_dir(self) -> str:
        return os.path.join(self.results_dir, SPECS_DIR)

    def spec_file(self, run_dir: str) -> str:
        """``<results_dir>/specs/<run directory below results_dir>.yaml``."""
        return os.path.join(self.specs_dir, os.path.relpath(run_dir, self.results_dir) + ".yaml")


def _run(config: dict, case: str, origin: str, *sections: dict, **overrides: Any) -> RunSpec:
    """The run of ``case``: the model, training and case sections' settings, then each of ``sections``
    (a stage's own), then ``overrides``, each typed as its TrainConfig field."""
    settings = dict(config["model"])
    settings.update(config["training"])
    settings.update(config["cases"][case])
    for section in sections:
        settings.update(section)
    settings.update(overrides)
    return RunSpec(case, {key: setting_value(key, value) for key, value in settings.items()}, origin)


def _plan_cases(config: dict, result: Plan) -> None:
    for case in config["cases"]:
        for seed in config["seeds"]:
            run_dir = f"{result.results_dir}/runs/{case}/seed{seed}"
            result.runs[run_dir] = _run(config, case, f"cases/{case}", seed=seed)
            result.case_runs.append(run_dir)
    for optimizer, sweep in config["sweep"].items():
        own = {key: value for key, value in sweep.items() if key not in SWEEP_GRID_KEYS}
        for lr in sweep["lrs"]:
            for seed in sweep["seeds"]:
                run_dir = f"{result.results_dir}/sweep/{optimizer}/lr{lr_label(lr)}/seed{seed}"
                result.runs[run_dir] = _run(config, optimizer, f"sweep/{optimizer}", lr=lr, seed=seed, **own)
                result.sweep_runs.append(run_dir)


def _plan_studies(config: dict, result: Plan) -> None:
    """Each study point's runs; a run with the settings of an earlier study run is copied from it."""
    trained: list[tuple[str, RunSpec]] = []
    for study, points in study_points(config).items():
        own = study_run_settings(config[study])
        result.study_runs[study] = []
        for point in points:
            for seed in config[study]["seeds"]:
                run_dir = f"{result.results_dir}/studies/{study}/{point.name}/seed{seed}"
                spec = _run(config, STUDY_CASE, f"{study}/{point.name}", own, point.architecture(), seed=seed)
                source = next((earlier for earlier, other in trained if other.same_run(spec)), None)
                if source is None:
                    trained.append((run_dir, spec))
                result.runs[run_dir] = RunSpec(spec.case, spec.settings, spec.origin, source)
                result.study_runs[study].append(run_dir)


def _plan_edits(config: dict, result: Plan) -> None:
    edits = config.get("edits")
    if not edits:
        return
    own = {key: value for key, value in edits.items() if key not in EDITS_GRID_KEYS}
    for seed in edits["seeds"]:
        run_dir = f"{result.results_dir}/edits/{edits['case']}/seed{seed}"
        result.runs[run_dir] = _run(config, edits["case"], "edits", own, seed=seed)
        result.edit_runs.append(run_dir)


def _plan_interventions(config: dict, result: Plan) -> None:
    """Each arm's run of each seed, the case run itself where that case's run trains exactly it (the
    baseline's, and the kept-moments rebalancing's, for the cases' seeds); then the identity runs."""
    section = config.get("interventions")
    if not section:
        return
    for index, arm in enumerate(intervention_arms(config)):
        result.arms.append(arm.name)
        origin = f"interventions/arms/{index - 1}" if index else "interventions"
        for seed in section["seeds"]:
            spec = _run(config, BASELINE_CASE, origin, arm_overrides(config, arm), seed=seed)
            spec = RunSpec(arm.case, spec.settings, origin)
            case_run = f"{result.results_dir}/runs/{arm.case}/seed{seed}"
            if case_run in result.runs and result.runs[case_run].same_run(spec):
                result.intervention_runs.append(case_run)
                continue
            run_dir = f"{result.results_dir}/interventions/{arm.name}/seed{seed}"
            result.runs[run_dir] = spec
            result.intervention_runs.append(run_dir)
    for seed in section["identity"]["seeds"]:
        run_dir = f"{result.results_dir}/interventions/identity/seed{seed}"
        spec = _run(config, BASELINE_CASE, "interventions/identity", identity_overrides(config), seed=seed)
        result.runs[run_dir] = RunSpec(IDENTITY_CASE, spec.settings, spec.origin)
        result.identity_runs.append(run_dir)


def check_runs(result: Plan, device: str, threads: int) -> None:
    """Every trained run passes ``attnid train``'s own checks (resolve_config), as its job will run it."""
    for run_dir, spec in result.trained().items():
        try:
            resolve_config(
                {**spec.options(), "data": "data", "out": run_dir, "device": device, "threads": threads}
            )
        except UserError as err:
            raise ConfigError(spec.origin, f"{err} (run {run_dir})") from None


def plan(config: dict, overrides: dict | None = None, checkout: str | os.PathLike | None = None) -> Plan:
    """Every run of ``config`` (a pipeline config, read and checked in place by
    :func:`attnid.plan.config.read_config` with ``overrides`` and ``checkout``), by run directory."""
    read_config(config, overrides, checkout)
    result = Plan(os.path.normpath(config["results_dir"]))
    _plan_cases(config, result)
    _plan_studies(config, result)
    _plan_edits(config, result)
    _plan_interventions(config, result)
    check_runs(result, config["device"], config["threads"])
    return result


def spec_text(spec: RunSpec, spec_file: str, run_dir: str) -> str:
    """The YAML file of one run: what ``attnid train --config`` reads (keys as its flags, underscored)."""
    header = SPEC_HEADER.format(spec=spec_file, run_dir=run_dir)
    return header + yaml.safe_dump(spec.options(), sort_keys=False, default_flow_style=False)


def trained_with(run_dir: str, spec: RunSpec) -> bool:
    """Whether the finished run in ``run_dir`` was trained with exactly ``spec``'s settings: its run.json
    records the same resolved options (the job's own, such as threads and device, aside)."""
    try:
        recorded = json.loads(Path(run_dir, RUN_FILE).read_text(encoding="utf-8")).get("config")
        (Path(run_dir) / METRICS_FILE).stat()
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(recorded, dict):
        return False
    expected = asdict(resolve_config({**spec.options(), "data": "data", "out": run_dir}))
    ignored = {*resume_free_keys(), "device"}
    return all(recorded.get(key) == value for key, value in expected.items() if key not in ignored)


def write_spec_files(result: Plan) -> list[str]:
    """Write each trained run's spec file (:meth:`Plan.spec_file`) whose content changed, atomically;
    returns those written. An unchanged file keeps its modification time, so a job reruns only when
    its own settings change (Snakemake reruns a job whose input is newer than its outputs). A spec
    written anew for a run already trained with exactly its settings (a setting changed and changed
    back, a deleted ``specs/``) is dated just before that run's outputs, so that run is not trained
    again."""
    written = []
    for run_dir, spec in result.trained().items():
        path = result.spec_file(run_dir)
        text = spec_text(spec, path, run_dir)
        try:
            if Path(path).read_text(encoding="utf-8") == text:
                continue
        except (OSError, UnicodeDecodeError):
            pass  # none yet, or not ours: written anew
        try:
            write_text_atomic(path, text)
            if trained_with(run_dir, spec):
                outputs = min(Path(run_dir, name).stat().st_mtime for name in (METRICS_FILE, RUN_FILE))
                os.utime(path, (outputs - 1, outputs - 1))
        except OSError as err:
            raise ConfigError("results_dir", f"cannot write {path}: {err.strerror or err}") from None
        written.append(path)
    return written
