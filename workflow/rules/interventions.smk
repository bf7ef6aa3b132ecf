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
# Round 2 (calibration/refine) waits for round 1 the same way: `attnid calibration-table` on round 1's
# runs writes the specs of calibration/<arm>/top<k>/seed<N> (the k-th best lr of round 1), and the final
# table reads both rounds (attnid.plan.rounds). The robustness variants' runs (robustness/<arm>/lr<lr>/)
# are the one part known only after the calibration: the final table is a checkpoint, and
# `attnid interventions-robustness` asks for the runs of each variant's picks, the final runs where a
# pick is the final one (Plan.robustness_runs).

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
RANKS = sorted({PLAN.runs[d].rank for d in PLAN.refine_runs})


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

    use rule train_case as train_refine with:
        input:
            data=rules.prepare_data.output,
            spec=f"{SPECS}/calibration/{{arm}}/top{{rank}}/seed{{seed}}.yaml",
        output:
            metrics=f"{RESULTS}/calibration/{{arm}}/top{{rank}}/seed{{seed}}/metrics.csv",
            run=f"{RESULTS}/calibration/{{arm}}/top{{rank}}/seed{{seed}}/run.json",
        log:
            f"{LOGS}/calibration/{{arm}}/top{{rank}}/seed{{seed}}.log",
        benchmark:
            f"{BENCHMARKS}/calibration/{{arm}}/top{{rank}}/seed{{seed}}.tsv"
        wildcard_constraints:
            arm=CALIBRATION_ARM_PATTERN,
            rank=r"\d+",
            seed=r"\d+",
        priority: 0  # after the case runs (train_case)

    use rule train_case as train_robustness with:
        input:
            data=rules.prepare_data.output,
            spec=f"{SPECS}/robustness/{{arm}}/lr{{lr}}/seed{{seed}}.yaml",
        output:
            metrics=f"{RESULTS}/robustness/{{arm}}/lr{{lr}}/seed{{seed}}/metrics.csv",
            run=f"{RESULTS}/robustness/{{arm}}/lr{{lr}}/seed{{seed}}/run.json",
        log:
            f"{LOGS}/robustness/{{arm}}/lr{{lr}}/seed{{seed}}.log",
        benchmark:
            f"{BENCHMARKS}/robustness/{{arm}}/lr{{lr}}/seed{{seed}}.tsv"
        wildcard_constraints:
            arm=CALIBRATION_ARM_PATTERN,
            lr=r"[0-9.e+-]+",
            seed=r"\d+",
        priority: 0  # after the case runs (train_case)

else:

    # interventions: one_job_per_arm: every seed of an arm (and lr) in one job, `attnid train-runs`, which pays
    # the start-up once (docs/experiments.md, "Sizing the interventions"); with lockstep, a job's runs train
    # together, one stacked step of all at a time (docs/design.md §11.6).
    LOCKSTEP = " --lockstep" if PLAN.lockstep else ""

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
            " --threads {threads} --device {params.device} --restart-if-changed"
            f"{LOCKSTEP} > {{log:q}} 2>&1"

    if PLAN.lockstep and PLAN.calibration_runs:

        # each round of the calibration in one job: an arm's runs at every lr (round 1) or at its best two
        # (round 2) train as one lockstep group, each at its own lr (docs/design.md §11.6)
        use rule train_intervention_seeds as train_calibration_round1 with:
            input:
                data=rules.prepare_data.output,
                specs=[PLAN.spec_file(run_dir) for run_dir in PLAN.calibration_runs],
            output:
                run_files(PLAN.calibration_runs),
            log:
                f"{LOGS}/calibration/round1.log",
            benchmark:
                f"{BENCHMARKS}/calibration/round1.tsv"
            # the build's longest chain (round 1, round 2, the per-arm jobs): started before the case runs
            priority: 2
            resources:
                **train_resources(len(PLAN.calibration_runs)),
            params:
                data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
                device=config["device"],
                outs=PLAN.calibration_runs,

    if PLAN.lockstep and PLAN.refine_runs:

        use rule train_intervention_seeds as train_calibration_round2 with:
            input:
                data=rules.prepare_data.output,
                specs=[PLAN.spec_file(run_dir) for run_dir in PLAN.refine_runs],
            output:
                run_files(PLAN.refine_runs),
            log:
                f"{LOGS}/calibration/round2.log",
            benchmark:
                f"{BENCHMARKS}/calibration/round2.tsv"
            # the build's longest chain (round 1, round 2, the per-arm jobs): started before the case runs
            priority: 2
            resources:
                **train_resources(len(PLAN.refine_runs)),
            params:
                data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
                device=config["device"],
                outs=PLAN.refine_runs,

    if not PLAN.lockstep:

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

        # round 2: an arm's k-th best lr of round 1 on the refine seeds, one job
        use rule train_intervention_seeds as train_refine_seeds with:
            input:
                data=rules.prepare_data.output,
                specs=[
                    f"{SPECS}/calibration/{{arm}}/top{{rank}}/seed{seed}.yaml"
                    for seed in PLAN.refine_seeds
                ],
            output:
                run_files(
                    [
                        f"{RESULTS}/calibration/{{arm}}/top{{rank}}/seed{seed}"
                        for seed in PLAN.refine_seeds
                    ]
                ),
            log:
                f"{LOGS}/calibration/{{arm}}/top{{rank}}.log",
            benchmark:
                f"{BENCHMARKS}/calibration/{{arm}}/top{{rank}}.tsv"
            wildcard_constraints:
                arm=CALIBRATION_ARM_PATTERN,
                rank=r"\d+",
            resources:
                **train_resources(len(PLAN.refine_seeds)),
            params:
                data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
                device=config["device"],
                outs=lambda wildcards: [
                    f"{RESULTS}/calibration/{wildcards.arm}/top{wildcards.rank}/seed{seed}"
                    for seed in PLAN.refine_seeds
                ],

    # a robustness variant's arm at a grid lr on the comparison seeds, one job
    use rule train_intervention_seeds as train_robustness_seeds with:
        input:
            data=rules.prepare_data.output,
            specs=[
                f"{SPECS}/robustness/{{arm}}/lr{{lr}}/seed{seed}.yaml"
                for seed in PLAN.intervention_seeds
            ],
        output:
            run_files(
                [
                    f"{RESULTS}/robustness/{{arm}}/lr{{lr}}/seed{seed}"
                    for seed in PLAN.intervention_seeds
                ]
            ),
        log:
            f"{LOGS}/robustness/{{arm}}/lr{{lr}}.log",
        benchmark:
            f"{BENCHMARKS}/robustness/{{arm}}/lr{{lr}}.tsv"
        wildcard_constraints:
            arm=CALIBRATION_ARM_PATTERN,
            lr=r"[0-9.e+-]+",
        params:
            data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
            device=config["device"],
            outs=lambda wildcards: [
                f"{RESULTS}/robustness/{wildcards.arm}/lr{wildcards.lr}/seed{seed}"
                for seed in PLAN.intervention_seeds
            ],


