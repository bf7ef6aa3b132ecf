# Tables, figures, the report's pages and the LaTeX appendix, under the config's results_dir.
# Each figure is one module of attnid.reports.figures (the registry): the one `figure` rule draws figN from
# exactly the files its module's INPUTS names, and writes its caption filled with the build's numbers
# (figN.rst next to figN.png), which the report and the appendix show.
# `snakemake --report report.html` (with the build's --configfile) opens on the claims (the landing text
# report/index.rst), then has every figure with its caption, then the tables (rule report_pages).

from attnid.reports.figures import registry
from attnid.reports.report_pages import TABLE_PAGES, table_pages

# The alignment stage's tables (alignment.smk), where it has pairs, and its planted SmolLM2 report.
ALIGNMENT_TABLE_FILES = (
    list(rules.alignment_table.output) if rules.has("alignment_table") else []
)
PLANTED_REPORTS = (
    list(rules.alignment_planted_smollm2.output)
    if rules.has("alignment_planted_smollm2")
    else []
)

# The optional stages this config runs: a figure of a stage (its module's STAGE) is drawn only with it.
STAGES = {
    "studies": bool(STUDY_RUN_DIRS),
    "edits": bool(EDITS),
    "interventions": bool(INTERVENTIONS),
    "quantization": bool(QUANTIZATION),
    "alignment": bool(ALIGNMENT_TABLE_FILES),
}
FIGURES = {
    name: figure
    for name, figure in registry().items()
    if figure.stage is None or STAGES[figure.stage]
}
FIGURE_FILES = [
    f"{FIGURES_DIR}/{name}.{ext}" for name in FIGURES for ext in ("png", "pdf", "rst")
]
# What a figure's sources (attnid.reports.figures.inputs) are in this build: a folder and the files this
# build makes there (a figure reads those of its INPUTS that are among them: the calibration's table only
# where the config has a calibration), or the run directories of a group.
SOURCE_FOLDERS = {"theory": THEORY_DIR, "tables": TABLES_DIR}
SOURCE_FILES = {
    "theory": [*rules.counts.output, *rules.verify.output],
    "tables": list(
        dict.fromkeys(
            TABLE_FILES
            + STUDY_TABLE_FILES
            + EDITS_TABLE_FILES
            + INTERVENTION_TABLE_FILES
            + list(PROTOCOL_TABLES.values())
            + QUANTIZATION_TABLE_FILES
            + ALIGNMENT_TABLE_FILES
        )
    ),
}
SOURCE_RUNS = {
    "runs": RUN_DIRS,
    "intervention_runs": INTERVENTION_RUN_DIRS,
    "identity_runs": PLAN.identity_runs,
}
REPORT_DIR = f"{RESULTS}/report"
# The table pages of the report this build has: {page: its CSVs}.
REPORT_PAGES = table_pages(os.path.basename(path) for path in SOURCE_FILES["tables"])


report: os.path.abspath(f"{REPORT_DIR}/index.rst")


# The optional stages this config leaves out: their files of an earlier build are never shown
# (the interventions' table appears once the config has an interventions stage).
OMITTED_PARTS = [stage for stage, on in STAGES.items() if not on]


