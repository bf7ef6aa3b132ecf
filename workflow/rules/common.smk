# The config (read, typed, validated), the output layout and the run lists: every name that more than one
# .smk file uses is defined here, and only here. The other files hold rules (and names only they use).
#
# Every output of a config goes under its `results_dir` (results/default, results/smoke,
# results/paper), so builds of different configs in one checkout never share a run directory,
# table, figure, log or appendix. Only the data under data/ (a pure function of its URL and
# checksum) is shared.

import os
import re
import shutil
import sys

from attnid.reports.interventions import (
    IDENTITY_CASE,
    arm_overrides,
    check_interventions_config,
    identity_overrides,
    intervention_arms,
)
from attnid.reports.interventions_table import BASELINE_CASE
from attnid.reports.studies import (
    STUDY_CASE,
    check_study_config,
    reused_points,
    study_points,
    study_run_settings,
)
from pipeline_config import (
    ConfigError,
    run_flags,
    unwritable,
    validate_config,
    yaml_error,
)
from snakemake.utils import update_config

# A number as YAML 1.2 reads it (PyYAML's YAML 1.1 would keep "1e-3" a string).
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
INTEGER = re.compile(r"[-+]?\d+")
BOOLEANS = {"true": True, "false": False}
NULLS = ("null", "~")
DEFAULT_CONFIG = "config/config.yaml"


def config_error(message):
    """A bad config is ONE line on stderr, never a traceback."""
    print(f"config error: {message}", file=sys.stderr)
    sys.exit(1)


def typed_value(value):
    """One --config value with YAML types: numbers, true/false and null; any other text stays text.

    Snakemake reads nested --config values (``cases={sgd: {lr: 0.1}}``) with YAML's
    BaseLoader, which keeps every leaf a string, and top-level ones only as Python
    int/float/True/False: without this, ``lr: 0.1`` or ``paper_pdf=true`` fail validation.
    """
    if isinstance(value, dict):
        return {key: typed_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed_value(item) for item in value]
    if not isinstance(value, str):
        return value
    if INTEGER.fullmatch(value):
        return int(value)
    if NUMBER.fullmatch(value):
        return float(value)
    if value.lower() in BOOLEANS:
        return BOOLEANS[value.lower()]
    return None if value in NULLS else value


def want_pdf():
    """paper_pdf: auto builds the appendix PDF only where latexmk is installed."""
    setting = config.get("paper_pdf", "auto")
    return shutil.which("latexmk") is not None if setting == "auto" else bool(setting)


def lr_label(lr):
    """The learning rate as it appears in a sweep path: 0.001, 1e-06, 1000000."""
    return f"{float(lr):.10g}"


# ------------------------------------------------------------------ reading and checking the config

# The default config, unless --configfile names another: then that file alone is the config
# (snakemake would otherwise merge it into the default, so a config listing fewer cases or
# seeds would silently keep the default's). Snakemake reads a --configfile itself, before this
# file runs, and reports a YAML error there without file or line; the default's is ours to name.
if not workflow.overwrite_configfiles:
    if os.path.exists(DEFAULT_CONFIG) and yaml_error(DEFAULT_CONFIG):
        config_error(yaml_error(DEFAULT_CONFIG))

    configfile: DEFAULT_CONFIG


def read_config():
    """The config: --config values merged into the config file's (nested mappings key by key,
    snakemake's update_config; lists and scalars replace), read with YAML types (typed_value);
    a section of the optional stages set to null (--config edits=null) is off; then checked.
    """
    update_config(config, typed_value(workflow.config_settings.config or {}))
    for section in ("heads", "variants", "edits", "interventions"):
        if section in config and config[section] is None:
            del config[section]
    try:
        validate_config(config)
    except ConfigError as err:
        config_error(str(err))
    # the cross-key rules the schema cannot say
    for optimizer in config["sweep"]:
        if optimizer not in config["cases"]:
            config_error(
                f"sweep/{optimizer}: no case '{optimizer}' under cases to take its settings from"
            )
    for problem in check_study_config(config):
        config_error(problem)
    edits = config.get("edits")
    if edits is not None and edits["case"] not in config["cases"]:
        config_error(
            f"edits/case: no case '{edits['case']}' under cases to take its settings from"
        )
    for problem in check_interventions_config(config):
        config_error(problem)


