"""``attnid counts``, ``attnid verify`` and ``attnid census``: the closed forms (:mod:`attnid.theory.counts`),
their Jacobian-nullity check (:mod:`attnid.theory.nullity`), and every symmetry of a whole model checked
against its Jacobian (:mod:`attnid.theory.census`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnid.cli.argument_types import seed_number, thread_count
from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.theory import whole_model
from attnid.theory.counts import (
    DEFAULT_COUNTS_OUT,
    counts_table,
    hf_whole_model_columns,
    load_architectures,
    single_head_table,
)


def run_hf_config_counts(path: str, out: str | None) -> int:
    """``attnid counts --hf-config PATH``: print (and with ``--out`` write) the model's counts row."""
    from attnid.common.files import write_csv_atomic
    from attnid.theory.hf_config import hf_architecture

    name, spec = hf_architecture(path)
    try:
        table = counts_table({name: spec})
    except (TypeError, ValueError) as err:
        raise UserError(f"{spec['source']}: {err}") from None
    table = table.assign(**hf_whole_model_columns(name, spec))
    row = {str(key): value for key, value in table.iloc[0].to_dict().items()}  # the column names
    width = max(len(key) for key in row)
    print("\n".join(f"{key.ljust(width)}  {value}" for key, value in row.items()))
    if out:
        write_csv_atomic(out, table)
    return 0


def add_counts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--architectures",
        default="config/architectures.yaml",
        help="YAML of architecture shapes (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"CSV to write (default: {DEFAULT_COUNTS_OUT}; with --hf-config only when given)",
    )
    parser.add_argument(
        "--single-head-out",
        default=None,
        help="also write the §4.10 single-head matching table here (e.g. results/theory/single_head.csv)",
    )
    parser.add_argument(
        "--whole-model-out",
        default=None,
        help="also write the whole-model counts (every symmetry class, attnid census) here "
        "(e.g. results/theory/whole_model.csv)",
    )
    parser.add_argument(
        "--hf-config",
        default=None,
        metavar="PATH",
        help="count one Hugging Face model instead: its config.json, or the folder holding it "
        "(GPT-2, Llama, Mistral, Qwen2, Gemma, Falcon); prints its row",
    )


def run_counts(args: argparse.Namespace) -> int:
    from attnid.common.files import write_csv_atomic

    rule = outputs.current()
    if args.hf_config is not None:
        config = Path(args.hf_config)
        rule.read(
            config / "config.json" if config.is_dir() else config
        )  # what is read: the folder may take --out
        rule.write(args.out, outputs.CSV, "--out")
        return run_hf_config_counts(args.hf_config, args.out)
    rule.read(args.architectures)
    rule.write(args.out or DEFAULT_COUNTS_OUT, outputs.CSV, "--out")
    rule.write(args.single_head_out, outputs.CSV, "--single-head-out")
    rule.write(args.whole_model_out, outputs.CSV, "--whole-model-out")
    architectures = load_architectures(args.architectures)
    write_csv_atomic(args.out or DEFAULT_COUNTS_OUT, counts_table(architectures))
    if args.single_head_out:
        write_csv_atomic(args.single_head_out, single_head_table(architectures))
    if args.whole_model_out:
        from attnid.theory.whole_model import whole_model_table

        write_csv_atomic(args.whole_model_out, whole_model_table(architectures))
    return 0


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="results/theory/nullity.csv", help="CSV to write (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=thread_count, default=1, help="torch threads (default: %(default)s)"
    )


def run_verify(args: argparse.Namespace) -> int:
    import torch

    from attnid.common.files import write_csv_atomic
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


# --------------------------------------------------------------------------------------------- census

DEFAULT_CENSUS_OUT = "results/theory/census.csv"
MAX_PARAMS = 3000  # the Jacobian has ROW_FACTOR x this many rows squared: minutes beyond it on a CPU
FAMILIES: dict[str, dict[str, Any]] = {  # presets; every flag given explicitly overrides them
    "nanogpt": dict(norm="layernorm", mlp="gelu", tied=True),
    "llama": dict(norm="rmsnorm", mlp="swiglu", tied=False, rope=True),
}