rule tables:
    input:
        runs=RUN_OUTPUTS,
        census=rules.census.output[0],
        nullity=rules.verify.output[0],
        interventions=INTERVENTION_OUTPUTS,
        protocol=list(PROTOCOL_TABLES.values()),
        quantization=QUANTIZATION_TABLE_FILES[:1],
        verdicts=INTERVENTION_TABLE_FILES[:1],
        alignment=ALIGNMENT_TABLE_FILES[:1],
        planted=PLANTED_REPORTS,
    output:
        TABLE_FILES,
    log:
        f"{LOGS}/tables.log",
    conda:
        ENV
    params:
        **RUN_SELECTION,
        interventions=INTERVENTION_SELECTION,
        protocol=" ".join(f"--{flag} {path}" for flag, path in PROTOCOL_TABLES.items()),
        quantization=lambda wildcards, input: (
            f"--quantization {input.quantization[0]}" if input.quantization else ""
        ),
        verdicts=lambda wildcards, input: (
            f"--verdicts {input.verdicts[0]}" if input.verdicts else ""
        ),
        alignment=lambda wildcards, input: (
            f"--alignment {input.alignment[0]}" if input.alignment else ""
        )
        + (f" --alignment-planted {input.planted[0]}" if input.planted else ""),
        out_dir=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "attnid tables --runs {params.runs} {params.sweep_runs} --census {input.census:q}"
        " --nullity {input.nullity:q} {params.interventions}"
        " {params.protocol} {params.quantization} {params.verdicts} {params.alignment} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule figure:
    input:
        lambda wildcards: FIGURES[wildcards.figure].input_files(
            SOURCE_FILES, SOURCE_RUNS
        ),
    output:
        png=f"{FIGURES_DIR}/{{figure}}.png",
        pdf=f"{FIGURES_DIR}/{{figure}}.pdf",
        caption=f"{FIGURES_DIR}/{{figure}}.rst",
    log:
        f"{LOGS}/figures/{{figure}}.log",
    wildcard_constraints:
        figure="|".join(FIGURES),
    conda:
        ENV
    params:
        sources=lambda wildcards: FIGURES[wildcards.figure].source_flags(
            SOURCE_FOLDERS, SOURCE_RUNS
        ),
        out_dir=lambda wildcards, output: os.path.dirname(output.png),
    shell:
        "attnid figures {wildcards.figure} {params.sources} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule report_pages:
    input:
        claims=f"{TABLES_DIR}/claims.csv",
        tables=[
            f"{TABLES_DIR}/{name}" for names in REPORT_PAGES.values() for name in names
        ],
        figures=[
            f"{FIGURES_DIR}/{name}.{ext}" for name in FIGURES for ext in ("png", "rst")
        ],
    output:
        index=f"{REPORT_DIR}/index.rst",
        claims=report(
            f"{REPORT_DIR}/claims.html",
            category="Claims",
            labels={
                "table": "claims",
                "shows": "every claim, its number and threshold",
            },
        ),
        figures=[
            report(
                f"{REPORT_DIR}/{name}.html",
                caption=os.path.abspath(f"{FIGURES_DIR}/{name}.rst"),
                category="Figures",
                labels={
                    "figure": f"Figure {figure.number}",
                    "shows": figure.title,
                },
            )
            for name, figure in FIGURES.items()
        ],
        tables=[
            report(
                f"{REPORT_DIR}/{page}.html",
                category="Tables",
                labels={
                    "table": TABLE_PAGES[page][0].split(":")[0],
                    "shows": TABLE_PAGES[page][0].split(": ")[1],
                },
            )
            for page in REPORT_PAGES
        ],
    log:
        f"{LOGS}/report_pages.log",
    conda:
        ENV
    params:
        tables=lambda wildcards, input: os.path.dirname(input.claims),
        figures=lambda wildcards, input: os.path.dirname(input.figures[0]),
        names=" ".join(FIGURES),
        pages=" ".join(REPORT_PAGES),
        title=f"the {os.path.basename(RESULTS)} build ({RESULTS})",
        out_dir=lambda wildcards, output: os.path.dirname(output.index),
    shell:
        "attnid report-pages --tables {params.tables:q} --figures {params.figures:q}"
        " --figure-names {params.names} --pages {params.pages} --title {params.title:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


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
        quantization=QUANTIZATION_TABLE_FILES,
        alignment=ALIGNMENT_TABLE_FILES,
        figures=[path for path in FIGURE_FILES if not path.endswith(".png")],
        main=rules.paper_main.output,
    output:
        **({"pdf": f"{PAPER_DIR}/main.pdf"} if WANT_PDF else {}),
        appendix=f"{PAPER_DIR}/appendix.tex",
    log:
        f"{LOGS}/appendix.log",
    conda:
        ENV
    params:
        tables=lambda wildcards, input: os.path.dirname(input.tables[0]),
        figures=lambda wildcards, input: os.path.dirname(input.figures[0]),
        pdf="--pdf" if WANT_PDF else "",
        omit=f"--omit {' '.join(OMITTED_PARTS)}" if OMITTED_PARTS else "",
    shell:
        "attnid appendix --counts {input.counts:q} --nullity {input.nullity:q} --single-head {input.single_head:q}"
        " --whole-model {input.whole_model:q} --census {input.census:q}"
        " --out {output.appendix:q} --experiment-tables {params.tables:q} --figures {params.figures:q}"
        " {params.omit} {params.pdf} > {log:q} 2>&1"