read_config()
EDITS = config.get("edits")

# ------------------------------------------------------------------ the output layout

RESULTS = os.path.normpath(config["results_dir"])
DATA_DIR = "data/tinyshakespeare"
DATA_LOGS = "data/logs"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
THEORY_DIR = f"{RESULTS}/theory"
TABLES_DIR = f"{RESULTS}/tables"
FIGURES_DIR = f"{RESULTS}/figures"
PAPER_DIR = f"{RESULTS}/paper"
EDITS_DIR = f"{RESULTS}/edits"
ENV = "../envs/attnid.yaml"


def check_folders_writable():
    """A folder no job could write is one line now, not a failed job later."""
    for key, folder in (
        ("results_dir", RESULTS),
        ("data directory", DATA_DIR),
        ("data directory", DATA_LOGS),
    ):
        reason = unwritable(folder)
        if reason:
            config_error(f"{key}: {folder} is not writable: {reason}")


check_folders_writable()

# ------------------------------------------------------------------ the training runs and their settings


def run_settings(case, **overrides):
    """Model + training defaults, then the case's own settings, then per-job overrides."""
    settings = dict(config["model"])
    settings.update(config["training"])
    settings.update(config["cases"][case])
    settings.update(overrides)
    return settings


def case_run(case, seed):
    """(case, settings) of one run of a case."""
    return case, run_settings(case, seed=seed)


def sweep_run(optimizer, lr, seed):
    """(case, settings) of one sweep point: the case's settings, the sweep's own on top."""
    sweep = config["sweep"][optimizer]
    overrides = {
        key: value for key, value in sweep.items() if key not in ("lrs", "seeds")
    }
    return optimizer, run_settings(optimizer, lr=lr, seed=seed, **overrides)


def study_run(study, point, seed):
    """(case, settings) of one run of a study point (attnid.reports.studies)."""
    return STUDY_CASE, run_settings(
        STUDY_CASE,
        **study_run_settings(config[study]),
        **STUDY_POINTS[study][point].architecture(),
        seed=seed,
    )


def intervention_run(arm, seed):
    """(case, settings) of one run of an interventions arm (attnid.reports.interventions): the adamw
    case's settings, with the arm's own (its case's rebalancing, its options) on top."""
    spec = INTERVENTION_ARMS[arm]
    return spec.case, run_settings(
        BASELINE_CASE, **arm_overrides(config, spec), seed=seed
    )


def identity_run(seed):
    """(case, settings) of the interventions' identity run: the projected arm's, in float64, shorter."""
    return IDENTITY_CASE, run_settings(
        BASELINE_CASE, **identity_overrides(config), seed=seed
    )


def edit_run(case, seed):
    """(case, settings) of one run of the edits stage: the case's, with biases."""
    return case, run_settings(
        case, bias=EDITS.get("bias", True), seed=seed, **EDITS_OVERRIDES
    )


# The `flags` param of each training rule: the run its wildcards name, as `attnid train` flags.
def case_flags(wildcards):
    return run_flags(*case_run(wildcards.case, int(wildcards.seed)))


def sweep_flags(wildcards):
    return run_flags(
        *sweep_run(wildcards.optimizer, float(wildcards.lr), int(wildcards.seed))
    )


def study_flags(wildcards):
    return run_flags(*study_run(wildcards.study, wildcards.point, int(wildcards.seed)))


def edit_flags(wildcards):
    return run_flags(*edit_run(wildcards.case, int(wildcards.seed)))


def intervention_flags(wildcards):
    return run_flags(*intervention_run(wildcards.arm, int(wildcards.seed)))


