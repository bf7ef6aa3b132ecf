"""The interventions' gathering commands (docs/experiments.md, "Does identification change training?"):
``attnid interventions-table``, every arm against its baseline seed by seed, with the verdicts, the effect
along training and the plateau check; ``attnid calibration-table``, each calibrated arm's best lr and the spec
files of its runs at that lr. They share the report commands' run selection and output rule
(:mod:`attnid.cli.reports`)."""

from __future__ import annotations

import argparse
import math

from attnid.cli.reports import (
    add_run_selection_arguments,
    check_run_selection,
    declare_report_files,
    written_by,
)
from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic
from attnid.plan.interventions import CALIBRATED_SUFFIX, FIXING_EFFECT
from attnid.plan.runs import SPEC_FILE, read_pending_spec
from attnid.reports.statistics import ALPHA


def add_interventions_table_arguments(parser: argparse.ArgumentParser) -> None:
    # lazy: pandas and scipy, which only this command's --help loads (for the defaults), not the others'
    from attnid.reports.interventions_table import BASELINE_CASE

    add_run_selection_arguments(parser, sweep=False)
    parser.add_argument(
        "--baseline",
        default=BASELINE_CASE,
        help="the case every other case (an arm) is compared with, seed by seed (default: %(default)s)",
    )
    parser.add_argument(
        "--out-dir",
        required=True,
        help="where interventions_seeds.csv, interventions.csv and interventions.tex go",
    )
    add_verdict_arguments(parser)
    parser.add_argument(
        "--plateau-last",
        type=float,
        default=None,
        metavar="FRACTION",
        help="write interventions_plateau.csv: each arm's whole-split val loss over this last fraction of "
        "training (needs --plateau-improvement and runs trained with --full-val-every)",
    )
    parser.add_argument(
        "--plateau-improvement",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the plateau check's threshold: a relative improvement below it is a plateau",
    )
    parser.add_argument(
        "--arm-costs",
        default=None,
        metavar="CSV",
        help="each arm's cost per step as written by benchmarks/arms_cost.py, shown beside the verdicts",
    )


def add_verdict_arguments(parser: argparse.ArgumentParser) -> None:
    """The verdict rule's flags (docs/design.md §11.3): a pipeline config fixes these before any run."""
    # lazy: pandas, which only these commands' --help loads (for the defaults), not the others'
    from attnid.reports.interventions_table import INTERACTION

    parser.add_argument(
        "--alpha", type=float, default=ALPHA, help="family-wise level of the verdicts (default: %(default)s)"
    )
    parser.add_argument(
        "--equivalence-margin",
        type=float,
        default=None,
        metavar="DELTA",
        help="a comparison is 'equivalent' when its 1 - 2 alpha t-interval lies inside +-DELTA, in the "
        "loss's units (default: none, so nothing is called equivalent)",
    )
    parser.add_argument(
        "--margin-fraction",
        type=float,
        default=None,
        metavar="F",
        help="instead of --equivalence-margin: DELTA = F times the baseline's mean final loss at its best lr "
        "in --calibration's table (a rule fixed before any run; docs/design.md §11.3)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="CSV",
        help="calibration.csv of 'attnid calibration-table', for --margin-fraction",
    )
    parser.add_argument(
        "--primary",
        default=None,
        metavar="COMPARISON",
        help="the comparison the study asks about, tested alone at --alpha, e.g. "
        f"{FIXING_EFFECT}{CALIBRATED_SUFFIX} (default: none; every verdict comes from the family)",
    )
    parser.add_argument(
        "--family",
        nargs="+",
        default=None,
        metavar="COMPARISON",
        help="the comparisons Holm's correction runs over: an arm (against the baseline), ARM-BASELINE, or a "
        f"2 x 2 contrast such as {INTERACTION} (default: every comparison the runs make but the primary)",
    )


def verdict_margin(args: argparse.Namespace, baseline: str) -> float | None:
    """The rule's margin: --equivalence-margin, or --margin-fraction of ``baseline``'s calibrated loss in
    --calibration's table."""
    # lazy: pandas, which --help does not wait for
    from attnid.reports.interventions_table import calibrated_margin

    if args.margin_fraction is not None and (args.calibration is None or args.equivalence_margin is not None):
        raise UserError("--margin-fraction needs --calibration CSV, and replaces --equivalence-margin")
    if args.margin_fraction is None:
        return args.equivalence_margin
    if not 0 < args.margin_fraction < 1:
        raise UserError(f"--margin-fraction must be in (0, 1), not {args.margin_fraction}")
    margin = calibrated_margin(args.calibration, args.margin_fraction, baseline)
    print(f"equivalence margin {margin:.4g}: {args.margin_fraction:g} x {baseline}'s calibrated loss")
    return margin


