"""LaTeX rendering: jinja2 helpers and ``attnid appendix`` (paper/appendix.tex).

Reusable helpers (the experiment tables in tables.py use them too):

* :func:`latex_environment` -- a jinja2 environment whose delimiters cannot
  clash with TeX: ``\\VAR{expr}`` prints, ``\\BLOCK{for ...}`` / ``\\BLOCK{endfor}``
  are statements, ``\\#{...}`` is a comment. Undefined names are errors. Filters:
  ``thousands`` (1048576 -> ``1,048,576``), ``fixed(n)`` (n decimals), ``tex``
  (escape ``& % $ # _ { } ~ ^ \\``), ``yesno`` (True -> ``yes``).
* :func:`render_table` -- render one template (a file name in the template
  folder, or template text) with ``rows`` (a list of dicts or a DataFrame).

Templates live in ``paper/templates/``: ``appendix.tex.j2`` is the skeleton,
``counts.tex.j2`` (A1), ``nullity.tex.j2`` (A2), ``single_head.tex.j2`` (A3).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from attnid.errors import UserError

PACKAGE_TEMPLATES = Path(__file__).resolve().parents[2] / "paper" / "templates"

_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "<": r"\textless{}", ">": r"\textgreater{}"}


def tex_escape(value) -> str:
    """Escape TeX's special characters in plain text."""
    return "".join(_TEX_ESCAPES.get(char, char) for char in str(value))


def thousands(value) -> str:
    """An integer with comma thousands separators: ``1048576 -> '1,048,576'``.

    Floats that are whole numbers are shown as integers; ``inf`` as ``$\\infty$``.
    """
    number = float(value)
    if math.isinf(number):
        return r"$\infty$"
    if number != round(number):
        raise ValueError(f"thousands() needs a whole number, got {value!r}")
    return f"{int(round(number)):,}"


def fixed(value, digits: int = 4) -> str:
    """A float with a fixed number of decimals (``fixed(0.9375, 3) -> '0.938'``)."""
    return f"{float(value):.{digits}f}"


def scientific(value, digits: int = 1) -> str:
    """A float like ``2.8e13`` as TeX, ``$2.8\\times10^{13}$``; ``inf`` as ``$\\infty$``."""
    number = float(value)
    if math.isinf(number):
        return r"$\infty$"
    mantissa, exponent = f"{number:.{digits}e}".split("e")
    return rf"${mantissa}\times10^{{{int(exponent)}}}$"


def yesno(value) -> str:
    return "yes" if str(value).strip().lower() in {"true", "1", "yes"} else "no"


def latex_environment(template_dir: str | os.PathLike | None = None):
    """A jinja2 Environment with TeX-safe delimiters and the filters above."""
    import jinja2

    loader = jinja2.FileSystemLoader(str(template_dir)) if template_dir is not None else None
    env = jinja2.Environment(
        loader=loader,
        block_start_string=r"\BLOCK{", block_end_string="}",
        variable_start_string=r"\VAR{", variable_end_string="}",
        comment_start_string=r"\#{", comment_end_string="}",
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    )
    env.filters.update(thousands=thousands, fixed=fixed, tex=tex_escape, yesno=yesno, sci=scientific)
    return env


def _records(rows) -> list[dict]:
    if hasattr(rows, "to_dict"):  # a pandas DataFrame
        return rows.to_dict(orient="records")
    return list(rows)


def render_table(template: str, rows, template_dir: str | os.PathLike | None = None, **context) -> str:
    """Render ``template`` with ``rows`` (list of dicts or DataFrame) and any extra context.

    ``template`` is a file name inside ``template_dir`` (default: the project's
    ``paper/templates``) or, if it contains a newline, the template text itself.
    """
    if "\n" in template:
        compiled = latex_environment().from_string(template)
    else:
        compiled = latex_environment(template_dir or find_template_dir()).get_template(template)
    return compiled.render(rows=_records(rows), **context)


def find_template_dir(explicit: str | os.PathLike | None = None) -> Path:
    for candidate in ([Path(explicit)] if explicit else [Path.cwd() / "paper" / "templates", PACKAGE_TEMPLATES]):
        if (candidate / "appendix.tex.j2").is_file():
            return candidate
    raise UserError("appendix templates not found (looked for paper/templates/appendix.tex.j2): "
                    "run from the repository root or pass --templates DIR")


# ---------------------------------------------------------------------------------------------
# attnid appendix

EXPERIMENT_TABLES = ("runs.tex", "cases.tex", "sweep.tex")
FIGURES = ("fig1.pdf", "fig2.pdf", "fig3.pdf", "fig4.pdf")


def _read_csv(path: str | os.PathLike, what: str, needed: set[str]):
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} CSV {path} not found: run the command that writes it first")
    try:
        frame = pd.read_csv(path)
    except Exception as err:  # pandas raises several types for broken files
        raise UserError(f"{what} CSV {path} cannot be read: {err}") from None
    missing = needed - set(frame.columns)
    if missing:
        raise UserError(f"{what} CSV {path} lacks column(s) {sorted(missing)}: regenerate it")
    return frame


