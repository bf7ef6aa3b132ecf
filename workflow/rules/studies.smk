# Does identification buy anything? The heads and variants studies (src/attnid/studies.py).
#
# One AdamW training job per point and seed under <results_dir>/studies/<study>/<point>/seed<N>/
# (the adamw case's settings, the model and training sections, then the study's own max_iters,
# log_every, ... and the point's attention shape), gathered by `attnid studies` into the tables.


include: "studies_common.smk"


rule train_study:
    input:
        rules.prepare_data.output,
    output:
        metrics=f"{RESULTS}/studies/{{study}}/{{point}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/studies/{{study}}/{{point}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/studies/{{study}}/{{point}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/studies/{{study}}/{{point}}/seed{{seed}}.tsv"
    wildcard_constraints:
        study="|".join(STUDY_POINTS),
        point=r"[a-z][a-z0-9_]*",
        seed=r"\d+",
    conda:
        ENV
    threads: config["threads"]
    resources:
        **TRAIN_RESOURCES,
    params:
        flags=study_flags,
        data_dir=lambda wildcards, input: os.path.dirname(input[0]),
        device=config["device"],
        out_dir=lambda wildcards, output: os.path.dirname(output.run),
    shell:
        TRAIN_SHELL


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
        heads=" ".join(STUDY_RUN_DIRS["heads"]),
        variants=" ".join(STUDY_RUN_DIRS["variants"]),
        out_dir=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "attnid studies --heads-runs {params.heads} --variants-runs {params.variants}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