def identity_flags(wildcards):
    return run_flags(*identity_run(int(wildcards.seed)))


CASES = list(config["cases"])
SEEDS = list(config["seeds"])
# Every training job of this config, by kind: {run directory: (case, settings)}, in the config's order.
CASE_RUNS = {
    f"{RESULTS}/runs/{case}/seed{seed}": case_run(case, seed)
    for case in CASES
    for seed in SEEDS
}
SWEEP_RUNS = {
    f"{RESULTS}/sweep/{optimizer}/lr{lr_label(lr)}/seed{seed}": sweep_run(
        optimizer, lr, seed
    )
    for optimizer, sweep in config["sweep"].items()
    for lr in sweep["lrs"]
    for seed in sweep["seeds"]
}
RUN_DIRS = list(CASE_RUNS)
SWEEP_DIRS = list(SWEEP_RUNS)
RUN_OUTPUTS = [
    f"{run_dir}/{name}"
    for run_dir in RUN_DIRS + SWEEP_DIRS
    for name in ("metrics.csv", "run.json")
]
TABLE_FILES = [
    f"{TABLES_DIR}/{name}"
    for name in [
        "runs.csv",
        "runs.tex",
        "cases.csv",
        "cases.tex",
        "sweep.csv",
        "sweep.tex",
        "sweep_slopes.csv",
        "claims.csv",
    ]
]
# Only the runs this config asks for are gathered, never leftovers of an older config.
RUN_SELECTION = {
    "runs": " ".join(RUN_DIRS),
    "sweep_runs": f"--sweep-runs {' '.join(SWEEP_DIRS)}" if SWEEP_DIRS else "",
}

# The identification studies (studies.smk): the points come from attnid.reports.studies, so the
# rules, the tests and `attnid studies` share one plan. {study: {point name: StudyPoint}}, in the
# config's order.
STUDY_POINTS = {
    study: {point.name: point for point in points}
    for study, points in study_points(config).items()
}
STUDY_RUNS = {
    study: {
        f"{RESULTS}/studies/{study}/{name}/seed{seed}": study_run(study, name, seed)
        for name in points
        for seed in config[study]["seeds"]
    }
    for study, points in STUDY_POINTS.items()
}
STUDY_RUN_DIRS = {study: list(runs) for study, runs in STUDY_RUNS.items()}
# "<study>/<point>" -> "<study>/<point>" of the earlier point that trains the same model with the same
# settings (e.g. variants/mha -> heads/h4): its runs are copied, not trained again.
REUSED_STUDY_RUNS = {
    f"{study}/{point}": f"{source_study}/{source_point}"
    for (study, point), (source_study, source_point) in reused_points(config).items()
}
STUDY_OUTPUTS = [
    f"{run_dir}/{name}"
    for run_dirs in STUDY_RUN_DIRS.values()
    for run_dir in run_dirs
    for name in ("metrics.csv", "run.json")
]
# A config without study sections (heads: null, variants: null) has no study jobs and no Figure 5.
STUDY_TABLE_FILES = (
    [f"{TABLES_DIR}/{study}.{ext}" for study in STUDY_POINTS for ext in ("csv", "tex")]
    + [f"{TABLES_DIR}/identification_correlation.{ext}" for ext in ("csv", "tex")]
    if STUDY_POINTS
    else []
)

# The checkpoint edits (edits.smk); without an `edits` section, none. Run settings the section may
# change (the rest are the case's): see the schema.
EDITS_OVERRIDES = {
    key: value
    for key, value in (EDITS or {}).items()
    if key in ("max_iters", "warmup_iters")
}
EDIT_RUNS = (
    {
        f"{EDITS_DIR}/{EDITS['case']}/seed{seed}": edit_run(EDITS["case"], seed)
        for seed in EDITS["seeds"]
    }
    if EDITS
    else {}
)
EDIT_DIRS = list(EDIT_RUNS)
# Each edit's JSON report; the gather reads which edit it is from the report itself.
EDIT_REPORTS = [
    f"{run_dir}/{edit}.json" for run_dir in EDIT_DIRS for edit in ("prune", "balance")
]
EDITS_TABLE_FILES = (
    [f"{TABLES_DIR}/{name}" for name in ("prune.csv", "prune_summary.csv", "prune.tex")]
    if EDITS
    else []
)


