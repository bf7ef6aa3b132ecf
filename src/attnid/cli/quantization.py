"""``attnid rotate``, ``attnid quant-report`` and ``attnid from-gguf``: the orbit as a quantization tool
(docs/design.md §16, docs/quantization.md)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from attnid.cli.argument_types import seed_number
from attnid.cli.checkpoints import EDIT_REPORT, FOLDER_HELP, check_load_memory, declare_edit_files
from attnid.common import outputs, progress
from attnid.common.errors import UserError
from attnid.common.files import write_json_atomic, write_text_atomic
from attnid.edits.options import (
    DEFAULT_QUANT_SETTINGS,
    OV_KINDS,
    QK_KINDS,
    RESIDUAL_KINDS,
    ROTATE_MOVES,
    STORED_DTYPE_NAMES,
)

# The edits import torch: each is imported in the function that runs it, so that `--help` answers at once.

# max |delta log p| on the probe that rotate accepts before it writes, by the dtype it writes
TOLERANCE = {"float64": 1e-4, "float32": 1e-3, "float16": 0.1, "bfloat16": 0.5}
# the moves themselves, in float64 (the census's forward): round-off, or a bug
EXACT_TOLERANCE = 1e-8
QUANT_REPORT = outputs.json_report("settings")  # attnid quant-report --json
QUANT_CSV = outputs.CSV


def _add_text_arguments(parser: argparse.ArgumentParser, calibration: int) -> None:
    parser.add_argument(
        "--text",
        type=Path,
        default=None,
        help="text to calibrate on (its first half) and to evaluate on (its second half); default: tiny "
        "shakespeare, its training part and its validation part",
    )
    parser.add_argument("--data", type=Path, default=None, help="prepared data folder of a character model")
    parser.add_argument(
        "--calibration-tokens",
        type=int,
        default=calibration,
        help="tokens of calibration text (default: %(default)s)",
    )
    parser.add_argument(
        "--length",
        type=int,
        default=256,
        help="tokens per window, at most the model's context (default: %(default)s)",
    )


def add_rotate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help=f"nanoGPT ckpt.pt, or {FOLDER_HELP}")
    parser.add_argument("--out", type=Path, required=True, help="where to write the moved copy, same format")
    parser.add_argument(
        "--moves",
        required=True,
        help=f"comma-separated, among {', '.join(ROTATE_MOVES)} (made in that order; residual implies "
        "fuse-norms)",
    )
    parser.add_argument(
        "--residual", choices=RESIDUAL_KINDS, default="hadamard", help="R1 (default %(default)s)"
    )
    parser.add_argument(
        "--seed", type=seed_number, default=0, help="seed of the random moves (default %(default)s)"
    )
    parser.add_argument(
        "--pick-seed",
        type=int,
        default=1,
        metavar="N",
        help="R1: the best of seeds SEED..SEED+N-1 on calibration text under --pick-setting (default 1: "
        "SEED)",
    )
    parser.add_argument(
        "--pick-setting", default="A4", help="what --pick-seed minimises (default %(default)s)"
    )
    parser.add_argument(
        "--ov", choices=OV_KINDS, default="optimized", help="the output-value move (default %(default)s)"
    )
    parser.add_argument(
        "--qk", choices=QK_KINDS, default="optimized", help="the query-key move (default %(default)s)"
    )
    parser.add_argument(
        "--keep-tied", action="store_true", help="refuse a move that would untie lm_head from the embedding"
    )
    parser.add_argument(
        "--dtype", choices=STORED_DTYPE_NAMES, default=None, help="store a Llama-family folder in this dtype"
    )
    parser.add_argument("--tolerance", type=float, default=None, help="largest probe |delta log p| to write")
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    parser.add_argument(
        "--probe-sequences",
        type=int,
        default=2,
        help="evaluation windows the function is checked on (default 2)",
    )
    _add_text_arguments(parser, calibration=512)


def run_rotate(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import HF_LLAMA, load_checkpoint, save_checkpoint
    from attnid.edits.heldout import calibration_and_evaluation
    from attnid.edits.hf_llama import LlamaCheckpoint, set_stored_dtype
    from attnid.edits.quant_eval import parse_setting
    from attnid.edits.quant_moves import RotateRequest, probe_change, requested_moves, rotate_whole
    from attnid.edits.whole_checkpoint import checkpoint_copy, write_whole_checkpoint

    declare_edit_files(args)
    parse_setting(args.pick_setting)
    check_load_memory(args.checkpoint)
    request = RotateRequest(
        moves=requested_moves([m.strip() for m in args.moves.split(",") if m.strip()]),
        residual=args.residual,
        seed=args.seed,
        pick_seeds=max(1, args.pick_seed),
        pick_setting=args.pick_setting,
        ov=args.ov,
        qk=args.qk,
        keep_tied=args.keep_tied,
    )
    progress.stage(f"reading {args.checkpoint}")
    checkpoint = load_checkpoint(args.checkpoint)
    if args.dtype is not None and checkpoint.kind != HF_LLAMA:
        raise UserError(
            f"--dtype rewrites Llama-family folders only; {args.checkpoint} is written in its own dtype"
        )
    progress.stage("encoding the calibration and evaluation text")
    calibration, evaluation, source = calibration_and_evaluation(
        checkpoint,
        args.text,
        args.data,
        args.length,
        args.probe_sequences * args.length,
        args.calibration_tokens,
        random_fallback=True,
    )
    probe = evaluation
    whole, report = rotate_whole(checkpoint, request, calibration, probe)
    moved = checkpoint_copy(checkpoint)
    write_whole_checkpoint(moved, whole)
    del whole
    if args.dtype is not None:
        assert isinstance(moved, LlamaCheckpoint)  # --dtype is refused above for the other formats
        set_stored_dtype(moved, args.dtype)
    dtype = str(next(iter(moved.tensors.values())).dtype).removeprefix("torch.")
    progress.stage("checking the function on the probe")
    change = probe_change(checkpoint, moved, probe)
    tolerance = args.tolerance if args.tolerance is not None else TOLERANCE.get(dtype, 1e-3)
    report.update({"input": str(args.checkpoint), "output": str(args.out), "stored_dtype": dtype})
    report.update({"probe": source, "probe_tokens": int(probe[:, 1:].numel()), "max_abs_dlogp": change})
    if not report["exact_max_abs_dlogp"] <= EXACT_TOLERANCE:
        raise UserError(
            f"the moves changed the float64 log-probabilities by {report['exact_max_abs_dlogp']:.3g} > "
            f"{EXACT_TOLERANCE:g}: not an orbit move of this model; nothing written"
        )
    if not change <= tolerance:
        raise UserError(
            f"the moved model's log-probabilities differ by {change:.3g} > {tolerance:g} on the probe "
            f"(stored as {dtype}); nothing written"
        )
    progress.stage(f"writing {args.out}")
    save_checkpoint(
        moved,
        args.out,
        record={"command": "rotate", **{k: v for k, v in report.items() if k not in ("input", "output")}},
    )
    lines = rotate_lines(report, request.moves, change, dtype, source, str(args.out))
    print("\n".join(lines))
    if args.json is not None:
        write_json_atomic(args.json, {"command": "rotate", **report}, EDIT_REPORT)
    return 0


def rotate_lines(report: dict, moves: tuple, change: float, dtype: str, source: str, out: str) -> list[str]:
    """What ``attnid rotate`` prints: the moves in the census's terms, the untying cost, the seed pick, the
    probe."""
    lines = [f"moves: {', '.join(moves)}", *report["notes"]]
    if report["untied_params"]:
        share = 100 * report["untied_params"] / report["params_before"]
        lines.append(
            f"untied lm_head from the embedding: +{report['untied_params']:,} parameters (+{share:.1f} %)"
        )
    if "seed_scores" in report:
        scores = ", ".join(f"{s}: {v:.4g}" for s, v in report["seed_scores"].items())
        lines.append(
            f"R1 seed {report['residual_seed']} picked on calibration {report['pick_setting']} KL ({scores})"
        )
    lines += [
        f"probe ({report['probe_tokens']} tokens of {source}): max |delta log p| "
        f"{report['exact_max_abs_dlogp']:.3g} in float64, {change:.3g} as written ({dtype}, the model's own "
        f"forward)",
        f"wrote {out}",
    ]
    return lines


def add_quant_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help=f"nanoGPT ckpt.pt, or {FOLDER_HELP}")
    parser.add_argument(
        "--settings",
        default=",".join(DEFAULT_QUANT_SETTINGS),
        help="comma-separated W<bits>, A<bits>[:sites], KV<bits>, K<bits>, V<bits> (sites: qkv, o, up, down; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--group", type=int, default=0, help="group size along the input axis (default 0: per channel/token)"
    )
    parser.add_argument(
        "--eval-tokens", type=int, default=1024, help="tokens of evaluation text (default %(default)s)"
    )
    parser.add_argument(
        "--orbit-points",
        action="store_true",
        help="also evaluate the orbit points of docs/quantization.md (shipped, fused, R1, R1+R2, attnid's "
        "moves) and the R1 seed study",
    )
    parser.add_argument(
        "--seeds", type=int, default=8, help="R1 seeds of the seed study; 0: none (default %(default)s)"
    )
    parser.add_argument(
        "--points",
        default=None,
        help="with --orbit-points: only these, comma-separated (default: all of docs/quantization.md's)",
    )
    parser.add_argument("--pick-setting", default="A4", help="the setting the seed study picks R1 for")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", type=Path, default=None, help="write the whole report as JSON here")
    output.add_argument("--csv", type=Path, default=None, help="write one row per point and setting here")
    _add_text_arguments(parser, calibration=512)


def run_quant_report(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import load_checkpoint
    from attnid.edits.heldout import calibration_and_evaluation
    from attnid.edits.quant_eval import parse_setting
    from attnid.edits.quant_study import ORBIT_POINTS, orbit_study, report_as_given

    rule = outputs.current()
    rule.read(args.checkpoint, args.text, args.data)
    rule.write(args.json, QUANT_REPORT, "--json")
    rule.write(args.csv, QUANT_CSV, "--csv")
    settings = [parse_setting(text) for text in args.settings.split(",") if text.strip()]
    parse_setting(args.pick_setting)
    for name, value in (
        ("--eval-tokens", args.eval_tokens),
        ("--calibration-tokens", args.calibration_tokens),
        ("--seeds", args.seeds + 1),
        ("--length", args.length),
    ):
        if value < 1:
            raise UserError(f"{name} must be positive, got {value}")
    if args.group < 0:
        raise UserError(f"--group must be 0 or positive, got {args.group}")
    points = None if args.points is None else [p.strip() for p in args.points.split(",") if p.strip()]
    unknown = [p for p in points or [] if p not in ORBIT_POINTS]
    if unknown:
        raise UserError(f"--points {', '.join(unknown)}: choose among {', '.join(ORBIT_POINTS)}")
    check_load_memory(args.checkpoint)
    progress.stage(f"reading {args.checkpoint}")
    checkpoint = load_checkpoint(args.checkpoint)
    progress.stage("encoding the calibration and evaluation text")
    calibration, evaluation, source = calibration_and_evaluation(
        checkpoint, args.text, args.data, args.length, args.eval_tokens, args.calibration_tokens
    )
    assert calibration is not None  # without random_fallback there is text
    if args.orbit_points:
        found = orbit_study(
            checkpoint, calibration, evaluation, settings, args.group, args.seeds, args.pick_setting, points
        )
    else:
        found = report_as_given(checkpoint, evaluation, settings, args.group)
    report = {
        "settings": [s.name for s in settings],
        "input": str(args.checkpoint),
        "group": args.group,
        "text": source,
        "calibration_tokens": int(calibration[:, 1:].numel()),
        "evaluation_tokens": int(evaluation[:, 1:].numel()),
        **found,
    }
    print(format_report(report))
    if args.json is not None:
        write_json_atomic(args.json, report, QUANT_REPORT)
    if args.csv is not None:
        write_text_atomic(args.csv, report_csv(report), QUANT_CSV)
    return 0


def report_csv(report: dict) -> str:
    """One line per point and setting: ``point,setting,kl,kl_max,loss,ppl``."""
    lines = ["point,setting,kl,kl_max,loss,ppl"]
    lines += [
        f"{row['point']},{row['setting']},{row['kl']:.6g},{row['kl_max']:.6g},{row['loss']:.6g},{row['ppl']:.6g}"
        for row in report["rows"]
    ]
    return "\n".join(lines) + "\n"


def format_report(report: dict) -> str:
    """The text report: KL per point and setting, the activations' kurtosis and max/rms, the seed study."""
    settings = ["float", *report["settings"]]
    points = list(dict.fromkeys(row["point"] for row in report["rows"]))
    by = {(row["point"], row["setting"]): row for row in report["rows"]}
    width = max(len(p) for p in points) + 2
    lines = [
        f"{report['input']}: KL(float || quantized) per token, nats ({report['evaluation_tokens']} "
        f"evaluation tokens of {report['text']}; group {report['group'] or 'per channel/token'})",
        "".ljust(width) + "".join(s.rjust(11) for s in settings[1:]) + "   ppl(float)",
    ]
    for point in points:
        values = "".join(f"{by[(point, s)]['kl']:11.4g}" for s in settings[1:])
        lines.append(point.ljust(width) + values + f"   {by[(point, 'float')]['ppl']:.4g}")
    lines.append(
        "activations (inputs of the linear layers): kurtosis max over layers, max/rms max over layers"
    )
    for point in points:
        cells = []
        for site in ("qkv", "o", "up", "down"):
            found = [a for a in report["activations"] if a["point"] == point and a["site"] == site]
            if found:
                kurt = max(a["kurtosis"] for a in found)
                ratio = max(a["max_over_rms"] for a in found if not math.isnan(a["max_over_rms"]))
                cells.append(f"{site} {kurt:.3g} / {ratio:.3g}")
        lines.append(point.ljust(width) + "; ".join(cells))
    if "seeds" in report:
        seeds = report["seeds"]
        lines.append(
            f"R1 seeds under {seeds['setting']}: picked seed {seeds['picked_seed']} on calibration, "
            f"evaluation KL {seeds['picked_evaluation_kl']:.4g}, median seed "
            f"{seeds['median_evaluation_kl']:.4g} "
            f"({seeds['median_over_picked']:.2f}x)"
        )
    return "\n".join(lines)


def add_from_gguf_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gguf", type=Path, help="a GGUF file of a Llama-family model")
    parser.add_argument("--out", type=Path, required=True, help="the Hugging Face folder to write (float32)")


def run_from_gguf(args: argparse.Namespace) -> int:
    # lazy: torch and transformers, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.gguf_import import write_gguf_folder

    rule = outputs.current()
    rule.read(args.gguf)
    progress.stage(f"dequantizing {args.gguf}")
    found = write_gguf_folder(args.gguf, args.out)
    print(json.dumps(found))
    return 0
