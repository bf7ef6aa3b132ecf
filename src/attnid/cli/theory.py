"""``attnid counts`` and ``attnid verify``: the closed forms (:mod:`attnid.theory.counts`) and their
Jacobian-nullity check (:mod:`attnid.theory.nullity`)."""

from __future__ import annotations

import argparse
import sys

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.theory.counts import DEFAULT_COUNTS_OUT, counts_table, load_architectures, single_head_table


def run_hf_config_counts(path: str, out: str | None) -> int:
    """``attnid counts --hf-config PATH``: print (and with ``--out`` write) the model's counts row."""
    from attnid.common.files import write_csv_atomic
    from attnid.theory.hf_config import hf_architecture

    name, spec = hf_architecture(path)
    try:
        table = counts_table({name: spec})
    except (TypeError, ValueError) as err:
        raise UserError(f"{spec['source']}: {err}") from None
    row = table.iloc[0].to_dict()
    width = max(len(key) for key in row)
    print("\n".join(f"{key.ljust(width)}  {value}" for key, value in row.items()))
    if out:
        write_csv_atomic(out, table)
    return 0


def add_counts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--architectures", default="config/architectures.yaml",
                        help="YAML of architecture shapes (default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help=f"CSV to write (default: {DEFAULT_COUNTS_OUT}; with --hf-config only when given)")
    parser.add_argument("--single-head-out", default=None,
                        help="also write the §4.10 single-head matching table here (e.g. results/theory/single_head.csv)")
    parser.add_argument("--hf-config", default=None, metavar="PATH",
                        help="count one Hugging Face model instead: its config.json, or the folder holding it "
                             "(GPT-2, Llama, Mistral, Qwen2, Gemma, Falcon); prints its row")


def run_counts(args: argparse.Namespace) -> int:
    from attnid.common.files import write_csv_atomic

    rule = outputs.current()
    if args.hf_config is not None:
        rule.read(args.hf_config)
        rule.write(args.out, outputs.CSV, "--out")
        return run_hf_config_counts(args.hf_config, args.out)
    rule.read(args.architectures)
    rule.write(args.out or DEFAULT_COUNTS_OUT, outputs.CSV, "--out")
    rule.write(args.single_head_out, outputs.CSV, "--single-head-out")
    architectures = load_architectures(args.architectures)
    write_csv_atomic(args.out or DEFAULT_COUNTS_OUT, counts_table(architectures))
    if args.single_head_out:
        write_csv_atomic(args.single_head_out, single_head_table(architectures))
    return 0


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results/theory/nullity.csv", help="CSV to write (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")


def run_verify(args: argparse.Namespace) -> int:
    from attnid.common.files import write_csv_atomic

    import torch

    from attnid.theory.nullity import GAP_REQUIRED, verify

    outputs.current().write(args.out, outputs.CSV, "--out")  # before the minutes of work
    torch.set_num_threads(max(1, args.threads))
    table = verify(progress=lambda line: print(line, file=sys.stderr, flush=True))
    write_csv_atomic(args.out, table)
    failed = table[~table["passed"]]
    if len(failed):
        print(f"attnid verify: {len(failed)} of {len(table)} cases FAILED (theory != measured or gap < "
              f"{GAP_REQUIRED:.0e}): {', '.join(failed['case'])}; see {args.out}", file=sys.stderr)
        return 1
    print(f"attnid verify: all {len(table)} cases pass; wrote {args.out}", file=sys.stderr)
    return 0