def render_appendix(counts_csv, nullity_csv, single_head_csv, out_path, experiment_tables=None, figures=None,
                    template_dir=None) -> str:
    """Render the appendix text (A1 counts, A2 nullity, A3 single-head match, plus the
    experiment tables and figures when given)."""
    counts_frame = _read_csv(counts_csv, "counts", {"architecture", "n_layer", "unidentified_qk_per_layer"})
    nullity_frame = _read_csv(nullity_csv, "nullity", {"case", "theory", "measured", "gap", "passed"})
    single_frame = _read_csv(single_head_csv, "single-head", {"label", "e0_equal_identified"})
    templates = find_template_dir(template_dir)
    out_dir = Path(out_path).resolve().parent

    experiment_blocks = []
    if experiment_tables is not None:
        for name in EXPERIMENT_TABLES:
            path = Path(experiment_tables) / name
            if path.is_file():
                experiment_blocks.append({"name": name, "text": path.read_text(encoding="utf-8")})
    figure_paths = []
    if figures is not None:
        missing = [name for name in FIGURES if not (Path(figures) / name).is_file()]
        if missing:
            raise UserError(f"--figures {figures}: missing {', '.join(missing)}; run 'attnid figures' first")
        figure_paths = [Path(os.path.relpath(Path(figures).resolve() / name, out_dir)).as_posix() for name in FIGURES]

    sources = [str(counts_csv), str(nullity_csv), str(single_head_csv)]
    sources += [str(Path(experiment_tables) / b["name"]) for b in experiment_blocks]
    env = latex_environment(templates)
    context = {
        "sources": sources,
        "templates": os.path.relpath(templates) if templates.is_absolute() else str(templates),
        "counts_rows": _records(counts_frame),
        "nullity_rows": _records(nullity_frame),
        "single_head_rows": _records(single_frame),
        "experiment_blocks": experiment_blocks,
        "figure_paths": figure_paths,
        "n_passed": int(nullity_frame["passed"].astype(str).str.lower().eq("true").sum()),
        "n_cases": len(nullity_frame),
    }
    return env.get_template("appendix.tex.j2").render(**context)


def add_appendix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counts", default="results/theory/counts.csv", help="default: %(default)s")
    parser.add_argument("--nullity", default="results/theory/nullity.csv", help="default: %(default)s")
    parser.add_argument("--single-head", default="results/theory/single_head.csv", help="default: %(default)s")
    parser.add_argument("--out", default="paper/appendix.tex", help="default: %(default)s")
    parser.add_argument("--experiment-tables", default=None,
                        help="folder with runs.tex, cases.tex, sweep.tex to include verbatim (those that exist)")
    parser.add_argument("--figures", default=None, help="folder with fig1.pdf .. fig4.pdf to include")
    parser.add_argument("--templates", default=None, help="template folder (default: paper/templates)")
    parser.add_argument("--pdf", action="store_true", help="then run latexmk -pdf on main.tex next to --out")


def compile_pdf(main_tex: Path) -> Path:
    """Run ``latexmk -pdf`` on ``main_tex`` in its own folder; returns the PDF path."""
    if shutil.which("latexmk") is None:
        raise UserError("latexmk not found: install TeX (e.g. apt-get install latexmk texlive-latex-recommended) or drop --pdf")
    if not main_tex.is_file():
        raise UserError(f"{main_tex} not found: --pdf compiles the main.tex that sits next to --out")
    # Build in a scratch folder and move the PDF into place, so a killed run leaves no half PDF.
    build = Path(tempfile.mkdtemp(prefix=".latexmk-", dir=main_tex.parent))
    try:
        result = subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error",
                                 f"-outdir={build.name}", main_tex.name],
                                cwd=main_tex.parent, capture_output=True, text=True)
        if result.returncode != 0:
            errors = [line for line in result.stdout.splitlines() if line.startswith("!")]
            log = main_tex.with_suffix(".log")
            if (build / log.name).is_file():  # keep the log for the user after the scratch folder goes
                shutil.copyfile(build / log.name, log)
            raise UserError(f"latexmk failed on {main_tex}: {errors[0] if errors else 'see ' + str(log)}")
        pdf = main_tex.with_suffix(".pdf")
        os.replace(build / pdf.name, pdf)
        return pdf
    finally:
        shutil.rmtree(build, ignore_errors=True)


def run_appendix(args: argparse.Namespace) -> int:
    from attnid.files import write_text_atomic

    text = render_appendix(args.counts, args.nullity, args.single_head, args.out, args.experiment_tables,
                           args.figures, args.templates)
    write_text_atomic(args.out, text)
    if args.pdf:
        compile_pdf(Path(args.out).resolve().parent / "main.tex")
    return 0
