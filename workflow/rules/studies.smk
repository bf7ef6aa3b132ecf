# Does identification buy anything? The heads and variants studies (src/attnid/reports/studies.py).
#
# One AdamW training job per point and seed under <results_dir>/studies/<study>/<point>/seed<N>/
# (the adamw case's settings, the model and training sections, then the study's own max_iters,
# log_every, ... and the point's attention shape), gathered by `attnid studies` into the tables.


use rule train_case as train_study with:
    output:
        metrics=f"{RESULTS}/studies/{{study}}/{{point}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/studies/{{study}}/{{point}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/studies/{{study}}/{{point}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/studies/{{study}}/{{point}}/seed{{seed}}.tsv"
    wildcard_constraints:
        study="|".join(STUDY_POINTS) or "none",
        point=r"[a-z][a-z0-9_]*",
        seed=r"\d+",
    params:
        flags=study_flags,


# A point that trains what an earlier point trains copies its runs (REUSED_STUDY_RUNS).
if REUSED_STUDY_RUNS:

    ruleorder: reuse_study_run > train_study

    rule reuse_study_run:
        input:
            metrics=lambda wildcards: reused_run_file(wildcards, "metrics.csv"),
            run=lambda wildcards: reused_run_file(wildcards, "run.json"),
        output:
            metrics=f"{RESULTS}/studies/{{reused}}/seed{{seed}}/metrics.csv",
            run=f"{RESULTS}/studies/{{reused}}/seed{{seed}}/run.json",
        log:
            f"{LOGS}/studies/{{reused}}/seed{{seed}}.log",
        wildcard_constraints:
            reused="|".join(map(re.escape, REUSED_STUDY_RUNS)),
            seed=r"\d+",
        conda:
            ENV
        shell:
            "(cp {input.metrics:q} {output.metrics:q}.tmp && mv {output.metrics:q}.tmp {output.metrics:q}"
            " && cp {input.run:q} {output.run:q}.tmp && mv {output.run:q}.tmp {output.run:q}"
            " && echo 'copied from {input.run:q}') > {log:q} 2>&1"


if STUDY_POINTS:

    rule study_tables:
        input:
            STUDY_OUTPUTS,
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
