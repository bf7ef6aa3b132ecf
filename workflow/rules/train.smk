# One training job per (case, seed) and per sweep point (optimizer, lr, seed).
#
# Only metrics.csv and run.json are declared outputs: the run's ckpt.pt is not, so a
# failed or killed job keeps its checkpoint and the rerun resumes from it. A diverged
# run is a finished job (exit 0, run.json status "diverged").
#
# train_case is the template of every training job: the sweeps here, the identification
# studies (studies.smk), the edits' runs (edits.smk) and the interventions (interventions.smk)
# are `use rule train_case as ... with:` their own output paths, wildcards and spec file (the
# run's settings, written by rule spec_file below); the data, threads, resources and command
# are this rule's. Its priority is not: each sets 0, because `use rule` would inherit this rule's 1. A run directory the plan does not list has no spec file, so no job makes it.


# Every run's spec file, <results_dir>/specs/<run directory>.yaml (a calibrated run's pending spec,
# <run directory>.pending.yaml), one job per file, any rule's input. Its text is the job's parameter
# (attnid.plan.spec_texts), so Snakemake reruns the job when the run's settings change, and with it every
# job that reads the file; nothing is written while the workflow is parsed (common.smk). A fixed
# temporary name: a rerun of a killed job replaces it.
rule spec_file:
    output:
        f"{SPECS}/{{spec}}.yaml",
    log:
        f"{LOGS}/specs/{{spec}}.log",
    wildcard_constraints:
        spec="|".join(
            re.escape(os.path.relpath(path, SPECS).removesuffix(".yaml"))
            for path in SPEC_TEXTS
        ),
    localrule: True
    conda:
        ENV
    params:
        # of the wildcards alone: Snakemake records (and compares) no parameter derived from the output
        text=lambda wildcards: SPEC_TEXTS[f"{SPECS}/{wildcards.spec}.yaml"],
    shell:
        "(printf '%s' {params.text:q} > {output:q}.tmp && mv {output:q}.tmp {output:q}) > {log:q} 2>&1"


rule train_case:
    input:
        data=rules.prepare_data.output,
        spec=f"{SPECS}/runs/{{case}}/seed{{seed}}.yaml",
    output:
        metrics=f"{RESULTS}/runs/{{case}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/runs/{{case}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/runs/{{case}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/runs/{{case}}/seed{{seed}}.tsv"
    wildcard_constraints:
        case="|".join(config["cases"]),
        seed=r"\d+",
    # The case runs are long jobs: started first (after the calibration's rounds, the head of the longest
    # chain, priority 2 in interventions.smk), they end before the short ones, which then fill both cores
    # to the end (docs/experiments.md, "The default run, measured").
    priority: 1
    conda:
        ENV
    threads: config["threads"]
    resources:
        **TRAIN_RESOURCES,
    params:
        data_dir=lambda wildcards, input: os.path.dirname(input.data[0]),
        device=config["device"],
        out_dir=lambda wildcards, output: os.path.dirname(output.run),
    shell:
        "attnid train --config {input.spec:q} --data {params.data_dir:q} --threads {threads}"
        " --device {params.device} --out {params.out_dir:q} --restart-if-changed > {log:q} 2>&1"


use rule train_case as train_sweep with:
    input:
        data=rules.prepare_data.output,
        spec=f"{SPECS}/sweep/{{optimizer}}/lr{{lr}}/seed{{seed}}.yaml",
    output:
        metrics=f"{RESULTS}/sweep/{{optimizer}}/lr{{lr}}/seed{{seed}}/metrics.csv",
        run=f"{RESULTS}/sweep/{{optimizer}}/lr{{lr}}/seed{{seed}}/run.json",
    log:
        f"{LOGS}/sweep/{{optimizer}}/lr{{lr}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/sweep/{{optimizer}}/lr{{lr}}/seed{{seed}}.tsv"
    wildcard_constraints:
        optimizer="|".join(config["sweep"]) or "none",
        lr=r"[0-9.e+-]+",
        seed=r"\d+",
    priority: 0  # after the case runs (train_case)
