"""The Python half of ``benchmarks/gpu_check.sh``: train flags from a config, one measured run, the summary.

    python benchmarks/gpu_check_summary.py flags --config config/paper.yaml --case sgd --steps 200
    python benchmarks/gpu_check_summary.py measure --result RUN/gpu_check.json --dtype bf16 --metrics on \
        -- train --data DIR --out RUN ...
    python benchmarks/gpu_check_summary.py summarize --out summary.tsv RUN_DIR...

``flags`` prints the ``attnid train`` flags of the config's model and of one case, for a
short timing run: evaluation and checkpoints only at the start and the end.

``measure`` runs ``attnid`` in this process (so that it can read the peak memory
afterwards) and writes RESULT (JSON: exit status, peak memory, device name, labels).

``summarize`` reads each run directory's ``metrics.csv``, ``run.json`` and
``gpu_check.json`` and writes the summary: ``#`` comment lines, then one
tab-separated header row and one row per run, with these columns:

    dtype        the requested training precision (bf16, float32, float64, or "default"
                 where this attnid has no --dtype flag)
    metrics      host or device (rho, beta, tau, mu every log step, their linear algebra on the host's CPU
                 threads or on the device: --metrics-device; with the config's metrics_threads, e.g. a
                 host thread beside the GPU), host-sync (on the host, --metrics-threads 0: the training
                 thread waits for them), on (where this attnid has no --metrics-device) or off
                 (--no-metrics)
    case         optimizer case
    steps        optimizer steps run
    status       completed | diverged | failed (rc N) | timeout
    ms_per_step  wall ms per step between the second logged row and the last row before the final
                 evaluation (CUDA start-up, the first steps and the evaluations excluded; with
                 metrics on it includes their cost at the log rows)
    max_rho_qk   largest per-step rho of the query-key circuit (design.md §3.1)
    max_rho_ov   the same for the output-value circuit
    max_tau      largest tau (design.md §3.3)
    max_drift1_qk, max_drift1_ov
                 largest first-order imbalance drift (design.md §7; zero up to the training precision's
                 round-off for plain SGD); NA where this attnid does not log it
    e1_rho       pass | fail: max_rho_qk < RHO_SGD_MAX (the tables' E1 threshold); only for case sgd;
                 n/a (dtype) below float64, which cannot resolve it
    e3_tau       pass | fail: max_tau < TAU_MAX (the tables' E3 threshold)
    peak_mb      peak memory in MiB: torch.cuda.max_memory_allocated() on CUDA (tensors only, without the
                 CUDA context and the allocator's cache), the process's peak RSS on the CPU
    peak_source  cuda_max_allocated | cpu_max_rss
    run_dtype    the precision run.json records, to confirm the flag took effect
    final_val_loss  validation loss at the last step

A value that was not measured is ``NA``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import resource
import sys
import time
from pathlib import Path

import yaml

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "dropout", "bias")
CASE_KEYS = ("lr", "weight_decay", "momentum", "rebalance_every", "rebalance_target")
COLUMNS = (
    "dtype",
    "metrics",
    "case",
    "steps",
    "status",
    "ms_per_step",
    "max_rho_qk",
    "max_rho_ov",
    "max_tau",
    "max_drift1_qk",
    "max_drift1_ov",
    "e1_rho",
    "e3_tau",
    "peak_mb",
    "peak_source",
    "run_dtype",
    "final_val_loss",
)
RESULT_FILE = "gpu_check.json"


def _flag(key: str, value) -> str:
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return name if value else "--no-" + key.replace("_", "-")
    return f"{name} {value}"


def train_flags(config: dict, case: str, steps: int) -> list[str]:
    """Model and case settings of a Snakemake config, and a schedule that fits ``steps``."""
    if case not in config.get("cases", {}):
        raise SystemExit(
            f"gpu_check: case {case!r} is not in the config's cases ({', '.join(config['cases'])})"
        )
    settings = {key: config["model"][key] for key in MODEL_KEYS if key in config["model"]}
    settings.update({key: value for key, value in config["cases"][case].items() if key in CASE_KEYS})
    training = config.get("training", {})
    log_every = int(training.get("log_every", 10))
    if steps < 10 * log_every:  # a short dry run still gets a few timed rows
        log_every = max(1, steps // 5)
    warmup = int(training.get("warmup_iters", 0))
    # the config's metrics schedule (a tau cadence, metrics threads), where it sets one
    settings.update({key: training[key] for key in ("tau_every", "metrics_threads") if key in training})
    settings.update(
        case=case,
        threads=int(config.get("threads", 1)),
        max_iters=steps,
        log_every=log_every,
        warmup_iters=warmup if warmup < steps else steps // 10,
        eval_every=steps,
        ckpt_every=steps,
    )  # evaluations and checkpoints at the start and end only
    return [_flag(key, value) for key, value in settings.items()]


def measure(result_path: Path, labels: dict, attnid_args: list[str]) -> int:
    """Run ``attnid ARGS`` in this process; record its exit status and peak memory."""
    import torch

    from attnid.cli import main

    started = time.time()
    result = {**labels, "rc": 1, "args": attnid_args}
    try:
        result["rc"] = main(attnid_args)
    finally:
        result["wall_s"] = time.time() - started
        if torch.cuda.is_initialized():
            result.update(
                peak_mb=torch.cuda.max_memory_allocated() / 2**20,
                peak_source="cuda_max_allocated",
                device_name=torch.cuda.get_device_name(),
            )
        else:
            # ru_maxrss is in KiB on Linux
            result.update(
                peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                peak_source="cpu_max_rss",
                device_name="cpu",
            )
        result_path.parent.mkdir(parents=True, exist_ok=True)
        result_path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return int(result["rc"])


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _column_max(rows: list[dict], column: str) -> float:
    values = [_number(row.get(column)) for row in rows]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else math.nan


def ms_per_step(rows: list[dict]) -> float:
    """Wall ms per step over the logged rows between the first timed row and the final evaluation."""
    timed = [row for row in rows if _number(row["step"]) > 0 and math.isnan(_number(row.get("val_loss")))]
    timed = timed[1:]  # the first interval holds CUDA start-up and the first, slow steps
    if len(timed) < 2:
        return math.nan
    steps = _number(timed[-1]["step"]) - _number(timed[0]["step"])
    return 1000 * (_number(timed[-1]["wall_s"]) - _number(timed[0]["wall_s"])) / steps


def _verdict(value: float, threshold: float, applies: bool, resolved: bool = True) -> str:
    """pass / fail, NA where the claim does not apply, and the tables' "not applicable (dtype)" where the
    run's precision cannot resolve the threshold (E1's rho < 1e-20 needs float64)."""
    if not applies or math.isnan(value):
        return "NA"
    if not resolved:
        return "n/a (dtype)"
    return "pass" if value < threshold else "fail"


def summary_row(run_dir: Path) -> dict:
    from attnid.reports.claims import FLOAT64_ONLY, RHO_SGD_MAX, TAU_MAX, resolves

    result = json.loads((run_dir / RESULT_FILE).read_text(encoding="utf-8"))
    run = (
        json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        if (run_dir / "run.json").is_file()
        else {}
    )
    rows = _read_rows(run_dir / "metrics.csv")
    if run:
        status = run.get("status", "NA")
    else:
        status = "timeout" if result.get("rc") in (124, 143) else f"failed (rc {result.get('rc')})"
    metrics_on = result.get("metrics") != "off"
    max_rho_qk, max_tau = _column_max(rows, "rho_qk"), _column_max(rows, "tau")
    return {
        "dtype": result.get("dtype"),
        "metrics": result.get("metrics"),
        "case": result.get("case"),
        "steps": run.get("steps_completed", "NA"),
        "status": status,
        "ms_per_step": ms_per_step(rows),
        "max_rho_qk": max_rho_qk,
        "max_rho_ov": _column_max(rows, "rho_ov"),
        "max_tau": max_tau,
        "max_drift1_qk": _column_max(rows, "drift1_qk"),
        "max_drift1_ov": _column_max(rows, "drift1_ov"),
        "e1_rho": _verdict(
            max_rho_qk,
            RHO_SGD_MAX,
            metrics_on and result.get("case") == "sgd",
            resolves(str(run.get("dtype", result.get("dtype"))), FLOAT64_ONLY),
        ),
        "e3_tau": _verdict(max_tau, TAU_MAX, metrics_on),
        "peak_mb": result.get("peak_mb"),
        "peak_source": result.get("peak_source"),
        "run_dtype": run.get("dtype", "NA"),
        "final_val_loss": run.get("final_val_loss"),
    }


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NA"
    if isinstance(value, float):
        return f"{value:.4g}" if 1e-3 <= abs(value) < 1e5 or value == 0 else f"{value:.3e}"
    return str(value)


def summarize(out: Path, run_dirs: list[Path], comments: list[str]) -> str:
    run_dirs = [d for d in run_dirs if (d / RESULT_FILE).is_file()]
    rows = [summary_row(d) for d in run_dirs]
    results = [json.loads((d / RESULT_FILE).read_text(encoding="utf-8")) for d in run_dirs]
    devices = sorted({result["device_name"] for result in results if result.get("device_name")})
    lines = [f"# {line}" for line in comments] + [f"# device: {', '.join(devices) or 'NA'}"]
    lines.append("\t".join(COLUMNS))
    lines += ["\t".join(_cell(row[column]) for column in COLUMNS) for row in rows]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    flags = sub.add_parser("flags", help="attnid train flags of a config's model and case")
    flags.add_argument("--config", required=True)
    flags.add_argument("--case", required=True)
    flags.add_argument("--steps", type=int, required=True)
    run = sub.add_parser("measure", help="run attnid ARGS in this process and record its peak memory")
    run.add_argument("--result", required=True, type=Path)
    run.add_argument("--dtype", required=True)
    run.add_argument("--metrics", required=True, choices=("host", "host-sync", "device", "on", "off"))
    run.add_argument("--case", required=True)
    run.add_argument("attnid_args", nargs=argparse.REMAINDER)
    summary = sub.add_parser("summarize", help="the TSV summary of measured runs")
    summary.add_argument("--out", required=True, type=Path)
    summary.add_argument("--comment", action="append", default=[])
    summary.add_argument("run_dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "flags":
        config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
        print(" ".join(train_flags(config, args.case, args.steps)))
        return 0
    if args.command == "measure":
        attnid_args = args.attnid_args[1:] if args.attnid_args[:1] == ["--"] else args.attnid_args
        return measure(
            args.result, {"dtype": args.dtype, "metrics": args.metrics, "case": args.case}, attnid_args
        )
    sys.stdout.write(summarize(args.out, args.run_dirs, args.comment))
    return 0


if __name__ == "__main__":
    sys.exit(main())
