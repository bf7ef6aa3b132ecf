# Claims T1-T6: closed-form counts for real architectures, checked by Jacobian nullity; the whole-model
# census (every continuous symmetry, not only attention's) for the same architectures and a grid of shapes.

# architectures.yaml is package data, its one copy; the workflow reads the installed package's file.
from attnid.theory.architectures import PACKAGED_ARCHITECTURES


rule counts:
    input:
        str(PACKAGED_ARCHITECTURES),
    output:
        counts=f"{THEORY_DIR}/counts.csv",
        single_head=f"{THEORY_DIR}/single_head.csv",
        whole_model=f"{THEORY_DIR}/whole_model.csv",
    log:
        f"{LOGS}/counts.log",
    conda:
        ENV
    shell:
        "attnid counts --architectures {input:q} --out {output.counts:q}"
        " --single-head-out {output.single_head:q} --whole-model-out {output.whole_model:q} > {log:q} 2>&1"


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


rule census:
    output:
        f"{THEORY_DIR}/census.csv",
    log:
        f"{LOGS}/census.log",
    benchmark:
        f"{BENCHMARKS}/census.tsv"
    conda:
        ENV
    shell:
        "attnid census --grid --out {output:q} > {log:q} 2>&1"
