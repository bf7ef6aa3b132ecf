# One training job per (case, seed) and per sweep point (optimizer, lr, seed).
#
# Only metrics.csv and run.json are declared outputs: the run's ckpt.pt is not, so a
# failed or killed job keeps its checkpoint and the rerun resumes from it. A diverged
# run is a finished job (exit 0, run.json status "diverged").

import os

CASES = list(config["cases"])
SEEDS = list(config["seeds"])


def lr_label(lr):
    """The learning rate as it appears in a sweep path: 0.001, 1e-06, 1000000."""
    return f"{float(lr):.10g}"


# Every (optimizer, lr, seed) of the sweeps, keyed by its run directory.
SWEEP_POINTS = {
    f"results/sweep/{optimizer}/lr{lr_label(lr)}/seed{seed}": (optimizer, lr, seed)
    for optimizer, sweep in config["sweep"].items()
    for lr in sweep["lrs"]
    for seed in sweep["seeds"]
}
RUN_DIRS = [f"results/runs/{case}/seed{seed}" for case in CASES for seed in SEEDS]
SWEEP_DIRS = list(SWEEP_POINTS)


def run_settings(case, **overrides):
    """Model + training defaults, then the case's own settings, then per-job overrides."""
    settings = dict(config["model"])
    settings.update(config["training"])
    settings.update(config["cases"][case])
    settings.update(overrides)
    return settings


def train_flags(case, settings):
    """The `attnid train` flags for one run: the one command builder for runs and sweeps."""
    flags = [f"--case {case}"]
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{key.replace('_', '-')}")
        else:
            flags.append(f"{flag} {value}")
    return " ".join(flags)


def case_flags(wildcards):
    return train_flags(wildcards.case, run_settings(wildcards.case, seed=int(wildcards.seed)))


def sweep_flags(wildcards):
    sweep = config["sweep"][wildcards.optimizer]
    overrides = {key: value for key, value in sweep.items() if key not in ("lrs", "seeds")}
    settings = run_settings(wildcards.optimizer, lr=float(wildcards.lr), seed=int(wildcards.seed), **overrides)
    return train_flags(wildcards.optimizer, settings)


TRAIN_RESOURCES = {"mem_mb": config["resources"]["mem_mb"], "runtime": config["resources"]["runtime"]}
if config["device"] == "cuda":
    TRAIN_RESOURCES["gpu"] = config["resources"]["gpu"]

TRAIN_SHELL = (
    "attnid train --data {DATA_DIR} {params.flags} --threads {threads} --device {params.device}"
    " --out {params.out_dir:q} > {log:q} 2>&1"
)


rule train_case:
    input:
        rules.prepare_data.output,
    output:
        metrics="results/runs/{case}/seed{seed}/metrics.csv",
        run="results/runs/{case}/seed{seed}/run.json",
    params:
        flags=case_flags,
        device=config["device"],
        out_dir=lambda wildcards, output: os.path.dirname(output.run),
    wildcard_constraints:
        case="|".join(CASES),
        seed=r"\d+",
    threads: config["threads"]
    resources:
        **TRAIN_RESOURCES,
    log:
        "results/logs/runs/{case}/seed{seed}.log",
    benchmark:
        "results/benchmarks/runs/{case}/seed{seed}.tsv"
    shell:
        TRAIN_SHELL


rule train_sweep:
    input:
        rules.prepare_data.output,
    output:
        metrics="results/sweep/{optimizer}/lr{lr}/seed{seed}/metrics.csv",
        run="results/sweep/{optimizer}/lr{lr}/seed{seed}/run.json",
    params:
        flags=sweep_flags,
        device=config["device"],
        out_dir=lambda wildcards, output: os.path.dirname(output.run),
    wildcard_constraints:
        optimizer="|".join(config["sweep"]) or "none",
        lr=r"[0-9.e+-]+",
        seed=r"\d+",
    threads: config["threads"]
    resources:
        **TRAIN_RESOURCES,
    log:
        "results/logs/sweep/{optimizer}/lr{lr}/seed{seed}.log",
    benchmark:
        "results/benchmarks/sweep/{optimizer}/lr{lr}/seed{seed}.tsv"
    shell:
        TRAIN_SHELL
