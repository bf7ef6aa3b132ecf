"""TeX formatting and the one table renderer (jinja2); the appendix itself is :mod:`attnid.reports.appendix`.

* :func:`latex_environment` -- a jinja2 environment whose delimiters cannot
  clash with TeX: ``\\VAR{expr}`` prints, ``\\BLOCK{for ...}`` / ``\\BLOCK{endfor}``
  are statements, ``\\#{...}`` is a comment. Undefined names are errors. Filters:
  ``thousands`` (1048576 -> ``1,048,576``), ``fixed(n)`` (n decimals), ``tex``
  (escape ``& % $ # _ { } ~ ^ \\``), ``yesno`` (True -> ``yes``), ``sci``, ``gap``.
* :func:`render_table` -- render one template (a file name in the template
  folder, or template text) with ``rows`` (a list of dicts or a DataFrame).

The templates are package data, ``attnid/reports/templates/``.
"""

from __future__ import annotations

import importlib.resources
import math
import os
from collections.abc import Iterable, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from attnid.common.errors import UserError

if TYPE_CHECKING:
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


def siunitx_number(value: Any, digits: int = 3, plain_from: float = 1e-2) -> str | None:
    """A number as siunitx reads it: ``digits`` significant digits, plain from ``plain_from`` up to 1e4
    (``0.0546``), mantissa and exponent otherwise (``2.53e-30``); None for a missing one (not a number, NaN,
    inf). The appendix typesets it with true minus signs and ``× 10^b`` (paper/main.tex's ``\\sisetup``)."""
    number = finite_or_none(value)
    if number is None:
        return None
    if number == 0:
        return "0"
    if plain_from <= abs(number) < 1e4:
        return f"{number:.{digits}g}"
    mantissa, exponent = f"{number:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def tex_number(value: Any, digits: int = 3) -> str:
    """A number for text or a table cell, ``\\num{...}`` (:func:`siunitx_number`); -- for missing."""
    shown = siunitx_number(value, digits)
    return "--" if shown is None else rf"\num{{{shown}}}"


# In an aligned column a number below 1 is written with its exponent (5.46e-2, not 0.0546): every number
# then has at most digits - 1 decimals, and the column stays as narrow as its widest mantissa.
TABLE_PLAIN_FROM = 1.0


def table_number(value: Any, digits: int = 3, plain_from: float = TABLE_PLAIN_FROM) -> str:
    """A number for a siunitx ``S`` column, aligned on its decimal marker; ``{--}`` for missing."""
    shown = siunitx_number(value, digits, plain_from)
    return "{--}" if shown is None else shown


def table_format(values: Iterable[Any], digits: int = 3, plain_from: float = TABLE_PLAIN_FROM) -> str:
    """The siunitx ``table-format`` of an ``S`` column holding ``values`` as :func:`table_number` writes them:
    room for the longest sign, integer part, decimals and exponent among them (``-1.4e-2``), so the column is
    as wide as its widest number and aligned on the decimal marker."""
    sign = integer = decimals = power = 0
    exponent_sign = ""
    for value in values:
        shown = siunitx_number(value, digits, plain_from)
        if shown is None:
            continue
        mantissa, _, exponent = shown.partition("e")
        sign = max(sign, mantissa.startswith("-"))
        whole, _, fraction = mantissa.lstrip("-").partition(".")
        integer, decimals = max(integer, len(whole)), max(decimals, len(fraction))
        if exponent:
            power = max(power, len(exponent.lstrip("-")))
            exponent_sign = exponent_sign or ("-" if exponent.startswith("-") else "")
    shape = f"{'-' * sign}{max(integer, 1)}.{decimals}" if decimals else f"{'-' * sign}{max(integer, 1)}"
    return shape + (f"e{exponent_sign}{power}" if power else "")


