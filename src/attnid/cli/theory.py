"""``attnid counts``, ``attnid verify`` and ``attnid census``: the closed forms (:mod:`attnid.theory.counts`,
:mod:`attnid.theory.architectures`), their Jacobian-nullity check (:mod:`attnid.theory.nullity`), and every
symmetry of a whole model checked against its Jacobian (:mod:`attnid.theory.census`).

The theory is pure functions; this module reads the files they need (an architectures file, a Hugging
Face ``config.json``) and writes what they compute. torch is imported only by the commands that measure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnid.cli.argument_types import seed_number, thread_count
from attnid.common import outputs, progress
from attnid.common.errors import UserError
from attnid.common.files import read_yaml, write_csv_atomic, write_text_atomic
from attnid.common.hf_config_file import hf_config_path, read_hf_config
from attnid.theory import whole_model
from attnid.theory.architectures import (
    PACKAGED_ARCHITECTURES,
    check_architectures,
    counts_table,
    shape_from_architecture,
    single_head_table,
    whole_model_columns,
    whole_model_table,
)
from attnid.theory.hf_config import architecture_from_hf_config, hf_model_name

if TYPE_CHECKING:
    import pandas as pd

# ---------------------------------------------------------------------------------------------------------
# Reading what the theory needs


def load_architectures(path: str | os.PathLike = PACKAGED_ARCHITECTURES) -> dict[str, dict]:
    """The checked entries of an architectures file (default: the published shapes shipped with attnid).
    Every problem is one UserError line naming the file, the entry and the field."""
    path = Path(path)
    if not path.exists():
        raise UserError(
            f"architectures file {path} not found: pass --architectures PATH "
            f"(default: the published shapes shipped with attnid)"
        )
    return check_architectures(read_yaml(path, "architectures file"), str(path))


def hf_architecture(path: str | os.PathLike) -> tuple[str, dict]:
    """``(name, entry)`` of the Hugging Face config at ``path`` (a ``config.json`` or its folder)."""
    config = read_hf_config(path)
    where = hf_config_path(path)
    spec = architecture_from_hf_config(config, source=str(where))
    return hf_model_name(config, where.parent.name), spec


# ---------------------------------------------------------------------------------------------------------
# counts

COUNTS_JSON = outputs.json_report("architectures")  # {"architectures": {name: row}}
STDOUT = "-"
# The columns of the table printed when neither --csv nor --json takes standard output.
COUNTS_TEXT_COLUMNS = {
    "architecture": "architecture",
    "n_layer": "L",
    "n_embd": "E",
    "n_head": "H",
    "n_kv_head": "G",
    "head_dim": "D",
    "rope": "rope",
    "bias": "bias",
    "total_attn_params": "attention params",
    "total_unidentified": "unidentified",
    "identified_fraction": "identified",
}


def add_counts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--architectures",
        type=Path,
        default=PACKAGED_ARCHITECTURES,
        metavar="PATH",
        help="YAML of architecture shapes (default: the published shapes shipped with attnid, "
        "attnid/theory/architectures.yaml; fields in docs/theory.md)",
    )
    parser.add_argument(
        "--hf-config",
        default=None,
        metavar="PATH",
        help="count one Hugging Face model instead: its config.json, or the folder holding it "
        "(GPT-2, Llama, Mistral, Qwen2, Gemma, Falcon)",
    )
    output = parser.add_argument_group(
        "output (without --csv or --json the table is printed as text; FILE omitted or '-': standard output)"
    )
    output.add_argument(
        "--csv",
        "--out",
        dest="csv",
        nargs="?",
        const=STDOUT,
        default=None,
        metavar="FILE",
        help="the table as CSV, one row per architecture (--out FILE is the same)",
    )
    output.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        default=None,
        metavar="FILE",
        help='the table as JSON: {"architectures": {name: {column: value}}}',
    )
    output.add_argument(
        "--single-head-out",
        default=None,
        metavar="FILE",
        help="also write the §4.10 single-head matching table here (e.g. results/theory/single_head.csv)",
    )
    output.add_argument(
        "--whole-model-out",
        default=None,
        metavar="FILE",
        help="also write the whole-model counts (every symmetry class, attnid census) here "
        "(e.g. results/theory/whole_model.csv)",
    )


def run_counts(args: argparse.Namespace) -> int:
    rule = outputs.current()
    if args.hf_config is not None:
        rule.read(hf_config_path(args.hf_config))  # the file, not its folder: the folder may take --csv
        declare_table_outputs(rule, args)
        table = hf_counts_table(args.hf_config)
        if not write_table(table, args):
            print(format_row(table))
        return 0
    rule.read(args.architectures)
    declare_table_outputs(rule, args)
    rule.write(args.single_head_out, outputs.CSV, "--single-head-out")
    rule.write(args.whole_model_out, outputs.CSV, "--whole-model-out")
    architectures = load_architectures(args.architectures)
    table = counts_table(architectures)
    if not write_table(table, args):
        print(format_counts_table(table))
    if args.single_head_out:
        write_csv_atomic(args.single_head_out, single_head_table(architectures))
    if args.whole_model_out:
        write_csv_atomic(args.whole_model_out, whole_model_table(architectures))
    return 0


def hf_counts_table(path: str) -> pd.DataFrame:
    """The counts row of one Hugging Face config, with its whole-model columns."""
    name, spec = hf_architecture(path)
    try:
        table = counts_table({name: spec})
    except (TypeError, ValueError) as err:
        raise UserError(f"{spec['source']}: {err}") from None
    return table.assign(**whole_model_columns(name, spec))


def declare_table_outputs(rule: outputs.OutputRule, args: argparse.Namespace) -> None:
    """--csv and --json: at most one on standard output; files declared before the work."""
    if args.csv == STDOUT and args.json == STDOUT:
        raise UserError("--csv and --json both print to standard output: give one of them a FILE")
    rule.write(None if args.csv in (None, STDOUT) else args.csv, outputs.CSV, "--csv")
    rule.write(None if args.json in (None, STDOUT) else args.json, COUNTS_JSON, "--json")


def write_table(table: pd.DataFrame, args: argparse.Namespace) -> bool:
    """Write ``table`` where --csv and --json say; True when one of them took standard output."""
    if args.csv == STDOUT:
        table.to_csv(sys.stdout, index=False)
    elif args.csv is not None:
        write_csv_atomic(args.csv, table)
    if args.json is not None:
        text = json.dumps({"architectures": json_rows(table)}, indent=2) + "\n"
        if args.json == STDOUT:
            sys.stdout.write(text)
        else:
            write_text_atomic(args.json, text, COUNTS_JSON)
    return STDOUT in (args.csv, args.json)


def json_value(value: Any) -> Any:
    """A table cell as JSON: numpy scalars as Python numbers, an empty (NaN) cell as null."""
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def json_rows(table: pd.DataFrame) -> dict[str, dict]:
    """``{architecture: {column: value}}`` of a counts table."""
    rows = {}
    for record in table.to_dict("records"):
        name = str(record.pop("architecture"))
        rows[name] = {str(key): json_value(value) for key, value in record.items()}
    return rows


def format_counts_table(table: pd.DataFrame) -> str:
    """The counts table as text: the attention's shape and totals, one line per architecture."""
    shown = table[list(COUNTS_TEXT_COLUMNS)].rename(columns=COUNTS_TEXT_COLUMNS)
    return shown.to_string(index=False, float_format=lambda x: f"{x:.4f}")


