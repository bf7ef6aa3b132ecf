# Tables, figures 1-6 (with report captions) and the LaTeX appendix, under the config's results_dir.
# Figure captions are package data (attnid/reports/templates/captions), shared with the LaTeX appendix;
# Figure 6's is filled with the build's numbers by `attnid figures` (fig6.rst next to the figure).


# Figures 1-4 always; Figure 5 draws the identification studies and Figure 6 the interventions, when the
# config has them.
FIGURE_NUMBERS = (
    [1, 2, 3, 4] + ([5] if STUDY_RUN_DIRS else []) + ([6] if INTERVENTIONS else [])
)
# The caption a figure's report entry shows: the package's, or the one its build filled in.
FIGURE_CAPTIONS = {
    i: (
        os.path.abspath(f"{FIGURES_DIR}/fig{i}.rst")
        if i == 6
        else caption_file(f"fig{i}")
    )
    for i in FIGURE_NUMBERS
}
# The optional stages this config leaves out: their files of an earlier build are never shown
# (the interventions' table appears once the config has an interventions stage).
OMITTED_PARTS = [
    part
    for part, on in (
        ("studies", STUDY_RUN_DIRS),
        ("edits", EDITS),
        ("interventions", config.get("interventions")),
    )
    if not on
]


rule tables:
    input:
        runs=RUN_OUTPUTS,
        census=rules.census.output[0],
        interventions=INTERVENTION_OUTPUTS,
    output:
        TABLE_FILES,
    log:
        f"{LOGS}/tables.log",
    conda:
        ENV
    params:
        **RUN_SELECTION,
        interventions=INTERVENTION_SELECTION,
        out_dir=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "attnid tables --runs {params.runs} {params.sweep_runs} --census {input.census:q} {params.interventions}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule figures:
    input:
        tables=TABLE_FILES,
        studies=STUDY_TABLE_FILES,
        runs=RUN_OUTPUTS,
        interventions=INTERVENTION_OUTPUTS,
        counts=rules.counts.output.counts,
        nullity=rules.verify.output[0],
    output:
        [
            report(
                f"{FIGURES_DIR}/fig{i}.png",
                caption=FIGURE_CAPTIONS[i],
                category="Figures",
            )
            for i in FIGURE_NUMBERS
        ],
        [f"{FIGURES_DIR}/fig{i}.pdf" for i in FIGURE_NUMBERS],
        [f"{FIGURES_DIR}/fig6.rst"] if INTERVENTIONS else [],
    log:
        f"{LOGS}/figures.log",
    conda:
        ENV
    params:
        **RUN_SELECTION,
        tables=lambda wildcards, input: os.path.dirname(input.tables[0]),
        theory=lambda wildcards, input: os.path.dirname(input.nullity),
        out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        studies="" if STUDY_RUN_DIRS else "--no-studies",
        interventions=INTERVENTION_SELECTION,
    shell:
        "attnid figures --tables {params.tables:q} --runs {params.runs} {params.studies} {params.interventions}"
        " --theory-dir {params.theory:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# The LaTeX main document's source stays paper/main.tex; each config compiles its own copy,
# next to its appendix.tex.
rule paper_main:
    input:
        "paper/main.tex",
    output:
        f"{PAPER_DIR}/main.tex",
    log:
        f"{LOGS}/paper_main.log",
    conda:
        ENV
    shell:
        "(cp {input:q} {output:q}.tmp && mv {output:q}.tmp {output:q}) > {log:q} 2>&1"


rule appendix:
    input:
        counts=rules.counts.output.counts,
        single_head=rules.counts.output.single_head,
        whole_model=rules.counts.output.whole_model,
        census=rules.census.output[0],
        nullity=rules.verify.output[0],
        tables=TABLE_FILES,
        studies=STUDY_TABLE_FILES,
        edits=EDITS_TABLE_FILES,
        interventions=INTERVENTION_TABLE_FILES,
        figures=rules.figures.output,
        main=rules.paper_main.output,
    output:
        **({"pdf": f"{PAPER_DIR}/main.pdf"} if want_pdf() else {}),
        appendix=f"{PAPER_DIR}/appendix.tex",
    log:
        f"{LOGS}/appendix.log",
    conda:
        ENV
    params:
        tables=lambda wildcards, input: os.path.dirname(input.tables[0]),
        figures=lambda wildcards, input: os.path.dirname(input.figures[0]),
        pdf="--pdf" if want_pdf() else "",
        omit=f"--omit {' '.join(OMITTED_PARTS)}" if OMITTED_PARTS else "",
    shell:
        "attnid appendix --counts {input.counts:q} --nullity {input.nullity:q} --single-head {input.single_head:q}"
        " --whole-model {input.whole_model:q} --census {input.census:q}"
        " --out {output.appendix:q} --experiment-tables {params.tables:q} --figures {params.figures:q}"
        " {params.omit} {params.pdf} > {log:q} 2>&1"
