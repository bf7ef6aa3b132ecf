"""``attnid tables``, ``figures``, ``studies``, ``appendix`` and ``edits-table``: gathering the runs
into tables, claims, figures and the LaTeX appendix (:mod:`attnid.reports`)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import write_text_atomic
from attnid.reports.figures import default_figures, make_figure, registry
from attnid.reports.figures.inputs import Sources
from attnid.reports.latex import records
from attnid.reports.report_pages import TABLE_PAGES, write_report_pages

# Every report command's --help imports this module: the modules that load pandas or scipy are imported
# by the command that runs them (the `# lazy:` imports), so `attnid tables --help` need not wait for them.


def add_run_selection_arguments(parser: argparse.ArgumentParser, sweep: bool = True) -> None:
    """--runs-dir (gather everything below) or --runs (exactly these); the same for the sweep if ``sweep``."""
    parser.add_argument(
        "--runs-dir", default=None, help="results/runs: <case>/seed<S>/{run.json,metrics.csv}"
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="exactly these run directories (instead of everything under --runs-dir)",
    )
    if sweep:
        parser.add_argument("--sweep-dir", default=None, help="results/sweep: <optimizer>/lr<lr>/seed<S>/...")
        parser.add_argument(
            "--sweep-runs",
            nargs="+",
            default=None,
            metavar="RUN_DIR",
            help="exactly these sweep run directories (instead of everything under --sweep-dir)",
        )


def check_run_selection(args: argparse.Namespace) -> None:
    if args.runs_dir is None and not args.runs:
        raise UserError("say which runs to gather: --runs-dir DIR or --runs RUN_DIR [RUN_DIR ...]")


def declare_report_files(args: argparse.Namespace, *inputs: str | os.PathLike | None) -> Path:
    """The output rule's view of a gathering command: the listed run directories and ``inputs`` are read,
    --out-dir is written (each table or figure in it is checked as it is written)."""
    rule = outputs.current()
    for listed in ("runs", "sweep_runs", "heads_runs", "variants_runs", "intervention_runs", "identity_runs"):
        rule.read(*(getattr(args, listed, None) or []))
    rule.read(*inputs)
    return rule.write_dir(args.out_dir, "--out-dir", lock=False)  # several commands write tables there


@contextlib.contextmanager
def written_by(writers: str) -> Iterator[None]:
    """The gathering commands read files that other attnid commands wrote; one that is not (a column or
    key missing, a value of the wrong kind, a template field without data) is the user's file, not our bug:
    one line naming the problem and who writes such files (``ATTNID_DEBUG=1`` shows where it was hit)."""
    try:
        yield
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise UserError(
            f"an input is not what {writers} writes ({type(err).__name__}: {err}); rerun that "
            f"step with this attnid, or pass its outputs"
        ) from err
    except Exception as err:
        if type(err).__name__ != "UndefinedError":  # jinja2: a template asks for a column the table lacks
            raise
        raise UserError(
            f"an input table lacks what the templates need ({err}); rerun {writers} with this attnid"
        ) from err


def files_in(folder: str | Path | None, pattern: str) -> list[Path]:
    return sorted(Path(folder).glob(pattern)) if folder is not None and Path(folder).is_dir() else []


def add_intervention_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The interventions study's runs (optional): its arms and baselines, and its float64 identity run."""
    parser.add_argument(
        "--intervention-runs",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="the interventions' arm and adamw runs (claims.csv's identities, Figure 6)",
    )
    parser.add_argument(
        "--identity-runs",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="the interventions' float64 adamw_projected run(s)",
    )