# The interventions (interventions.smk); without an `interventions` section, none. {arm name: Arm},
# the baseline adamw first. Each arm's run of a seed is a case run when it trains exactly what that
# case's run trains (the baseline's, and the kept-moments rebalancing's, for the cases' seeds): the
# gather reads that run, and only the others are trained here, under interventions/<arm>/seed<N>.
INTERVENTION_ARMS = {arm.name: arm for arm in intervention_arms(config)}
INTERVENTIONS = config.get("interventions") or {}


def plan_intervention_runs():
    """(every run the gather pairs, arms and baselines, in the config's order; {run directory: (case,
    settings)} of the runs this stage trains)."""
    run_dirs, trained = [], {}
    for arm in INTERVENTION_ARMS:
        for seed in INTERVENTIONS.get("seeds", []):
            run = intervention_run(arm, seed)
            if run[0] in CASES and seed in SEEDS and case_run(run[0], seed) == run:
                run_dirs.append(f"{RESULTS}/runs/{run[0]}/seed{seed}")
            else:
                trained[f"{RESULTS}/interventions/{arm}/seed{seed}"] = run
                run_dirs.append(f"{RESULTS}/interventions/{arm}/seed{seed}")
    return run_dirs, trained


INTERVENTION_RUN_DIRS, INTERVENTION_RUNS = plan_intervention_runs()
IDENTITY_RUNS = {
    f"{RESULTS}/interventions/identity/seed{seed}": identity_run(seed)
    for seed in (INTERVENTIONS["identity"]["seeds"] if INTERVENTIONS else [])
}
INTERVENTION_OUTPUTS = [
    f"{run_dir}/{name}"
    for run_dir in INTERVENTION_RUN_DIRS + list(IDENTITY_RUNS)
    for name in ("metrics.csv", "run.json")
]
INTERVENTION_TABLE_FILES = (
    [f"{TABLES_DIR}/interventions.{ext}" for ext in ("csv", "tex")]
    if INTERVENTIONS
    else []
)
# What `attnid tables` and `attnid figures` read of the stage (claims.csv's identities, Figure 6).
INTERVENTION_SELECTION = (
    f"--intervention-runs {' '.join(INTERVENTION_RUN_DIRS)}"
    f" --identity-runs {' '.join(IDENTITY_RUNS)}"
    if INTERVENTIONS
    else ""
)


def check_run_flags():
    """Every planned run's flags are built now, so that a setting without an `attnid train` flag
    is a config error, not a failed job."""
    runs = {
        **CASE_RUNS,
        **SWEEP_RUNS,
        **EDIT_RUNS,
        **INTERVENTION_RUNS,
        **IDENTITY_RUNS,
    }
    for study_runs in STUDY_RUNS.values():
        runs.update(study_runs)
    for run_dir, (case, settings) in runs.items():
        try:
            run_flags(case, settings)
        except ConfigError as err:
            config_error(f"{run_dir}: {err}")


check_run_flags()


def reused_run_file(wildcards, name):
    """A file of the run that the reused study point {reused} copies (rule reuse_study_run)."""
    source = REUSED_STUDY_RUNS[wildcards.reused]
    return f"{RESULTS}/studies/{source}/seed{wildcards.seed}/{name}"


# The resources of every training job (train.smk's template rule).
TRAIN_RESOURCES = {
    "mem_mb": config["resources"]["mem_mb"],
    "runtime": config["resources"]["runtime"],
}
if config["device"] == "cuda":
    TRAIN_RESOURCES["gpu"] = config["resources"]["gpu"]
