"""attnid appendix: the rendered tables carry exactly the CSVs' numbers, and the PDF compiles."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import jinja2
import pandas as pd
import pytest
from synthetic_runs import write_run, write_study
from system_packages import needs

from attnid.cli import main
from attnid.common import tex
from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic
from attnid.reports import appendix, figures, latex
from attnid.theory import nullity

# The comparisons of a paper-sized build (16 seeds): (comparison, arm, baseline, mean difference, spread).
SAMPLE_COMPARISONS = (
    ("adamw_from_gauge_point", "adamw_from_gauge_point", "adamw", -0.0112, 0.003),
    ("adamw_frozen_mlp", "adamw_frozen_mlp", "adamw", 0.0204, 0.004),
    ("adamw_lr2x", "adamw_lr2x", "adamw", -0.006, 0.03),
    ("adamw_rebalance", "adamw_rebalance", "adamw", 0.0021, 0.003),
    ("adamw_rebalance_first_moment", "adamw_rebalance_first_moment", "adamw", 0.0043, 0.003),
    (
        "adamw_rebalance_first_moment-adamw_rebalance",
        "adamw_rebalance_first_moment",
        "adamw_rebalance",
        2.2e-5,
        0.003,
    ),
    ("adamw_projected", "adamw_projected", "adamw", 0.0011, 0.002),
    ("adamw_gauge_fixed", "adamw_gauge_fixed", "adamw", -0.0123, 0.003),
    ("adamw_gauge_fixed_at_init", "adamw_gauge_fixed_at_init", "adamw", 0.0005, 0.002),
)


def sample_fig6_numbers() -> dict:
    """Figure 6's caption numbers of a paper-sized build (every arm, 16 seeds, the 2 x 2, the identity run):
    its tables computed by the interventions table's own code from a synthetic seeds table."""
    import numpy as np
    import pandas as pd

    from attnid.reports.figures import fig6_interventions
    from attnid.reports.interventions_table import comparisons_table

    rows = []
    for i, (comparison, arm, baseline, mean, spread) in enumerate(SAMPLE_COMPARISONS):
        for seed in range(16):
            base = 2.4 + 0.02 * seed
            rows.append((comparison, arm, baseline, seed, base + mean + spread * np.sin(seed + i), base))
    seeds = pd.DataFrame(
        rows, columns=["comparison", "arm", "baseline", "seed", "arm_value", "baseline_value"]
    )
    seeds["difference"] = seeds["arm_value"] - seeds["baseline_value"]
    by_arm = {(arm, seed): value for _, arm, b, seed, value, _ in rows if b == "adamw"}
    interaction = [
        (by_arm[("adamw_gauge_fixed", s)] - by_arm[("adamw_from_gauge_point", s)])
        - (by_arm[("adamw_gauge_fixed_at_init", s)] - (2.4 + 0.02 * s))
        for s in range(16)
    ]
    seeds = pd.concat(
        [
            seeds,
            pd.DataFrame(
                {
                    "comparison": "start_x_frozen",
                    "arm": "adamw_gauge_fixed-adamw_from_gauge_point",
                    "baseline": "adamw_gauge_fixed_at_init-adamw",
                    "seed": range(16),
                    "arm_value": np.nan,
                    "baseline_value": np.nan,
                    "difference": interaction,
                }
            ),
        ],
        ignore_index=True,
    )
    table = comparisons_table(seeds, 0.05, 0.01, primary="adamw_gauge_fixed")
    comparisons = fig6_interventions.comparisons_of(table, seeds, {})
    grid = fig6_interventions.two_by_two(seeds, comparisons)
    numbers = fig6_interventions.caption_numbers(table, comparisons, grid, {}, [])
    arms = [arm for _, arm, baseline, _, _ in SAMPLE_COMPARISONS if baseline == "adamw"]
    return (
        numbers
        | {  # the other panels' numbers of such a build: along training, its calibration, the orbit
            "best_lr": True,
            "along": {
                "n_steps": 11,
                "first_step": 0,
                "last_step": 5000,
                "n_seeds": 16,
                "primary": True,
                "mid_step": 2500,
                "primary_mid": -0.0101,
            },
            "calibration": {
                "n_seeds": 2,
                "refined_seeds": 8,
                "lr_low": 2.5e-4,
                "lr_high": 4e-3,
                "arms": [{"arm": arm, "best_lr": 1e-3 * (1 + i % 3)} for i, arm in enumerate(arms)],
                "at_edge": "``adamw_lr2x``",
            },
            "orbit": True,
            "projected_steps": 5000,
            "projected_rho_max": 8.1e-11,
            "projected_dtype": "float32",
            "identity_steps": 200,
            "identity_rho_max": 1.6e-28,
            "identity_drift_ratio_max": 2.9e-14,
            "adamw_rho_mean": 0.033,
        }
    )


