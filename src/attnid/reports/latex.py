"""LaTeX rendering: jinja2 helpers and ``attnid appendix`` (paper/appendix.tex).

Reusable helpers (the experiment tables in tables.py use them too):

* :func:`latex_environment` -- a jinja2 environment whose delimiters cannot
  clash with TeX: ``\\VAR{expr}`` prints, ``\\BLOCK{for ...}`` / ``\\BLOCK{endfor}``
  are statements, ``\\#{...}`` is a comment. Undefined names are errors. Filters:
  ``thousands`` (1048576 -> ``1,048,576``), ``fixed(n)`` (n decimals), ``tex``
  (escape ``& % $ # _ { } ~ ^ \\``), ``yesno`` (True -> ``yes``), ``sci``, ``gap``.
* :func:`render_table` -- render one template (a file name in the template
  folder, or template text) with ``rows`` (a list of dicts or a DataFrame).

The templates are package data, ``attnid/reports/templates/``: ``appendix.tex.j2`` is the
skeleton, ``counts.tex.j2`` (A1), ``nullity.tex.j2`` (A2), ``single_head.tex.j2``
(A3), ``whole_model.tex.j2`` (A4) and ``census.tex.j2`` (A5, the whole-model census),
``experiment_*.tex.j2`` (the tables of ``attnid tables``). The figure
captions, ``attnid/reports/templates/captions/<figure>.rst``, are shared with the Snakemake
report (``report(..., caption=...)`` in workflow/rules/report.smk): a new figure is
its caption file plus its name in :data:`FIGURES`.
"""

from __future__ import annotations

import importlib.resources
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import atomic_path
from attnid.reports.studies import STUDIES

if TYPE_CHECKING:
    import jinja2
    import pandas as pd

# "~" in a label means "about" ("beta after rebalance ~ 0"): shown as a math \sim, not as an accent.
_TEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"$\sim$",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


def tex_escape(value: Any) -> str:
    """Escape TeX's special characters in plain text."""
    return "".join(_TEX_ESCAPES.get(char, char) for char in str(value))


def thousands(value: Any) -> str:
    """An integer with comma thousands separators: ``1048576 -> '1,048,576'``.

    Floats that are whole numbers are shown as integers; ``inf`` as ``$\\infty$``.
    """
    number = float(value)
    if math.isinf(number):
        return r"$\infty$"
    if number != round(number):
        raise ValueError(f"thousands() needs a whole number, got {value!r}")
    return f"{int(round(number)):,}"


def fixed(value: Any, digits: int = 4) -> str:
    """A float with a fixed number of decimals (``fixed(0.9375, 3) -> '0.938'``)."""
    return f"{float(value):.{digits}f}"


def scientific(value: Any, digits: int = 1) -> str:
    """A float like ``2.8e13`` as TeX, ``$2.8\\times10^{13}$``; ``inf`` as ``$\\infty$``."""
    number = float(value)
    if math.isinf(number):
        return r"$\infty$"
    mantissa, exponent = f"{number:.{digits}e}".split("e")
    return rf"${mantissa}\times10^{{{int(exponent)}}}$"


def yesno(value: Any) -> str:
    return "yes" if str(value).strip().lower() in {"true", "1", "yes"} else "no"


def bias_label(row: Mapping[str, Any]) -> str:
    """The bias column of table A1: ``yes`` (q, k, v and output), ``qkv`` (q, k, v only, as Qwen2),
    ``out`` (output only) or ``no``, from counts.csv's ``bias`` and ``out_bias``."""
    qkv, out = yesno(row["bias"]) == "yes", yesno(row.get("out_bias", row["bias"])) == "yes"
    return {(True, True): "yes", (True, False): "qkv", (False, True): "out", (False, False): "no"}[(qkv, out)]