def add_tables_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_selection_arguments(parser)
    add_intervention_run_arguments(parser)
    parser.add_argument("--out-dir", required=True, help="where runs/cases/sweep .csv/.tex and claims.csv go")
    parser.add_argument(
        "--census",
        default=None,
        metavar="CSV",
        help="census.csv of attnid census --grid: adds its claim row to claims.csv",
    )
    parser.add_argument(
        "--plateau",
        default=None,
        metavar="CSV",
        help="interventions_plateau.csv of attnid interventions-table: adds the plateau claim",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="CSV",
        help="calibration.csv of attnid calibration-table: adds the claim that no best lr is at a grid edge",
    )
    parser.add_argument(
        "--quantization",
        default=None,
        metavar="CSV",
        help="quantization.csv of attnid quantization-table (quantization_seeds.csv beside it): adds the "
        "quantization stage's claims to claims.csv",
    )
    parser.add_argument(
        "--verdicts",
        default=None,
        metavar="CSV",
        help="interventions.csv of attnid interventions-table: adds its verdicts, as findings",
    )
    parser.add_argument(
        "--alignment",
        default=None,
        metavar="CSV",
        help="alignment.csv of attnid alignment-table: adds the alignment stage's claim to claims.csv",
    )
    parser.add_argument(
        "--alignment-planted",
        default=None,
        metavar="JSON",
        help="attnid barrier --json of a model and its planted element (attnid plant): adds its two checks",
    )
    parser.add_argument(
        "--nullity",
        default=None,
        metavar="CSV",
        help="nullity.csv of attnid verify: adds the theory claims T1-T6 (its Jacobians) to claims.csv",
    )


def run_tables(args: argparse.Namespace) -> int:
    # lazy: pandas, which --help does not wait for
    from attnid.reports.tables import write_tables

    check_run_selection(args)
    quantization_seeds = (
        None if args.quantization is None else Path(args.quantization).with_name("quantization_seeds.csv")
    )
    declare_report_files(
        args,
        args.census,
        args.plateau,
        args.calibration,
        args.quantization,
        quantization_seeds,
        args.verdicts,
        args.alignment,
        args.alignment_planted,
        args.nullity,
    )
    with written_by("attnid train"):
        tables = write_tables(
            args.runs_dir,
            args.sweep_dir,
            args.out_dir,
            args.runs,
            args.sweep_runs,
            args.census,
            args.intervention_runs,
            args.identity_runs,
            args.plateau,
            args.calibration,
            args.quantization,
            args.verdicts,
            nullity_csv=args.nullity,
            alignment_csv=args.alignment,
            planted_json=args.alignment_planted,
        )
    for row in tables["claims"].itertuples():
        print(
            f"{row.result:>7}  {row.claim}: measured {row.measured:.3g} in {row.dtype or '?'!s} "
            f"({row.detail})"
        )
    print(f"wrote {len(tables)} tables to {args.out_dir}")
    return 0


def add_figures_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "figures",
        nargs="*",
        metavar="FIGURE",
        help="draw only these (fig1, fig2, ...; each needs the sources its module's INPUTS name); by default "
        "every figure without an optional stage, and fig5 / fig6 / fig7 / fig8 where the studies' / the "
        "interventions' / the quantization stage's / the alignment stage's tables are given",
    )
    parser.add_argument("--tables", default=None, help="results/tables (sweep.csv, sweep_slopes.csv, ...)")
    add_run_selection_arguments(parser, sweep=False)  # Figure 4 reads the sweep from the tables
    parser.add_argument("--theory-dir", default=None, help="results/theory (counts.csv, nullity.csv)")
    add_intervention_run_arguments(parser)
    parser.add_argument(
        "--out-dir", required=True, help="where each figure's .png, .pdf and filled caption .rst go"
    )
    parser.add_argument(
        "--no-studies",
        dest="studies",
        action="store_false",
        help="no Figure 5, even where study tables of an earlier build exist",
    )


def run_figures(args: argparse.Namespace) -> int:
    sources = Sources(
        theory=None if args.theory_dir is None else Path(args.theory_dir),
        tables=None if args.tables is None else Path(args.tables),
        runs_dir=None if args.runs_dir is None else Path(args.runs_dir),
        runs=args.runs,
        intervention_runs=args.intervention_runs,
        identity_runs=args.identity_runs,
    )
    unknown = [name for name in args.figures if name not in registry()]
    if unknown:
        raise UserError(f"no figure {', '.join(unknown)}: the figures are {', '.join(registry())}")
    names = args.figures or default_figures(sources, frozenset() if args.studies else frozenset({"studies"}))
    declare_report_files(args, *files_in(args.tables, "*.csv"), *files_in(args.theory_dir, "*.csv"))
    paths: list[Path] = []
    with written_by("attnid tables, counts, verify or train"):
        for name in names:
            paths += make_figure(name, sources, args.out_dir)
    print(f"wrote {len(paths)} files to {args.out_dir}")
    return 0


