# Claims T1-T6: closed-form counts for real architectures, checked by Jacobian nullity.


rule counts:
    input:
        "config/architectures.yaml",
    output:
        counts=f"{THEORY_DIR}/counts.csv",
        single_head=f"{THEORY_DIR}/single_head.csv",
    log:
        f"{LOGS}/counts.log",
    conda:
        ENV
    shell:
        "attnid counts --architectures {input:q} --out {output.counts:q}"
        " --single-head-out {output.single_head:q} > {log:q} 2>&1"


rule verify:
    output:
        f"{THEORY_DIR}/nullity.csv",
    log:
        f"{LOGS}/verify.log",
    benchmark:
        f"{BENCHMARKS}/verify.tsv"
    conda:
        ENV
    shell:
        "attnid verify --out {output:q} > {log:q} 2>&1"
