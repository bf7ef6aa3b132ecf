# Tiny shakespeare: download (or copy from a file:// URL), check its sha256, encode.

DATA_DIR = "data/tinyshakespeare"


rule fetch_data:
    output:
        f"{DATA_DIR}/input.txt",
    params:
        url=config["data_url"],
        sha256=config["data_sha256"],
    log:
        "results/logs/fetch_data.log",
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
        "results/logs/prepare_data.log",
    shell:
        "attnid prepare --text {input:q} --out-dir {DATA_DIR} > {log:q} 2>&1"
