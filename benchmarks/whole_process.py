"""Whole-process time of ``attnid train`` against a nanoGPT-style ``train.py``, side by side, and where it
goes.

Both train the default config's model (4 layers, 4 heads, E=128, block 64, batch 12, AdamW, lr 1e-3,
one thread) for ``--max-iters`` steps with nanoGPT's evaluation (``--eval-iters`` 20 batches per
split at step 0 and every ``--eval-every`` 250 steps), a checkpoint at each evaluation after step 0
and the loss read every 10 steps. The nanoGPT-style process is written here (nanoGPT's ``train.py``
reduced to what it runs in this setting: a fresh ``np.memmap`` per batch, ``estimate_loss`` over random
batches, ``torch.save`` of model, optimizer and config when the validation loss improves); it uses
attnid's copy of nanoGPT's model, so the two differ only in the loop around it. ``attnid train`` runs
as the pipeline runs it (``python -m attnid train``), three ways: every metric on the training thread
(the default), every metric on a worker thread (``--metrics-threads 1``) and ``--no-metrics``.

Each process is started fresh (imports included) and timed on the wall clock; rounds interleave the
four; medians. It prints the whole-process ratios (target <= 1.05) and, from one more run of each
with its phases timed in-process, where the time goes: start-up (imports, data, model, optimizer,
trackers), the evaluations, the checkpoint writes, the training steps and the end (outputs).

    python benchmarks/whole_process.py [--data DIR] [--max-iters 500] [--rounds 3] [--eval-every 250]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()  # the phases below count from here (the interpreter's own start-up is not in it)

MODEL = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
VARIANTS = ("nanogpt", "attnid", "attnid-overlap", "attnid-no-metrics")


# --------------------------------------------------------------------------------------
# A nanoGPT-style train.py process
# --------------------------------------------------------------------------------------


def nanogpt_style_process(
    data_dir: Path, out_dir: Path, max_iters: int, eval_every: int, eval_iters: int, phases: dict
) -> None:
    """nanoGPT's training process for the CPU config: what its train.py does, step by step."""
    import numpy as np
    import torch

    from attnid.model.gpt import GPT, GPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(1337)
    block, batch = MODEL["block_size"], MODEL["batch_size"]
    vocab_size = int(json.loads((data_dir / "meta.json").read_text())["vocab_size"])
    model_args = dict(
        n_layer=MODEL["n_layer"],
        n_head=MODEL["n_head"],
        n_embd=MODEL["n_embd"],
        block_size=block,
        bias=False,
        vocab_size=vocab_size,
        dropout=0.0,
    )
    model = GPT(GPTConfig(**model_args))
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3, betas=(0.9, 0.99))
    lr, min_lr, warmup = 1e-3, 1e-4, min(100, max_iters // 10)

    def get_batch(split):
        data = np.memmap(
            data_dir / f"{split}.bin", dtype=np.uint16, mode="r"
        )  # reopened per batch, as nanoGPT
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix])
        return x, y

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                _, loss = model(*get_batch(split))
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it):
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        ratio = (it - warmup) / (max_iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

    phases["start-up"] = time.perf_counter() - START
    best_val_loss, x, y = 1e9, *get_batch("train")
    for iter_num in range(max_iters + 1):
        if iter_num % eval_every == 0 or iter_num == max_iters:
            started = time.perf_counter()
            losses = estimate_loss()
            phases["evaluation"] = phases.get("evaluation", 0.0) + time.perf_counter() - started
            if losses["val"] < best_val_loss and iter_num > 0:
                started = time.perf_counter()
                best_val_loss = losses["val"]
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "model_args": model_args,
                        "iter_num": iter_num,
                        "best_val_loss": best_val_loss,
                        "config": dict(MODEL),
                    },
                    out_dir / "ckpt.pt",
                )
                phases["checkpoints"] = phases.get("checkpoints", 0.0) + time.perf_counter() - started
        if iter_num == max_iters:
            break
        for group in optimizer.param_groups:
            group["lr"] = get_lr(iter_num)
        _, loss = model(x, y)
        x, y = get_batch("train")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % 10 == 0:
            loss.item()


# --------------------------------------------------------------------------------------
# attnid train, whole and by phase
# --------------------------------------------------------------------------------------


