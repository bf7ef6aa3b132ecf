# Function-preserving checkpoint edits (docs/design.md §9), from the config's `edits` section:
# the runs of one case retrained with attention biases, one per seed, in
# <results_dir>/edits/<case>/seed<N>/ (apart from runs/, so the case tables never see them);
# `attnid prune-biases` and `attnid balance` on each run's checkpoint; the table of both edits.
# Without an `edits` section the stage is skipped.
#
# ckpt.pt is not a declared output of training (see train.smk): the edits take the run's
# run.json, written after the final checkpoint, and read ckpt.pt next to it. Each edit
# measures on a batch of the validation split (--data: the prepared data), so its loss
# change is a change of validation loss.

EDITS = config.get("edits")
if EDITS is not None and EDITS["case"] not in config["cases"]:
    config_error(
        f"edits/case: no case '{EDITS['case']}' under cases to take its settings from"
    )
# Run settings the section may change (the rest are the case's): see the schema.
EDITS_OVERRIDES = {
    key: value
    for key, value in (EDITS or {}).items()
    if key in ("max_iters", "warmup_iters")
}
EDITS_DIR = f"{RESULTS}/edits"
EDIT_DIRS = (
    [f"{EDITS_DIR}/{EDITS['case']}/seed{seed}" for seed in EDITS["seeds"]]
    if EDITS
    else []
)
# Each edit's JSON report; the gather reads which edit it is from the report itself.
EDIT_REPORTS = [
    f"{run_dir}/{edit}.json" for run_dir in EDIT_DIRS for edit in ("prune", "balance")
]
EDITS_TABLE_FILES = (
    [f"{TABLES_DIR}/{name}" for name in ("prune.csv", "prune_summary.csv", "prune.tex")]
    if EDITS
    else []
)
EDIT_SHELL = (
    "attnid {params.command} {params.checkpoint:q} --out {output.checkpoint:q}"
    " --data {params.data_dir:q} --json {output.report:q} > {log:q} 2>&1"
)


# Only a config with an `edits` section has these jobs.
if EDITS:

    rule train_edits:
        input:
            rules.prepare_data.output,
        output:
            metrics=f"{EDITS_DIR}/{{case}}/seed{{seed}}/metrics.csv",
            run=f"{EDITS_DIR}/{{case}}/seed{{seed}}/run.json",
        log:
            f"{LOGS}/edits/{{case}}/seed{{seed}}.log",
        benchmark:
            f"{BENCHMARKS}/edits/{{case}}/seed{{seed}}.tsv"
        wildcard_constraints:
            case=EDITS["case"],
            seed=r"\d+",
        conda:
            ENV
        threads: config["threads"]
        resources:
            **TRAIN_RESOURCES,
        params:
            flags=lambda wildcards: train_flags(
                wildcards.case,
                run_settings(
                    wildcards.case,
                    bias=EDITS.get("bias", True),
                    seed=int(wildcards.seed),
                    **EDITS_OVERRIDES,
                ),
            ),
            data_dir=lambda wildcards, input: os.path.dirname(input[0]),
            device=config["device"],
            out_dir=lambda wildcards, output: os.path.dirname(output.run),
        shell:
            TRAIN_SHELL

    rule prune_biases:
        input:
            run=f"{EDITS_DIR}/{{case}}/seed{{seed}}/run.json",
            val=rules.prepare_data.output.val,
            meta=rules.prepare_data.output.meta,
        output:
            checkpoint=f"{EDITS_DIR}/{{case}}/seed{{seed}}/pruned.pt",
            report=f"{EDITS_DIR}/{{case}}/seed{{seed}}/prune.json",
        log:
            f"{LOGS}/edits/{{case}}/seed{{seed}}.prune.log",
        wildcard_constraints:
            case=EDITS["case"],
            seed=r"\d+",
        conda:
            ENV
        params:
            command="prune-biases",
            checkpoint=lambda wildcards, input: os.path.join(
                os.path.dirname(input.run), "ckpt.pt"
            ),
            data_dir=lambda wildcards, input: os.path.dirname(input.val),
        shell:
            EDIT_SHELL

    rule balance:
        input:
            run=f"{EDITS_DIR}/{{case}}/seed{{seed}}/run.json",
            val=rules.prepare_data.output.val,
            meta=rules.prepare_data.output.meta,
        output:
            checkpoint=f"{EDITS_DIR}/{{case}}/seed{{seed}}/balanced.pt",
            report=f"{EDITS_DIR}/{{case}}/seed{{seed}}/balance.json",
        log:
            f"{LOGS}/edits/{{case}}/seed{{seed}}.balance.log",
        wildcard_constraints:
            case=EDITS["case"],
            seed=r"\d+",
        conda:
            ENV
        params:
            command="balance --target balanced",
            checkpoint=lambda wildcards, input: os.path.join(
                os.path.dirname(input.run), "ckpt.pt"
            ),
            data_dir=lambda wildcards, input: os.path.dirname(input.val),
        shell:
            EDIT_SHELL

    rule edits_table:
        input:
            EDIT_REPORTS,
        output:
            EDITS_TABLE_FILES,
        log:
            f"{LOGS}/edits_table.log",
        conda:
            ENV
        params:
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "attnid edits-table --json {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