def add_appendix_arguments(parser: argparse.ArgumentParser) -> None:
    # lazy: pandas, which only this command's --help loads (for the optional parts), not the others'
    from attnid.reports.appendix import optional_parts

    parts = optional_parts()

    parser.add_argument("--counts", default="results/theory/counts.csv", help="default: %(default)s")
    parser.add_argument("--nullity", default="results/theory/nullity.csv", help="default: %(default)s")
    parser.add_argument(
        "--single-head", default="results/theory/single_head.csv", help="default: %(default)s"
    )
    parser.add_argument(
        "--whole-model",
        default=None,
        help="whole-model counts CSV (attnid counts --whole-model-out) for table A4",
    )
    parser.add_argument("--census", default=None, help="census CSV (attnid census --grid --out) for table A5")
    parser.add_argument("--out", default="paper/appendix.tex", help="default: %(default)s")
    parser.add_argument(
        "--experiment-tables",
        default=None,
        help="folder with runs.tex, cases.tex, sweep.tex, prune.tex, the studies' and "
        "interventions' tables to include verbatim (those that exist)",
    )
    parser.add_argument(
        "--figures",
        default=None,
        help=f"folder with {', '.join(name + '.pdf' for name in registry())} (and the captions attnid "
        "figures filled in, .rst) to include",
    )
    parser.add_argument(
        "--templates",
        default=None,
        help="template folder overriding the package's (copy of attnid/reports/templates)",
    )
    parser.add_argument("--pdf", action="store_true", help="then run latexmk -pdf on main.tex next to --out")
    parser.add_argument(
        "--omit",
        nargs="+",
        default=[],
        choices=sorted(parts),
        metavar="PART",
        help="leave out the tables and figures of these optional stages even where files of an "
        f"earlier build exist ({', '.join(sorted(parts))})",
    )


def run_appendix(args: argparse.Namespace) -> int:
    # lazy: pandas, which only this command's --help loads, not the others'
    from attnid.reports.appendix import compile_pdf, render_appendix

    rule = outputs.current()
    rule.read(
        args.counts,
        args.nullity,
        args.single_head,
        args.whole_model,
        args.census,
        args.templates,
        *files_in(args.experiment_tables, "*.tex"),
        *files_in(args.figures, "*.pdf"),
        *files_in(args.figures, "*.rst"),
    )
    rule.write(args.out, outputs.TEX, "--out")
    if args.pdf:
        main_tex = Path(args.out).resolve().parent / "main.tex"
        rule.read(main_tex)
        rule.write(main_tex.with_suffix(".pdf"), outputs.PDF)
        rule.write(main_tex.with_suffix(".log"), outputs.TEXT)
    with written_by("attnid counts, verify, tables or figures"):
        text = render_appendix(
            args.counts,
            args.nullity,
            args.single_head,
            args.out,
            args.experiment_tables,
            args.figures,
            args.templates,
            omit=args.omit,
            whole_model_csv=args.whole_model,
            census_csv=args.census,
        )
    write_text_atomic(args.out, text, outputs.TEX)
    if args.pdf:
        compile_pdf(Path(args.out).resolve().parent / "main.tex")
    return 0


def add_report_pages_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", required=True, help="results/<config>/tables (claims.csv and the others)")
    parser.add_argument("--figures", required=True, help="results/<config>/figures (figN.png and figN.rst)")
    parser.add_argument(
        "--figure-names",
        nargs="*",
        default=[],
        metavar="FIGURE",
        help="the figures to show (fig1, fig2, ...)",
    )
    parser.add_argument(
        "--pages",
        nargs="*",
        default=[],
        choices=sorted(TABLE_PAGES),
        metavar="PAGE",
        help=f"the table pages to write ({', '.join(TABLE_PAGES)})",
    )
    parser.add_argument(
        "--title", required=True, help="what the landing page calls the build (e.g. its results_dir)"
    )
    parser.add_argument("--out-dir", required=True, help="where index.rst and the .html pages go")


def run_report_pages(args: argparse.Namespace) -> int:
    rule = outputs.current()
    rule.read(
        *files_in(args.tables, "*.csv"), *files_in(args.figures, "*.png"), *files_in(args.figures, "*.rst")
    )
    rule.write_dir(args.out_dir, "--out-dir")
    with written_by("attnid tables, studies, edits-table, interventions-table or figures"):
        written = write_report_pages(
            args.tables, args.figures, args.out_dir, args.title, args.figure_names, args.pages
        )
    print(f"wrote {len(written)} report pages to {args.out_dir}")
    return 0


