# Does identification buy anything? The heads and variants studies (src/attnid/plan/studies.py).
#
# One AdamW training job per point and seed under <results_dir>/studies/<study>/<point>/seed<N>/
# (the adamw case's settings, the model and training sections, then the study's own max_iters,
# log_every, ... and the point's attention shape), gathered by `attnid studies` into the tables.


use rule train_case as train_study with:
    input:
        data=rules.prepare_data.output,
        spec=f"{SPECS}/studies/{{study}}/{{point}}/seed{{seed}}.yaml",
    output:
        metrics=f"{RESULTS}/studies/{{study}}/{{point}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/studies/{{study}}/{{point}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/studies/{{study}}/{{point}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/studies/{{study}}/{{point}}/seed{{seed}}.tsv"
    wildcard_constraints:
        study="|".join(STUDY_RUN_DIRS) or "none",
        point=r"[a-z][a-z0-9_]*",
        seed=r"\d+",
    priority: 0  # after the case runs (train_case)


# A run that trains what an earlier study run trains copies its files:
# {"<study>/<point>/seed<N>" of the copy: the run directory it copies}.
COPIED_STUDY_RUNS = {
    os.path.relpath(run_dir, f"{RESULTS}/studies"): source
    for run_dir, source in PLAN.copied().items()
}
if COPIED_STUDY_RUNS:

    ruleorder: reuse_study_run > train_study

    rule reuse_study_run:
        input:
            metrics=lambda wildcards: f"{COPIED_STUDY_RUNS[wildcards.copied]}/metrics.csv",
            run=lambda wildcards: f"{COPIED_STUDY_RUNS[wildcards.copied]}/run.json",
        output:
            metrics=f"{RESULTS}/studies/{{copied}}/metrics.csv",
            run=f"{RESULTS}/studies/{{copied}}/run.json",
        log:
            f"{LOGS}/studies/{{copied}}.log",
        wildcard_constraints:
            copied="|".join(map(re.escape, COPIED_STUDY_RUNS)),
        conda:
            ENV
        shell:
            "(cp {input.metrics:q} {output.metrics:q}.tmp && mv {output.metrics:q}.tmp {output.metrics:q}"
            " && cp {input.run:q} {output.run:q}.tmp && mv {output.run:q}.tmp {output.run:q}"
            " && echo 'copied from {input.run:q}') > {log:q} 2>&1"


if STUDY_RUN_DIRS:

    rule study_tables:
        input:
            run_files(d for run_dirs in STUDY_RUN_DIRS.values() for d in run_dirs),
        output:
            STUDY_TABLE_FILES,
        log:
            f"{LOGS}/study_tables.log",
        conda:
            ENV
        params:
            runs=" ".join(
                f"--{study}-runs {' '.join(run_dirs)}"
                for study, run_dirs in STUDY_RUN_DIRS.items()
            ),
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "attnid studies {params.runs} --out-dir {params.out_dir:q} > {log:q} 2>&1"
