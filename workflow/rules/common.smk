# The wiring every .smk file shares: the config, read and checked by attnid.plan, the output layout and
# the run lists. Every name that more than one .smk file uses is defined here, and only here; the other
# files hold rules (and names only they use). The workflow imports only attnid.plan's public names, the
# figures' registry and the report's table pages (tests/workflow/test_workflow.py checks it).
#
# Every output of a config goes under its `results_dir` (attnid.plan.layout); only data/ (a pure function
# of its URL and checksum) is shared between configs. One build of a results_dir runs at a time (below).
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
    as_one_build,
    check_config_file,
    check_writable,
    output_layout,
    plan,
    quantization_settings,
    run_files,
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

# ------------------------------------------------------------------ the output layout (attnid.plan.layout)

LAYOUT = output_layout(PLAN, config)
RESULTS, SPECS = PLAN.results_dir, PLAN.specs_dir
LOGS, BENCHMARKS, THEORY_DIR = (
    LAYOUT.folder(n) for n in ("logs", "benchmarks", "theory")
)
TABLES_DIR, FIGURES_DIR = LAYOUT.folder("tables"), LAYOUT.folder("figures")
PAPER_DIR, EDITS_DIR = LAYOUT.folder("paper"), LAYOUT.folder("edits")
train_resources = LAYOUT.train_resources
TRAIN_RESOURCES = train_resources()

# The runs, by stage, and what each stage's gathering jobs declare and read (attnid.plan): the case runs
# and sweeps; the studies ({study: its run directories}); the edits; the interventions; the quantization.
RUN_DIRS, RUN_OUTPUTS = PLAN.case_runs, LAYOUT.run_outputs
TABLE_FILES, RUN_SELECTION = LAYOUT.table_files, LAYOUT.run_selection
STUDY_RUN_DIRS, STUDY_TABLE_FILES = PLAN.study_runs, LAYOUT.study_table_files
EDITS, EDITS_TABLE_FILES = config.get("edits"), LAYOUT.edits_table_files
INTERVENTIONS = config.get("interventions") or {}
INTERVENTION_RUN_DIRS = PLAN.intervention_runs
INTERVENTION_OUTPUTS = LAYOUT.intervention_outputs
INTERVENTION_TABLE_FILES = LAYOUT.intervention_table_files
ROBUSTNESS_TABLE_FILES = LAYOUT.robustness_table_files
PROTOCOL_TABLES = LAYOUT.protocol_tables
INTERVENTION_SELECTION = LAYOUT.intervention_selection
QUANTIZATION = quantization_settings(config)
QUANTIZATION_DIR = LAYOUT.folder("quantization")
QUANTIZATION_REPORTS = LAYOUT.quantization_reports
QUANTIZATION_TABLE_FILES = LAYOUT.quantization_table_files

# ------------------------------------------------------------------ one build per results_dir

# A build (not a dry run, --lint, --list-rules, --report, --summary, --dag: none of them executes the
# workflow; nor a job's own parse, local or on SLURM: not the main process) holds attnid's lock on its
# results_dir (attnid.plan.builds) from before Snakemake builds its DAG, where it would find a running
# build's jobs incomplete, to its end: a second build is one line naming the first (docs/cluster.md).
if workflow.is_main_process:
    workflow.execute = as_one_build(
        workflow.execute,
        RESULTS,
        dry=lambda executor_plugin, **_: executor_plugin.common_settings.dryrun_exec,
        say=lambda line: print(line, file=sys.stderr),
    )


def robustness_runs(wildcards):
    """The robustness variants' runs (interventions.smk): each run once (a run of two variants, a final run)."""
    picks = checkpoints.calibration_table.get().output.picks
    variants = PLAN.robustness_runs(picks)
    return run_files(list(dict.fromkeys(d for dirs in variants.values() for d in dirs)))