@pytest.fixture(scope="module")
def theory_csvs(tmp_path_factory, repo_root):
    folder = tmp_path_factory.mktemp("theory")
    assert (
        main(
            [
                "counts",
                "--out",
                str(folder / "counts.csv"),
                "--single-head-out",
                str(folder / "single_head.csv"),
            ]
        )
        == 0
    )
    cases = [
        c
        for c in nullity.default_cases()
        if c.kind == "pair"
        or c.name in {"attention E=12 H=2", "RoPE half+bias E=12 H=3", "GQA E=12 H=4 G=1 D=3"}
    ]
    write_csv_atomic(folder / "nullity.csv", nullity.verify(cases))
    return folder


def _render(theory_csvs, out, *extra) -> int:
    return main(
        [
            "appendix",
            "--counts",
            str(theory_csvs / "counts.csv"),
            "--nullity",
            str(theory_csvs / "nullity.csv"),
            "--single-head",
            str(theory_csvs / "single_head.csv"),
            "--out",
            str(out),
            *extra,
        ]
    )


def _table_rows(tex: str, label: str) -> list[list[str]]:
    """Body cells of the booktabs table labelled ``label``."""
    block = tex[tex.index(rf"\label{{{label}}}") :]
    body = block[block.index(r"\midrule") + len(r"\midrule") : block.index(r"\bottomrule")]
    return [
        [cell.strip() for cell in line.strip().removesuffix(r"\\").split("&")]
        for line in body.strip().splitlines()
    ]


def _integer(cell: str) -> int:
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", cell), f"not a thousands-separated integer: {cell!r}"
    return int(cell.replace(",", ""))


def _unescape(cell: str) -> str:
    return (
        cell.replace(r"\textless{}", "<")
        .replace(r"\textgreater{}", ">")
        .replace(r"\_", "_")
        .replace(r"\&", "&")
    )


