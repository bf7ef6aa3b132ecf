"""attnid: every number, table and figure of the paper from one command.

    snakemake --cores all                                   # default, laptop CPU -> results/default/
    snakemake --cores all --configfile config/paper.yaml    # the paper's scale, GPU -> results/paper/
    snakemake --report report.html                          # the claims, figures, tables (default)
    snakemake --report report.html --configfile config/smoke.yaml   # ... of the smoke build

The rules are thin: each one calls the ``attnid`` command line. The DAG is
data -> (theory, training runs) -> tables -> figures -> appendix. Each config writes
everything under its own ``results_dir``; only data/ is shared.

``--config`` values are YAML and merge into the config: ``--config 'cases={sgd: {lr: 0.1}}'``
changes SGD's learning rate and keeps every other case and setting (lists, such as
``seeds=[0]``, replace the config's list). The config is read and checked, and every training run
laid out, by attnid.plan (src/attnid/plan/); workflow/rules/common.smk wires it in.
"""

from snakemake.utils import min_version

min_version("8.0")


# The config (config/config.yaml unless --configfile names another), checked, and the run lists (attnid.plan).
include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/theory.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/studies.smk"
include: "workflow/rules/edits.smk"
include: "workflow/rules/interventions.smk"
include: "workflow/rules/quantization.smk"
include: "workflow/rules/alignment.smk"
include: "workflow/rules/report.smk"


# Snakemake's rate limiter (max-jobs-per-timespan, profiles/default/config.yaml) leaves a timer behind each
# scheduling round, and Python waits for every such timer before it exits: once the build is over, none may
# delay the exit (docs/cluster.md, "Snakemake's own CPU").
onsuccess:
    cancel_scheduling_timers()


onerror:
    cancel_scheduling_timers()


rule all:
    default_target: True
    input:
        rules.tables.output,
        STUDY_TABLE_FILES,
        INTERVENTION_TABLE_FILES,
        ROBUSTNESS_TABLE_FILES,
        QUANTIZATION_TABLE_FILES,
        rules.report_pages.output,
        rules.appendix.output,
