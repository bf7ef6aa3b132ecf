"""``attnid inspect``, ``attnid prune-biases`` and ``attnid balance``: the theory on a checkpoint
(:mod:`attnid.measure.inspect`) and the function-preserving edits (:mod:`attnid.edits`), each edit
proved on a held-out batch before and after."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnid.common import outputs, progress
from attnid.common.errors import UserError
from attnid.common.files import write_json_atomic
from attnid.edits.options import BALANCE_TARGETS, STORED_DTYPE_NAMES

if TYPE_CHECKING:
    from attnid.edits.checkpoints import Checkpoint

# The edits and the measurements import torch: each is imported in the function that runs it, so that
# `--help` answers at once.

FOLDER_HELP = (
    "a Hugging Face folder (config.json + safetensors or pytorch_model.bin, sharded or not) of "
    "Llama, Mistral, Qwen2, Gemma or GPT-2"
)


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        type=Path,
        help=f"nanoGPT-format ckpt.pt (ours or nanoGPT's, compiled or not), or {FOLDER_HELP}",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    output.add_argument("--csv", action="store_true", help="print one CSV row per layer instead of a table")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="also draw mu_QK and mu_OV per layer (on the model's own orbits) to this PNG",
    )


def _inspect_file(path: Path) -> dict:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import load_checkpoint
    from attnid.measure.inspect import inspect_model
    from attnid.model.gpt import model_from_checkpoint

    progress.stage(f"reading {path}")
    checkpoint = load_checkpoint(path)
    try:
        model = model_from_checkpoint(dict(checkpoint.payload, model=checkpoint.tensors), str(path)).eval()
    except (KeyError, AttributeError, TypeError, ValueError) as err:
        raise UserError(f"{path} is not a usable nanoGPT checkpoint ({type(err).__name__}: {err})") from None
    try:
        report = inspect_model(model)
    except ValueError as err:  # a shape counts.py has no closed form for (e.g. heads wider than E)
        raise UserError(f"{path}: {err}") from None
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"format": "nanogpt", "dtype": dtype, **report}


def _inspect_folder(path: Path) -> dict:
    """A Hugging Face folder read without building its model: the pairs of its stored attention tensors."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.api import inspect_checkpoint
    from attnid.edits.checkpoints import load_checkpoint

    progress.stage(f"reading {path}")
    checkpoint = load_checkpoint(path)
    return {
        "format": checkpoint.kind,
        "model_type": checkpoint.payload.get("model_type"),
        "dtype": stored_dtype_name(checkpoint),
        **inspect_checkpoint(checkpoint),
    }


def run_inspect(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.measure.inspect import format_inspection, inspection_csv

    rule = outputs.current()
    rule.read(args.checkpoint)
    rule.write(args.plot, outputs.PNG, "--plot")
    report = _inspect_folder(args.checkpoint) if args.checkpoint.is_dir() else _inspect_file(args.checkpoint)
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.csv:
        print(inspection_csv(report), end="")
    else:
        print(format_inspection(report))
    if args.plot is not None:
        # lazy: matplotlib, which --help must not import (tests/cli/test_cli_help.py)
        from attnid.reports.inspect_figure import plot_inspection

        plot_inspection(report, args.plot, title=str(args.checkpoint))
    return 0


def add_edit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help=f"nanoGPT ckpt.pt, or {FOLDER_HELP}")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="where to write the edited copy, in the same format (a folder: the same shards)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    parser.add_argument(
        "--dtype",
        choices=STORED_DTYPE_NAMES,
        default=None,
        help="store a Llama-family folder's weights in this dtype instead of the input's: a "
        "bfloat16 or float16 model's edited weights are then not rounded back to it",
    )
    add_heldout_arguments(parser)


def add_prune_biases_arguments(parser: argparse.ArgumentParser) -> None:
    add_edit_arguments(parser)


def add_balance_arguments(parser: argparse.ArgumentParser) -> None:
    add_edit_arguments(parser)
    parser.add_argument(
        "--target",
        choices=BALANCE_TARGETS,
        default="balanced",
        help="imbalance to move every pair to: 0 ('balanced', mu = 0) or the I_0 that "
        "attnid train stored ('initial') (default: %(default)s)",
    )


def stored_dtype_name(checkpoint: Checkpoint) -> str:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.hf_llama import LlamaCheckpoint

    if isinstance(checkpoint, LlamaCheckpoint):
        return checkpoint.stored_dtype()
    stored = checkpoint.tensors[f"{checkpoint.layer_prefix}0.attn.c_attn.weight"]
    return str(stored.dtype).removeprefix("torch.")


