# Does identification change training? The interventions on the orbit (src/attnid/plan/interventions.py).
#
# One training job per arm and seed under <results_dir>/interventions/<arm>/seed<N>/ (the adamw case's
# settings, the model and training sections, the stage's own, then the arm's), except where a case run
# already trains exactly that run (attnid.plan: INTERVENTION_RUN_DIRS lists it instead); the float64
# identity run of the projected arm under interventions/identity/seed<N>/; `attnid interventions-table`
# pairs every arm with its baseline seed by seed.
#
# The calibration (docs/design.md §6): each calibrated arm at each lr of its grid under
# calibration/<arm>/lr<lr>/seed<N>/; then `attnid calibration-table` writes calibration.csv and, from the
# plan's pending specs, the spec files of the runs at each arm's best lr (interventions/<arm>_best_lr/),
# whose training jobs wait for it. The jobs are known before any runs: only those spec files' lr is not.

import shlex

from attnid.plan import verdict_options


use rule train_case as train_intervention with:
    input:
        data=rules.prepare_data.output,
        spec=f"{SPECS}/interventions/{{arm}}/seed{{seed}}.yaml",
    output:
        metrics=f"{RESULTS}/interventions/{{arm}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/interventions/{{arm}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/interventions/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/interventions/{{arm}}/seed{{seed}}.tsv"
    wildcard_constraints:
        arm="|".join(map(re.escape, PLAN.arms)) or "none",
        seed=r"\d+",
    priority: 0  # after the case runs (train_case)


use rule train_case as train_intervention_identity with:
    input:
        data=rules.prepare_data.output,
        spec=f"{SPECS}/interventions/identity/seed{{seed}}.yaml",
    output:
        metrics=f"{RESULTS}/interventions/identity/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/interventions/identity/seed{{seed}}/run.json",
    log:
        f"{LOGS}/interventions/identity/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/interventions/identity/seed{{seed}}.tsv"
    wildcard_constraints:
        seed=r"\d+",
    priority: 0  # after the case runs (train_case)


use rule train_case as train_calibration with:
    input:
        data=rules.prepare_data.output,
        spec=f"{SPECS}/calibration/{{arm}}/lr{{lr}}/seed{{seed}}.yaml",
    output:
        metrics=f"{RESULTS}/calibration/{{arm}}/lr{{lr}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/calibration/{{arm}}/lr{{lr}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/calibration/{{arm}}/lr{{lr}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/calibration/{{arm}}/lr{{lr}}/seed{{seed}}.tsv"
    wildcard_constraints:
        arm="|".join(map(re.escape, PLAN.arms)) or "none",
        lr=r"[0-9.e+-]+",
        seed=r"\d+",
    priority: 0  # after the case runs (train_case)


CALIBRATED_RUN_DIRS = PLAN.calibrated()

if CALIBRATED_RUN_DIRS:

    rule calibration_table:
        input:
            runs=run_files(PLAN.calibration_runs),
            pending=[PLAN.pending_spec_file(run_dir) for run_dir in CALIBRATED_RUN_DIRS],
        output:
            table=f"{TABLES_DIR}/calibration.csv",
            specs=[PLAN.spec_file(run_dir) for run_dir in CALIBRATED_RUN_DIRS],
        log:
            f"{LOGS}/calibration_table.log",
        conda:
            ENV
        params:
            runs=" ".join(PLAN.calibration_runs),
            out_dir=lambda wildcards, output: os.path.dirname(output.table),
        shell:
            "attnid calibration-table --runs {params.runs} --out-dir {params.out_dir:q} "
            "--pending-specs {input.pending:q} > {log:q} 2>&1"


# Each arm's cost per step over adamw's, measured by benchmarks/arms_cost.py and kept in the repository:
# an input of the table where it exists, so a new measurement redraws the table.
ARM_COSTS = "benchmarks/arms_cost.csv"
ARM_COST_FILES = [ARM_COSTS] if os.path.exists(ARM_COSTS) else []


if INTERVENTIONS:

    rule intervention_table:
        input:
            runs=[
                f"{run_dir}/{name}"
                for run_dir in INTERVENTION_RUN_DIRS
                for name in ("metrics.csv", "run.json")
            ],
            costs=ARM_COST_FILES,
        output:
            INTERVENTION_TABLE_FILES,
        log:
            f"{LOGS}/intervention_table.log",
        conda:
            ENV
        params:
            runs=" ".join(INTERVENTION_RUN_DIRS),
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
            # the verdict rule of the config (docs/design.md §11.3)
            rule=" ".join(map(shlex.quote, verdict_options(config))),
            costs=lambda wildcards, input: (
                f"--arm-costs {input.costs[0]}" if input.costs else ""
            ),
        shell:
            "attnid interventions-table --runs {params.runs} --out-dir {params.out_dir:q} {params.rule} "
            "{params.costs} > {log:q} 2>&1"
