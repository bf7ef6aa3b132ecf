"""What a pipeline config trains: every run directory and its settings (docs/design.md §6).

:func:`plan` reads and checks a config (:func:`attnid.plan.config.read_config`) and lays out every
training run of every stage, in the config's order:

* ``runs/<case>/seed<N>``: each case and seed, with the model, training and case sections' settings;
* ``sweep/<case>/lr<lr>/seed<N>``: each sweep point, the case's settings with the sweep's on top;
* ``studies/<study>/<point>/seed<N>``: each study point (:mod:`attnid.plan.studies`), copied from an
  earlier study run with the same settings instead of trained again (the variants' ``mha`` is the heads
  sweep's point at the model's ``H``);
* the alignment stage's own seeds of a case or heads point (``alignment/pairs_from``,
  :func:`attnid.plan.alignment.alignment_runs`): laid out as the case's or point's runs, in no stage's list
  but :attr:`Plan.alignment_runs`;
* ``edits/<case>/seed<N>``: the edited case, with biases;
* ``interventions/<arm>/seed<N>`` and ``interventions/identity/seed<N>`` (:mod:`attnid.plan.interventions`),
  where an arm's run that is exactly a case run is that case run;
* ``calibration/<arm>/lr<lr>/seed<N>``: each calibrated arm at each lr of its grid (the arm's lr times
  each of ``interventions/calibration/lr_factors``) on the calibration's seeds. The arm's runs at its best
  lr, ``interventions/<arm>_best_lr/seed<N>``, are *calibrated runs*: their lr is known only once the
  calibration runs are done;
* ``calibration/<arm>/top<k>/seed<N>``: round 2 of the calibration (``calibration/refine``), each arm's
  k-th best lr of round 1 on seeds of its own, also known only once round 1 is done
  (:mod:`attnid.plan.rounds`);
* ``robustness/<arm>/lr<lr>/seed<N>``: the runs a robustness variant may need at a grid lr on the
  comparison seeds (:attr:`Plan.robustness`): not trained unless the variant's pick asks for them
  (:meth:`Plan.robustness_runs`, after the calibration).

Each run is a :class:`RunSpec`: its case and its settings, each a field of
:class:`attnid.training.config.TrainConfig`. Every run is checked as ``attnid train`` would check it
(:func:`attnid.training.config.resolve_config`), so a setting the command refuses is a config error
before any job starts. The workflow writes each trained run's spec to
``<results_dir>/specs/<run directory>.yaml``, the file its job's ``attnid train --config`` reads: a job of
its own writes it, its text (:func:`spec_texts`) that job's parameter, so that nothing is written when the
workflow is parsed. A calibrated run's spec is not known then: its job writes the run's *pending spec*
(``<run directory>.pending.yaml``: the settings with the lr marked ``{calibrated: ARM}``) instead, and
``attnid calibration-table``, a job after the calibration runs, writes the spec from it with the arm's
best lr (:func:`read_pending_spec`, :func:`calibrated_spec_text`; docs/design.md §6).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import read_yaml
from attnid.plan.alignment import alignment_runs
from attnid.plan.config import read_config
from attnid.plan.errors import ConfigError
from attnid.plan.interventions import (
    ARM_NAME_SETTING,
    BASELINE_CASE,
    CALIBRATED_SUFFIX,
    IDENTITY_CASE,
    Arm,
    arm_origin,
    arm_overrides,
    identity_overrides,
    intervention_arms,
    optimizer_overrides,
    stage_settings,
)
from attnid.plan.rounds import (
    FINAL,
    STAGE_LR,
    read_picks,
    refine_dir,
    robustness_dir,
)
from attnid.plan.studies import STUDY_CASE, study_points, study_run_settings
from attnid.training.config import lockstep_refusal, option_type, resolve_config, resume_free_keys

# Where a run's spec file lies, under the results folder: specs/<run directory>.yaml.
SPECS_DIR = "specs"
# A calibrated run's pending spec, beside its spec file: specs/<run directory>.pending.yaml.
PENDING_SUFFIX = ".pending.yaml"
# The pending spec's mark on the lr that the calibration chooses: {calibrated: <arm>}.
CALIBRATED_LR = "calibrated"
# Keys of the calibration section that are its grid, not settings of its runs.
CALIBRATION_GRID_KEYS = ("arms", "lr_factors", "seeds")
# Keys of a sweep section that are its grid, not settings of its runs.
SWEEP_GRID_KEYS = ("lrs", "seeds")
# Keys of the edits section that are not settings of its runs.
EDITS_GRID_KEYS = ("case", "seeds")
SPEC_HEADER = (
    "# The settings of one training run, written by the workflow from the pipeline config\n"
    "# (attnid.plan; docs/design.md §6): edit the config, not this file.\n"
    "# Read by: attnid train --config {spec} --out {run_dir}\n"
)
# A spec file as an output (attnid calibration-table writes those of the calibrated runs): recognised by
# its first line, so that a rerun replaces its own and nothing else.
SPEC_FILE = outputs.Format(
    "a run's spec file written by attnid",
    lambda path: (outputs.text_head(path) or "").startswith(SPEC_HEADER.splitlines()[0]),
)
PENDING_HEADER = (
    "# The settings of one training run whose lr the calibration chooses, written by the workflow\n"
    "# from the pipeline config (attnid.plan; docs/design.md §6): edit the config, not this file.\n"
    "# attnid calibration-table writes spec_file from it, lr the best lr of arm best_lr_of.\n"
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
    # a calibrated run: the arm whose best lr replaces the lr of ``settings`` (that arm's own, checked)
    best_lr_of: str | None = None
    # a round-2 calibration run: the rank of its lr among round 1's of ``best_lr_of`` (1: the best)
    rank: int | None = None

    def options(self) -> dict[str, Any]:
        """What ``attnid train --config`` reads: the case, then the settings."""
        return {"case": self.case, **self.settings}

    def same_run(self, other: RunSpec) -> bool:
        """Whether the two train exactly the same (their settings compared as mappings)."""
        return self.case == other.case and self.settings == other.settings

    def same_training(self, other: RunSpec) -> bool:
        """Whether the two train the same, whatever they evaluate after the last step or are named
        (``full_val_eval``, ``arm``: keys that change no step, TrainConfig's resume-free ones)."""
        return self.case == other.case and _trained(self.settings) == _trained(other.settings)

    def with_evaluation_of(self, other: RunSpec) -> RunSpec:
        """This run, evaluated and named as ``other`` asks (its resume-free settings added)."""
        extra = {key: value for key, value in other.settings.items() if key not in _trained(other.settings)}
        return replace(self, settings=self.settings | extra)


def _trained(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that change what a run trains: all but TrainConfig's resume-free keys."""
    free = set(resume_free_keys())
    return {key: value for key, value in settings.items() if key not in free}


@dataclass
class Plan:
    """Every run directory of a config and its :class:`RunSpec`, and the directories of each stage."""

    results_dir: str
    runs: dict[str, RunSpec] = field(default_factory=dict)  # every run the build trains or copies
    case_runs: list[str] = field(default_factory=list)
    sweep_runs: list[str] = field(default_factory=list)
    study_runs: dict[str, list[str]] = field(default_factory=dict)  # study -> its runs
    alignment_runs: list[str] = field(default_factory=list)  # trained for the alignment stage alone
    edit_runs: list[str] = field(default_factory=list)
    arms: list[str] = field(default_factory=list)  # the interventions' arm names, the baseline first
    intervention_runs: list[str] = field(default_factory=list)  # every run the interventions' gather pairs
    identity_runs: list[str] = field(default_factory=list)
    calibration_runs: list[str] = field(default_factory=list)  # the calibrated arms at each lr of the grid
    # the stage's comparison and calibration seeds, and whether one job trains every seed of an arm (and lr)
    intervention_seeds: list[int] = field(default_factory=list)
    calibration_seeds: list[int] = field(default_factory=list)
    calibration_arms: list[str] = field(default_factory=list)  # the arms the calibration trains on its grid
    one_job_per_arm: bool = False
    lockstep: bool = False  # a job's runs trained together (attnid train-runs --lockstep)
    refine_runs: list[str] = field(default_factory=list)  # round 2 of the calibration (rounds.py)
    refine_seeds: list[int] = field(default_factory=list)
    # the robustness variants, and the runs they may need: each calibrated arm at each grid lr on the
    # comparison seeds, named as the arm at its best lr (not in ``runs``: trained only where a pick asks)
    robustness_variants: list[str] = field(default_factory=list)
    robustness: dict[str, RunSpec] = field(default_factory=dict)
    stage_lrs: dict[str, float] = field(default_factory=dict)  # each calibrated arm's lr at the stage's
    arm_runs: dict[str, list[str]] = field(default_factory=dict)  # each arm's comparison runs, by arm name

    def trained(self) -> dict[str, RunSpec]:
        """The runs a training job makes (not the copies)."""
        return {run_dir: spec for run_dir, spec in self.runs.items() if spec.copied_from is None}

    def lockstep_runs(self) -> list[str]:
        """The runs that lockstep jobs train (none without ``lockstep``): the arms' comparison runs, the
        calibration's two rounds and the robustness variants' runs; not the identity runs (their own jobs)."""
        if not self.lockstep:
            return []
        arms = f"{self.results_dir}/interventions/"
        compared = [d for d in self.trained() if d.startswith(arms) and d not in self.identity_runs]
        return compared + self.calibration_runs + self.refine_runs + list(self.robustness)

    def copied(self) -> dict[str, str]:
        """{run directory: the run directory it is copied from}."""
        return {run_dir: spec.copied_from for run_dir, spec in self.runs.items() if spec.copied_from}

    def calibrated(self) -> list[str]:
        """The calibrated runs: trained at their arm's best lr, which the calibration runs decide."""
        return [
            run_dir
            for run_dir, spec in self.runs.items()
            if spec.best_lr_of is not None and spec.rank is None
        ]

    def robustness_runs(self, picks_file: str | os.PathLike) -> dict[str, list[str]]:
        """{variant: the run directories of its comparisons} once the calibration has written its picks
        (``calibration_picks.csv``), ``final`` (the final runs) first: each calibrated arm at the variant's
        lr on the comparison seeds, the final runs where that lr is the final pick, the stage's runs where
        it is the stage's lr and the stage has them, else the arm's :attr:`robustness` runs at that lr."""
        picks = read_picks(picks_file)
        final = [self.arm_runs[arm + CALIBRATED_SUFFIX] for arm in self.calibration_arms]
        variants = {FINAL: [run_dir for runs in final for run_dir in runs]}
        for variant in self.robustness_variants:
            chosen = self.stage_lrs if variant == STAGE_LR else picks.get(variant, {})
            run_dirs: list[str] = []
            for arm in self.calibration_arms:
                if arm not in chosen or arm not in picks.get(FINAL, {}):
                    raise UserError(f"{picks_file} has no {variant} or final pick of arm {arm}")
                label = lr_label(chosen[arm])
                if label == lr_label(picks[FINAL][arm]):
                    run_dirs += self.arm_runs[arm + CALIBRATED_SUFFIX]
                elif variant == STAGE_LR and arm in self.arm_runs:
                    run_dirs += self.arm_runs[arm]
                else:
                    base = robustness_dir(self.results_dir, arm, label)
                    run_dirs += [f"{base}/seed{seed}" for seed in self.intervention_seeds]
            variants[variant] = run_dirs
        return variants

    @property
    def specs_dir(self) -> str:
        return os.path.join(self.results_dir, SPECS_DIR)

    def spec_file(self, run_dir: str) -> str:
        """``<results_dir>/specs/<run directory below results_dir>.yaml``."""
        return os.path.join(self.specs_dir, os.path.relpath(run_dir, self.results_dir) + ".yaml")

    def pending_spec_file(self, run_dir: str) -> str:
        """A calibrated run's pending spec: ``<results_dir>/specs/<run directory>.pending.yaml``."""
        return os.path.join(self.specs_dir, os.path.relpath(run_dir, self.results_dir) + PENDING_SUFFIX)


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


def _plan_alignment(config: dict, result: Plan) -> None:
    """The runs an alignment pair reads that no study trains (``alignment/pairs_from``'s other seeds): the
    case's or heads point's settings at that seed (a heads point's copied from an earlier study run that
    trains the same, as :func:`_plan_studies` does)."""
    points = {point.name: point for point in study_points(config).get("heads", [])}
    for run_dir, study, group, seed in alignment_runs(config, result.results_dir):
        if run_dir in result.runs:
            continue
        origin = f"alignment/pairs_from/{study}/{group}"
        if study == "cases":
            result.runs[run_dir] = _run(config, group, origin, seed=seed)
        else:
            own = study_run_settings(config["heads"])
            spec = _run(config, STUDY_CASE, origin, own, points[group].architecture(), seed=seed)
            trained = result.trained()
            studies = [d for runs in result.study_runs.values() for d in runs if d in trained]
            source = next((d for d in studies if trained[d].same_run(spec)), None)
            result.runs[run_dir] = replace(spec, copied_from=source)
        result.alignment_runs.append(run_dir)


def _plan_edits(config: dict, result: Plan) -> None:
    edits = config.get("edits")
    if not edits:
        return
    own = {key: value for key, value in edits.items() if key not in EDITS_GRID_KEYS}
    for seed in edits["seeds"]:
        run_dir = f"{result.results_dir}/edits/{edits['case']}/seed{seed}"
        result.runs[run_dir] = _run(config, edits["case"], "edits", own, seed=seed)
        result.edit_runs.append(run_dir)


def _arm_run(config: dict, arm: Arm, origin: str, **overrides: Any) -> RunSpec:
    """A run of ``arm``: the ``adamw`` case's settings, the stage's, the arm's baseline's optimizer settings
    (an SGD arm keeps SGD's lr whatever the stage sets for its AdamW arms), the arm's own, then
    ``overrides`` (its seed, a calibration lr)."""
    stage = [stage_settings(config), optimizer_overrides(config, arm), arm_overrides(config, arm)]
    spec = _run(config, BASELINE_CASE, origin, *stage, **overrides)
    return RunSpec(arm.case, spec.settings, origin)


def _plan_interventions(config: dict, result: Plan) -> None:
    """Each arm's run of each seed, the case run itself where that case's run trains exactly it (the
    baseline's, and the kept-moments rebalancing's, for the cases' seeds, when the stage sets no other
    settings); an arm at its best lr, a calibrated run whose lr the calibration runs choose; then the
    identity runs and the calibration runs."""
    section = config.get("interventions")
    if not section:
        return
    arms = intervention_arms(config)
    result.one_job_per_arm = bool(section.get("one_job_per_arm"))
    result.lockstep = bool(section.get("lockstep"))
    if result.lockstep and not result.one_job_per_arm:
        raise ConfigError("interventions/lockstep", "trains a job's runs as one: needs one_job_per_arm: true")
    result.intervention_seeds = list(section["seeds"])
    result.calibration_seeds = list((section.get("calibration") or {}).get("seeds", []))
    for arm in arms:
        result.arms.append(arm.name)
        origin = arm_origin(config, arm)
        for seed in section["seeds"]:
            spec = _arm_run(config, arm, origin, seed=seed)
            run_dir = f"{result.results_dir}/interventions/{arm.name}/seed{seed}"
            if arm.calibrated:  # the lr checked is the arm's own; its best replaces it (the calibration)
                uncalibrated = arm.name.removesuffix(CALIBRATED_SUFFIX)
                result.runs[run_dir] = RunSpec(arm.case, spec.settings, origin, best_lr_of=uncalibrated)
                result.intervention_runs.append(run_dir)
                result.arm_runs.setdefault(arm.name, []).append(run_dir)
                continue
            case_run = f"{result.results_dir}/runs/{arm.case}/seed{seed}"
            # one job trains every seed of an arm: a seed that is a case run is trained in it all the same
            reusable = case_run in result.runs and not result.one_job_per_arm
            if reusable and result.runs[case_run].same_training(spec):
                # that case run trains exactly this run: it is evaluated as the table needs (and named)
                result.runs[case_run] = result.runs[case_run].with_evaluation_of(spec)
                result.intervention_runs.append(case_run)
                result.arm_runs.setdefault(arm.name, []).append(case_run)
                continue
            result.runs[run_dir] = spec
            result.intervention_runs.append(run_dir)
            result.arm_runs.setdefault(arm.name, []).append(run_dir)
    for seed in section["identity"]["seeds"]:
        run_dir = f"{result.results_dir}/interventions/identity/seed{seed}"
        spec = _run(config, BASELINE_CASE, "interventions/identity", identity_overrides(config), seed=seed)
        result.runs[run_dir] = RunSpec(IDENTITY_CASE, spec.settings, spec.origin)
        result.identity_runs.append(run_dir)
    _plan_calibration(config, result, [replace(arm, calibrated=False) for arm in arms if arm.calibrated])


def _plan_calibration(config: dict, result: Plan, arms: list[Arm]) -> None:
    """Round 1: each arm at each lr of its grid; round 2: at its ``top`` best lrs of round 1 (calibrated
    runs, their lr marked by rank); the robustness variants' possible runs (:mod:`attnid.plan.rounds`)."""
    section = config["interventions"]
    calibration = section.get("calibration") or {}
    refine = calibration.get("refine") or {}
    result.refine_seeds = list(refine.get("seeds", []))
    result.robustness_variants = list((section.get("robustness") or {}).get("variants", []))
    origin = "interventions/calibration"
    for arm in arms:
        result.calibration_arms.append(arm.name)
        own_lr = _arm_run(config, arm, origin).settings["lr"]
        result.stage_lrs[arm.name] = float(lr_label(own_lr))
        grid = [float(lr_label(own_lr * factor)) for factor in calibration["lr_factors"]]
        for lr in grid:
            for seed in calibration["seeds"]:
                run_dir = f"{result.results_dir}/calibration/{arm.name}/lr{lr_label(lr)}/seed{seed}"
                result.runs[run_dir] = _arm_run(config, arm, origin, lr=lr, seed=seed)
                result.calibration_runs.append(run_dir)
        # a variant's lr: one of the grid's, or the stage's (which a grid need not hold)
        for lr in dict.fromkeys([*grid, result.stage_lrs[arm.name]] if result.robustness_variants else []):
            named = {ARM_NAME_SETTING: arm.name + CALIBRATED_SUFFIX}
            for seed in section["seeds"]:
                run_dir = f"{robustness_dir(result.results_dir, arm.name, lr_label(lr))}/seed{seed}"
                spec = _arm_run(config, arm, origin, lr=lr, seed=seed)
                result.robustness[run_dir] = replace(spec, settings=spec.settings | named)
        for rank in range(1, refine.get("top", 0) + 1):
            for seed in result.refine_seeds:
                run_dir = f"{refine_dir(result.results_dir, arm.name, rank)}/seed{seed}"
                spec = _arm_run(config, arm, origin, seed=seed)
                result.runs[run_dir] = replace(spec, best_lr_of=arm.name, rank=rank)
                result.refine_runs.append(run_dir)


def check_runs(result: Plan, device: str, threads: int) -> None:
    """Every trained run passes ``attnid train``'s own checks (resolve_config), as its job will run it."""
    lockstep = set(result.lockstep_runs())
    for run_dir, spec in {**result.trained(), **result.robustness}.items():
        try:
            cfg = resolve_config(
                {**spec.options(), "data": "data", "out": run_dir, "device": device, "threads": threads}
            )
        except UserError as err:
            raise ConfigError(spec.origin, f"{err} (run {run_dir})") from None
        refusal = lockstep_refusal(cfg) if run_dir in lockstep else None
        if refusal is not None:
            raise ConfigError("interventions/lockstep", f"run {run_dir} cannot train in lockstep: {refusal}")


def plan(config: dict, overrides: dict | None = None, checkout: str | os.PathLike | None = None) -> Plan:
    """Every run of ``config`` (a pipeline config, read and checked in place by
    :func:`attnid.plan.config.read_config` with ``overrides`` and ``checkout``), by run directory."""
    read_config(config, overrides, checkout)
    result = Plan(os.path.normpath(config["results_dir"]))
    _plan_cases(config, result)
    _plan_studies(config, result)
    _plan_alignment(config, result)
    _plan_edits(config, result)
    _plan_interventions(config, result)
    check_runs(result, config["device"], config["threads"])
    return result


def spec_text(spec: RunSpec, spec_file: str, run_dir: str) -> str:
    """The YAML file of one run: what ``attnid train --config`` reads (keys as its flags, underscored)."""
    header = SPEC_HEADER.format(spec=spec_file, run_dir=run_dir)
    return header + yaml.safe_dump(spec.options(), sort_keys=False, default_flow_style=False)


def pending_spec_text(spec: RunSpec, pending_file: str, spec_file: str, run_dir: str) -> str:
    """The pending spec of a calibrated run: where its spec file goes, its run directory, the arm whose
    best lr it takes, and its options with the lr marked ``{calibrated: ARM}``."""
    options = spec.options() | {"lr": lr_mark(spec.best_lr_of, spec.rank)}
    document: dict[str, Any] = {
        "spec_file": spec_file,
        "run_dir": run_dir,
        "best_lr_of": spec.best_lr_of,
        "options": options,
    }
    if spec.rank is not None:
        document["rank"] = spec.rank
    return PENDING_HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def lr_mark(arm: str | None, rank: int | None) -> dict:
    """A pending spec's lr: ``{calibrated: ARM}`` (the arm's pick), ``{calibrated: ARM, rank: K}`` (a round-2
    run at the K-th best lr of round 1)."""
    return {CALIBRATED_LR: arm} | ({"rank": rank} if rank is not None else {})


@dataclass(frozen=True)
class PendingSpec:
    """A calibrated run's pending spec, read back (:func:`read_pending_spec`)."""

    spec_file: str
    run_dir: str
    best_lr_of: str  # the arm whose best lr the run trains with
    options: dict[str, Any]  # the spec's options, the lr still marked
    rank: int | None = None  # a round-2 run: the rank of its lr among round 1's (1: the best)


def read_pending_spec(path: str | os.PathLike) -> PendingSpec:
    """A pending spec that :func:`pending_spec_text` wrote; anything else is a :class:`UserError`."""
    document = read_yaml(path, "pending spec")
    keys = ("spec_file", "run_dir", "best_lr_of", "options")
    if not isinstance(document, dict) or any(key not in document for key in keys):
        raise UserError(f"{path} is no pending spec of attnid.plan (keys {', '.join(keys)}): rerun snakemake")
    options = document["options"]
    rank = document.get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise UserError(f"{path}: rank {rank!r} is no rank of round 1's lrs (1, 2, ...)")
    mark = lr_mark(str(document["best_lr_of"]), rank)
    if not isinstance(options, dict) or options.get("lr") != mark:
        raise UserError(f"{path}: its lr is not marked {mark}")
    return PendingSpec(
        str(document["spec_file"]), str(document["run_dir"]), str(document["best_lr_of"]), options, rank
    )


def calibrated_spec_text(pending: PendingSpec, lr: float) -> str:
    """The spec file of a calibrated run: its pending spec's options with the lr the calibration chose."""
    options = pending.options | {"lr": setting_value("lr", lr)}
    spec = RunSpec(str(options.pop("case")), options, "interventions/calibration")
    return spec_text(spec, pending.spec_file, pending.run_dir)


def spec_texts(result: Plan) -> dict[str, str]:
    """{path: text} of every file a spec job of the workflow writes: each trained run's spec file
    (:meth:`Plan.spec_file`), or for a calibrated run its pending spec (:meth:`Plan.pending_spec_file`).
    A calibrated run's spec file is the calibration job's output (attnid calibration-table), never one of
    these. Nothing is written here: parsing the workflow, and a dry run, write nothing (docs/design.md §6)."""
    texts = {}
    for run_dir, spec in result.trained().items():
        if spec.best_lr_of is not None:
            path = result.pending_spec_file(run_dir)
            texts[path] = pending_spec_text(spec, path, result.spec_file(run_dir), run_dir)
        else:
            path = result.spec_file(run_dir)
            texts[path] = spec_text(spec, path, run_dir)
    for run_dir, spec in result.robustness.items():
        path = result.spec_file(run_dir)
        texts[path] = spec_text(spec, path, run_dir)
    return texts
