# Claims T1-T6: closed-form counts for real architectures, checked by Jacobian nullity.


rule counts:
    input:
        "config/architectures.yaml",
    output:
        counts="results/theory/counts.csv",
        single_head="results/theory/single_head.csv",
    log:
        "results/logs/counts.log",
    shell:
        "attnid counts --architectures {input:q} --out {output.counts:q}"
        " --single-head-out {output.single_head:q} > {log:q} 2>&1"


rule verify:
    output:
        "results/theory/nullity.csv",
    log:
        "results/logs/verify.log",
    benchmark:
        "results/benchmarks/verify.tsv"
    shell:
        "attnid verify --out {output:q} > {log:q} 2>&1"
