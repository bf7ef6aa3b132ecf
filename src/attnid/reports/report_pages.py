"""The pages of the Snakemake report (``snakemake --report report.html``), written by ``attnid report-pages``
from a build's tables and figures:

- ``index.rst``, the report's landing text (the workflow's ``report:``): the claims, pass or fail with their
  numbers, and where the figures and tables are;
- ``claims.html``, the claims table with every column;
- ``figN.html`` per figure: the figure with its caption, filled with the build's numbers, under it;
- one page per table (:data:`TABLE_PAGES`): cases, interventions with their verdicts, identification,
  prune, each CSV of it as an HTML table.

Every page is one self-contained file (the figure embedded), as the report embeds it.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docutils.core import publish_parts  # type: ignore[import-untyped]

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import write_text_atomic
from attnid.reports.figures import caption_parts

if TYPE_CHECKING:
    import pandas as pd

# page -> (title, the CSVs of the tables folder it shows; a page is written when one of them is there)
TABLE_PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cases": ("Cases: each optimizer case over its seeds", ("cases.csv",)),
    "interventions": (
        "Interventions: each arm against its paired baseline, with its verdict",
        ("interventions.csv", "interventions_seeds.csv"),
    ),
    "identification": (
        "Identification: the heads and variants studies and their rank correlations",
        ("heads.csv", "variants.csv", "identification_correlation.csv"),
    ),
    "prune": ("Prune and balance: the function-preserving checkpoint edits", ("prune_summary.csv",)),
    "quantization": (
        "Quantization: KL per orbit point and setting, and the R1 seed study",
        ("quantization.csv", "quantization_seeds.csv"),
    ),
    "alignment": (
        "Alignment: two seeds aligned along the orbit, class by class, and the loss barriers",
        ("alignment.csv",),
    ),
}
CLAIMS_CSV = "claims.csv"
# The landing's claims table: claims.csv's columns as shown there (detail is on the claims page).
LANDING_COLUMNS = {
    "result": "result",
    "claim": "claim",
    "measured": "measured",
    "threshold": "threshold",
    "dtype": "runs in",
}
LANDING_WIDTHS = (8, 46, 14, 16, 16)
PAGE_STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1.2em; color: #1e293b; }
table { border-collapse: collapse; margin: 0.6em 0 1.6em; }
th, td { border-bottom: 1px solid #cbd5e1; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f5f9; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.pass { color: #15803d; font-weight: 600; } td.fail { color: #b91c1c; font-weight: 600; }
tr.undecided td { color: #94a3b8; } td.decided { font-weight: 600; }
p.rule { max-width: 60em; line-height: 1.45; } details { margin-bottom: 1.6em; }
table.compact { font-size: 12px; } table.compact th, table.compact td { padding: 2px 5px; }
img { max-width: 100%; } figcaption { max-width: 60em; line-height: 1.45; margin-top: 0.8em; }
"""


