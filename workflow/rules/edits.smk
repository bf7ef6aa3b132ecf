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

EDIT_SHELL = (
    "attnid {params.command} {params.checkpoint:q} --out {output.checkpoint:q}"
    " --data {params.data_dir:q} --json {output.report:q} > {log:q} 2>&1"
)


# Only a config with an `edits` section has these jobs.
if EDITS:

    use rule train_case as train_edits with:
        input:
            data=rules.prepare_data.output,
            spec=f"{SPECS}/edits/{{case}}/seed{{seed}}.yaml",
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
        priority: 0  # after the case runs (train_case)

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
            [
                f"{d}/{edit}.json"
                for d in PLAN.edit_runs
                for edit in ("prune", "balance")
            ],
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