def test_every_number_in_the_tables_equals_the_csv(theory_csvs, tmp_path):
    out = tmp_path / "paper" / "appendix.tex"
    assert _render(theory_csvs, out) == 0
    tex = out.read_text()
    assert tex.startswith("% GENERATED FILE")
    assert str(theory_csvs / "counts.csv") in tex.split(r"\section")[0]

    counts = pd.read_csv(theory_csvs / "counts.csv")
    a1, a1b = _table_rows(tex, "tab:a1-counts"), _table_rows(tex, "tab:a1-totals")
    assert len(a1) == len(a1b) == len(counts)
    integer_columns = ["n_layer", "n_embd", "n_head", "n_kv_head", "head_dim"]
    for cells, cells_b, (_, row) in zip(a1, a1b, counts.iterrows()):
        assert cells[0] == cells_b[0] == row.architecture
        assert [_integer(c) for c in cells[1:6]] == [row[c] for c in integer_columns]
        bias = {(True, True): "yes", (True, False): "qkv", (False, True): "out", (False, False): "no"}
        assert cells[6:8] == ["yes" if row.rope else "no", bias[bool(row.bias), bool(row.out_bias)]]
        assert [_integer(c) for c in cells[8:12]] == [
            row.attn_params_per_layer,
            row.unidentified_qk_per_layer,
            row.unidentified_ov_per_layer,
            row.unidentified_bias_per_layer,
        ]
        assert float(cells[12]) == pytest.approx(row.identified_fraction, abs=5e-5)
        assert [_integer(c) for c in cells_b[1:]] == [
            row.qk_if_mha_per_layer,
            row.qk_with_gqa_only_per_layer,
            row.qk_with_rope_only_per_layer,
            row.unidentified_qk_per_layer,
            row.total_attn_params,
            row.total_unidentified,
        ]

    null = pd.read_csv(theory_csvs / "nullity.csv")
    a2 = _table_rows(tex, "tab:a2-nullity")
    assert len(a2) == len(null)
    for cells, (_, row) in zip(a2, null.iterrows()):
        assert _unescape(cells[0]) == row.case
        assert [_integer(c) for c in cells[1:5]] == [row.n_params, row.n_outputs, row.theory, row.measured]
        if row.gap == float("inf"):
            # no singular value dropped: the rank is the row count, footnoted as such (*)
            rank_is_rows = row.n_outputs < row.n_params and row.measured == row.n_params - row.n_outputs
            assert cells[5] == (r"$\infty^{*}$" if rank_is_rows else r"$\infty^{\dagger}$")
        else:
            mantissa, exponent = re.fullmatch(r"\$([\d.]+)\\times10\^\{(-?\d+)\}\$", cells[5]).groups()
            assert float(mantissa) * 10 ** int(exponent) == pytest.approx(row.gap, rel=0.06)
        assert cells[6] == ("yes" if row.passed else "no")
    if (null.gap == float("inf")).any():
        assert "No singular value was dropped" in tex

    single = pd.read_csv(theory_csvs / "single_head.csv")
    a3 = _table_rows(tex, "tab:a3-single-head")
    assert len(a3) == len(single)
    for cells, (_, row) in zip(a3, single.iterrows()):
        assert cells[0] == row.label
        assert [_integer(c) for c in cells[1:3]] == [row.n_embd, row.n_head]
        numbers = [float(c) for c in cells[3:]]
        expected = [
            row.e0_equal_identified,
            row.e0_ratio_equal_identified,
            row.param_ratio_equal_identified,
            row.e0_half_identified,
            row.e0_ratio_half_identified,
            row.param_ratio_half_identified,
        ]
        assert numbers == pytest.approx(expected, abs=0.051)


def test_experiment_tables_and_figures_are_included(theory_csvs, tmp_path):
    tables, figures = tmp_path / "tables", tmp_path / "figs"
    tables.mkdir()
    figures.mkdir()
    (tables / "runs.tex").write_text(
        "\\begin{tabular}{l}\\toprule runs-marker\\\\ \\bottomrule\\end{tabular}\n"
    )
    (tables / "sweep.tex").write_text("sweep-marker\n")  # cases.tex absent: skipped
    for k in range(1, 5):
        (figures / f"fig{k}.pdf").write_bytes(b"%PDF-1.4 placeholder")
        (figures / f"fig{k}.rst").write_text(_filled_caption(f"fig{k}"), encoding="utf-8")
    out = tmp_path / "paper" / "appendix.tex"
    assert _render(theory_csvs, out, "--experiment-tables", str(tables), "--figures", str(figures)) == 0
    tex = out.read_text()
    assert "runs-marker" in tex and "sweep-marker" in tex and "cases.tex" not in tex
    # the portrait sweep table follows the section's text; the wide per-run table gets a landscape page
    landscape = tex[tex.index(r"\section{Experiments}") :]
    landscape = landscape[landscape.index(r"\begin{landscape}") : landscape.index(r"\end{landscape}")]
    assert "runs-marker" in landscape and "sweep-marker" not in landscape
    assert tex.index("sweep-marker") < tex.index("runs-marker")
    assert r"Table~\ref{tab:experiment-runs} lists every training run." in tex  # no cases table to mention
    for k in range(1, 5):
        # at most 0.62 of a portrait page, less where the caption would not fit beside it
        size = r"width=\linewidth,height=\attnidheight,keepaspectratio"
        assert r"\attnidfigureheight{0.62}{" in tex
        assert rf"\includegraphics[{size}]{{../figs/fig{k}.pdf}}" in tex
        title = appendix.figure_caption(f"fig{k}", figures)["title"]
        assert (
            rf"\caption[{title}]{{\textbf{{{title}.}}" in tex
            and rf"Figure~\ref{{fig:fig{k}}}, {title}" in tex
        )