def table_pages(available: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """{page: its CSVs that are ``available``} of every table page with at least one of them."""
    there = set(available)
    pages = {page: tuple(name for name in names if name in there) for page, (_, names) in TABLE_PAGES.items()}
    return {page: names for page, names in pages.items() if names}


def cell(value: Any) -> str:
    """A number as the tables show it (3 significant digits, integers whole, -- for none); text as is."""
    if isinstance(value, bool) or value is None:
        return "--" if value is None else str(value)
    if isinstance(value, (int, float)):
        number = float(value)
        if not math.isfinite(number):
            return "--"
        if number.is_integer() and abs(number) < 1e15:
            return f"{int(number):,}"
        return f"{number:#.3g}".rstrip(".")
    return str(value)


def shown_columns(frame: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(heading, source columns) of a table as a page shows it: ``X_mean`` and ``X_sd`` as one
    ``X (mean ± sd)`` column, every other column as is, in the CSV's order."""
    columns: list[tuple[str, list[str]]] = []
    for column in frame.columns:
        if column.endswith("_sd") and f"{column[:-3]}_mean" in frame.columns:
            continue
        if column.endswith("_mean") and f"{column[:-5]}_sd" in frame.columns:
            columns.append((f"{column[:-5]} (mean ± sd)", [column, f"{column[:-5]}_sd"]))
        else:
            columns.append((column, [column]))
    return columns


def html_table(frame: pd.DataFrame) -> str:
    """``frame`` as an HTML table: numbers right-aligned, a pass or fail cell coloured."""
    # lazy: pandas, which the workflow and --help (reading TABLE_PAGES) do not load
    import pandas as pd

    columns = shown_columns(frame)
    head = "".join(f"<th>{html.escape(heading)}</th>" for heading, _ in columns)
    rows = []
    for _, row in frame.iterrows():
        cells = []
        for _, sources in columns:
            values = [None if pd.isna(row[source]) else row[source] for source in sources]
            text = " ± ".join(cell(value) for value in values) if values[-1] is not None else cell(values[0])
            numeric = any(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values)
            kind = "number" if numeric else str(values[0]) if values[0] in ("pass", "fail") else ""
            cells.append(
                f'<td class="{kind}">{html.escape(text)}</td>' if kind else f"<td>{html.escape(text)}</td>"
            )
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# interventions.csv as its page shows it: (heading, how a row's cell is made); every column is in the
# full table below it.
INTERVENTION_PAGE_COLUMNS = (
    ("comparison", lambda row: str(row["comparison"])),
    ("n", lambda row: cell(row["n_seeds"])),
    ("mean Δ", lambda row: cell(row["delta_mean"])),
    ("95 % t-interval", lambda row: f"[{cell(row['ci_low'])}, {cell(row['ci_high'])}]"),
    ("p (sign-flip)", lambda row: cell(row["p_value"])),
    ("Holm p", lambda row: cell(row["p_holm"])),
    (
        "detectable Δ",
        lambda row: "none at this n" if _is_inf(row["detectable_effect"]) else cell(row["detectable_effect"]),
    ),
    ("cost per step", lambda row: cell(row["cost_ratio"])),
    ("verdict", lambda row: str(row["verdict"])),
)
# attnid.reports.statistics.LABELS and DIFFERENT_LABELS (not imported: it loads scipy)
DIFFERENT = ("better", "worse", "better, within the margin", "worse, within the margin")
DECIDED = (*DIFFERENT, "equivalent", "inconclusive")


def _is_inf(value: Any) -> bool:
    try:
        return math.isinf(float(value))
    except (TypeError, ValueError):
        return False


def interventions_html(frame: pd.DataFrame) -> str:
    """interventions.csv as a reader wants it: per comparison its n, mean difference with the t-interval,
    p before and after Holm, the smallest detectable effect, the cost and the verdict (grey where the rule
    gives none), the rule's settings under it, and every column in a table to unfold."""
    # lazy: pandas, which the workflow and --help (reading TABLE_PAGES) do not load
    import pandas as pd

    frame = frame.astype(object).where(pd.notna(frame), None)
    head = "".join(f"<th>{html.escape(heading)}</th>" for heading, _ in INTERVENTION_PAGE_COLUMNS)
    rows = []
    for row in frame.to_dict("records"):
        decided = str(row["verdict"]) in DECIDED
        cells = []
        for heading, make in INTERVENTION_PAGE_COLUMNS:
            kind = "" if heading in ("comparison", "verdict") else "number"
            if heading == "verdict" and str(row["verdict"]) in DIFFERENT:
                kind = "decided"
            text = html.escape(make(row))
            cells.append(f'<td class="{kind}">{text}</td>' if kind else f"<td>{text}</td>")
        opening = "<tr>" if decided else '<tr class="undecided">'
        rows.append(opening + "".join(cells) + "</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    first = frame.iloc[0] if len(frame) else None
    rule = ""
    if first is not None:
        family = int(pd.Series(frame["in_family"]).astype(str).str.lower().eq("true").sum())
        margin = first["equivalence_margin"]
        rule = (
            f'<p class="rule">The rule, fixed before the runs: Δ is the arm\'s final loss on the whole '
            f"validation split minus the baseline's, seed by seed; different when Holm's p over the "
            f"{family} comparisons of the family is below α = {float(first['alpha']):g} (exact sign-flip "
            "test), "
            + (
                f"equivalent when the {round(100 * (1 - 2 * float(first['alpha'])))} % t-interval lies "
                f"inside ±{float(margin):g} (TOST p below α): better or worse when only different, "
                "better or worse, within the margin when both, equivalent when only equivalent, "
                if margin is not None
                else "better or worse when different, "
            )
            + f"inconclusive when neither; no verdict below n = {int(first['min_seeds'])} seed pairs (n too "
            "small). Detectable: the smallest mean |Δ| found with 80 % power at this n.</p>"
        )
    every = f"<details><summary>every column of interventions.csv</summary>{html_table(frame)}</details>"
    return table + rule + every


def seeds_html(frame: pd.DataFrame) -> str:
    """interventions_seeds.csv as one row per comparison and one column per seed: each seed's difference,
    arm minus baseline (-- where a run diverged)."""
    # lazy: pandas, which the workflow and --help (reading TABLE_PAGES) do not load
    import pandas as pd

    order = list(dict.fromkeys(frame["comparison"]))
    wide = frame.pivot_table(
        index="comparison", columns="seed", values="difference", aggfunc="first", dropna=False
    )
    wide = wide.reindex(order)
    head = "<th>comparison</th>" + "".join(f"<th>seed {int(seed)}</th>" for seed in wide.columns)
    rows = []
    for comparison, values in wide.iterrows():
        cells = "".join(
            f'<td class="number">{html.escape(cell(None if pd.isna(v) else v))}</td>' for v in values
        )
        rows.append(f"<tr><td>{html.escape(str(comparison))}</td>{cells}</tr>")
    return (
        "<p>Each seed's difference, arm minus baseline (the final loss on the whole validation split): "
        "every number of the table above is computed from these alone.</p>"
        f'<table class="compact"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


# A table with a view of its own on its page (else every column as is, :func:`html_table`).
TABLE_VIEWS = {"interventions.csv": interventions_html, "interventions_seeds.csv": seeds_html}


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page."""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{PAGE_STYLE}</style></head>\n<body>\n<h2>{html.escape(title)}</h2>\n{body}\n</body></html>\n"
    )


def caption_html(caption_rst: str) -> str:
    """A figure caption (reStructuredText, :mod:`attnid.reports.figures`) as HTML, math as MathML, as the
    report renders its captions (docutils)."""
    parts = publish_parts(
        caption_rst,
        writer_name="html5",
        settings_overrides={"math_output": "MathML", "report_level": 4, "halt_level": 5},
    )
    return parts["body"]


def figure_page(png: Path, caption_rst: str, title: str) -> str:
    """The figure, embedded, with its caption under it."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    body = f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(title)}">'
    return html_page(title, body + f"<figcaption>{caption_html(caption_rst)}</figcaption></figure>")


def _rst_text(value: Any) -> str:
    """Plain text safe in reStructuredText (its inline markup characters escaped)."""
    text = cell(value)
    for char in "\\*`_|":
        text = text.replace(char, "\\" + char)
    return text


# what each group of claims.csv is, under its heading on the landing page
GROUP_TEXT = {
    "paper": "The paper's claims, each checked in this build's runs: a failing one does not replicate.",
    "finding": "Our own hypotheses, each with its outcome as measured: a rejected one is an answer, not a "
    "failure of the build.",
    "check": "What makes this build trustworthy: round-off floors, exactness, the protocol's declared "
    "conditions.",
}


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def _landing_table(claims: pd.DataFrame) -> list[str]:
    """A group's rows as an RST list-table: the result (its role), the claim, the number, the threshold, the
    precision."""
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        f"   :widths: {' '.join(str(width) for width in LANDING_WIDTHS)}",
        "",
        "   * - " + "\n     - ".join(LANDING_COLUMNS.values()),
    ]
    for row in claims.to_dict("records"):
        result = str(row["result"])
        role = result if result in ("pass", "fail") and row.get("kind") != "finding" else "other"
        shown = row | {"threshold": f"{row['relation']} {row['threshold']}", "result": f":{role}:`{result}`"}
        cells = [shown["result"]] + [_rst_text(shown[column]) or "--" for column in list(LANDING_COLUMNS)[1:]]
        lines.append("   * - " + "\n     - ".join(cells))
    return lines


def landing_rst(claims: pd.DataFrame, title: str, figures: Mapping[str, str], pages: Iterable[str]) -> str:
    """The report's landing text: the claims in claims.csv's three groups (its ``kind``: the paper's claims,
    our findings, the checks), each under its own heading with its count and its table (each result a
    ``:pass:``, ``:fail:`` or ``:other:`` role, coloured by workflow/report/style.css: a finding's outcome,
    rejected included, is ``:other:``, an answer and not a failure), and what else the report holds
    (``figures``: {name: title}; ``pages``: the table pages). ``Figures``, ``Tables`` and ``Claims`` are
    links to the report's categories of those names (Snakemake adds their targets)."""
    # lazy: pandas (claims.csv's kinds), which the workflow and --help (reading TABLE_PAGES) do not load
    from attnid.reports.claim_kinds import KINDS, group_summary, with_kinds

    claims = claims if "kind" in claims else with_kinds(claims)
    heading = f"attnid: the claims of {title}"
    groups = [(kind, claims[claims["kind"] == kind]) for kind in KINDS if (claims["kind"] == kind).any()]
    told = [group_summary(kind, rows["result"]) for kind, rows in groups]
    named = "; ".join(f"{name[3:]}, {_rst_text(shows)}" for name, shows in figures.items())
    listed = [TABLE_PAGES[page][0].split(":")[0].lower() for page in pages]
    lines = [
        ".. role:: pass",
        ".. role:: fail",
        ".. role:: other",
        "",
        heading,
        "=" * len(heading),
        "",
        f"**{_capitalized('; '.join(told)) or 'No claims'}**. Each is checked against a number measured in "
        "this build's own runs; every column, with how each number is computed, is under Claims_.",
        "",
        f"Every figure with its caption, filled with this build's numbers, is under Figures_ ({named})."
        + (f" The tables ({', '.join(listed)}) are under Tables_." if listed else ""),
    ]
    for (kind, rows), summary in zip(groups, told):
        title_line = _capitalized(summary)
        lines += ["", title_line, "-" * len(title_line), "", GROUP_TEXT[kind], ""]
        lines += _landing_table(rows)
    return "\n".join(lines) + "\n"


PAGE = outputs.Format("a report page written by attnid report-pages", outputs.starts_with(b"<!doctype html>"))
LANDING = outputs.Format(
    "the report's landing text written by attnid report-pages", outputs.starts_with(b"attnid: ")
)


def write_report_pages(
    tables_dir: str | Path,
    figures_dir: str | Path,
    out_dir: str | Path,
    results_dir: str,
    figure_names: Iterable[str],
    pages: Iterable[str],
) -> list[Path]:
    """Write ``index.rst``, ``claims.html``, each figure's page and each table page of ``pages`` into
    ``out_dir``; returns their paths."""
    # lazy: pandas, which the workflow and --help (reading TABLE_PAGES) do not load
    import pandas as pd

    tables, figures, out = Path(tables_dir), Path(figures_dir), Path(out_dir)
    claims_csv = tables / CLAIMS_CSV
    if not claims_csv.is_file():
        raise UserError(
            f"{claims_csv} not found; run 'attnid tables' first (or simply snakemake --cores all)"
        )
    claims = pd.read_csv(claims_csv)
    titles = {}
    written = []
    for name in figure_names:
        png, caption = figures / f"{name}.png", figures / f"{name}.rst"
        for needed in (png, caption):
            if not needed.is_file():
                raise UserError(f"{needed} not found; run 'attnid figures {name}' first")
        text = caption.read_text(encoding="utf-8")
        parts = caption_parts(text)
        titles[name] = (parts[0] if parts else name).strip().rstrip(".")
        written.append(
            write_text_atomic(out / f"{name}.html", figure_page(png, text, f"Figure {name[3:]}"), PAGE)
        )
    shown = table_pages(path.name for path in tables.glob("*.csv"))
    for page in pages:
        if page not in shown:
            raise UserError(f"no table of the {page} page ({', '.join(TABLE_PAGES[page][1])}) in {tables}")
        body = "".join(
            f"<h3>{name}</h3>{TABLE_VIEWS.get(name, html_table)(pd.read_csv(tables / name))}"
            for name in shown[page]
        )
        written.append(write_text_atomic(out / f"{page}.html", html_page(TABLE_PAGES[page][0], body), PAGE))
    written.append(write_text_atomic(out / "claims.html", html_page("Claims", html_table(claims)), PAGE))
    landing = landing_rst(claims, results_dir, titles, pages)
    written.append(write_text_atomic(out / "index.rst", landing, LANDING))
    return written
