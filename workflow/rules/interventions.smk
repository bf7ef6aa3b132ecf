# Does identification change training? The interventions on the orbit (src/attnid/plan/interventions.py).
#
# One training job per arm and seed under <results_dir>/interventions/<arm>/seed<N>/ (the adamw case's
# settings, the model and training sections, then the arm's own), except where a case run already trains
# exactly that run (attnid.plan: INTERVENTION_RUN_DIRS lists it instead); the float64 identity run of the
# projected arm under interventions/identity/seed<N>/; `attnid interventions-table` pairs every arm with
# adamw seed by seed.


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


if INTERVENTIONS:

    rule intervention_table:
        input:
            [
                f"{run_dir}/{name}"
                for run_dir in INTERVENTION_RUN_DIRS
                for name in ("metrics.csv", "run.json")
            ],
        output:
            INTERVENTION_TABLE_FILES,
        log:
            f"{LOGS}/intervention_table.log",
        conda:
            ENV
        params:
            runs=" ".join(INTERVENTION_RUN_DIRS),
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "attnid interventions-table --runs {params.runs} --out-dir {params.out_dir:q} > {log:q} 2>&1"