def add_studies_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--studies-dir",
        default=None,
        help="results/<config>/studies: gather every heads/<point>/seed<N> and variants/... below",
    )
    parser.add_argument(
        "--heads-runs",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="exactly these run directories of the heads study (<point>/seed<N>)",
    )
    parser.add_argument(
        "--variants-runs",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="exactly these run directories of the variants study (<point>/seed<N>)",
    )
    parser.add_argument(
        "--out-dir",
        required=True,
        help="where heads.csv/.tex, variants.csv/.tex and identification_correlation.csv/.tex go",
    )


def run_studies(args: argparse.Namespace) -> int:
    # lazy: pandas and scipy, which --help does not wait for
    from attnid.reports.studies import STUDIES, write_study_tables
    from attnid.training.rundir import find_run_dirs

    if args.studies_dir is None and not args.heads_runs and not args.variants_runs:
        raise UserError(
            "say which runs to gather: --studies-dir DIR, or --heads-runs / --variants-runs RUN_DIR ..."
        )
    run_dirs = {}
    for study in STUDIES:
        listed = getattr(args, f"{study}_runs")
        root = Path(args.studies_dir) / study if args.studies_dir is not None else None
        run_dirs[study] = find_run_dirs(root, listed)
    declare_report_files(args)
    with written_by("attnid train"):
        tables = write_study_tables(run_dirs, args.out_dir)
    for row in tables["correlation"].itertuples():
        if row.quantity == "final_val_loss":
            print(
                f"{row.study} ({row.subset}): Spearman(identified fraction, val loss) over {row.n_points} "
                f"point means = {row.spearman_of_means:.2f}, permutation p = {row.p_value:.2g}, "
                f"95% bootstrap CI over {row.n_ci_seeds} seeds [{row.ci_low:.2f}, {row.ci_high:.2f}]; "
                f"per-seed mean {row.spearman_per_seed_mean:.2f}, spread (sd) "
                f"{row.spearman_per_seed_sd:.2f} over {row.n_seed_correlations} seeds"
            )
    print(f"wrote {', '.join(name for name in tables if name != 'correlation')} tables to {args.out_dir}")
    return 0


def add_edits_table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        type=Path,
        nargs="+",
        required=True,
        metavar="REPORT",
        help="JSON reports of attnid prune-biases and attnid balance (their --json)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("results/tables"),
        help="where prune.csv, prune_summary.csv and prune.tex go (default: %(default)s)",
    )


def run_edits_table(args: argparse.Namespace) -> int:
    # lazy: pandas, which --help does not wait for
    from attnid.reports.edits_table import write_edits_table

    declare_report_files(args, *args.json)
    with written_by("attnid prune-biases or balance (--json)"):
        tables = write_edits_table(args.json, args.out_dir)
    summary = tables["summary"]
    for row in records(summary):
        print(
            f"{row['edit']} ({row['n_runs']} checkpoint(s), L={row['n_layer']} H={row['n_head']} "
            f"E={row['n_embd']}): max relative logit change {row['max_rel_logit_change']:.3g}, "
            f"largest |loss change| {row['max_abs_loss_change']:.3g}"
        )
    print(f"wrote {args.out_dir / 'prune.csv'}, prune_summary.csv, prune.tex")
    return 0


def add_quantization_table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        nargs="+",
        required=True,
        type=Path,
        help="attnid quant-report --orbit-points --json reports",
    )
    parser.add_argument(
        "--out-dir", required=True, help="where quantization.csv, _seeds.csv, _activations.csv and .tex go"
    )


def run_quantization_table(args: argparse.Namespace) -> int:
    # lazy: pandas, which --help does not wait for
    from attnid.reports.quantization_table import write_quantization_tables

    declare_report_files(args, *args.json)
    with written_by("attnid quant-report --orbit-points"):
        tables = write_quantization_tables(args.json, Path(args.out_dir))
    rows = tables["quantization"]
    print(f"wrote quantization.csv ({len(rows)} rows, {rows['model'].nunique()} models) to {args.out_dir}")
    return 0
