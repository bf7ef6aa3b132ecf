# Tables, figures 1-4 (with report captions) and the LaTeX appendix.
# Figure captions are package data (attnid/templates/captions), shared with the LaTeX appendix.
from attnid.latex import caption_file

TABLES_DIR = "results/tables"
TABLE_FILES = [
    f"{TABLES_DIR}/{name}"
    for name in ["runs.csv", "runs.tex", "cases.csv", "cases.tex", "sweep.csv", "sweep.tex",
                 "sweep_slopes.csv", "claims.csv"]
]
RUN_OUTPUTS = [f"{d}/{name}" for d in RUN_DIRS + SWEEP_DIRS for name in ("metrics.csv", "run.json")]
THEORY_FILES = rules.counts.output + rules.verify.output


# Only the runs this config asks for are gathered, never leftovers of an older config.
RUN_SELECTION = {
    "runs": " ".join(RUN_DIRS),
    "sweep_runs": ("--sweep-runs " + " ".join(SWEEP_DIRS)) if SWEEP_DIRS else "",
}


rule tables:
    input:
        RUN_OUTPUTS,
    output:
        TABLE_FILES,
    params:
        **RUN_SELECTION,
    log:
        "results/logs/tables.log",
    shell:
        "attnid tables --runs {params.runs} {params.sweep_runs} --out-dir {TABLES_DIR} > {log:q} 2>&1"


rule figures:
    input:
        TABLE_FILES,
        RUN_OUTPUTS,
        THEORY_FILES,
    output:
        [report(f"figures/fig{i}.png", caption=caption_file(f"fig{i}"), category="Figures") for i in range(1, 5)],
        [f"figures/fig{i}.pdf" for i in range(1, 5)],
    params:
        **RUN_SELECTION,
    log:
        "results/logs/figures.log",
    shell:
        "attnid figures --tables {TABLES_DIR} --runs {params.runs}"
        " --theory-dir results/theory --out-dir figures > {log:q} 2>&1"


rule appendix:
    input:
        counts=rules.counts.output.counts,
        single_head=rules.counts.output.single_head,
        nullity=rules.verify.output[0],
        tables=TABLE_FILES,
        figures=rules.figures.output,
    output:
        ["paper/appendix.tex"] + (["paper/main.pdf"] if want_pdf() else []),
    params:
        pdf="--pdf" if want_pdf() else "",
    log:
        "results/logs/appendix.log",
    shell:
        "attnid appendix --counts {input.counts:q} --nullity {input.nullity:q} --single-head {input.single_head:q}"
        " --out paper/appendix.tex --experiment-tables {TABLES_DIR} --figures figures {params.pdf} > {log:q} 2>&1"
