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

from attnid.plan import margin_fraction, verdict_options


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


ARM_PATTERN = "|".join(map(re.escape, PLAN.arms)) or "none"
CALIBRATION_ARM_PATTERN = "|".join(map(re.escape, PLAN.calibration_arms)) or "none"


if not PLAN.one_job_per_arm:

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
            arm=ARM_PATTERN,
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
            arm=CALIBRATION_ARM_PATTERN,
            lr=r"[0-9.e+-]+",
            seed=r"\d+",
        priority: 0  # after the case runs (train_case)

else:

    # interventions: one_job_per_arm: every seed of an arm (and lr) in one job, `attnid train-runs`, which pays
    # the start-up once (docs/experiments.md, "Sizing the interventions").
    rule train_intervention_seeds:
        input:
            data=rules.prepare_data.output,
            specs=[
                f"{SPECS}/interventions/{{arm}}/seed{seed}.yaml"
                for seed in PLAN.intervention_seeds
            ],
        output:
            run_files(
                [
                    f"{RESULTS}/interventions/{{arm}}/seed{seed}"
                    for seed in PLAN.intervention_seeds
                ]
            ),
        log:
            f"{LOGS}/interventions/{{arm}}.log",
        benchmark:
            f"{BENCHMARKS}/interventions/{{arm}}.tsv"
        wildcard_constraints:
            arm=ARM_PATTERN,
        priority: 0  # after the case runs (train_case)
        conda:
            ENV
        threads: config["threads"]
        resources:
            **train_resources(len(PLAN.intervention_seeds)),
        params:
            data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
            device=config["device"],
            outs=lambda wildcards: [
                f"{RESULTS}/interventions/{wildcards.arm}/seed{seed}"
                for seed in PLAN.intervention_seeds
            ],
        shell:
            "attnid train-runs --configs {input.specs:q} --outs {params.outs:q} --data {params.data_dir:q}"
            " --threads {threads} --device {params.device} --restart-if-changed > {log:q} 2>&1"

    use rule train_intervention_seeds as train_calibration_seeds with:
        input:
            data=rules.prepare_data.output,
            specs=[
                f"{SPECS}/calibration/{{arm}}/lr{{lr}}/seed{seed}.yaml"
                for seed in PLAN.calibration_seeds
            ],
        output:
            run_files(
                [
                    f"{RESULTS}/calibration/{{arm}}/lr{{lr}}/seed{seed}"
                    for seed in PLAN.calibration_seeds
                ]
            ),
        log:
            f"{LOGS}/calibration/{{arm}}/lr{{lr}}.log",
        benchmark:
            f"{BENCHMARKS}/calibration/{{arm}}/lr{{lr}}.tsv"
        wildcard_constraints:
            arm=CALIBRATION_ARM_PATTERN,
            lr=r"[0-9.e+-]+",
        resources:
            **train_resources(len(PLAN.calibration_seeds)),
        params:
            data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
            device=config["device"],
            outs=lambda wildcards: [
                f"{RESULTS}/calibration/{wildcards.arm}/lr{wildcards.lr}/seed{seed}"
                for seed in PLAN.calibration_seeds
            ],


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
    # a margin that is a fraction of the calibrated baseline's loss reads it from the calibration table
    CALIBRATION_TABLE = f"{TABLES_DIR}/calibration.csv"
    MARGIN_INPUTS = [CALIBRATION_TABLE] if margin_fraction(config) is not None else []

    rule intervention_table:
        input:
            runs=[
                f"{run_dir}/{name}"
                for run_dir in INTERVENTION_RUN_DIRS
                for name in ("metrics.csv", "run.json")
            ],
            costs=ARM_COST_FILES,
            calibration=MARGIN_INPUTS,
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
            rule=" ".join(map(shlex.quote, verdict_options(config, CALIBRATION_TABLE))),
            costs=lambda wildcards, input: (
                f"--arm-costs {input.costs[0]}" if input.costs else ""
            ),
        shell:
            "attnid interventions-table --runs {params.runs} --out-dir {params.out_dir:q} {params.rule} "
            "{params.costs} > {log:q} 2>&1"