def _edit_and_prove(
    args: argparse.Namespace,
    command: str,
    edit,
    allow_rope: bool,
    allow_resized: bool = False,
    nothing_to_do=None,
) -> dict | None:
    """Load, measure, edit (``edit(checkpoint, rope) -> report fields``), save, reload, measure; the
    report. None, with nothing written, where ``nothing_to_do(checkpoint, rope)`` gives a reason (printed)
    why the edit would leave the checkpoint as it is."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import HF_LLAMA, load_checkpoint, save_checkpoint
    from attnid.edits.heldout import compare, evaluate, heldout_batch, load_for_eval
    from attnid.edits.hf_llama import LlamaCheckpoint, set_stored_dtype
    from attnid.edits.operations import check_plain_layout

    declare_edit_files(args)
    check_load_memory(args.checkpoint)
    progress.stage(f"reading {args.checkpoint}")
    checkpoint = load_checkpoint(args.checkpoint)
    rope = check_plain_layout(checkpoint, command, allow_rope, allow_resized)
    reason = nothing_to_do(checkpoint, rope) if nothing_to_do is not None else None
    if reason is not None:
        print(f"{args.checkpoint}: {reason}; no copy written")
        return None
    if args.dtype is not None and checkpoint.kind != HF_LLAMA:
        raise UserError(
            f"--dtype rewrites Llama-family folders only; {args.checkpoint} is written in its own dtype"
        )
    batch, token_source = heldout_batch(checkpoint, args)
    progress.stage(f"evaluating {args.checkpoint} on the held-out batch")
    loss_before, logits_before = evaluate(load_for_eval(checkpoint), batch)
    report = {
        "command": command,
        "input": str(args.checkpoint),
        "output": str(args.out),
        "format": checkpoint.kind,
        "n_layer": checkpoint.n_layer,
        "n_head": checkpoint.attention.n_head,
        "n_embd": checkpoint.attention.n_embd,
        "bias": checkpoint.attention_layer(0).c_attn_bias is not None,
        "input_dtype": stored_dtype_name(checkpoint),
    }
    if isinstance(checkpoint, LlamaCheckpoint):
        report.update(
            {
                "model_type": checkpoint.model_type,
                "n_kv_head": checkpoint.attention.n_kv_head,
                "head_dim": checkpoint.attention.head_dim,
            }
        )
        if args.dtype is not None:
            set_stored_dtype(checkpoint, args.dtype)
    report["stored_dtype"] = stored_dtype_name(checkpoint)
    progress.stage(f"editing {args.checkpoint}")
    report.update(edit(checkpoint, rope))
    progress.stage(f"writing {args.out}")
    save_checkpoint(
        checkpoint, args.out, record={k: v for k, v in report.items() if k not in ("input", "output")}
    )
    progress.stage(f"evaluating {args.out} on the held-out batch")
    loss_after, logits_after = evaluate(load_for_eval(load_checkpoint(args.out)), batch)
    report.update(
        {"tokens": token_source, "sequences": int(batch.shape[0]), "length": int(batch.shape[1] - 1)}
    )
    report.update(compare(loss_before, logits_before, loss_after, logits_after))
    return report


def _model_line(report: dict) -> str:
    grouped = ""
    if "n_kv_head" in report:
        grouped = f", G={report['n_kv_head']} key/value heads, D={report['head_dim']}"
    return (
        f"{report.get('model_type', report['format'])} model, {report['n_layer']} layers x "
        f"{report['n_head']} heads{grouped}, E={report['n_embd']}, stored as {report['stored_dtype']}"
    )


EDIT_REPORT = outputs.json_report("command")  # the --json of prune-biases and balance


def declare_edit_files(args: argparse.Namespace) -> None:
    """The edit's inputs and outputs for the output rule, checked before the checkpoint is read:
    --out in the input's format (a file, or a folder of the same files), --json a report."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.checkpoints import HF_FOLDER, weight_format

    rule = outputs.current()
    source = args.checkpoint
    # the input, the held-out data named or found next to a nanoGPT checkpoint, the text
    rule.read(
        source,
        args.data,
        args.text,
        *([source.parent / "val.bin", source.parent / "meta.json"] if source.is_file() else []),
    )
    if source.is_dir():
        out = rule.write_dir(args.out, "--out", HF_FOLDER)
        for item in sorted(source.iterdir()):
            if item.is_file():
                rule.write(out / item.name, weight_format(item.name))
    else:
        rule.write(args.out, outputs.TORCH_ARCHIVE, "--out")
    rule.write(args.json, EDIT_REPORT, "--json")


