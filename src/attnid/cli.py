"""The ``attnid`` command line.

Each subcommand lives in the module of its concern, which provides two functions:
``add_<name>_arguments(parser)`` and ``run_<name>(args) -> int | None`` (a ``-`` in the
name becomes ``_``). Only the module of the chosen subcommand is imported, so ``attnid fetch`` does not pay for
importing torch. A :class:`~attnid.errors.UserError` (or a bad flag) becomes one
line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from attnid import __version__
from attnid.errors import UserError

# name -> (module, one-line help). The module defines add_<name>_arguments and run_<name>.
COMMANDS: dict[str, tuple[str, str]] = {
    "fetch": ("attnid.data", "download a file (http(s) or file://), verify its sha256, write it atomically"),
    "prepare": ("attnid.data", "encode tiny shakespeare at character level into train.bin / val.bin / meta.json"),
    "train": ("attnid.train", "train one run (one optimizer case, lr, seed) and log rho, beta, tau, mu"),
    "inspect": ("attnid.metrics", "mu, imbalance and identification counts per layer of a nanoGPT checkpoint"),
    "counts": ("attnid.counts", "closed-form (un)identified parameter counts for real architectures"),
    "prune-biases": ("attnid.edits", "zero the key biases and fold the value biases into the output bias "
                                      "(exact), for nanoGPT and Hugging Face GPT-2 checkpoints"),
    "balance": ("attnid.edits", "move every attention factor pair to balance (mu = 0) without changing the function"),
    "edits-table": ("attnid.edits_table", "gather prune-biases and balance reports into prune.csv and prune.tex"),
    "verify": ("attnid.nullity", "check every closed form against the numerical nullity of a Jacobian"),
    "census": ("attnid.census", "every continuous symmetry of a whole model, class by class, checked "
                                "against the nullity of its Jacobian"),
    "appendix": ("attnid.latex", "render paper/appendix.tex from the jinja2 templates"),
    "tables": ("attnid.tables", "gather run logs into per-run, per-case and LR-sweep tables"),
    "figures": ("attnid.figures", "draw figures 1-5 from the tables and logs"),
    "studies": ("attnid.studies", "gather the heads and variants studies (does identification buy anything?) "
                                  "into tables with rank correlations"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line that points at --help."""

    def error(self, message: str):  # noqa: D401 - argparse API
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
            command_parser.set_defaults(_run=getattr(module, f"run_{function_name}"))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        status = args._run(args)
    except UserError as err:
        print(f"attnid {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnid {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
