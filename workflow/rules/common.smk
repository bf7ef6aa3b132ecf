# The wiring every .smk file shares: the config, read and checked by attnid.plan, the output layout and
# the run lists. Every name that more than one .smk file uses is defined here, and only here; the other
# files hold rules (and names only they use). The workflow imports only attnid.plan's public names, the
# figures' registry and the report's table pages (tests/workflow/test_workflow.py checks it).
#
# Every output of a config goes under its `results_dir` (results/default, results/smoke,
# results/paper), so builds of different configs in one checkout never share a run directory,
# table, figure, log or appendix. Only the data under data/ (a pure function of its URL and
# checksum) is shared.
#
# Each training job reads its settings from its spec file, <results_dir>/specs/<run directory>.yaml,
# an input of the job (docs/design.md §6), which a job of its own writes (spec_file in train.smk): the
# file's text is that job's parameter, so Snakemake reruns it when the run's settings change (its params
# rerun trigger), and then the jobs that read the file; a job reruns when its own settings change, and no
# other. Parsing this workflow, and a dry run, write nothing: a second snakemake, whatever its config,
# never changes a running build's inputs.

import os
import re
import sys
import threading

from attnid.plan import (
    ConfigError,
    check_config_file,
    check_writable,
    plan,
    QUANTIZATION_TABLES,
    quantization_checkpoints,
    quantization_settings,
    smollm2_gguf,
    spec_texts,
    why_no_pdf,
)

DEFAULT_CONFIG = "config/config.yaml"
DATA_DIR = "data/tinyshakespeare"
DATA_LOGS = "data/logs"
ENV = "../envs/attnid.yaml"


def cancel_scheduling_timers():
    """End the scheduler's pending re-evaluation timers (threading.Timer): the build is over."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()


def config_error(err):
    """A bad config is ONE line on stderr, never a traceback (ATTNID_DEBUG=1 shows it)."""
    if os.environ.get("ATTNID_DEBUG"):
        raise err
    print(f"config error: {err}", file=sys.stderr)
    sys.exit(1)


# The default config, unless --configfile names another: then that file alone is the config
# (snakemake would otherwise merge it into the default, so a config listing fewer cases or
# seeds would silently keep the default's). Snakemake reads a --configfile itself, before this
# file runs, and reports a YAML error there without file or line; the default's is ours to name.
if not workflow.overwrite_configfiles:
    try:
        if os.path.exists(DEFAULT_CONFIG):
            check_config_file(DEFAULT_CONFIG)
    except ConfigError as err:
        config_error(err)

    configfile: DEFAULT_CONFIG


# The config with the --config values merged in (YAML-typed; nested mappings merge key by key, lists
# and scalars replace), checked, its defaults filled in; every run of every stage (attnid.plan.runs).
try:
    PLAN = plan(config, workflow.config_settings.config, checkout=workflow.basedir)
    check_writable(
        {"results_dir": [PLAN.results_dir], "data directory": [DATA_DIR, DATA_LOGS]}
    )
except ConfigError as err:
    config_error(err)

# {path: text} of every spec file (and calibrated run's pending spec) that a spec_file job writes.
SPEC_TEXTS = spec_texts(PLAN)

# paper_pdf: true builds the appendix PDF and needs latexmk and the LaTeX packages the appendix loads
# (attnid.common.tex); auto builds it only where they are found, and says why not once; false never. A
# job's own parse (a cluster's node) decides for itself, as the build's does.
NO_PDF = why_no_pdf() if config["paper_pdf"] is not False else None
if NO_PDF and workflow.is_main_process:
    if config["paper_pdf"] is True:
        config_error(
            ConfigError("paper_pdf", f"true, but {NO_PDF} (or set paper_pdf: auto)")
        )
    print(
        f"paper_pdf: auto: this build makes no appendix PDF: {NO_PDF}", file=sys.stderr
    )
WANT_PDF = config["paper_pdf"] is True or (
    config["paper_pdf"] == "auto" and NO_PDF is None
)

# ------------------------------------------------------------------ the output layout

RESULTS = PLAN.results_dir
SPECS = PLAN.specs_dir
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
THEORY_DIR = f"{RESULTS}/theory"
TABLES_DIR = f"{RESULTS}/tables"
FIGURES_DIR = f"{RESULTS}/figures"
PAPER_DIR = f"{RESULTS}/paper"
EDITS_DIR = f"{RESULTS}/edits"


def train_resources(runs=1):
    """The resources of a training job that trains ``runs`` runs one after another (attnid train-runs)."""
    resources = {
        "mem_mb": config["resources"]["mem_mb"],
        "runtime": config["resources"]["runtime"] * runs,
    }
    if config["device"] == "cuda":
        resources["gpu"] = config["resources"]["gpu"]
    return resources


TRAIN_RESOURCES = train_resources()


def run_files(run_dirs):
    """What a training job declares: each run's metrics.csv and run.json."""
    return [f"{d}/{name}" for d in run_dirs for name in ("metrics.csv", "run.json")]