def gap_note(row: Mapping[str, Any]) -> str:
    """Why a row of nullity.csv has ``gap = inf`` (no positive dropped singular value):
    ``rows`` -- the Jacobian has fewer rows than parameters and every singular value is kept
    (rank = rows), so the null directions are exactly those no row sees; ``zero`` -- the largest
    dropped singular value came out exactly 0.0. Empty for a finite gap."""
    if not math.isinf(float(row["gap"])):
        return ""
    n_params, n_rows = int(row["n_params"]), int(row["n_outputs"])
    if n_rows < n_params and int(row["measured"]) == n_params - n_rows:
        return "rows"
    return "zero"


GAP_MARKS = {"rows": "*", "zero": r"\dagger"}


def nullity_gap(row: Mapping[str, Any]) -> str:
    """The gap cell of table A2: ``$2.8\\times10^{15}$``, or for an infinite gap ``$\\infty$``
    with the mark of its reason (:func:`gap_note`), explained under the table."""
    note = gap_note(row)
    return rf"$\infty^{{{GAP_MARKS[note]}}}$" if note else scientific(row["gap"])


def tex_number(value: Any, digits: int = 3) -> str:
    """A number for a table cell: plain for moderate magnitudes, a×10^b otherwise, -- for missing."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "--"
    if not math.isfinite(value):
        return "--"
    if value == 0:
        return "0"
    if 1e-2 <= abs(value) < 1e4:
        return f"{value:.{digits}g}"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"${mantissa}\\times10^{{{int(exponent)}}}$"


def tex_mean_sd(mean: Any, sd: Any, digits: int = 3) -> str:
    if sd is None or not math.isfinite(float(sd)):
        return tex_number(mean, digits)
    return f"{tex_number(mean, digits)} $\\pm$ {tex_number(sd, 2)}"


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def tex_signed(value: Any) -> str:
    """A correlation as ``$+0.54$`` / ``$-0.54$``; ``--`` when there is none."""
    number = _finite(value)
    return "--" if number is None else f"${number:+.2f}$"


def tex_spread(value: Any) -> str:
    r"""``sd 0.12`` after a per-seed mean: the seeds' spread, labelled as one; ``--`` for a single seed."""
    number = _finite(value)
    return "--" if number is None else f"sd {number:.2f}"


def tex_probability(value: Any) -> str:
    """A p-value to two significant digits (``0.34``, ``0.017``); ``--`` when there is none."""
    number = _finite(value)
    return "--" if number is None else f"{number:.2g}"


def tex_interval(low: Any, high: Any) -> str:
    """A correlation's CI as ``[$-0.52$, $-0.10$]``; ``--`` when there is none."""
    if _finite(low) is None or _finite(high) is None:
        return "--"
    return f"[{tex_signed(low)}, {tex_signed(high)}]"


def tex_whole(value: Any) -> str:
    """A count or a rate as a whole number with thousands separators; ``--`` when missing."""
    number = _finite(value)
    return "--" if number is None else thousands(round(number))


def package_template_dir() -> Traversable:
    """The templates shipped with the package, found with importlib.resources (a Traversable:
    a folder in a checkout or an installed package, a zip member in a zipped one)."""
    return importlib.resources.files("attnid.reports").joinpath("templates")


def _resource_loader(folder: Traversable) -> jinja2.BaseLoader:
    """A jinja2 loader over a Traversable folder (what importlib.resources returns)."""
    import jinja2

    def load(name: str):
        resource = folder.joinpath(*name.split("/"))
        return resource.read_text(encoding="utf-8") if resource.is_file() else None

    return jinja2.FunctionLoader(load)