def run_interventions_table(args: argparse.Namespace) -> int:
    # lazy: pandas and scipy, which --help does not wait for
    from attnid.reports.interventions_curves import PlateauRule
    from attnid.reports.interventions_table import calibrated_margin, write_interventions_table

    check_run_selection(args)
    if args.margin_fraction is not None and (args.calibration is None or args.equivalence_margin is not None):
        raise UserError("--margin-fraction needs --calibration CSV, and replaces --equivalence-margin")
    if (args.plateau_last is None) != (args.plateau_improvement is None):
        raise UserError("--plateau-last and --plateau-improvement go together")
    for name in ("margin_fraction", "plateau_last", "plateau_improvement"):
        value = getattr(args, name)
        if value is not None and not 0 < value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be in (0, 1), not {value}")
    declare_report_files(args, args.arm_costs, args.calibration)
    margin = args.equivalence_margin
    if args.margin_fraction is not None:
        margin = calibrated_margin(args.calibration, args.margin_fraction, args.baseline)
        print(
            f"equivalence margin {margin:.4g}: {args.margin_fraction:g} x {args.baseline}'s calibrated loss"
        )
    plateau = (
        PlateauRule(args.plateau_last, args.plateau_improvement) if args.plateau_last is not None else None
    )
    with written_by("attnid train"):
        table, notes = write_interventions_table(
            args.runs_dir,
            args.out_dir,
            args.runs,
            args.baseline,
            alpha=args.alpha,
            equivalence_margin=margin,
            family=args.family,
            costs_path=args.arm_costs,
            primary=args.primary,
            plateau=plateau,
        )
    for note in notes:
        print(f"note: {note}")
    for row in table.to_dict("records"):
        cost = "" if math.isnan(row["cost_ratio"]) else f", cost per step x{row['cost_ratio']:.3g}"
        print(
            f"{row['comparison']}: mean {row['delta_mean']:+.4g}, {100 * (1 - args.alpha):g}% t-CI "
            f"[{row['ci_low']:+.4g}, {row['ci_high']:+.4g}] over {row['n_seeds']} seeds, sign-flip "
            f"p = {row['p_value']:.3g}, Holm p = {row['p_holm']:.3g}, detectable "
            f"{row['detectable_effect']:.3g}{cost}: {row['verdict']}"
            + (" (primary)" if row["role"] == "primary" else "")
        )
    print(
        f"wrote interventions_seeds.csv, interventions.csv, interventions_along.csv"
        f"{', interventions_plateau.csv' if plateau else ''} and interventions.tex to {args.out_dir}"
    )
    return 0


def add_calibration_table_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_selection_arguments(parser, sweep=False)
    parser.add_argument("--out-dir", required=True, help="where calibration.csv and calibration_picks.csv go")
    parser.add_argument(
        "--refine-runs",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="round 2's runs: the best lrs of round 1 (--runs) on more seeds; the pick is then the lowest "
        "mean over both rounds' seeds at those lrs",
    )
    parser.add_argument(
        "--pending-specs",
        nargs="+",
        default=[],
        metavar="PENDING",
        help="pending specs of runs at an arm's best lr (written by the workflow's spec jobs): each one's "
        "spec file is written with the lr of the lowest mean final full-split val loss (a round-2 run's: "
        "the lr of its rank in round 1)",
    )


def run_calibration_table(args: argparse.Namespace) -> int:
    # lazy: pandas and scipy, which --help does not wait for
    from attnid.reports.calibration import write_calibration

    check_run_selection(args)
    declare_report_files(args, *args.pending_specs)
    outputs.current().read(*args.refine_runs)
    pending = [read_pending_spec(path) for path in args.pending_specs]
    rule = outputs.current()
    for spec in pending:
        rule.write(spec.spec_file, SPEC_FILE, "a pending spec's spec_file")
    with written_by("attnid train"):
        table, written = write_calibration(args.runs_dir, args.out_dir, args.runs, pending, args.refine_runs)
    for row in table.to_dict("records"):
        mean = "diverged" if row["n_diverged"] else f"mean {row['mean']:.4f} over {row['n_seeds']} seeds"
        round_two = " (round 2)" if row["round"] == 2 else ""
        print(f"{row['arm']} lr {row['lr']:.4g}{round_two}: {mean}{' (best)' if row['best'] else ''}")
    print(
        f"wrote calibration.csv and calibration_picks.csv to {args.out_dir} and {len(written)} calibrated "
        f"spec file(s)"
    )
    return 0


def add_interventions_robustness_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        required=True,
        metavar=("NAME", "RUN_DIR"),
        help="a variant's name and its runs on the comparison seeds (every arm at the variant's lr); once "
        "per variant",
    )
    parser.add_argument(
        "--out-dir", required=True, help="where interventions_robustness.csv and its _seeds.csv go"
    )
    add_verdict_arguments(parser)


def run_interventions_robustness(args: argparse.Namespace) -> int:
    # lazy: pandas and scipy, which --help does not wait for
    from attnid.reports.interventions_table import BASELINE_CASE
    from attnid.reports.robustness import robustness_table

    variants = [(words[0], words[1:]) for words in args.variant]
    bare = [name for name, runs in variants if not runs]
    if bare:
        raise UserError(f"variant {', '.join(bare)} lists no runs: --variant NAME RUN_DIR...")
    rule = outputs.current()
    for _, runs in variants:
        rule.read(*runs)
    rule.read(args.calibration)
    out = rule.write_dir(args.out_dir, "--out-dir", lock=False)
    margin = verdict_margin(args, BASELINE_CASE)
    with written_by("attnid train"):
        table, seeds = robustness_table(variants, args.alpha, margin, args.family, args.primary)
        write_csv_atomic(out / "interventions_robustness.csv", table)
        write_csv_atomic(out / "interventions_robustness_seeds.csv", seeds)
    for row in table.to_dict("records"):
        print(
            f"{row['variant']}: {row['comparison']} mean {row['delta']:+.4g} [{row['ci_low']:+.4g}, "
            f"{row['ci_high']:+.4g}] over {row['n']} seeds ({row['seeds_positive']} positive), "
            f"p = {row['p']:.3g}: {row['outcome']}"
        )
    print(f"wrote interventions_robustness.csv and interventions_robustness_seeds.csv to {args.out_dir}")
    return 0