def tex_mean_sd(mean: Any, sd: Any, digits: int = 3) -> str:
    """A mean with the seeds' sd in one box that never breaks across lines: ``\\num{m +- s}``, the sd to the
    mean's last digit and in its exponent (``(4.13 ± 5.00) × 10^-27``), or the two numbers apart where the
    sd rounds to 0 there; the mean alone without an sd."""
    m, s = finite_or_none(mean), finite_or_none(sd)
    if m is None or s is None:
        return tex_number(mean, digits)
    exponent = 0
    shown = f"{m:#.{digits}g}".rstrip(".")  # 3.20, not 3.2: the spread is rounded to the mean's last digit
    if m != 0 and not 1e-2 <= abs(m) < 1e4:
        shown, power = f"{m:.{digits - 1}e}".split("e")
        exponent = int(power)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    spread = f"{abs(s) / 10**exponent:.{decimals}f}"
    if float(spread) == 0:  # the spread is below the mean's last digit: both numbers in full
        return rf"\mbox{{{tex_number(m, digits)} $\pm$ {tex_number(s, 2)}}}"
    suffix = f" e{exponent}" if exponent else ""
    return rf"\mbox{{\num{{{shown} +- {spread}{suffix}}}}}"


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or None where it is missing, not a number, or not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def tex_signed(value: Any) -> str:
    """A correlation as ``$+0.54$`` / ``$-0.54$``; ``--`` when there is none."""
    number = finite_or_none(value)
    return "--" if number is None else f"${number:+.2f}$"


def tex_spread(value: Any) -> str:
    r"""``sd 0.12`` after a per-seed mean: the seeds' spread, labelled as one; ``--`` for a single seed."""
    number = finite_or_none(value)
    return "--" if number is None else f"sd {number:.2f}"


def tex_probability(value: Any) -> str:
    """A p-value to two significant digits (``0.34``, ``0.017``); ``--`` when there is none."""
    number = finite_or_none(value)
    return "--" if number is None else f"{number:.2g}"


def tex_interval(low: Any, high: Any) -> str:
    """A correlation's CI as ``[$-0.52$, $-0.10$]``; ``--`` when there is none."""
    if finite_or_none(low) is None or finite_or_none(high) is None:
        return "--"
    return f"[{tex_signed(low)}, {tex_signed(high)}]"


def tex_whole(value: Any) -> str:
    """A count or a rate as a whole number with thousands separators; ``--`` when missing."""
    number = finite_or_none(value)
    return "--" if number is None else thousands(round(number))


def package_template_dir() -> Traversable:
    """The templates shipped with the package, found with importlib.resources (a Traversable:
    a folder in a checkout or an installed package, a zip member in a zipped one)."""
    return importlib.resources.files("attnid.reports").joinpath("templates")


def _resource_loader(folder: Traversable) -> jinja2.BaseLoader:
    """A jinja2 loader over a Traversable folder (what importlib.resources returns)."""

    def load(name: str):
        resource = folder.joinpath(*name.split("/"))
        return resource.read_text(encoding="utf-8") if resource.is_file() else None

    return jinja2.FunctionLoader(load)


def latex_environment(template_dir: str | os.PathLike | Traversable | None = None) -> jinja2.Environment:
    """A jinja2 Environment with TeX-safe delimiters and the filters above.

    Templates are read from ``template_dir`` (a folder path, or a Traversable such as
    :func:`package_template_dir`), by default from the package's own templates.
    """
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
        cell=table_number,
        signed=tex_signed,
        spread=tex_spread,
        whole=tex_whole,
        p=tex_probability,
    )
    env.globals.update(mean_sd=tex_mean_sd, interval=tex_interval, sformat=table_format)
    return env


def records(rows: pd.DataFrame | Iterable[dict]) -> list[dict]:
    """Rows for a template: a DataFrame's records with every missing value (NaN, NA) as None, so that
    templates and filters see one kind of missing; any other iterable of dicts as a list."""
    if not hasattr(rows, "to_dict"):
        return list(rows)
    # lazy: pandas, for a DataFrame's rows only: the report commands' --help import this module
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
