"""The figures: one module per figure, ``figN_<topic>.py``, found by :func:`registry`.

A figure module declares

- ``INPUTS``: what it reads, ``{source: file names}`` (:mod:`.inputs`), e.g. ``{"theory": ("counts.csv",
  "nullity.csv")}``. The workflow's one ``figure`` rule builds ``figN`` from exactly these files of the
  build, and ``attnid figures figN`` is given exactly these sources.
- ``STAGE`` (optional): the optional stage of the pipeline the figure shows (``"studies"``,
  ``"interventions"``); it is drawn only for a build with that stage. Without it, every build draws it.
- ``CAPTION``: its caption, reStructuredText whose first sentence is ``**Figure N — title.**``, a jinja2
  template filled with the numbers the drawing returns (``fmt`` formats a number, ``value`` a signed one
  for prose: a true minus sign, a power of ten in math).
- ``draw(sources) -> Drawing``: the matplotlib figure (drawn under the one style, :mod:`.style`) and the
  numbers of its caption.

:func:`make_figure` writes ``figN.png``, ``figN.pdf`` and the filled caption ``figN.rst`` side by side: the
Snakemake report and the LaTeX appendix both show that caption. A new figure is one new module.
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from jinja2 import StrictUndefined, Template

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import write_text_atomic
from attnid.reports.figures.inputs import FOLDERS, SOURCE_FLAGS, Drawing, Sources
from attnid.reports.figures.style import pyplot, save_figure, styled

FIGURE_MODULE = re.compile(r"fig(?P<number>\d+)_(?P<topic>\w+)")
# A caption attnid figures filled in: an earlier build's may be replaced, nothing else.
FILLED_CAPTION = outputs.Format(
    "a figure caption written by attnid figures", outputs.starts_with(b"**Figure ")
)


@dataclass(frozen=True)
class FigureModule:
    """One figure of the registry: its name (``fig3``), number and topic, and the module that draws it."""

    name: str
    number: int
    topic: str
    module: ModuleType

    @property
    def inputs(self) -> Mapping[str, tuple[str, ...]]:
        return self.module.INPUTS

    @property
    def stage(self) -> str | None:
        return getattr(self.module, "STAGE", None)

    @property
    def caption_template(self) -> str:
        return self.module.CAPTION

    @property
    def title(self) -> str:
        """The caption's title, ``**Figure N — title.**`` without its number and full stop."""
        parts = caption_parts(self.caption_template)
        if parts is None:
            raise ValueError(f"{self.name}: its CAPTION must start with **Figure {self.number} — title.**")
        return parts[0].rstrip(".")

    def draw(self, sources: Sources) -> Drawing:
        return styled(self.module.draw)(sources)

    def input_files(self, made: Mapping[str, list[str]], runs: Mapping[str, list[str]]) -> list[str]:
        """Exactly the files of a build this figure reads: of each folder source the files named in
        ``INPUTS`` that the build makes (``made``: {source: paths}), of each run group (``runs``: {source:
        run directories}) every run's files."""
        files = []
        for source, names in self.inputs.items():
            if source in FOLDERS:
                by_name = {Path(path).name: path for path in made.get(source, [])}
                files += [by_name[name] for name in names if name in by_name]
            else:
                files += [f"{run}/{name}" for run in runs.get(source, []) for name in names]
        return files

    def source_flags(self, folders: Mapping[str, str], runs: Mapping[str, list[str]]) -> str:
        """The ``attnid figures`` flags that name this figure's sources: each folder (``folders``:
        {source: folder}) and each non-empty run group."""
        flags = []
        for source in self.inputs:
            if source in FOLDERS:
                flags.append(f"{SOURCE_FLAGS[source]} {folders[source]}")
            elif runs.get(source):
                flags.append(f"{SOURCE_FLAGS[source]} {' '.join(runs[source])}")
        return " ".join(flags)


@functools.cache
def registry() -> dict[str, FigureModule]:
    """{name: figure} of every ``figN_<topic>`` module of this package, by number."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        match = FIGURE_MODULE.fullmatch(info.name)
        if match is None:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.append(FigureModule(f"fig{match['number']}", int(match["number"]), match["topic"], module))
    return {figure.name: figure for figure in sorted(found, key=lambda figure: figure.number)}


def caption_number(value: float, digits: int = 2) -> str:
    """A number for a caption: ``g`` format, NaN as "n/a" (e.g. no run of that kind)."""
    if value is None or not math.isfinite(float(value)):
        return "n/a"
    return f"{float(value):.{digits}g}"


MINUS = "\u2212"  # a true minus sign; the appendix sets it as TeX's $-$


def caption_value(value: float, digits: int = 2) -> str:
    """A signed number for a caption's prose, as reStructuredText: a true minus sign, and a power of ten
    in math below 1e-3 or from 1e4 (``−0.012``, ``:math:`3.6 \\times 10^{-5}```); "n/a" for none."""
    if value is None or not math.isfinite(float(value)):
        return "n/a"
    number = float(value)
    if number != 0 and not 1e-3 <= abs(number) < 1e4:
        mantissa, exponent = f"{number:.{digits - 1}e}".split("e")
        return rf":math:`{mantissa} \times 10^{{{int(exponent)}}}`"
    return f"{number:.{digits}g}".replace("-", MINUS)


CAPTION_HEADING = re.compile(r"\*\*(?:Figure\s+\d+\s*[—–-]+\s*)?(?P<title>.+?)\*\*\s*(?P<rest>.*)", re.S)


def caption_parts(text: str) -> tuple[str, str] | None:
    """(title, the rest) of a caption whose first sentence is ``**Figure N — title.**`` (reStructuredText);
    None for one that does not start so."""
    heading = CAPTION_HEADING.match(text.strip())
    return None if heading is None else (heading["title"], heading["rest"])


def fill_caption(template: str, numbers: Mapping[str, Any]) -> str:
    """A caption template (jinja2) filled with a drawing's ``numbers``; ``fmt`` is :func:`caption_number`,
    ``value`` :func:`caption_value`."""
    return Template(
        template, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    ).render(**numbers, fmt=caption_number, value=caption_value)


def make_figure(name: str, sources: Sources, out_dir: str | Path) -> list[Path]:
    """Draw figure ``name`` from ``sources`` into ``out_dir``: ``name.png``, ``name.pdf`` and its filled
    caption ``name.rst``; returns the three paths."""
    figure = registry()[name]
    try:
        drawing = figure.draw(sources)
    except UserError as err:
        raise UserError(f"{name}: {err}") from err
    paths = save_figure(drawing.figure, out_dir, name)
    pyplot().close(drawing.figure)
    caption_path = Path(out_dir) / f"{name}.rst"
    write_text_atomic(caption_path, fill_caption(figure.caption_template, drawing.numbers), FILLED_CAPTION)
    return paths + [caption_path]


def default_figures(sources: Sources, left_out: frozenset[str] = frozenset()) -> list[str]:
    """What ``attnid figures`` draws when no figure is named, by number: every figure without a stage, and
    each figure of a stage (not in ``left_out``) for which something of its inputs is there."""
    names = []
    for name, figure in registry().items():
        if figure.stage in left_out:
            continue
        if figure.stage is None or any(
            sources.given(source) and (source not in FOLDERS or any(sources.has(source, f) for f in files))
            for source, files in figure.inputs.items()
        ):
            names.append(name)
    return names
