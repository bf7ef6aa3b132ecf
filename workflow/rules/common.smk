# Shared by the other .smk files: the config (typed, validated), the output layout and the run lists.
#
# Every output of a config goes under its `results_dir` (results/default, results/smoke,
# results/paper), so builds of different configs in one checkout never share a run directory,
# table, figure, log or appendix. Only the data under data/ (a pure function of its URL and
# checksum) is shared.

import os
import re
import shutil
import sys

from attnid.reports.latex import caption_file
from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config, validate

# A number as YAML 1.2 reads it (PyYAML's YAML 1.1 would keep "1e-3" a string).
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
INTEGER = re.compile(r"[-+]?\d+")
BOOLEANS = {"true": True, "false": False}
NULLS = ("null", "~")


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


def config_error(message):
    """A bad config is ONE line on stderr, never a traceback."""
    print(f"config error: {message}", file=sys.stderr)
    sys.exit(1)


def validate_config_or_exit(config):
    """Validate against the schema, then the cross-key rules the schema cannot say."""
    try:
        validate(config, "../schemas/config.schema.yaml")
    except WorkflowError as err:
        # snakemake wraps the jsonschema ValidationError; it is the exception's context.
        cause = err.__context__ if hasattr(err.__context__, "absolute_path") else None
        if cause is None:
            config_error(str(err).splitlines()[0])
        where = (
            os.path.join(*map(str, cause.absolute_path))
            if cause.absolute_path
            else "(top level)"
        )
        config_error(f"{where}: {cause.message}")
    for optimizer in config["sweep"]:
        if optimizer not in config["cases"]:
            config_error(
                f"sweep/{optimizer}: no case '{optimizer}' under cases to take its settings from"
            )


def want_pdf():
    """paper_pdf: auto builds the appendix PDF only where latexmk is installed."""
    setting = config.get("paper_pdf", "auto")
    return shutil.which("latexmk") is not None if setting == "auto" else bool(setting)


def lr_label(lr):
    """The learning rate as it appears in a sweep path: 0.001, 1e-06, 1000000."""
    return f"{float(lr):.10g}"


def run_settings(case, **overrides):
    """Model + training defaults, then the case's own settings, then per-job overrides."""
    settings = dict(config["model"])
    settings.update(config["training"])
    settings.update(config["cases"][case])
    settings.update(overrides)
    return settings


def train_flags(case, settings):
    """The `attnid train` flags for one run: the one command builder for runs and sweeps."""
    flags = [f"--case {case}"]
    for key, value in settings.items():
        option = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{option}" if value else f"--no-{option}")
        else:
            flags.append(f"--{option} {value}")
    return " ".join(flags)


def case_flags(wildcards):
    return train_flags(
        wildcards.case, run_settings(wildcards.case, seed=int(wildcards.seed))
    )


def sweep_flags(wildcards):
    sweep = config["sweep"][wildcards.optimizer]
    overrides = {
        key: value for key, value in sweep.items() if key not in ("lrs", "seeds")
    }
    settings = run_settings(
        wildcards.optimizer,
        lr=float(wildcards.lr),
        seed=int(wildcards.seed),
        **overrides,
    )
    return train_flags(wildcards.optimizer, settings)


# --config values merge into the config (nested mappings key by key, snakemake's
# update_config; lists and scalars replace), read with YAML types: see typed_value.
update_config(config, typed_value(workflow.config_settings.config or {}))
# The stages beyond the paper are optional: a section set to null (--config edits=null) is off.
for section in ("heads", "variants", "edits"):
    if section in config and config[section] is None:
        del config[section]
validate_config_or_exit(config)

RESULTS = os.path.normpath(config["results_dir"])
DATA_DIR = "data/tinyshakespeare"
DATA_LOGS = "data/logs"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
THEORY_DIR = f"{RESULTS}/theory"
TABLES_DIR = f"{RESULTS}/tables"
FIGURES_DIR = f"{RESULTS}/figures"
PAPER_DIR = f"{RESULTS}/paper"
ENV = "../envs/attnid.yaml"

CASES = list(config["cases"])
SEEDS = list(config["seeds"])
# Every (optimizer, lr, seed) of the sweeps, keyed by its run directory.
SWEEP_POINTS = {
    f"{RESULTS}/sweep/{optimizer}/lr{lr_label(lr)}/seed{seed}": (optimizer, lr, seed)
    for optimizer, sweep in config["sweep"].items()
    for lr in sweep["lrs"]
    for seed in sweep["seeds"]
}
RUN_DIRS = [f"{RESULTS}/runs/{case}/seed{seed}" for case in CASES for seed in SEEDS]
SWEEP_DIRS = list(SWEEP_POINTS)
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

TRAIN_RESOURCES = {
    "mem_mb": config["resources"]["mem_mb"],
    "runtime": config["resources"]["runtime"],
}
if config["device"] == "cuda":
    TRAIN_RESOURCES["gpu"] = config["resources"]["gpu"]
