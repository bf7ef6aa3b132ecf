"""``attnid appendix``: paper/appendix.tex from the jinja2 templates (:mod:`attnid.reports.latex`), the
theory CSVs, the experiment tables and the figures of the registry (:mod:`attnid.reports.figures`) with the
captions their build filled in, and its PDF (``latexmk``).

The templates are package data, ``attnid/reports/templates/``: ``appendix.tex.j2`` is the skeleton,
``counts.tex.j2`` (A1), ``nullity.tex.j2`` (A2), ``single_head.tex.j2`` (A3), ``whole_model.tex.j2`` (A4) and
``census.tex.j2`` (A5, the whole-model census), ``experiment_*.tex.j2`` (the tables of ``attnid tables``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import atomic_path
from attnid.common.tex import why_no_pdf
from attnid.plan.studies import STUDIES
from attnid.reports.figures import caption_parts, registry
from attnid.reports.latex import find_template_dir, gap_note, latex_environment, records, tex_escape

# prune.tex: attnid edits-table; alignment.tex: attnid alignment-table
EXPERIMENT_TABLES = ("runs.tex", "cases.tex", "sweep.tex", "prune.tex", "alignment.tex")
# One row per run (or case) with a dozen numbers: too wide for a portrait page at a readable size.
LANDSCAPE_TABLES = ("runs.tex", "cases.tex", "alignment.tex")
# The studies' tables (attnid studies), included when present, each after its own paragraph.
STUDY_TABLES = (*(f"{study}.tex" for study in STUDIES), "identification_correlation.tex")
# The interventions' paired comparison (attnid interventions-table), in the same section, when present.
INTERVENTION_TABLES = ("interventions.tex",)
# What of the appendix each optional stage owns besides its figures (a figure's STAGE), so that a build with a
# stage turned off (`--omit`) never includes that stage's leftovers from an earlier build.
STAGE_TABLES = {
    "studies": set(STUDY_TABLES),
    "edits": {"prune.tex"},
    "interventions": set(INTERVENTION_TABLES),
    "quantization": {"quantization.tex"},
    "alignment": {"alignment.tex"},
}


def optional_parts() -> dict[str, set[str]]:
    """{stage: the tables and figures of the appendix it owns}: :data:`STAGE_TABLES` and each figure of the
    registry with that ``STAGE``."""
    parts = {stage: set(tables) for stage, tables in STAGE_TABLES.items()}
    for name, figure in registry().items():
        if figure.stage is not None:
            parts.setdefault(figure.stage, set()).add(name)
    return parts


# Typographic characters of the caption files and their TeX; anything else non-ASCII must be
# written as :math:`...` (pdflatex with T1 fonts has no glyph for a bare Greek letter).
_CAPTION_CHARACTERS = {
    "—": "---",
    "–": "--",
    "’": "'",
    "‘": "`",
    "“": "``",
    "”": "''",
    "\u00a0": "~",
    "\u2212": "$-$",  # a true minus sign (attnid.reports.figures.caption_value)
}
_RST_INLINE = re.compile(
    r"``(?P<code>.+?)``|:math:`(?P<math>.+?)`|\*\*(?P<strong>.+?)\*\*|\*(?P<emph>[^*]+?)\*", re.S
)


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


def figure_caption(name: str, caption_dir: str | os.PathLike) -> dict:
    """Title and caption TeX of figure ``name`` from the caption its build filled in,
    ``caption_dir/name.rst``, whose first sentence is ``**Figure N — title.**`` (the report shows it as is;
    LaTeX numbers the figure itself)."""
    source = Path(caption_dir) / f"{name}.rst"
    if not source.is_file():
        raise UserError(
            f"no caption {source} next to {name}.pdf: draw the figure again with 'attnid figures'"
        )
    parts = caption_parts(source.read_text(encoding="utf-8"))
    if parts is None:
        raise UserError(f"{source}: the caption must start with **Figure N — title.**")
    title = rst_to_tex(parts[0], str(source))
    return {
        "name": name,
        "title": title.rstrip("."),
        "caption": rf"\textbf{{{title}}} " + rst_to_tex(parts[1], str(source)),
    }


def _figures(
    figures: str | os.PathLike | None, out_dir: Path, omitted: frozenset = frozenset()
) -> list[dict]:
    """Each figure's PDF (relative to the appendix) with its caption; one error lists all missing."""
    if figures is None:
        return []
    every = registry()
    present = [name for name in every if name not in omitted and (Path(figures) / f"{name}.pdf").is_file()]
    missing = [
        f"{name}.pdf" for name, figure in every.items() if name not in present and figure.stage is None
    ]
    if missing:
        raise UserError(f"--figures {figures}: missing {', '.join(missing)}; run 'attnid figures' first")
    return [
        figure_caption(name, figures)
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
    figures of the ``omit`` stages (:func:`optional_parts`)."""
    theory = _theory_context(counts_csv, nullity_csv, single_head_csv, whole_model_csv, census_csv)
    parts = optional_parts()
    omitted = frozenset().union(*(parts[part] for part in omit))
    blocks = _table_blocks(experiment_tables, omitted)
    read = (counts_csv, nullity_csv, single_head_csv, whole_model_csv, census_csv)
    sources = [str(path) for path in read if path is not None]
    if experiment_tables is not None:  # the blocks come from there
        sources += [str(Path(experiment_tables) / b["name"]) for group in blocks.values() for b in group]
    context = {
        "sources": sources,
        "templates": "attnid/reports/templates (package data)" if template_dir is None else str(template_dir),
        "experiment_blocks": blocks["experiment"],
        "experiment_tables": {block["name"] for block in blocks["experiment"]},
        "study_blocks": blocks["study"],
        "study_tables": {block["name"] for block in blocks["study"]},
        "intervention_blocks": blocks["intervention"],
        "figures": _figures(figures, Path(out_path).resolve().parent, omitted),
        **theory,
    }
    env = latex_environment(find_template_dir(template_dir))
    return env.get_template("appendix.tex.j2").render(**context)


def _theory_context(
    counts_csv: str | os.PathLike,
    nullity_csv: str | os.PathLike,
    single_head_csv: str | os.PathLike,
    whole_model_csv: str | os.PathLike | None,
    census_csv: str | os.PathLike | None,
) -> dict[str, Any]:
    """The rows and counts of tables A1-A5 for the appendix template."""
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
    return {
        "counts_rows": records(counts_frame),
        "nullity_rows": records(nullity_frame),
        "single_head_rows": records(single_frame),
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


def _table_blocks(experiment_tables: str | os.PathLike | None, omitted: frozenset) -> dict[str, list[dict]]:
    """The experiment, study and intervention tables to include verbatim, each ``{name, text}`` (and
    ``landscape`` for an experiment table)."""
    experiment = [
        block | {"landscape": block["name"] in LANDSCAPE_TABLES}
        for block in _verbatim_blocks(experiment_tables, EXPERIMENT_TABLES, omitted)
    ]
    return {
        "experiment": experiment,
        "study": _verbatim_blocks(experiment_tables, STUDY_TABLES, omitted),
        "intervention": _verbatim_blocks(experiment_tables, INTERVENTION_TABLES, omitted),
    }


# The scratch folder latexmk builds in, beside main.tex (its name's start).
LATEXMK_SCRATCH = ".latexmk-"


def compile_pdf(main_tex: Path) -> Path:
    """Run ``latexmk -pdf`` on ``main_tex`` in its own folder; returns the PDF path. The LaTeX
    log is kept next to it (``main.log``)."""
    missing = why_no_pdf()
    if missing is not None:
        raise UserError(f"{missing}, or drop --pdf (paper_pdf: false)")
    if not main_tex.is_file():
        raise UserError(f"{main_tex} not found: --pdf compiles the main.tex that sits next to --out")
    # Build in a scratch folder and move the PDF into place, so a killed run leaves no half PDF. The
    # scratch folders of a killed run are removed here, by the command that holds the PDF's lock (§6.1).
    pdf = main_tex.with_suffix(".pdf")
    if outputs.locked(pdf):
        for stale in main_tex.parent.glob(f"{LATEXMK_SCRATCH}*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
    build = Path(tempfile.mkdtemp(prefix=LATEXMK_SCRATCH, dir=main_tex.parent))
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
        with atomic_path(pdf, outputs.PDF) as tmp:
            os.replace(build / pdf.name, tmp)
        return pdf
    finally:
        shutil.rmtree(build, ignore_errors=True)