def attnid_flags(data_dir: Path, out_dir: Path, args, variant: str) -> list[str]:
    flags = [
        "--data",
        str(data_dir),
        "--out",
        str(out_dir),
        "--case",
        "adamw",
        "--lr",
        "1e-3",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--max-iters",
        str(args.max_iters),
        "--eval-every",
        str(args.eval_every),
        "--ckpt-every",
        str(args.eval_every),
        "--eval-iters",
        str(args.eval_iters),
        "--fresh",
        "--progress-every",
        "1e9",
    ]
    flags += [x for key, value in MODEL.items() for x in (f"--{key.replace('_', '-')}", str(value))]
    if variant == "attnid-overlap":
        flags += ["--metrics-threads", "1"]
    if variant == "attnid-no-metrics":
        flags += ["--no-metrics"]
    return flags


def attnid_phases(data_dir: Path, out_dir: Path, args, variant: str, phases: dict) -> None:
    """``attnid train`` in this process, with its phases timed around the Run's methods."""
    from attnid.cli import main as attnid_main
    from attnid.training import rundir, train

    def timed(owner, name, phase):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started

        setattr(owner, name, wrapper)

    timed(train.Run, "evaluate", "evaluation")
    timed(train.Run, "save_checkpoint", "checkpoints")
    timed(rundir, "write_outputs", "outputs")
    original_start = train.Run.start_clocks

    def start_clocks(run):
        phases["start-up"] = time.perf_counter() - START
        original_start(run)

    train.Run.start_clocks = start_clocks
    assert attnid_main(["train", *attnid_flags(data_dir, out_dir, args, variant)]) == 0


def whole_process(data_dir: Path, args, variant: str) -> float:
    """Wall seconds of one fresh process, interpreter start-up included."""
    with tempfile.TemporaryDirectory() as out:
        if variant == "nanogpt":
            command = [
                sys.executable,
                __file__,
                "--process",
                "nanogpt",
                "--data",
                str(data_dir),
                "--out",
                out,
                "--max-iters",
                str(args.max_iters),
                "--eval-every",
                str(args.eval_every),
                "--eval-iters",
                str(args.eval_iters),
            ]
        else:
            command = [
                sys.executable,
                "-m",
                "attnid",
                "train",
                *attnid_flags(data_dir, Path(out), args, variant),
            ]
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, text=True, check=True)
        return time.perf_counter() - started


def phases_of(data_dir: Path, args, variant: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            __file__,
            "--process",
            variant,
            "--phases",
            "--data",
            str(data_dir),
            "--out",
            out,
            "--max-iters",
            str(args.max_iters),
            "--eval-every",
            str(args.eval_every),
            "--eval-iters",
            str(args.eval_iters),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="prepared data directory (default: prepared here)")
    parser.add_argument("--max-iters", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--process", choices=VARIANTS, help=argparse.SUPPRESS)  # one process (internal)
    parser.add_argument("--phases", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.process:
        phases: dict = {}
        if args.process == "nanogpt":
            nanogpt_style_process(
                args.data, args.out, args.max_iters, args.eval_every, args.eval_iters, phases
            )
        else:
            attnid_phases(args.data, args.out, args, args.process, phases)
        phases["total"] = time.perf_counter() - START
        if args.phases:
            print(json.dumps(phases))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            from attnid.training.data import prepare

            data_dir = Path(tmp) / "data"
            prepare(Path(__file__).resolve().parents[1] / "assets" / "tinyshakespeare.txt", data_dir)
        walls = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name in VARIANTS:
                walls[name].append(whole_process(data_dir, args, name))
        breakdown = {name: phases_of(data_dir, args, name) for name in VARIANTS}

    median = {name: statistics.median(walls[name]) for name in VARIANTS}
    print(
        f"default model {MODEL}, AdamW, 1 thread, {args.max_iters} steps, eval every {args.eval_every} steps "
        f"({args.eval_iters} batches per split) and a checkpoint at each; {args.rounds} interleaved rounds "
        f"of fresh processes, wall clock (medians, s)"
    )
    for name in VARIANTS:
        print(f"  {name:>18}: {median[name]:7.2f}   (rounds: {', '.join(f'{w:.2f}' for w in walls[name])})")
    for name in VARIANTS[1:]:
        print(f"whole process, {name} / nanogpt: {median[name] / median['nanogpt']:.3f}   (target <= 1.05)")
    print(
        "where the time goes, one more process of each (s; start-up: from the script's first line to the "
        "first step; steps: the rest):"
    )
    columns = ("start-up", "evaluation", "checkpoints", "outputs", "steps", "total")
    print("  " + " " * 18 + "".join(f"{c:>12}" for c in columns))
    for name, phases in breakdown.items():
        phases["steps"] = phases["total"] - sum(phases.get(c, 0.0) for c in columns[:4])
        print(f"  {name:>18}" + "".join(f"{phases.get(c, 0.0):12.2f}" for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
