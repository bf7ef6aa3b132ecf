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
# an input of the job (docs/design.md §6). The plan writes the spec files when the workflow is parsed
# (a dry run too), atomically and only those whose content changed: Snakemake reruns a job whose input
# is newer than its outputs, so a job reruns when its own settings change, and no other.

import os
import re
import shutil
import sys

from attnid.plan import (
    ConfigError,
    check_config_file,
    check_writable,
    plan,
    write_spec_files,
)

DEFAULT_CONFIG = "config/config.yaml"
DATA_DIR = "data/tinyshakespeare"
DATA_LOGS = "data/logs"
ENV = "../envs/attnid.yaml"


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
    write_spec_files(PLAN)
except ConfigError as err:
    config_error(err)

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


def run_files(run_dirs):
    """What a training job declares: each run's metrics.csv and run.json."""
    return [f"{d}/{name}" for d in run_dirs for name in ("metrics.csv", "run.json")]


def want_pdf():
    """paper_pdf: auto builds the appendix PDF only where latexmk is installed."""
    setting = config.get("paper_pdf", "auto")
    return shutil.which("latexmk") is not None if setting == "auto" else bool(setting)


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
    [f"{TABLES_DIR}/interventions{tail}" for tail in (".csv", "_seeds.csv", ".tex")]
    if INTERVENTIONS
    else []
)
# What `attnid tables` and `attnid figures` read of the stage (claims.csv's identities, Figure 6).
INTERVENTION_SELECTION = (
    f"--intervention-runs {' '.join(INTERVENTION_RUN_DIRS)}"
    f" --identity-runs {' '.join(PLAN.identity_runs)}"
    if INTERVENTIONS
    else ""
)
