# Tiny shakespeare: download (or copy from a file:// URL), check its sha256, encode.
# Shared by every config (it depends only on the URL's bytes, which the checksum pins).


rule fetch_data:
    output:
        f"{DATA_DIR}/input.txt",
    log:
        f"{DATA_LOGS}/fetch_data.log",
    conda:
        ENV
    params:
        url=config["data_url"],
        sha256=config["data_sha256"],
    shell:
        "attnid fetch --url {params.url:q} --sha256 {params.sha256} --out {output:q} > {log:q} 2>&1"


rule prepare_data:
    input:
        rules.fetch_data.output,
    output:
        train=f"{DATA_DIR}/train.bin",
        val=f"{DATA_DIR}/val.bin",
        meta=f"{DATA_DIR}/meta.json",
    log:
        f"{DATA_LOGS}/prepare_data.log",
    conda:
        ENV
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output.meta),
    shell:
        "attnid prepare --text {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
