"""``attnid align``, ``attnid compare`` and ``attnid barrier``: two checkpoints of one architecture (nanoGPT
``ckpt.pt`` files, or Hugging Face GPT-2, Llama, Mistral, Qwen2 or Gemma folders),
B moved along its symmetry orbit to the point nearest A (:mod:`attnid.edits.alignment`), what is left
between them, and the held-out loss along the straight line between them (:mod:`attnid.edits.barrier`);
docs/design.md §17 and §18."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnid.cli.argument_types import seed_number, thread_count
from attnid.cli.checkpoints import add_heldout_arguments, check_load_memory, stored_dtype_name
from attnid.cli.reports import declare_report_files, written_by
from attnid.common import outputs, progress
from attnid.common.errors import UserError
from attnid.common.files import write_json_atomic

if TYPE_CHECKING:
    from attnid.edits.checkpoint_types import Checkpoint
    from attnid.edits.whole_checkpoint import WholeCheckpoint

# The alignment imports torch: it is imported in the function that runs it, so that `--help` answers at once.

ALIGN_REPORT = outputs.json_report("command")  # the --json of align


def _add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="the reference: nanoGPT ckpt.pt or a Hugging Face folder")
    parser.add_argument("b", type=Path, help="the model moved along its orbit: A's format and shape")
    parser.add_argument(
        "--classes",
        default=None,
        help="comma-separated among stream, stream_rotation, heads, mlp, ov, qk, ov_gl, qk_gl, norm_gain "
        "(made in that order), or all (the default): every class the architecture has; leave out ov_gl and "
        "qk_gl for speed on two trained runs (their Newton solve: docs/design.md §17)",
    )
    parser.add_argument(
        "--seed", type=seed_number, default=0, help="seed of the layer order and the probe (default 0)"
    )


def add_align_arguments(parser: argparse.ArgumentParser) -> None:
    _add_pair_arguments(parser)
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="where B aligned to A goes (B's format)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    _add_pair_arguments(parser)
    add_heldout_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of lines")


def add_barrier_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="one end of the line: nanoGPT ckpt.pt or a Hugging Face folder")
    parser.add_argument("b", type=Path, help="the other end, aligned to A at each level (A's format, shape)")
    parser.add_argument(
        "--classes",
        default=None,
        help="the all level's classes, as attnid align's --classes (default: every class the architecture "
        "has)",
    )
    parser.add_argument(
        "--points", type=int, default=11, help="values of t from 0 to 1, both included (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=seed_number, default=0, help="seed of the layer order and the probe (default 0)"
    )
    add_heldout_arguments(parser)
    parser.add_argument(
        "--threads", type=thread_count, default=1, help="torch threads (default: %(default)s)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")


def add_alignment_table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        nargs="+",
        required=True,
        help="attnid barrier reports, <study>/<group>/<pair>.json (group: a case or a point)",
    )
    parser.add_argument("--out-dir", required=True, help="where alignment.csv and alignment.tex go")


def _aligned_pair(args: argparse.Namespace):
    """Both checkpoints read, B aligned to A (not written), and the report."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.alignment import align_whole, parse_classes, read_pair
    from attnid.edits.checkpoints import load_checkpoint

    classes = parse_classes(args.classes)
    check_load_memory(args.a)
    check_load_memory(args.b)
    progress.stage(f"reading {args.a} and {args.b}")
    a, b = load_checkpoint(args.a), load_checkpoint(args.b)
    whole_a, whole_b = read_pair(a, b)
    progress.stage("aligning")
    moved, report = align_whole(whole_a, whole_b, classes, args.seed)
    return a, b, whole_a, moved, {"a": str(args.a), "b": str(args.b), **report}