def latex_environment(template_dir: str | os.PathLike | Traversable | None = None) -> jinja2.Environment:
    """A jinja2 Environment with TeX-safe delimiters and the filters above.

    Templates are read from ``template_dir`` (a folder path, or a Traversable such as
    :func:`package_template_dir`), by default from the package's own templates.
    """
    import jinja2

    loader: jinja2.BaseLoader
    if isinstance(template_dir, (str, os.PathLike)):
        loader = jinja2.FileSystemLoader(str(template_dir))
    else:
        loader = _resource_loader(template_dir if template_dir is not None else package_template_dir())
    env = jinja2.Environment(
        loader=loader,
        block_start_string=r"\BLOCK{",
        block_end_string="}",
        variable_start_string=r"\VAR{",
        variable_end_string="}",
        comment_start_string=r"\#{",
        comment_end_string="}",
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters.update(
        thousands=thousands,
        fixed=fixed,
        tex=tex_escape,
        yesno=yesno,
        sci=scientific,
        bias=bias_label,
        gap=nullity_gap,
        num=tex_number,
        signed=tex_signed,
        spread=tex_spread,
        whole=tex_whole,
        p=tex_probability,
    )
    env.globals.update(mean_sd=tex_mean_sd, interval=tex_interval)
    return env


def records(rows: pd.DataFrame | Iterable[dict]) -> list[dict]:
    """Rows for a template: a DataFrame's records with every missing value (NaN, NA) as None, so that
    templates and filters see one kind of missing; any other iterable of dicts as a list."""
    if not hasattr(rows, "to_dict"):
        return list(rows)
    import pandas as pd

    return [
        {
            key: (None if pd.api.types.is_scalar(value) and pd.isna(value) else value)
            for key, value in row.items()
        }
        for row in rows.to_dict("records")
    ]


def render_table(
    template: str,
    rows: pd.DataFrame | Iterable[dict] = (),
    template_dir: str | os.PathLike | None = None,
    **context: Any,
) -> str:
    """Render ``template`` with ``rows`` and any extra context; every DataFrame among them is passed
    as :func:`records`. The one renderer of every table and of the appendix.

    ``template`` is a file name inside ``template_dir`` (default: the package's
    ``attnid/reports/templates``) or, if it contains a newline, the template text itself.
    """
    if "\n" in template:
        compiled = latex_environment().from_string(template)
    else:
        compiled = latex_environment(template_dir or find_template_dir()).get_template(template)
    context = {key: records(value) if hasattr(value, "to_dict") else value for key, value in context.items()}
    return compiled.render(rows=records(rows), **context)


def find_template_dir(explicit: str | os.PathLike | None = None) -> Traversable:
    """``explicit`` (``--templates DIR``) if given, else the package's own templates."""
    if explicit is None:
        return package_template_dir()
    if not (Path(explicit) / "appendix.tex.j2").is_file():
        raise UserError(
            f"--templates {explicit}: no appendix.tex.j2 there (copy attnid/reports/templates to start from)"
        )
    return Path(explicit)


# ---------------------------------------------------------------------------------------------
# attnid appendix

EXPERIMENT_TABLES = ("runs.tex", "cases.tex", "sweep.tex", "prune.tex")  # prune.tex: attnid edits-table
# One row per run (or case) with a dozen numbers: too wide for a portrait page at a readable size.
LANDSCAPE_TABLES = ("runs.tex", "cases.tex")
# The figures of `attnid figures`, in order; each has its caption in templates/captions/<name>.rst.
FIGURES = ("fig1", "fig2", "fig3", "fig4", "fig5", "fig6")
# Drawn only for a build with the identification studies (attnid.plan.studies) or the interventions
# (attnid.plan.interventions): included when present.
OPTIONAL_FIGURES = ("fig5", "fig6")
# A figure whose caption is filled with its build's numbers: attnid figures writes <name>.rst next to it,
# and that is the caption shown (the package's captions/<name>.rst is its template).
FILLED_CAPTIONS = ("fig6",)
# The studies' tables (attnid studies), included when present, each after its own paragraph.
STUDY_TABLES = (*(f"{study}.tex" for study in STUDIES), "identification_correlation.tex")
# The interventions' paired comparison (attnid interventions-table), in the same section, when present.
INTERVENTION_TABLES = ("interventions.tex",)
# The optional stages a build may leave out (`--omit`): what of the appendix each one owns, so that a
# build with a stage turned off never includes that stage's leftovers from an earlier build.
OPTIONAL_PARTS = {
    "studies": {*STUDY_TABLES, "fig5"},
    "edits": {"prune.tex"},
    "interventions": {*INTERVENTION_TABLES, "fig6"},
}

# Typographic characters of the caption files and their TeX; anything else non-ASCII must be
# written as :math:`...` (pdflatex with T1 fonts has no glyph for a bare Greek letter).
_CAPTION_CHARACTERS = {"—": "---", "–": "--", "’": "'", "‘": "`", "“": "``", "”": "''", "\u00a0": "~"}
_RST_INLINE = re.compile(
    r"``(?P<code>.+?)``|:math:`(?P<math>.+?)`|\*\*(?P<strong>.+?)\*\*|\*(?P<emph>[^*]+?)\*", re.S
)


def caption_file(name: str) -> str:
    """The caption file of figure ``name`` (e.g. ``fig1``): the Snakemake report's caption too."""
    return str(package_template_dir().joinpath("captions", f"{name}.rst"))


def _caption_text(text: str, where: str) -> str:
    escaped = tex_escape(text)
    for char, tex in _CAPTION_CHARACTERS.items():
        escaped = escaped.replace(char, tex)
    strange = sorted({char for char in escaped if ord(char) > 127})
    if strange:
        raise ValueError(f"{where}: {''.join(strange)!r} has no TeX form here; write it as :math:`...`")
    return escaped


def rst_to_tex(text: str, where: str = "caption") -> str:
    """TeX for the reStructuredText subset of the caption files: ``code``, :math:`x`,
    **strong**, *emphasis* and plain text (special characters escaped)."""
    pieces, position = [], 0
    for match in _RST_INLINE.finditer(text):
        pieces.append(_caption_text(text[position : match.start()], where))
        if match["code"] is not None:  # long identifiers may break after . _ /
            code = tex_escape(match["code"])
            for breakable in (".", r"\_", "/"):
                code = code.replace(breakable, breakable + r"\allowbreak{}")
            pieces.append(rf"\texttt{{{code}}}")
        elif match["math"] is not None:
            pieces.append(f"${match['math']}$")
        elif match["strong"] is not None:
            pieces.append(rf"\textbf{{{rst_to_tex(match['strong'], where)}}}")
        else:
            pieces.append(rf"\emph{{{rst_to_tex(match['emph'], where)}}}")
        position = match.end()
    pieces.append(_caption_text(text[position:], where))
    return " ".join("".join(pieces).split())


def figure_caption(name: str, caption_dir: Traversable | None = None) -> dict:
    """Title and caption TeX of figure ``name`` from its caption file, whose first sentence is
    ``**Figure N — title.**`` (the report shows it as is; LaTeX numbers the figure itself)."""
    folder = caption_dir if caption_dir is not None else package_template_dir().joinpath("captions")
    source = folder.joinpath(f"{name}.rst")
    if not source.is_file():
        raise UserError(
            f"no caption for figure {name}: add {source} and list it in attnid.reports.latex.FIGURES"
        )
    text = source.read_text(encoding="utf-8").strip()
    heading = re.match(r"\*\*(?:Figure\s+\d+\s*[—–-]+\s*)?(?P<title>.+?)\*\*\s*(?P<rest>.*)", text, re.S)
    if heading is None:
        raise UserError(f"{source}: the caption must start with **Figure N — title.**")
    title = rst_to_tex(heading["title"], str(source))
    return {
        "name": name,
        "title": title.rstrip("."),
        "caption": rf"\textbf{{{title}}} " + rst_to_tex(heading["rest"], str(source)),
    }


def _figures(
    figures: str | os.PathLike | None, out_dir: Path, omitted: frozenset = frozenset()
) -> list[dict]:
    """Each figure's PDF (relative to the appendix) with its caption; one error lists all missing."""
    if figures is None:
        return []
    present = [name for name in FIGURES if name not in omitted and (Path(figures) / f"{name}.pdf").is_file()]
    missing = [f"{name}.pdf" for name in FIGURES if name not in present and name not in OPTIONAL_FIGURES]
    if missing:
        raise UserError(f"--figures {figures}: missing {', '.join(missing)}; run 'attnid figures' first")
    return [
        figure_caption(name, Path(figures) if name in FILLED_CAPTIONS else None)
        | {
            "path": Path(os.path.relpath(Path(figures).resolve() / f"{name}.pdf", out_dir)).as_posix(),
            "wide": pdf_aspect_ratio(Path(figures) / f"{name}.pdf") > WIDE_FIGURE_ASPECT,
        }
        for name in present
    ]


# A figure wider than this (width / height) gets a landscape page of its own: on a portrait
# page its labels would shrink below a readable size.
WIDE_FIGURE_ASPECT = 1.6


def pdf_aspect_ratio(path: Path) -> float:
    """Width / height of a one-page PDF's ``/MediaBox`` (matplotlib writes it as plain text)."""
    match = re.search(
        rb"/MediaBox\s*\[\s*([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*\]", path.read_bytes()
    )
    if match is None:
        return 1.0  # unknown size: a portrait page, as before
    left, bottom, right, top = (float(value) for value in match.groups())
    return (right - left) / max(top - bottom, 1e-9)


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


def _verbatim_blocks(
    folder: str | os.PathLike | None, names: Iterable[str], omitted: frozenset
) -> list[dict]:
    """``{name, text}`` of each table ``names`` lists that exists in ``folder`` and is not ``omitted``."""
    if folder is None:
        return []
    return [
        {"name": name, "text": (Path(folder) / name).read_text(encoding="utf-8")}
        for name in names
        if name not in omitted and (Path(folder) / name).is_file()
    ]


def render_appendix(
    counts_csv: str | os.PathLike,
    nullity_csv: str | os.PathLike,
    single_head_csv: str | os.PathLike,
    out_path: str | os.PathLike,
    experiment_tables: str | os.PathLike | None = None,
    figures: str | os.PathLike | None = None,
    template_dir: str | os.PathLike | None = None,
    omit: Iterable[str] = (),
    whole_model_csv: str | os.PathLike | None = None,
    census_csv: str | os.PathLike | None = None,
) -> str:
    """Render the appendix text (A1 counts, A2 nullity, A3 single-head match, A4 whole-model counts and
    A5 census when given, plus the experiment tables and figures when given), without the tables and
    figures of the ``omit`` parts (:data:`OPTIONAL_PARTS`)."""
    counts_frame = _read_csv(counts_csv, "counts", {"architecture", "n_layer", "unidentified_qk_per_layer"})
    nullity_frame = _read_csv(
        nullity_csv, "nullity", {"case", "n_params", "n_outputs", "theory", "measured", "gap", "passed"}
    )
    single_frame = _read_csv(single_head_csv, "single-head", {"label", "e0_equal_identified"})
    whole_frame = (
        None
        if whole_model_csv is None
        else _read_csv(
            whole_model_csv,
            "whole-model",
            {"architecture", "whole_params", "whole_unidentified", "group_rotation"},
        )
    )
    census_frame = (
        None
        if census_csv is None
        else _read_csv(census_csv, "census", {"shape", "n_params", "theory", "measured", "gap", "closes"})
    )
    templates = find_template_dir(template_dir)
    out_dir = Path(out_path).resolve().parent
    omitted = frozenset().union(*(OPTIONAL_PARTS[part] for part in omit))

    experiment_blocks = []
    if experiment_tables is not None:
        for name in EXPERIMENT_TABLES:
            path = Path(experiment_tables) / name
            if name not in omitted and path.is_file():
                experiment_blocks.append(
                    {
                        "name": name,
                        "text": path.read_text(encoding="utf-8"),
                        "landscape": name in LANDSCAPE_TABLES,
                    }
                )
    study_blocks = _verbatim_blocks(experiment_tables, STUDY_TABLES, omitted)
    intervention_blocks = _verbatim_blocks(experiment_tables, INTERVENTION_TABLES, omitted)
    figure_entries = _figures(figures, out_dir, omitted)

    sources = [str(counts_csv), str(nullity_csv), str(single_head_csv)]
    sources += [str(path) for path in (whole_model_csv, census_csv) if path is not None]
    if experiment_tables is not None:  # the blocks come from there
        sources += [
            str(Path(experiment_tables) / b["name"])
            for b in experiment_blocks + study_blocks + intervention_blocks
        ]
    shown_templates = "attnid/reports/templates (package data)" if template_dir is None else str(template_dir)
    env = latex_environment(templates)
    context = {
        "sources": sources,
        "templates": shown_templates,
        "counts_rows": records(counts_frame),
        "nullity_rows": records(nullity_frame),
        "single_head_rows": records(single_frame),
        "experiment_blocks": experiment_blocks,
        "experiment_tables": {block["name"] for block in experiment_blocks},
        "study_blocks": study_blocks,
        "study_tables": {block["name"] for block in study_blocks},
        "intervention_blocks": intervention_blocks,
        "figures": figure_entries,
        "n_passed": int(nullity_frame["passed"].astype(str).str.lower().eq("true").sum()),
        "n_cases": len(nullity_frame),
        "gap_notes": {gap_note(row) for row in records(nullity_frame)} - {""},
        "whole_model_rows": [] if whole_frame is None else records(whole_frame),
        "census_rows": [] if census_frame is None else records(census_frame),
        "n_census": 0 if census_frame is None else len(census_frame),
        "n_census_closing": 0
        if census_frame is None
        else int(census_frame["closes"].astype(str).str.lower().eq("true").sum()),
    }
    return env.get_template("appendix.tex.j2").render(**context)


def compile_pdf(main_tex: Path) -> Path:
    """Run ``latexmk -pdf`` on ``main_tex`` in its own folder; returns the PDF path. The LaTeX
    log is kept next to it (``main.log``)."""
    if shutil.which("latexmk") is None:
        raise UserError(
            "latexmk not found: install TeX (e.g. apt-get install latexmk texlive-latex-recommended) "
            "or drop --pdf"
        )
    if not main_tex.is_file():
        raise UserError(f"{main_tex} not found: --pdf compiles the main.tex that sits next to --out")
    # Build in a scratch folder and move the PDF into place, so a killed run leaves no half PDF.
    build = Path(tempfile.mkdtemp(prefix=".latexmk-", dir=main_tex.parent))
    try:
        result = subprocess.run(
            [
                "latexmk",
                "-pdf",
                "-interaction=nonstopmode",
                "-halt-on-error",
                f"-outdir={build.name}",
                main_tex.name,
            ],
            cwd=main_tex.parent,
            capture_output=True,
            text=True,
        )
        log = main_tex.with_suffix(".log")
        if (build / log.name).is_file():  # the log outlives the scratch folder (overfull boxes, errors)
            with atomic_path(log, outputs.TEXT) as tmp:
                shutil.copyfile(build / log.name, tmp)
        if result.returncode != 0:
            errors = [line for line in result.stdout.splitlines() if line.startswith("!")]
            raise UserError(f"latexmk failed on {main_tex}: {errors[0] if errors else 'see ' + str(log)}")
        pdf = main_tex.with_suffix(".pdf")
        with atomic_path(pdf, outputs.PDF) as tmp:
            os.replace(build / pdf.name, tmp)
        return pdf
    finally:
        shutil.rmtree(build, ignore_errors=True)
