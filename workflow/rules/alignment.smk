# Two runs that differ only in their seed, aligned along the symmetry orbit (docs/design.md §18,
# docs/experiments.md "The alignment stage"), from the config's `alignment` section: `attnid barrier` on
# every pair of seeds of each case's runs and of each heads-study point (attnid.plan.alignment; its report
# holds what `attnid compare` reports too, so one job per pair imports torch once), the table, its claim
# (read by `attnid tables`) and Figure 8. Without the section, or with no group of two seeds, no job.

from attnid.plan import alignment_pairs

# {pair name (<study>/<group>/seed<i>-seed<j>): the pair}
ALIGNMENT_PAIRS = {pair.name: pair for pair in alignment_pairs(config, PLAN)}
ALIGNMENT_SECTION = config.get("alignment") or {}


if ALIGNMENT_PAIRS:

    rule alignment_pair:
        input:
            a=lambda wildcards: f"{ALIGNMENT_PAIRS[wildcards.pair].run_a}/run.json",
            b=lambda wildcards: f"{ALIGNMENT_PAIRS[wildcards.pair].run_b}/run.json",
            meta=rules.prepare_data.output.meta,
        output:
            f"{RESULTS}/alignment/{{pair}}.json",
        log:
            f"{LOGS}/alignment/{{pair}}.log",
        benchmark:
            f"{BENCHMARKS}/alignment/{{pair}}.tsv"
        wildcard_constraints:
            pair="|".join(map(re.escape, ALIGNMENT_PAIRS)),
        conda:
            ENV
        threads: config["threads"]
        params:
            a=lambda wildcards, input: os.path.join(os.path.dirname(input.a), "ckpt.pt"),
            b=lambda wildcards, input: os.path.join(os.path.dirname(input.b), "ckpt.pt"),
            data=lambda wildcards, input: os.path.dirname(input.meta),
            points=ALIGNMENT_SECTION.get("points"),
            sequences=ALIGNMENT_SECTION.get("sequences"),
            classes=",".join(ALIGNMENT_SECTION.get("classes") or []),
        shell:
            "attnid barrier {params.a:q} {params.b:q} --classes {params.classes} --points {params.points}"
            " --sequences {params.sequences}"
            " --data {params.data:q} --threads {threads} --json {output:q} > {log:q} 2>&1"

    rule alignment_table:
        input:
            [f"{RESULTS}/alignment/{name}.json" for name in ALIGNMENT_PAIRS],
        output:
            [
                f"{TABLES_DIR}/{name}"
                for name in ("alignment.csv", "alignment_line.csv", "alignment.tex")
            ],
        log:
            f"{LOGS}/alignment_table.log",
        benchmark:
            f"{BENCHMARKS}/alignment/table.tsv"
        conda:
            ENV
        params:
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "attnid alignment-table --json {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# A planted element of every class of SmolLM2 (where the quantization section has `smollm2: true`), brought
# back by `attnid barrier --classes all` (docs/design.md §18): its report gives claims.csv two checks.
ALIGNMENT_PLANTED = (
    [f"{RESULTS}/alignment/planted/smollm2.json"]
    if ALIGNMENT_SECTION and QUANTIZATION and QUANTIZATION.get("smollm2")
    else []
)


if ALIGNMENT_PLANTED:

    rule alignment_plant_smollm2:
        input:
            model=rules.smollm2_folder.output,
        output:
            temp(directory(f"{RESULTS}/alignment/planted/smollm2_model")),
        log:
            f"{LOGS}/alignment/plant_smollm2.log",
        benchmark:
            f"{BENCHMARKS}/alignment/plant_smollm2.tsv"
        conda:
            ENV
        shell:
            "attnid plant {input.model:q} --out {output:q} --seed 7 > {log:q} 2>&1"

    rule alignment_planted_smollm2:
        input:
            model=rules.smollm2_folder.output,
            planted=rules.alignment_plant_smollm2.output,
            text=rules.fetch_data.output,
        output:
            ALIGNMENT_PLANTED[0],
        log:
            f"{LOGS}/alignment/planted_smollm2.log",
        benchmark:
            f"{BENCHMARKS}/alignment/planted_smollm2.tsv"
        conda:
            ENV
        threads: config["threads"]
        shell:
            "attnid barrier {input.model:q} {input.planted:q} --classes all --points 3 --sequences 2"
            " --length 64 --text {input.text:q} --threads {threads} --json {output:q} > {log:q} 2>&1"