CALIBRATED_RUN_DIRS = PLAN.calibrated()

if PLAN.refine_runs:

    # round 1's picks, by rank: the specs of round 2's runs
    rule calibration_round1:
        input:
            runs=run_files(PLAN.calibration_runs),
            pending=[PLAN.pending_spec_file(run_dir) for run_dir in PLAN.refine_runs],
        output:
            table=f"{RESULTS}/calibration/round1/calibration.csv",
            picks=f"{RESULTS}/calibration/round1/calibration_picks.csv",
            specs=[PLAN.spec_file(run_dir) for run_dir in PLAN.refine_runs],
        log:
            f"{LOGS}/calibration_round1.log",
        conda:
            ENV
        params:
            runs=" ".join(PLAN.calibration_runs),
            out_dir=lambda wildcards, output: os.path.dirname(output.table),
        shell:
            "attnid calibration-table --runs {params.runs} --out-dir {params.out_dir:q} "
            "--pending-specs {input.pending:q} > {log:q} 2>&1"


if CALIBRATED_RUN_DIRS:

    # a checkpoint: the robustness variants' runs are known once its picks are
    checkpoint calibration_table:
        input:
            runs=run_files(PLAN.calibration_runs + PLAN.refine_runs),
            pending=[PLAN.pending_spec_file(run_dir) for run_dir in CALIBRATED_RUN_DIRS],
        output:
            table=f"{TABLES_DIR}/calibration.csv",
            picks=f"{TABLES_DIR}/calibration_picks.csv",
            specs=[PLAN.spec_file(run_dir) for run_dir in CALIBRATED_RUN_DIRS],
        log:
            f"{LOGS}/calibration_table.log",
        conda:
            ENV
        params:
            runs=" ".join(PLAN.calibration_runs),
            refine=(
                f"--refine-runs {' '.join(PLAN.refine_runs)}"
                if PLAN.refine_runs
                else ""
            ),
            out_dir=lambda wildcards, output: os.path.dirname(output.table),
        shell:
            "attnid calibration-table --runs {params.runs} {params.refine} --out-dir {params.out_dir:q} "
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


# The robustness variants (attnid.plan.rounds): each variant's runs, once the calibration's picks are known
# (the checkpoint above), compared as the table compares the final runs, under the same verdict rule.
if ROBUSTNESS_TABLE_FILES:

    rule interventions_robustness:
        input:
            runs=robustness_runs,
            picks=f"{TABLES_DIR}/calibration_picks.csv",
            calibration=MARGIN_INPUTS,
        output:
            ROBUSTNESS_TABLE_FILES,
        log:
            f"{LOGS}/interventions_robustness.log",
        conda:
            ENV
        params:
            # (evaluated in a dry run too, before the calibration has written its picks)
            variants=lambda wildcards, input: " ".join(
                f"--variant {variant} {' '.join(dirs)}"
                for variant, dirs in (
                    PLAN.robustness_runs(input.picks)
                    if os.path.exists(input.picks)
                    else {}
                ).items()
            ),
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
            rule=" ".join(
                map(
                    shlex.quote,
                    verdict_options(config, CALIBRATION_TABLE, plateau_check=False),
                )
            ),
        shell:
            "attnid interventions-robustness {params.variants} --out-dir {params.out_dir:q} "
            "{params.rule} > {log:q} 2>&1"
