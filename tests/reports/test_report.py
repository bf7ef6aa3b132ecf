"""The report is the landing page: `snakemake --report` after the smoke build opens on the claims, has every
figure with its caption inline and the tables (checked in headless Chromium where it is installed); the smoke
build's figures show every series and no label overlaps (tests/helpers/figure_checks.py)."""

from __future__ import annotations

import html
import re
import shlex
import shutil
import subprocess

import pandas as pd
import pytest
from figure_checks import invisible_legend_entries, overlapping_labels
from pipeline_helpers import run_smoke_dag, shared_smoke_run, smoke_config
from system_packages import needs

from attnid.cli import build_parser
from attnid.reports import figures, report_pages
from attnid.reports.figures.inputs import Sources

SMOKE = smoke_config()["results_dir"]
CHROMIUM = shutil.which("chromium") or "chromium"


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory, shakespeare_url):
    return shared_smoke_run(tmp_path_factory, shakespeare_url)


@pytest.fixture(scope="module")
def report_html(smoke_dir, shakespeare_url, tmp_path_factory):
    """The smoke build's report, as the README makes it."""
    report = tmp_path_factory.mktemp("report") / "report.html"
    proc = run_smoke_dag(smoke_dir, shakespeare_url, "--nolock", "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return report


@pytest.mark.slow
def test_the_report_holds_the_claims_every_figure_with_its_caption_and_the_tables(smoke_dir, report_html):
    text = report_html.read_text(errors="replace")
    claims = pd.read_csv(smoke_dir / SMOKE / "tables" / "claims.csv")
    # the landing text (the workflow's description) is the claims table of this build
    assert "attnid: the claims of the smoke build" in text
    for claim in claims["claim"]:
        assert html.escape(claim, quote=False) in text, claim
    for result in ("pass", "fail"):  # each result in its colour
        assert text.count(f'<span class=\\"{result}\\">{result}</span>') == (claims["result"] == result).sum()
    for category in ("Claims", "Figures", "Tables"):
        assert f'"{category}"' in text
    # the smoke config has every stage (the alignment stage's pairs declared, alignment/pairs_from): every
    # figure, its caption inline, and every table page
    for name in figures.registry():
        assert f"report/{name}.html" in text
    for page in report_pages.TABLE_PAGES:
        assert f"report/{page}.html" in text
    caption = (smoke_dir / SMOKE / "figures" / "fig6.rst").read_text()
    assert "does identification change training" in caption and "{{" not in caption


@pytest.mark.slow
@needs("chromium")
def test_the_report_opens_on_the_claims_in_chromium(report_html, tmp_path):
    """Chromium runs the report's scripts; the page it shows first is the claims table."""
    command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"]
    shown = subprocess.run(
        [*command, "--dump-dom", report_html.as_uri()], capture_output=True, text=True, timeout=300
    ).stdout
    assert "attnid: the claims of the smoke build" in shown, shown[-2000:]
    assert '<span class="pass">pass</span>' in shown  # the table's cells, drawn by the report's own code
    screenshot = tmp_path / "landing.png"
    subprocess.run(
        [*command, "--window-size=1600,1000", f"--screenshot={screenshot}", report_html.as_uri()],
        capture_output=True,
        timeout=300,
    )
    assert screenshot.read_bytes().startswith(b"\x89PNG") and screenshot.stat().st_size > 20_000


@pytest.fixture(scope="module")
def figure_sources(smoke_dir, shakespeare_url) -> dict[str, Sources]:
    """{figure: its sources} exactly as the workflow's `figure` rule gives them (from a dry run)."""
    proc = run_smoke_dag(smoke_dir, shakespeare_url, "-n", "-p", "--nolock", "--forcerun", "figure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sources = {}
    for command in re.findall(r"attnid figures (fig\d+ [^>\n]*)", proc.stdout + proc.stderr):
        args = build_parser("figures").parse_args(["figures", *shlex.split(command)])
        (name,) = args.figures
        sources[name] = Sources(
            theory=args.theory_dir and smoke_dir / args.theory_dir,
            tables=args.tables and smoke_dir / args.tables,
            runs=[str(smoke_dir / d) for d in args.runs or []],
            intervention_runs=[str(smoke_dir / d) for d in args.intervention_runs or []],
            identity_runs=[str(smoke_dir / d) for d in args.identity_runs or []],
        )
    assert set(sources) == set(SMOKE_FIGURES), proc.stdout[-3000:]
    return sources


# the smoke build's figures: every one (Figure 8 of the pairs that the smoke config declares)
SMOKE_FIGURES = list(figures.registry())


@pytest.mark.slow
@pytest.mark.parametrize("name", SMOKE_FIGURES)
def test_the_smoke_build_s_figures_show_every_series_with_no_label_overlapping(figure_sources, name):
    fig = figures.registry()[name].draw(figure_sources[name]).figure
    assert not invisible_legend_entries(fig)
    assert not overlapping_labels(fig)


def test_the_landing_text_is_the_claims_table_as_the_report_renders_it():
    """The landing page shows claims.csv's three kinds under their own headings, each with its count: the
    paper's claims (a failing one loud), our findings (a rejected one and a verdict are outcomes, not
    failures), the checks (a failing one loud)."""
    from docutils.core import publish_parts

    claims = pd.DataFrame(
        {
            "claim": [
                "E1 sgd sweep beta_qk slope in [1.8, 2.2]",
                "E2 rho_qk adamw mean > 1e-2",
                "E1 *odd* claim",
                "whole-model census closes on 3 shapes",
                "interventions: fixing changes final_val_loss_full (primary)",
                "drift split closes: closure < 1e-10",
                "interventions: every best lr inside its calibration grid",
            ],
            "paper": [
                "E1, Section 5",
                "E2, Section 5",
                "E1",
                "census (ours)",
                "interventions (ours)",
                "drift split (ours)",
                "protocol (ours)",
            ],
            "measured": [2.004, 0.0031, float("nan"), 2.0, 0.004, 1e-16, 1.0],
            "relation": ["in", ">", "<", "=", "±", "<", "in"],
            "threshold": ["[1.8, 2.2]", "0.01", "1e-20", "3", "0.01", "1e-10", "[0, 0]"],
            "dtype": ["float64", "float32", "float32", "float64", "", "float64", ""],
            "result": ["pass", "fail", "not applicable (dtype)", "fail", "worse, within the margin", "pass"]
            + ["fail"],
        }
    )
    rst = report_pages.landing_rst(claims, "the toy build", {"fig1": "identification by design"}, ["cases"])
    # the report appends a link target for each category; rendered as Snakemake renders it (docutils)
    targets = "\n".join(
        f".. _{name}: javascript:app.showCategory('{name}')" for name in ("Claims", "Figures", "Tables")
    )
    shown = publish_parts(rst + "\n" + targets, writer_name="html", settings_overrides={"halt_level": 2})
    body = shown["html_body"]
    assert "attnid: the claims of the toy build" in body
    # each group a section under its count, in the order paper, findings, checks
    headings = re.findall(r"<h\d>(.*?)</h\d>", body)  # the title has a class, the sections' do not
    assert headings == [
        "The paper's 3 claims: 1 replicate (1 fail, 1 not applicable (dtype))",
        "Our 2 findings: 1 rejected, 1 worse, within the margin",
        "Checks: 1 of 2 hold (1 fail)",
    ], headings
    sections = dict(zip(headings, re.split(r"<h\d>.*?</h\d>", body)[1:]))
    paper, findings, checks = sections.values()
    assert '<span class="pass">pass</span>' in paper and '<span class="fail">fail</span>' in paper
    assert '<span class="other">rejected</span>' in findings and 'class="fail"' not in findings
    assert '<span class="other">worse, within the margin</span>' in findings  # the verdict's own label
    assert '<span class="fail">fail</span>' in checks  # a failing check stays loud
    assert "beta_qk slope in [1.8, 2.2]" in body and "E1 *odd* claim" in body  # shown as written
    assert "2.00" in body and "&gt; 0.01" in body and "--" in body  # the numbers, a missing one as --
    assert "± 0.01" in findings
    assert "1, identification by design" in body and "(cases)" in body


def test_a_table_page_shows_a_mean_and_its_sd_as_one_column():
    frame = pd.DataFrame({"case": ["adamw"], "val_mean": [3.6594], "val_sd": [0.0215], "n_seeds": [2]})
    assert [heading for heading, _ in report_pages.shown_columns(frame)] == [
        "case",
        "val (mean ± sd)",
        "n_seeds",
    ]
    table = report_pages.html_table(frame)
    assert '<td class="number">3.66 ± 0.0215</td>' in table and '<td class="number">2</td>' in table


def test_the_interventions_page_shows_the_verdict_columns_and_every_seed(tmp_path):
    """interventions.csv's page: per comparison n, the mean with its t-interval, p before and after Holm, the
    detectable effect, the cost and the verdict, grey where the rule gives none; the rule under it; every
    column to unfold; and the seeds table as one row per comparison, one column per seed."""
    from synthetic_runs import DEFAULT_EFFECTS, final_losses, write_intervention_runs

    from attnid.reports.interventions_table import write_interventions_table

    losses = final_losses(DEFAULT_EFFECTS, 8)
    arm_dirs, _ = write_intervention_runs(tmp_path / "runs", losses, identity=False)
    family = ["adamw_gauge_fixed", "adamw_from_gauge_point", "start_x_frozen"]
    table, _ = write_interventions_table(
        None, tmp_path, runs=arm_dirs, equivalence_margin=0.01, family=family
    )
    page = report_pages.interventions_html(pd.read_csv(tmp_path / "interventions.csv"))
    head = re.findall(r"<th>(.*?)</th>", page.split("<details>")[0])
    assert head == [html.escape(h) for h, _ in report_pages.INTERVENTION_PAGE_COLUMNS]
    body = page.split("<details>")[0]
    rows = [
        (grey, re.findall(r"<td[^>]*>(.*?)</td>", cells))
        for grey, cells in re.findall(r'<tr( class="undecided")?>(.*?)</tr>', body)
        if "<td" in cells
    ]
    assert [cells[0] for _, cells in rows] == table["comparison"].tolist()
    for (grey, cells), row in zip(rows, table.itertuples()):
        assert cells[2] == report_pages.cell(row.delta_mean) and cells[-1] == row.verdict
        assert cells[3] == f"[{report_pages.cell(row.ci_low)}, {report_pages.cell(row.ci_high)}]"
        assert bool(grey) == (row.verdict == "not in family")  # outside the family: shown, not judged
    assert "over the 3 comparisons of the family is below α = 0.05" in page and "inside ±0.01" in page
    assert "<summary>every column of interventions.csv</summary>" in page and "tost_low" in page
    seeds = report_pages.seeds_html(pd.read_csv(tmp_path / "interventions_seeds.csv"))
    assert re.findall(r"<th>(.*?)</th>", seeds) == ["comparison"] + [f"seed {s}" for s in range(8)]
    first = re.search(r"<tr><td>adamw_from_gauge_point</td>(.*?)</tr>", seeds).group(1)
    shown = re.findall(r'<td class="number">(.*?)</td>', first)
    expected = [b - a for a, b in zip(losses["adamw"], losses["adamw_from_gauge_point"])]
    assert shown == [report_pages.cell(value) for value in expected]


def test_the_report_pages_know_the_rule_s_six_labels():
    """report_pages writes the labels out (importing statistics would load scipy): they are the rule's."""
    from attnid.reports import statistics

    assert report_pages.DECIDED == statistics.LABELS
    assert report_pages.DIFFERENT == statistics.DIFFERENT_LABELS
