"""The ``attnid`` command line.

The command line is the top layer: each subcommand's parser and its output live in one module
of this package (``attnid.cli.data``, ``.theory``, ``.train``, ``.checkpoints``, ``.reports``), which
provides two functions: ``add_<name>_arguments(parser)`` and ``run_<name>(args) -> int | None``
(a ``-`` in the name becomes ``_``) and calls the library for the science. Only the module of the
chosen subcommand is imported, so ``attnid fetch`` does not pay for importing torch.

:func:`main` is where every failure a user can cause becomes one line on stderr, never a traceback:
a :class:`~attnid.common.errors.UserError` or a bad flag (exit 2), an ``OSError`` about a path
(the path and the reason, exit 2), running out of memory (exit 2), Ctrl-C (exit 130). Anything else
is a bug of ours and keeps its traceback; ``ATTNID_DEBUG=1`` prints the traceback of the one-line
errors too. Each command runs under its output rule (:mod:`attnid.common.outputs`: ``--force``) and
a heartbeat that reports progress when it is silent (:mod:`attnid.common.progress`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import traceback
from typing import NoReturn

from attnid import __version__
from attnid.common import interrupts, outputs, progress
from attnid.common.errors import UserError

# name -> (module, one-line help). The module defines add_<name>_arguments and run_<name>.
COMMANDS: dict[str, tuple[str, str]] = {
    "fetch": (
        "attnid.cli.data",
        "download a file (http(s) or file://), verify its sha256, write it atomically",
    ),
    "prepare": (
        "attnid.cli.data",
        "encode tiny shakespeare at character level into train.bin / val.bin / meta.json",
    ),
    "train": ("attnid.cli.train", "train one run (one optimizer case, lr, seed) and log rho, beta, tau, mu"),
    "train-runs": (
        "attnid.cli.train",
        "train several runs, each from its attnid train --config file, one after another in one process",
    ),
    "inspect": (
        "attnid.cli.checkpoints",
        "mu, imbalance, orbit dimension and identification counts per layer of a nanoGPT "
        "checkpoint or a Llama/Mistral/Qwen2/Gemma/GPT-2 folder",
    ),
    "counts": ("attnid.cli.theory", "closed-form (un)identified parameter counts for real architectures"),
    "prune-biases": (
        "attnid.cli.checkpoints",
        "zero the key biases and fold the value biases into the output bias (exact), for "
        "nanoGPT checkpoints and Hugging Face GPT-2 and Llama-family folders",
    ),
    "balance": (
        "attnid.cli.checkpoints",
        "move every attention factor pair to balance (mu = 0) without changing the function",
    ),
    "align": (
        "attnid.cli.alignment",
        "move B along its symmetry orbit (head/group and MLP permutations, per-group rotations; RoPE: per "
        "plane) to the point nearest A, exactly (nanoGPT, GPT-2, Llama-family); the distance left by class",
    ),
    "plant": (
        "attnid.cli.alignment",
        "move a checkpoint by a seeded random element of every class of its symmetry orbit (exact), to check "
        "attnid align against",
    ),
    "compare": (
        "attnid.cli.alignment",
        "the distance between two checkpoints before and after each symmetry class of attnid align, and "
        "their KL on held-out text (nothing written)",
    ),
    "barrier": (
        "attnid.cli.alignment",
        "the held-out loss along the straight line between two checkpoints, before alignment, after the "
        "permutations and after every class of attnid align; its barrier",
    ),
    "rotate": (
        "attnid.cli.quantization",
        "move a checkpoint along its symmetry orbit to quantize better (fuse-norms, residual, qk, ov, "
        "smooth) without changing its function",
    ),
    "quant-report": (
        "attnid.cli.quantization",
        "simulated round-to-nearest quantization of weights, activations and the KV cache: KL per token, "
        "perplexity, activation kurtosis; at the orbit points with --orbit-points",
    ),
    "from-gguf": (
        "attnid.cli.quantization",
        "dequantize a Llama-family GGUF file into a Hugging Face folder (float32) that the edits read",
    ),
    "alignment-table": (
        "attnid.cli.alignment",
        "gather attnid barrier reports into alignment.csv and alignment.tex",
    ),
    "quantization-table": (
        "attnid.cli.reports",
        "gather attnid quant-report --orbit-points reports into quantization.csv, its seed study, the "
        "activations per layer and .tex",
    ),
    "edits-table": (
        "attnid.cli.reports",
        "gather prune-biases and balance reports into prune.csv and prune.tex",
    ),
    "verify": ("attnid.cli.theory", "check every closed form against the numerical nullity of a Jacobian"),
    "census": (
        "attnid.cli.theory",
        "every continuous symmetry of a whole model, class by class, checked "
        "against the nullity of its Jacobian",
    ),
    "appendix": ("attnid.cli.reports", "render paper/appendix.tex from the jinja2 templates"),
    "tables": ("attnid.cli.reports", "gather run logs into per-run, per-case and LR-sweep tables"),
    "report-pages": (
        "attnid.cli.reports",
        "the Snakemake report's pages: the claims first, each figure with its caption, each table",
    ),
    "figures": ("attnid.cli.reports", "draw figures 1-8 from the tables and logs"),
    "studies": (
        "attnid.cli.reports",
        "gather the heads and variants studies (does identification buy anything?) "
        "into tables with rank correlations",
    ),
    "interventions-table": (
        "attnid.cli.interventions",
        "compare every arm with its baseline (adamw), seed by seed: mean difference, t-CI, exact p, Holm, "
        "verdict",
    ),
    "calibration-table": (
        "attnid.cli.interventions",
        "each calibrated arm's best lr from its calibration runs; the spec files of its runs at that lr",
    ),
    "interventions-robustness": (
        "attnid.cli.interventions",
        "the interventions' comparisons again under each robustness variant (other lrs than the picks)",
    ),
}


# Commands that write nothing (no --force).
READ_ONLY_COMMANDS = ("inspect", "compare")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line that points at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="attnid", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnid {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            function_name = name.replace("-", "_")  # prune-biases -> add_prune_biases_arguments
            getattr(module, f"add_{function_name}_arguments")(command_parser)
            if name not in READ_ONLY_COMMANDS:
                command_parser.add_argument(
                    "--force",
                    action="store_true",
                    help="replace existing files that are not what this command writes there (never an "
                    "input, never a directory)",
                )
            command_parser.set_defaults(_run=getattr(module, f"run_{function_name}"))
    return parser


def describe_os_error(err: OSError) -> str:
    """One line for an OSError: the path(s) it names and the reason."""
    reason = err.strerror or str(err) or type(err).__name__
    paths = [str(name) for name in (err.filename, err.filename2) if name is not None]
    return f"{' -> '.join(paths)}: {reason}" if paths else reason


def _is_out_of_memory(err: BaseException) -> bool:
    # torch.OutOfMemoryError (CUDA) and the CPU allocator's "DefaultCPUAllocator: can't allocate memory"
    return type(err).__name__ == "OutOfMemoryError" or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    command = chosen if chosen in COMMANDS else None
    try:
        # from the start: importing torch takes seconds, and its libraries may swallow a KeyboardInterrupt
        with interrupts.recorded(), progress.Heartbeat(command or "attnid"):
            args = build_parser(command).parse_args(argv)
            interrupts.stop_if_received()
            rule = outputs.OutputRule(args.command, force=getattr(args, "force", False))
            try:
                # loaded: a command that names no finer stage must not go on saying it is loading
                progress.stage("computing")
                with outputs.active(rule):  # a failure removes what the command wrote, then unlocks
                    status = args._run(args)
            except BrokenPipeError:
                return _reader_gone()
            except Exception as err:  # noqa: BLE001 - sorted into a user's problem (one line) or our bug
                message = _one_line(err)
                if message is None:
                    raise
                if os.environ.get("ATTNID_DEBUG") == "1":
                    traceback.print_exc()
                print(f"attnid {args.command}: error: {message}", file=sys.stderr)
                return 2
    except KeyboardInterrupt:  # also while the parser imports torch, before any command runs
        print(f"attnid{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


def _reader_gone() -> int:
    """stdout's reader went away (``attnid inspect ... | head``): stop quietly, as ``head``'s writers do.
    stdout is pointed at /dev/null so that Python's flush at exit does not fail on the pipe again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _one_line(err: Exception) -> str | None:
    """The one-line message for a failure a user can cause or fix; None for a bug of ours."""
    if isinstance(err, UserError):
        return str(err)
    if isinstance(err, OSError):
        return describe_os_error(err)
    if isinstance(err, MemoryError) or _is_out_of_memory(err):
        first = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
        return f"out of memory ({first}); use a smaller model, batch or --length"
    return None


if __name__ == "__main__":
    sys.exit(main())