# ------------------------------------------------------------------ the runs, by stage (attnid.plan)

RUN_DIRS, SWEEP_DIRS = PLAN.case_runs, PLAN.sweep_runs
RUN_OUTPUTS = run_files(RUN_DIRS + SWEEP_DIRS)
TABLE_FILES = [
    f"{TABLES_DIR}/{name}"
    for name in "runs.csv runs.tex cases.csv cases.tex sweep.csv sweep.tex".split()
    + ["sweep_slopes.csv", "claims.csv"]
]
# Only the runs this config asks for are gathered, never leftovers of an older config.
RUN_SELECTION = {
    "runs": " ".join(RUN_DIRS),
    "sweep_runs": f"--sweep-runs {' '.join(SWEEP_DIRS)}" if SWEEP_DIRS else "",
}

# The identification studies (studies.smk): {study: its run directories}. A config without study
# sections (heads: null, variants: null) has no study jobs and no Figure 5.
STUDY_RUN_DIRS = PLAN.study_runs
STUDY_TABLE_FILES = (
    [
        f"{TABLES_DIR}/{study}.{ext}"
        for study in STUDY_RUN_DIRS
        for ext in ("csv", "tex")
    ]
    + [f"{TABLES_DIR}/identification_correlation.{ext}" for ext in ("csv", "tex")]
    if STUDY_RUN_DIRS
    else []
)

# The checkpoint edits (edits.smk); without an `edits` section, none.
EDITS = config.get("edits")
EDITS_TABLE_FILES = (
    [f"{TABLES_DIR}/{name}" for name in ("prune.csv", "prune_summary.csv", "prune.tex")]
    if EDITS
    else []
)

# The interventions (interventions.smk); without an `interventions` section, none. Every run the gather
# pairs (a case run where an arm's run is exactly that run), and the identity runs.
INTERVENTIONS = config.get("interventions") or {}
INTERVENTION_RUN_DIRS = PLAN.intervention_runs
INTERVENTION_OUTPUTS = run_files(INTERVENTION_RUN_DIRS + PLAN.identity_runs)
INTERVENTION_TABLE_FILES = (
    [
        f"{TABLES_DIR}/interventions{tail}"
        for tail in (".csv", "_seeds.csv", "_along.csv", ".tex")
        + (("_plateau.csv",) if INTERVENTIONS.get("plateau") else ())
    ]
    if INTERVENTIONS
    else []
)
# The tables of the stage's protocol that claims.csv checks (`attnid tables --plateau/--calibration`).
PROTOCOL_TABLES = {
    flag: f"{TABLES_DIR}/{name}"
    for flag, name, wanted in (
        ("plateau", "interventions_plateau.csv", INTERVENTIONS.get("plateau")),
        ("calibration", "calibration.csv", INTERVENTIONS.get("calibration")),
    )
    if wanted
}
# What `attnid tables` and `attnid figures` read of the stage (claims.csv's identities, Figure 6).
INTERVENTION_SELECTION = (
    f"--intervention-runs {' '.join(INTERVENTION_RUN_DIRS)}"
    f" --identity-runs {' '.join(PLAN.identity_runs)}"
    if INTERVENTIONS
    else ""
)

# The quantization stage (quantization.smk); without a `quantization` section, none. Its reports: one per
# studied checkpoint of the build's case runs, and SmolLM2's where the section asks for it.
QUANTIZATION = quantization_settings(config)
QUANTIZATION_DIR = f"{RESULTS}/quantization"
QUANTIZATION_REPORTS = (
    [
        f"{QUANTIZATION_DIR}/{os.path.relpath(d, f'{RESULTS}/runs')}.json"
        for d in quantization_checkpoints(config, RESULTS)
    ]
    + ([f"{QUANTIZATION_DIR}/smollm2.json"] if QUANTIZATION["smollm2"] else [])
    if QUANTIZATION
    else []
)
QUANTIZATION_TABLE_FILES = (
    [f"{TABLES_DIR}/{name}" for name in QUANTIZATION_TABLES] if QUANTIZATION else []
)