def _alignment_lines(report: dict) -> list[str]:
    before = report["distance_before"]["total"]
    lines = [f"distance A-B {before:.6g} (relative {before / report['norm_a']:.4g})"]
    for step in report["steps"]:
        lines.append(
            f"after {step['class']}: {step['distance']['total']:.6g} "
            f"(share removed {100 * step['share_removed']:.2f} %)"
        )
    products = report["identified_products"]
    if products is not None:
        lines.append(f"identified products: W_Q^T W_K {products['qk']:.6g}, W_O W_V {products['ov']:.6g}")
    lines.append(f"float64 max |delta log p| {report['exact_max_abs_dlogp']:.3g}")
    functional = report.get("functional")
    if functional is not None:
        lines.append(
            f"KL(A || B) on held-out text {functional['kl_before']:.6g} nats per token; after the alignment "
            f"{functional['kl_after']:.6g} (the same function: change {functional['kl_change']:.2g})"
        )
    return lines


def read_whole(checkpoint: Checkpoint) -> WholeCheckpoint:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.whole_checkpoint import read_whole_checkpoint

    return read_whole_checkpoint(checkpoint)


BARRIER_REPORT = outputs.json_report("command", "levels")  # the --json of barrier


def run_barrier(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    import torch

    from attnid.edits.alignment import parse_classes, read_pair
    from attnid.edits.barrier import barrier_report, check_points
    from attnid.edits.checkpoints import load_checkpoint
    from attnid.edits.heldout import heldout_batch

    check_points(args.points)
    classes = parse_classes(args.classes)
    torch.set_num_threads(args.threads)
    rule = outputs.current()
    rule.read(args.a, args.b)
    rule.write(args.json, BARRIER_REPORT, "--json")
    check_load_memory(args.a)
    check_load_memory(args.b)
    progress.stage(f"reading {args.a} and {args.b}")
    a, b = load_checkpoint(args.a), load_checkpoint(args.b)
    whole_a, whole_b = read_pair(a, b)
    batch, source = heldout_batch(b, args)
    progress.stage(f"the loss along A-B at {args.points} points, three alignment levels")
    result = barrier_report(b, whole_a, whole_b, args.points, batch, args.seed, classes)
    result["alignment"] = {"a": str(args.a), "b": str(args.b), **result["alignment"]}
    result["alignment"]["functional"]["tokens"] = source
    report = {"command": "barrier", "a": str(args.a), "b": str(args.b), "tokens": source, **result}
    lines = [
        f"level {name}: barrier {level['barrier']:.4g} nats (loss at t=0 {level['loss'][0]:.4f}, "
        f"t=1 {level['loss'][-1]:.4f}, max {max(level['loss']):.4f})"
        for name, level in report["levels"].items()
    ]
    lines += _alignment_lines(report["alignment"])
    print("\n".join(lines))
    if args.json is not None:
        write_json_atomic(args.json, report, BARRIER_REPORT)
    return 0


def run_alignment_table(args: argparse.Namespace) -> int:
    # lazy: pandas, which --help must not import
    from attnid.reports.alignment_table import write_alignment_tables

    declare_report_files(args, *args.json)
    with written_by("attnid barrier --json"):
        rows = write_alignment_tables([Path(p) for p in args.json], Path(args.out_dir))
    print(f"wrote alignment.csv ({len(rows)} rows, {rows['pair'].nunique()} pairs) to {args.out_dir}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.barrier import LineEvaluator, functional_distance
    from attnid.edits.heldout import heldout_batch

    rule = outputs.current()
    rule.read(args.a, args.b)
    _, b, whole_a, moved, report = _aligned_pair(args)
    batch, source = heldout_batch(b, args)
    progress.stage("evaluating A, B and B aligned on the held-out batch")
    evaluator = LineEvaluator(b, batch)
    (loss_a, logits_a), (loss_b, logits_b) = evaluator(whole_a), evaluator(read_whole(b))
    functional = functional_distance(logits_a, logits_b, evaluator(moved)[1])
    report["functional"] = {"tokens": source, "loss_a": loss_a, "loss_b": loss_b, **functional}
    report = {"command": "compare", **report}
    print(json.dumps(report, indent=2) if args.json else "\n".join(_alignment_lines(report)))
    return 0


def _declare_like(rule: outputs.OutputRule, source: Path, out: Path) -> None:
    """``out`` written as ``source`` is: a Hugging Face folder's files (nothing outside ``--out``), or a
    nanoGPT file."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import HF_FOLDER, weight_format

    if source.is_dir():
        folder = rule.write_dir(out, "--out", HF_FOLDER)
        for item in sorted(source.iterdir()):
            if item.is_file():
                rule.write(folder / item.name, weight_format(item.name))
    else:
        rule.write(out, outputs.TORCH_ARCHIVE, "--out")


def _write_like(source: Checkpoint, moved: WholeCheckpoint, seed: int, out: Path, record: dict) -> float:
    """``moved`` written in ``source``'s files and dtype to ``out``, after checking that the stored copy
    keeps the float64 model's log-probabilities to :data:`AS_WRITTEN_DLOGP`; that change."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.alignment import probe_tokens
    from attnid.edits.checkpoints import save_checkpoint
    from attnid.edits.quant_moves import exact_log_probs
    from attnid.edits.whole_checkpoint import checkpoint_copy, read_whole_checkpoint, write_whole_checkpoint

    written = checkpoint_copy(source)
    write_whole_checkpoint(written, moved)
    stored = read_whole_checkpoint(written)
    tokens = probe_tokens(moved, seed)
    change = float((exact_log_probs(stored, tokens) - exact_log_probs(moved, tokens)).abs().max())
    if not change <= AS_WRITTEN_DLOGP:
        raise UserError(
            f"the moved weights rounded to {stored_dtype_name(source)} change log p by {change:.3g} "
            f"(> {AS_WRITTEN_DLOGP:g}); nothing written"
        )
    progress.stage(f"writing {out}")
    save_checkpoint(written, out, record=record)
    return change


def _read_released(path: Path) -> tuple[Checkpoint, WholeCheckpoint]:
    """The checkpoint at ``path`` in float64 census names, its stored tensors let go once read (its config
    and file lists kept): ``attnid align`` holds no more than two float64 models (docs/design.md §17)."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import load_checkpoint

    checkpoint = load_checkpoint(path)
    whole = read_whole(checkpoint)
    checkpoint.tensors = {}
    checkpoint.payload = {k: v for k, v in checkpoint.payload.items() if k != "model"}  # nanoGPT's tensors
    return checkpoint, whole


def run_align(args: argparse.Namespace) -> int:
    """B read, aligned in place, written; then the file as written read back and aligned again in place
    (the idempotence check): A and one float64 B at a time, plus B's stored tensors while it is written."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.alignment import (
        EXACT_DLOGP,
        align_whole,
        check_same_architecture,
        parse_classes,
        probe_tokens,
        stored_relative_move,
    )

    # lazy: torch, as above
    from attnid.edits.checkpoints import load_checkpoint, save_checkpoint
    from attnid.edits.quant_moves import exact_log_probs
    from attnid.edits.whole_checkpoint import read_whole_checkpoint, write_whole_checkpoint

    rule = outputs.current()
    rule.read(args.a, args.b)
    _declare_like(rule, args.b, args.out)
    rule.write(args.json, ALIGN_REPORT, "--json")
    classes = parse_classes(args.classes)
    check_load_memory(args.a)
    check_load_memory(args.b)
    progress.stage(f"reading {args.a} and {args.b}")
    a, whole_a = _read_released(args.a)
    b, moved = _read_released(args.b)
    check_same_architecture(a, b, whole_a, moved)
    progress.stage("aligning")
    moved, report = align_whole(whole_a, moved, classes, args.seed, in_place=True)
    report = {"a": str(args.a), "b": str(args.b), **report}
    assert report["exact_max_abs_dlogp"] <= EXACT_DLOGP
    tokens = probe_tokens(moved, args.seed)
    exact = exact_log_probs(moved, tokens)
    written = load_checkpoint(args.b)  # B's files and dtype again: its tensors were let go while aligning
    write_whole_checkpoint(written, moved)
    del moved  # the stored copy stands for it from here
    stored = read_whole_checkpoint(written)
    change = float((exact_log_probs(stored, tokens) - exact).abs().max())
    if not change <= AS_WRITTEN_DLOGP:
        raise UserError(
            f"the moved weights rounded to {stored_dtype_name(written)} change log p by {change:.3g} "
            f"(> {AS_WRITTEN_DLOGP:g}); nothing written"
        )
    report["as_written_max_abs_dlogp"] = change
    record = {"command": "align", **{k: report[k] for k in ("classes", "seed", "share_removed")}}
    progress.stage(f"writing {args.out}")
    save_checkpoint(written, args.out, record=record)
    progress.stage("aligning the written copy again (idempotence)")
    again, _ = align_whole(whole_a, stored, tuple(report["classes"]), args.seed, in_place=True, measure=False)
    report["realign_relative_move"] = stored_relative_move(written, again)
    report = {"command": "align", **report, "output": str(args.out)}
    lines = [*_alignment_lines(report), f"wrote {args.out}"]
    print("\n".join(lines))
    if args.json is not None:
        write_json_atomic(args.json, report, ALIGN_REPORT)
    return 0


def add_plant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="the model: nanoGPT ckpt.pt or a Hugging Face folder")
    parser.add_argument("--out", type=Path, required=True, help="where g A goes (A's format)")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed of g and the probe (default 0)")
    parser.add_argument(
        "--gl",
        action="store_true",
        help="per-group moves in GL(D) (with RoPE: the commutant) instead of orthogonal ones, which attnid "
        "align recovers with ov_gl and qk_gl (in its default classes)",
    )
    parser.add_argument(
        "--no-stream",
        action="store_true",
        help="leave out the residual stream's classes (its permutation, its rotation where lm_head is "
        "untied, the norms' gain scales, of mixed signs)",
    )