def format_row(table: pd.DataFrame) -> str:
    """The one row of ``table`` as ``column  value`` lines."""
    row = {str(key): value for key, value in table.iloc[0].to_dict().items()}
    width = max(len(key) for key in row)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in row.items())


# ---------------------------------------------------------------------------------------------------------
# verify


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="results/theory/nullity.csv", help="CSV to write (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=thread_count, default=1, help="torch threads (default: %(default)s)"
    )


def run_verify(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    import torch

    from attnid.theory.nullity import GAP_REQUIRED, verify

    outputs.current().write(args.out, outputs.CSV, "--out")  # before the minutes of work
    torch.set_num_threads(max(1, args.threads))
    table = verify(progress=lambda line: print(line, file=sys.stderr, flush=True))
    write_csv_atomic(args.out, table)
    failed = table[~table["passed"]]
    if len(failed):
        print(
            f"attnid verify: {len(failed)} of {len(table)} cases FAILED (theory != measured or gap < "
            f"{GAP_REQUIRED:.0e}): {', '.join(failed['case'])}; see {args.out}",
            file=sys.stderr,
        )
        return 1
    print(f"attnid verify: all {len(table)} cases pass; wrote {args.out}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------------
# census

DEFAULT_CENSUS_OUT = "results/theory/census.csv"
MAX_PARAMS = 3000  # the Jacobian has ROW_FACTOR x this many rows squared: minutes beyond it on a CPU
FAMILIES: dict[str, dict[str, Any]] = {  # presets; every flag given explicitly overrides them
    "nanogpt": dict(norm="layernorm", mlp="gelu", tied=True),
    "llama": dict(norm="rmsnorm", mlp="swiglu", tied=False, rope=True),
}
CENSUS_DOC = 'docs/theory.md, "The whole model"'


def add_census_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model (the options of attnid train, plus the whole-model choices)")
    add_census_size_arguments(model)
    add_census_component_arguments(model)
    add_census_measurement_arguments(parser.add_argument_group(f"measurement (see {CENSUS_DOC})"))


def add_census_size_arguments(model: argparse._ArgumentGroup) -> None:
    """The family preset and the sizes: attnid train's flags, plus the vocabulary."""
    model.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        default="nanogpt",
        help="presets: nanogpt = LayerNorm, GELU, tied, learned positions; llama = RMSNorm, SwiGLU, "
        "untied, RoPE (default: %(default)s)",
    )
    model.add_argument("--n-layer", type=int, default=1, help="blocks L (default %(default)s)")
    model.add_argument("--n-head", type=int, default=2, help="query heads H (default %(default)s)")
    model.add_argument("--n-embd", type=int, default=8, help="width E (default %(default)s)")
    model.add_argument("--n-kv-head", type=int, default=None, help="key/value heads G (default H)")
    model.add_argument("--head-dim", type=int, default=None, metavar="D", help="head width D (default E / H)")
    model.add_argument(
        "--block-size", type=int, default=4, help="positions T, the sequence length (default %(default)s)"
    )
    model.add_argument("--vocab-size", type=int, default=12, help="vocabulary V (default %(default)s)")
    model.add_argument(
        "--rope",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rotary positions, no wpe (default: off for nanogpt, on for llama)",
    )
    model.add_argument(
        "--positions",
        choices=whole_model.POSITIONS,
        default=None,
        help="learned (wpe), rope or none (default: rope with --rope, else learned)",
    )


def add_census_component_arguments(model: argparse._ArgumentGroup) -> None:
    """Biases, norm, MLP, tying, block and epsilon: the whole-model choices beyond attention."""
    model.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="nanoGPT's bias: every Linear and LayerNorm (default off); the flags below refine it",
    )
    for name, what in (
        ("norm-bias", "LayerNorm biases"),
        ("qkv-bias", "query/key/value biases"),
        ("out-bias", "attention output bias"),
        ("mlp-bias", "MLP biases"),
    ):
        model.add_argument(
            f"--{name}", action=argparse.BooleanOptionalAction, default=None, help=f"{what} (default: --bias)"
        )
    model.add_argument("--norm", choices=whole_model.NORMS, default=None, help="default: the family's")
    model.add_argument("--mlp", choices=whole_model.MLPS, default=None, help="default: the family's")
    model.add_argument("--mlp-hidden", type=int, default=None, metavar="F", help="MLP width F (default 4E)")
    model.add_argument(
        "--tied",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lm_head = wte (default: the family's)",
    )
    model.add_argument(
        "--block",
        choices=whole_model.BLOCKS,
        default="sequential",
        help="parallel: attention and MLP read one shared norm (Falcon) (default %(default)s)",
    )
    model.add_argument(
        "--norm-eps",
        type=float,
        default=whole_model.DEFAULT_NORM_EPS,
        help="the norms' epsilon (default %(default)g, model.py's); 0 makes the residual scaling exact",
    )


def add_census_measurement_arguments(run: argparse._ArgumentGroup) -> None:
    """What is measured (one shape, the grid, or a Hugging Face config), how and where it goes.

    The defaults of --random-shapes and --rope-base are the census's own, resolved when it runs, so that
    building this parser (``--help``) does not import torch."""
    which = run.add_mutually_exclusive_group()
    which.add_argument(
        "--grid",
        action="store_true",
        help="run the theory stage's grid of tiny shapes instead of one shape (the model options are "
        "then ignored)",
    )
    which.add_argument(
        "--hf-config",
        default=None,
        metavar="PATH",
        help="the whole model of a Hugging Face config.json (or its folder; GPT-2 and Llama families): its "
        "closed-form count class by class, measured only up to --max-params (the model options are then "
        "ignored)",
    )
    run.add_argument(
        "--random-shapes",
        type=int,
        default=None,
        help="with --grid: random shapes added to the hand-picked ones (default: the theory stage's, 8)",
    )
    run.add_argument(
        "--seed",
        type=seed_number,
        default=0,
        help="random point (and random shapes) seed (default %(default)s)",
    )
    run.add_argument(
        "--rope-base",
        type=float,
        default=None,
        help="RoPE base of the measurement (default: the census's, 10, for a resolved rank; see "
        f"{CENSUS_DOC})",
    )
    run.add_argument(
        "--max-params",
        type=int,
        default=MAX_PARAMS,
        help="measure no larger model: the Jacobian grows with the square (default %(default)s)",
    )
    run.add_argument("--threads", type=thread_count, default=1, help="torch threads (default %(default)s)")
    run.add_argument(
        "--out", default=None, help=f"CSV to write, one row per shape (e.g. {DEFAULT_CENSUS_OUT})"
    )


def shape_from_args(args: argparse.Namespace) -> whole_model.WholeModelShape:
    """The census shape of the command line; a bad combination is one UserError line."""
    preset = FAMILIES[args.family]
    rope = preset.get("rope", False) if args.rope is None else args.rope
    positions = args.positions or ("rope" if rope else "learned")
    if args.positions is not None and args.rope is not None and (positions == "rope") != rope:
        raise UserError(f"--positions {positions} contradicts --{'' if rope else 'no-'}rope")
    norm = args.norm or preset["norm"]

    def bias(flag):
        return args.bias if flag is None else flag

    norm_bias = bias(args.norm_bias) and norm == "layernorm" if args.norm_bias is None else args.norm_bias
    try:
        return whole_model.whole_model_shape(
            n_layer=args.n_layer,
            n_embd=args.n_embd,
            n_head=args.n_head,
            vocab_size=args.vocab_size,
            block_size=args.block_size,
            n_kv_head=args.n_kv_head,
            head_dim=args.head_dim,
            norm=norm,
            norm_bias=norm_bias,
            qkv_bias=bias(args.qkv_bias),
            out_bias=bias(args.out_bias),
            mlp=args.mlp or preset["mlp"],
            mlp_hidden=args.mlp_hidden,
            mlp_bias=bias(args.mlp_bias),
            tied=preset["tied"] if args.tied is None else args.tied,
            positions=positions,
            block=args.block,
            norm_eps=args.norm_eps,
        )
    except ValueError as err:
        raise UserError(str(err)) from None


def shape_from_hf_config(path: str) -> tuple[str, whole_model.WholeModelShape]:
    """The whole-model shape of a Hugging Face config, or one UserError line saying why there is none."""
    name, spec = hf_architecture(path)
    if "whole_model_note" in spec:
        raise UserError(f"{spec['source']}: no whole-model census for this model: {spec['whole_model_note']}")
    try:
        return name, shape_from_architecture(name, spec)
    except UserError as err:
        raise UserError(f"{spec['source']}: {err}") from None


def class_lines(row: dict) -> list[str]:
    """The closed forms of one census row: one line per class, then the sum."""
    lines = [row["shape"], f"  {'class':<22} {'dimension':>10}  what"]
    for symmetry in whole_model.CLASSES:
        dimension = row[f"class_{symmetry.name}"]
        note = f" [log-probabilities only: {symmetry.logprobs_only}]" if symmetry.logprobs_only else ""
        lines.append(f"  {symmetry.name:<22} {dimension:>10}  {symmetry.summary}{note}")
    total = f"  {'sum (closed forms)':<22} {row['theory']:>10}"
    lines.append(f"{total}  attention alone (the paper): {row['attention_only']}")
    return lines


def measurement_lines(row: dict) -> list[str]:
    """The measurement of one census row: nullity, gap, the residual scaling and the verdict."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.theory.nullity import GAP_REQUIRED

    lines = [
        f"  {'measured nullity':<22} {row['measured']:>10}  of {row['n_params']} parameters, "
        f"{row['n_rows']} Jacobian rows ({row['n_sequences']} sequences)",
        f"  gap {row['gap']:.2e} (smallest kept {row['smallest_kept']:.1e}, largest dropped "
        f"{row['largest_dropped']:.1e} of the largest singular value)",
    ]
    if row["class_residual_scale"]:
        lines.append(f"  residual scaling exact: |J v| / |v| s_max = {row['near_null_scale']:.1e}")
    else:
        above = (
            f"{row['near_null_singular'] / row['largest_dropped']:.1e}x the largest dropped"
            if row["largest_dropped"] > 0
            else "above an exact zero"
        )
        lines.append(
            f"  residual scaling broken by eps: its singular value {row['near_null_singular']:.1e} lies in "
            f"the gap, {above} (|J v| / |v| s_max = {row['near_null_scale']:.1e})"
        )
    verdict = "closes" if row["closes"] else "DOES NOT CLOSE"
    lines.append(
        f"  {verdict}: sum {row['theory']} {'=' if row['theory'] == row['measured'] else '!='} measured "
        f"{row['measured']}, gap {'>=' if row['gap'] >= GAP_REQUIRED else '<'} {GAP_REQUIRED:.0e}"
    )
    return lines


def class_report(row: dict) -> str:
    """The census of one shape as text: one line per class, the sum, the measurement, the verdict."""
    return "\n".join(class_lines(row) + measurement_lines(row))


def run_census(args: argparse.Namespace) -> int:
    rule = outputs.current()
    if args.hf_config is not None:
        rule.read(hf_config_path(args.hf_config))
    rule.write(args.out, outputs.CSV, "--out")
    if args.hf_config is not None:
        return census_of_hf_config(args)
    if args.grid:
        # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
        from attnid.theory.census_grid import RANDOM_SHAPES, default_grid

        count = RANDOM_SHAPES if args.random_shapes is None else args.random_shapes
        shapes = default_grid(count, args.seed)
    else:
        shapes = [shape_from_args(args)]
    for shape in shapes:
        check_measurable(shape, args.max_params)
    return measure_shapes(shapes, args)


def check_measurable(shape: whole_model.WholeModelShape, max_params: int) -> None:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.theory.census import describe_shape, measurable

    try:
        measurable(shape, max_params)
    except ValueError as err:
        advice = " (see --max-params)" if "parameters >" in str(err) else ""
        raise UserError(f"{describe_shape(shape)}: {err}{advice}") from None


def census_of_hf_config(args: argparse.Namespace) -> int:
    """``census --hf-config``: the closed forms of a real model, class by class; measured only when it is
    small enough (--max-params) and its inputs can pin its parameters. No Jacobian is built otherwise."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.theory.census import closed_form_row, measurable

    name, shape = shape_from_hf_config(args.hf_config)
    n_params = whole_model.whole_model_params(shape)
    if n_params > args.max_params:
        reason = f"{n_params:,} parameters > --max-params {args.max_params:,}"
    else:
        try:
            measurable(shape)
        except ValueError as err:
            reason = str(err)
        else:
            return measure_shapes([shape], args)
    row = {
        **closed_form_row(shape),
        "n_params": n_params,
        "attention_only": whole_model.attention_only_unidentified(shape),
    }
    print(f"{name} ({args.hf_config})")
    print("\n".join(class_lines(row)))
    print(f"  {'parameters':<22} {n_params:>10}  not measured: {reason}")
    if args.out:
        # lazy: pandas, which --help does not wait for
        import pandas as pd

        write_csv_atomic(args.out, pd.DataFrame([row]))
    return 0


def measure_shapes(shapes: list[whole_model.WholeModelShape], args: argparse.Namespace) -> int:
    """Measure every shape, print (one shape: its report; a grid: one line each), write --out, and return 1
    when a shape does not close."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    import torch

    from attnid.theory.census import CENSUS_ROPE_BASE
    from attnid.theory.census_grid import run_grid
    from attnid.theory.nullity import GAP_REQUIRED

    torch.set_num_threads(max(1, args.threads))
    progress.stage(f"measuring the Jacobian of {len(shapes)} shape(s) in float64")
    per_shape = (lambda line: print(line, file=sys.stderr, flush=True)) if len(shapes) > 1 else None
    rope_base = CENSUS_ROPE_BASE if args.rope_base is None else args.rope_base
    table = run_grid(shapes, progress=per_shape, rope_base=rope_base)
    if len(shapes) == 1:
        print(class_report(table.iloc[0].to_dict()))
    if args.out:
        write_csv_atomic(args.out, table)
    failed = table[~table["closes"]]
    if len(failed):
        print(
            f"attnid census: {len(failed)} of {len(table)} shapes do not close (sum of the closed forms != "
            f"measured nullity, or gap < {GAP_REQUIRED:.0e}): {'; '.join(failed['shape'])}",
            file=sys.stderr,
        )
        return 1
    if len(shapes) > 1:
        print(
            f"attnid census: all {len(table)} shapes close (worst gap {table['gap'].min():.1e})"
            + (f"; wrote {args.out}" if args.out else ""),
            file=sys.stderr,
        )
    return 0