def check_load_memory(source: Path) -> None:
    """An edit holds the checkpoint's tensors twice at least (as read, and in the model that proves the
    edit): refuse before reading one that cannot fit (docs/design.md §6.2)."""
    # lazy: torch, through attnid.common.memory (--help must not import it)
    from attnid.common.memory import require_memory

    files = [item for item in source.iterdir() if item.is_file()] if source.is_dir() else [source]
    stored = sum(item.stat().st_size for item in files if item.is_file())
    require_memory(
        {"the checkpoint read": stored, "its evaluation model": stored},
        "cpu",
        f"editing {source}",
        "edit it on a machine with more memory",
    )


def _finish(report: dict, json_path: Path | None, lines: list[str]) -> int:
    lines += [
        f"held-out batch: {report['sequences']} x {report['length']} tokens ({report['tokens']})",
        f"loss {report['loss_before']:.6f} -> {report['loss_after']:.6f} "
        f"(change {report['loss_change']:+.3g}); "
        f"max relative logit change {report['max_rel_logit_change']:.3g}",
    ]
    if report["stored_dtype"] in ("bfloat16", "float16") and report.get("write_back_rel_error", 0) > 0:
        lines.append(
            f"the edited weights were rounded to {report['stored_dtype']} on writing (relative "
            f"error {report['write_back_rel_error']:.2g}): that rounding, not the edit, is the "
            f"logit change above; --dtype float32 writes a float32 folder instead"
        )
    lines.append(f"wrote {report['output']}")
    print("\n".join(lines))
    if json_path is not None:
        write_json_atomic(json_path, report, EDIT_REPORT)
    return 0


def run_prune_biases(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.api import prune_checkpoint
    from attnid.edits.operations import redundant_bias_count

    def edit(checkpoint: Checkpoint, rope: bool) -> dict:
        return prune_checkpoint(checkpoint)

    def nothing_to_prune(checkpoint: Checkpoint, rope: bool) -> str | None:
        count = redundant_bias_count(checkpoint)
        if count["redundant_params"]:
            return None
        if checkpoint.attention_layer(0).c_attn_bias is None:
            return "nothing to prune: no attention biases"
        return (
            f"nothing to prune: its {count['key_biases_kept']:,} key biases are identified under RoPE and "
            f"its {count['value_biases_kept']:,} value biases have no output bias to fold into"
        )

    report = _edit_and_prove(args, "prune-biases", edit, allow_rope=True, nothing_to_do=nothing_to_prune)
    if report is None:
        return 0
    biases = "yes" if report["bias"] else "none"
    lines = [
        f"{_model_line(report)}, attention biases: {biases}",
        f"redundant biases set to 0: {report['redundant_params']:,} of "
        f"{report['attention_params']:,} attention parameters ({100 * report['redundant_share']:.3f} %); "
        f"non-zero before: "
        f"{report['nonzero_key_biases_zeroed']:,} key, {report['nonzero_value_biases_folded']:,} value",
    ]
    if report["key_biases_kept"] or report["value_biases_kept"]:
        lines.append(
            f"kept: {report['key_biases_kept']:,} key biases (identified under RoPE), "
            f"{report['value_biases_kept']:,} value biases (no output bias to fold them into)"
        )
    return _finish(report, args.json, lines)


def run_balance(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.edits.api import balance_checkpoint

    def edit(checkpoint: Checkpoint, rope: bool) -> dict:
        return balance_checkpoint(checkpoint, args.target)

    report = _edit_and_prove(args, "balance", edit, allow_rope=True, allow_resized=True)
    assert report is not None  # balance always writes its copy (a balanced model is moved by 0)
    lines = [
        f"{_model_line(report)}; target {report['target']}, {report['skipped_pairs']} pair(s) skipped "
        f"(near rank-deficient)",
        f"mu_qk {report['mu_qk_before']:.4g} -> {report['mu_qk_after']:.4g}; "
        f"mu_ov {report['mu_ov_before']:.4g} -> {report['mu_ov_after']:.4g} (each on the model's own "
        f"orbit)",
        f"attention weight norm {report['attn_norm_before']:.6g} -> {report['attn_norm_after']:.6g}",
    ]
    return _finish(report, args.json, lines)


def add_heldout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--text",
        type=Path,
        default=None,
        help="held-out text to compare logits on (default: tiny shakespeare's validation part)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="prepared data folder (val.bin, meta.json) of a character model (default: found next "
        "to the checkpoint, in its training config, or data/tinyshakespeare)",
    )
    parser.add_argument(
        "--sequences", type=int, default=8, help="sequences in the held-out batch (default: %(default)s)"
    )
    parser.add_argument(
        "--length",
        type=int,
        default=128,
        help="tokens per sequence, at most the model's context (default: %(default)s)",
    )
