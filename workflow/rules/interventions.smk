# Does identification change training? The interventions on the orbit (src/attnid/plan/interventions.py).
#
# One training job per arm and seed under <results_dir>/interventions/<arm>/seed<N>/ (the adamw case's
# settings, the model and training sections, then the arm's own), except where a case run already trains
# exactly that run (attnid.plan: INTERVENTION_RUN_DIRS lists it instead); the float64 identity run of the
# projected arm under interventions/identity/seed<N>/; `attnid interventions-table` pairs every arm with
# adamw seed by seed.

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