def test_missing_inputs_are_one_line_errors(theory_csvs, tmp_path, capsys):
    out = tmp_path / "appendix.tex"
    assert _render(theory_csvs, out, "--figures", str(tmp_path / "nothing")) == 2
    assert "fig1.pdf" in capsys.readouterr().err
    assert _render(theory_csvs, out, "--templates", str(tmp_path)) == 2
    assert "appendix.tex.j2" in capsys.readouterr().err
    assert main(["appendix", "--counts", str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err
    assert not out.exists()


def test_pdf_compiles_or_says_latexmk_is_missing(theory_csvs, tmp_path, repo_root, capsys):
    paper = tmp_path / "paper"
    paper.mkdir()
    shutil.copy(repo_root / "paper" / "main.tex", paper / "main.tex")
    # what a killed earlier run left: latexmk's scratch folder and the PDF's temporary file
    (paper / ".latexmk-k1ll3d00").mkdir()
    (paper / ".latexmk-k1ll3d00" / "main.aux").write_text("half\n")
    (paper / ".main.pdf.k1ll3d00.tmp").write_bytes(b"%PDF-1.5 half")
    status = _render(theory_csvs, paper / "appendix.tex", "--pdf")
    if shutil.which("latexmk") is None:
        assert status == 2 and "latexmk not found" in capsys.readouterr().err
    elif tex.missing_tex_packages():
        err = capsys.readouterr().err
        assert status == 2 and "siunitx.sty not found" in err and "texlive-science" in err
    else:
        assert status == 0, capsys.readouterr().err
        pdf = paper / "main.pdf"
        assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 10_000
        assert not list(paper.glob(".latexmk-*")), "scratch build folder left behind"
        assert sorted(p.name for p in paper.iterdir() if p.name.startswith(".")) == []


@needs("latexmk", "kpsewhich")
def test_a_missing_latex_package_is_one_line_naming_its_debian_package(tmp_path, monkeypatch):
    """Where TeX lacks a package paper/main.tex loads, --pdf says which and what installs it, before latexmk
    runs (instead of latexmk's first error)."""
    monkeypatch.setattr(tex, "TEX_PACKAGES", {"no-such-package-attnid.sty": "texlive-nothing"})
    assert tex.missing_tex_packages() == ["no-such-package-attnid.sty"]
    (tmp_path / "main.tex").write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    with pytest.raises(
        UserError, match=r"no-such-package-attnid.sty not found .* apt-get install texlive-nothing"
    ):
        appendix.compile_pdf(tmp_path / "main.tex")
    assert not (tmp_path / "main.pdf").exists()


def _filled_caption(name: str) -> str:
    """The caption ``attnid figures`` writes next to figure ``name``, with a build's numbers."""
    figure = figures.registry()[name]
    numbers = {
        "fig2": {"rho_floors": {"SGD": 2.6e-24}},
        "fig6": sample_fig6_numbers(),
        "fig7": {
            "models": "nanogpt seed 0, nanogpt seed 1, smollm2",
            "float_spread": 3.3e-14,
            # both of panel (a)'s sentences: SmolLM2's outliers, and none in the build's own checkpoints
            "smollm2": True,
            "smollm2_shipped": 412.0,
            "smollm2_r1": 3.02,
            "outlier": 10.0,
            "no_outliers": True,
            "build_largest": 3.08,
            "build_shipped": 2.89,
            "build_r1": 3.08,
        },
        "fig8": {
            "line_group": "adamw",
            "barrier_none": 0.31,
            "barrier_discrete": 0.12,
            "barrier_all": 0.05,
            "exact": 2.2e-15,
        },
    }.get(name, {})
    return figures.fill_caption(figure.caption_template, numbers)


def _figure_pdfs(folder):
    """Stand-in figures (the appendix is under test, not the plots), with TrueType text."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    folder.mkdir()
    with matplotlib.rc_context({"pdf.fonttype": 42}):
        for name in figures.registry():
            # Figure 6 with a family as long as this one is as tall as the appendix draws a figure (its
            # filled caption is the longest)
            fig, ax = plt.subplots(figsize=(12.2, 12.2) if name == "fig6" else (6, 3))
            ax.plot([1, 2, 3], [1, 4, 9], label=name)
            ax.legend()
            fig.savefig(folder / f"{name}.pdf")
            plt.close(fig)
            # the caption filled with a build's numbers sits next to its figure (as long as a real one)
            (folder / f"{name}.rst").write_text(_filled_caption(name), encoding="utf-8")


def _overfull_boxes(log: str) -> list[float]:
    """Widths (pt) of every overfull box LaTeX reports; horizontal ones are what runs off a page."""
    return [float(width) for width in re.findall(r"Overfull \\[hv]box \(([\d.]+)pt too (?:wide|high)\)", log)]


def _font_types(pdffonts_output: str) -> set[str]:
    """The ``type`` column of ``pdffonts`` (cut at the positions of its dashed header rule)."""
    lines = pdffonts_output.splitlines()
    columns = [match.span() for match in re.finditer(r"-+", lines[1])]
    start, end = columns[1]
    return {line[start:end].strip() for line in lines[2:] if line.strip()}


@needs("latexmk", "siunitx.sty", "pdffonts")
def test_pdf_fits_the_page_in_vector_fonts(theory_csvs, tmp_path, repo_root):
    """The whole document (theory tables, experiment tables of a synthetic study, figures with
    their captions) compiles with no box more than 5 pt too wide, no float too tall, and no
    Type 3 (bitmap) font."""
    runs, sweep = write_study(tmp_path / "study")
    for seed in range(3):  # every cell a mean +- sd in scientific notation: the widest the tables get
        write_run(
            runs / "sgd_momentum" / f"seed{seed}",
            "sgd_momentum",
            seed,
            0.05,
            rho_qk=1.3e-9 * (seed + 1),
            rho_ov=2.7e-13 * (seed + 1),
            final_beta=1.1e-5 * (seed + 1),
            tau=1.7e-7 * (seed + 1),
            mu=0.147 + 0.0043 * seed,
            final_val_loss=3.14 + 0.022 * seed,
        )
    tables, figures, paper = tmp_path / "tables", tmp_path / "figures", tmp_path / "paper"
    assert main(["tables", "--runs-dir", str(runs), "--sweep-dir", str(sweep), "--out-dir", str(tables)]) == 0
    _figure_pdfs(figures)
    paper.mkdir()
    shutil.copy(repo_root / "paper" / "main.tex", paper / "main.tex")
    assert (
        _render(
            theory_csvs,
            paper / "appendix.tex",
            "--experiment-tables",
            str(tables),
            "--figures",
            str(figures),
            "--pdf",
        )
        == 0
    )
    log = (paper / "main.log").read_text(errors="replace")
    assert "Overfull" not in log or max(_overfull_boxes(log)) <= 5.0, re.findall(r"Overfull.*", log)
    assert "Float too large" not in log and "undefined" not in log.lower().replace("undefined references", "")
    fonts = subprocess.run(
        ["pdffonts", str(paper / "main.pdf")], capture_output=True, text=True, check=True
    ).stdout
    kinds = _font_types(fonts)
    assert kinds and "Type 3" not in kinds, fonts
    assert kinds <= {"Type 1", "Type 1C", "TrueType", "CID Type 0C", "CID TrueType"}, fonts
    tex = (paper / "appendix.tex").read_text()
    assert r"\resizebox" not in tex and r"\scriptsize" not in tex and r"\tiny" not in tex
    floats = _floats_in_page_order(paper / "main.pdf")
    assert floats == sorted(floats, key=_float_order), floats  # A1 before A2 ..., tables before figures
    assert floats[:3] == ["Table A1", "Table A1b", "Table A2"], floats


def _floats_in_page_order(pdf) -> list[str]:
    """The captions' labels (``Table A1``, ``Figure 3``) in the order the PDF's pages show them."""
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True).stdout
    return re.findall(r"^\s*((?:Table|Figure) [A-Z]?\d+b?):", text, flags=re.M)


def _float_order(label: str) -> tuple:
    kind, number = label.split()
    match = re.fullmatch(r"([A-Z]?)(\d+)(b?)", number)
    return (kind == "Figure", match[1], int(match[2]), match[3])


def test_log_and_font_parsers():
    log = "Overfull \\hbox (17.59224pt too wide) in paragraph\nOverfull \\vbox (3.0pt too high) has occurred"
    assert _overfull_boxes(log) == [17.59224, 3.0]
    fonts = (
        "name                                 type              encoding         emb sub uni object ID\n"
        "------------------------------------ ----------------- ---------------- --- --- --- ---------\n"
        "ULCCWF+LMRoman17-Regular             Type 1            Custom           yes yes yes      4  0\n"
        "FTUMPH+DejaVuSans-Oblique            Type 3            Custom           yes yes yes     19  0\n"
    )
    assert _font_types(fonts) == {"Type 1", "Type 3"}


def test_every_caption_converts(tmp_path):
    for name in figures.registry():
        text = _filled_caption(name)
        assert text.startswith(f"**Figure {name.removeprefix('fig')} ") and "{{" not in text
        (tmp_path / f"{name}.rst").write_text(text, encoding="utf-8")
        caption = appendix.figure_caption(name, tmp_path)
        assert caption["caption"].startswith(rf"\textbf{{{caption['title']}.}} ")
        assert all(ord(char) < 128 for char in caption["caption"]), name  # pdflatex-safe
    assert appendix.rst_to_tex("the drift :math:`\\beta` of ``run.json`` is *small* — 50% off") == (
        r"the drift $\beta$ of \texttt{run.\allowbreak{}json} is \emph{small} --- 50\% off"
    )
    with pytest.raises(ValueError, match="ρ"):
        appendix.rst_to_tex("a bare ρ")


def test_templates_are_package_data(repo_root):
    """Every shipped template matches a package-data glob, so a wheel has them;
    they are found through importlib.resources, not through the source tree."""
    patterns = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["attnid"]
    package = repo_root / "src" / "attnid"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    templates = {path for path in (package / "reports" / "templates").rglob("*") if path.is_file()}
    assert templates and templates <= shipped, sorted(map(str, templates - shipped))
    assert str(latex.find_template_dir()) == str(package / "reports" / "templates")
    assert not (repo_root / "paper" / "templates").exists()


def test_helpers_escape_and_format():
    assert latex.thousands(1048576) == "1,048,576" and latex.thousands(131072.0) == "131,072"
    assert latex.tex_escape("a_b & 50% <x>") == r"a\_b \& 50\% \textless{}x\textgreater{}"
    assert latex.tex_escape("beta ~ 0") == r"beta $\sim$ 0"  # "about", not a raised tilde
    assert latex.fixed(0.9375, 3) == "0.938" or latex.fixed(0.9375, 3) == "0.937"
    assert latex.scientific(2.8e13) == r"$2.8\times10^{13}$"
    text = latex.render_table(
        "\\BLOCK{for row in rows}\\VAR{row.name | tex} & \\VAR{row.n | thousands} \\\\\n\\BLOCK{endfor}",
        [{"name": "x_1", "n": 12345}, {"name": "y", "n": 7}],
    )
    assert text == "x\\_1 & 12,345 \\\\\ny & 7 \\\\\n"
    with pytest.raises(jinja2.UndefinedError, match="missing"):
        latex.render_table("\\VAR{missing}\n", [])


def test_wide_figures_get_a_landscape_page(tmp_path):
    """A figure much wider than tall would shrink its labels on a portrait page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnid.reports.appendix import WIDE_FIGURE_ASPECT, pdf_aspect_ratio

    ratios = {}
    for name, size in {"wide": (12, 6), "square": (6, 6)}.items():
        fig = plt.figure(figsize=size)
        fig.savefig(tmp_path / f"{name}.pdf")
        plt.close(fig)
        ratios[name] = pdf_aspect_ratio(tmp_path / f"{name}.pdf")
    assert abs(ratios["wide"] - 2.0) < 1e-6 and abs(ratios["square"] - 1.0) < 1e-6
    assert ratios["square"] < WIDE_FIGURE_ASPECT < ratios["wide"]