def run_plant(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.alignment import (
        ALIGN_CLASSES,
        EXACT_DLOGP,
        STREAM_CLASSES,
        align_refusal,
        classes_of,
        distances,
        norm_of,
        probe_tokens,
    )

    # lazy: torch, as above
    from attnid.edits.checkpoints import load_checkpoint
    from attnid.edits.planted import random_group_element
    from attnid.edits.quant_moves import exact_log_probs

    rule = outputs.current()
    rule.read(args.a)
    _declare_like(rule, args.a, args.out)
    check_load_memory(args.a)
    progress.stage(f"reading {args.a}")
    checkpoint = load_checkpoint(args.a)
    whole = read_whole(checkpoint)
    reason = align_refusal(whole, ("heads", "mlp") + (() if args.no_stream else ("stream", "norm_gain")))
    if reason is not None:
        raise UserError(reason)
    progress.stage("planting")
    planted = random_group_element(whole.clone(), args.seed, args.gl, stream=not args.no_stream)
    tokens = probe_tokens(whole, args.seed)
    change = float((exact_log_probs(planted, tokens) - exact_log_probs(whole, tokens)).abs().max())
    if not change <= EXACT_DLOGP:  # a defect of the moves, never of the input: said, nothing written
        raise UserError(f"the planted element changes the float64 log-probabilities by {change:.3g}")
    per_group = ("ov_gl", "qk_gl") if args.gl else ("ov", "qk")
    stream = () if args.no_stream else STREAM_CLASSES
    classes = [c for c in classes_of(whole, ALIGN_CLASSES) if c in ("heads", "mlp", *per_group, *stream)]
    record = {"command": "plant", "seed": args.seed, "gl": args.gl, "classes": classes}
    _write_like(checkpoint, planted, args.seed, args.out, record)
    moved = distances(whole, planted)["total"] / norm_of(whole)
    print(
        f"planted g of {', '.join(classes)}{' (GL(D) per group)' if args.gl else ''}, seed {args.seed}: "
        f"relative distance to A {moved:.4g}, float64 max |delta log p| {change:.3g}\nwrote {args.out}"
    )
    return 0


AS_WRITTEN_DLOGP = 1e-4  # the aligned copy as stored (its dtype), against the aligned float64 model