def add_census_arguments(parser: argparse.ArgumentParser) -> None:
    from attnid.theory.census import CENSUS_ROPE_BASE, RANDOM_SHAPES

    model = parser.add_argument_group("model (the options of attnid train, plus the whole-model choices)")
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
    run = parser.add_argument_group("measurement")
    run.add_argument(
        "--grid",
        action="store_true",
        help="run the theory stage's grid of tiny shapes instead of one shape (the model options are "
        "then ignored)",
    )
    run.add_argument(
        "--random-shapes",
        type=int,
        default=RANDOM_SHAPES,
        help="with --grid: random shapes added to the hand-picked ones (default %(default)s)",
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
        default=CENSUS_ROPE_BASE,
        help="RoPE base of the measurement (default %(default)g; see docs/whole_model.md)",
    )
    run.add_argument(
        "--max-params",
        type=int,
        default=MAX_PARAMS,
        help="refuse larger models: the Jacobian grows with the square (default %(default)s)",
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


def class_report(row: dict) -> str:
    """The census of one shape as text: one line per class, the sum, the measurement, the verdict."""
    from attnid.theory.nullity import GAP_REQUIRED

    lines = [row["shape"], f"  {'class':<22} {'dimension':>10}  what"]
    for symmetry in whole_model.CLASSES:
        dimension = row[f"class_{symmetry.name}"]
        note = f" [log-probabilities only: {symmetry.logprobs_only}]" if symmetry.logprobs_only else ""
        lines.append(f"  {symmetry.name:<22} {dimension:>10}  {symmetry.summary}{note}")
    total = f"  {'sum (closed forms)':<22} {row['theory']:>10}"
    lines.append(f"{total}  attention alone (the paper): {row['attention_only']}")
    lines.append(
        f"  {'measured nullity':<22} {row['measured']:>10}  of {row['n_params']} parameters, "
        f"{row['n_rows']} Jacobian rows ({row['n_sequences']} sequences)"
    )
    lines.append(
        f"  gap {row['gap']:.2e} (smallest kept {row['smallest_kept']:.1e}, largest dropped "
        f"{row['largest_dropped']:.1e} of the largest singular value); residual scaling "
        f"{'exact' if row['class_residual_scale'] else 'broken by eps'}: |J v| / |v| s_max = "
        f"{row['near_null_scale']:.1e}"
    )
    verdict = "closes" if row["closes"] else "DOES NOT CLOSE"
    lines.append(
        f"  {verdict}: sum {row['theory']} {'=' if row['theory'] == row['measured'] else '!='} measured "
        f"{row['measured']}, gap {'>=' if row['gap'] >= GAP_REQUIRED else '<'} {GAP_REQUIRED:.0e}"
    )
    return "\n".join(lines)


def run_census(args: argparse.Namespace) -> int:
    import torch

    from attnid.common.files import write_csv_atomic
    from attnid.theory.census import default_grid, describe_shape, measurable, run_grid
    from attnid.theory.nullity import GAP_REQUIRED

    outputs.current().write(args.out, outputs.CSV, "--out")
    torch.set_num_threads(max(1, args.threads))
    if args.grid:
        shapes = default_grid(args.random_shapes, args.seed)
    else:
        shapes = [shape_from_args(args)]
    for shape in shapes:
        try:
            measurable(shape, args.max_params)
        except ValueError as err:
            raise UserError(
                f"{describe_shape(shape)}: {err} (see --max-params)"
                if "parameters >" in str(err)
                else f"{describe_shape(shape)}: {err}"
            ) from None
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if args.grid else None
    table = run_grid(shapes, progress=progress, rope_base=args.rope_base)
    if not args.grid:
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
    if args.grid:
        print(
            f"attnid census: all {len(table)} shapes close (worst gap {table['gap'].min():.1e})"
            + (f"; wrote {args.out}" if args.out else ""),
            file=sys.stderr,
        )
    return 0
