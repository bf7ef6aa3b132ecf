"""attnid appendix: the rendered tables carry exactly the CSVs' numbers, and the PDF compiles."""

from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest

from attnid import latex, nullity
from attnid.cli import main
from attnid.files import write_csv_atomic


@pytest.fixture(scope="module")
def theory_csvs(tmp_path_factory, repo_root):
    folder = tmp_path_factory.mktemp("theory")
    assert main(["counts", "--architectures", str(repo_root / "config" / "architectures.yaml"),
                 "--out", str(folder / "counts.csv"), "--single-head-out", str(folder / "single_head.csv")]) == 0
    cases = [c for c in nullity.default_cases() if c.kind == "pair" or c.name in
             {"attention E=12 H=2", "RoPE half+bias E=12 H=3", "GQA E=12 H=4 G=1 D=3"}]
    write_csv_atomic(folder / "nullity.csv", nullity.verify(cases))
    return folder


def _render(theory_csvs, out, *extra) -> int:
    return main(["appendix", "--counts", str(theory_csvs / "counts.csv"), "--nullity", str(theory_csvs / "nullity.csv"),
                 "--single-head", str(theory_csvs / "single_head.csv"), "--out", str(out), *extra])


def _table_rows(tex: str, label: str) -> list[list[str]]:
    """Body cells of the booktabs table labelled ``label``."""
    block = tex[tex.index(rf"\label{{{label}}}"):]
    body = block[block.index(r"\midrule") + len(r"\midrule"): block.index(r"\bottomrule")]
    return [[cell.strip() for cell in line.strip().removesuffix(r"\\").split("&")]
            for line in body.strip().splitlines()]


def _integer(cell: str) -> int:
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", cell), f"not a thousands-separated integer: {cell!r}"
    return int(cell.replace(",", ""))


def _unescape(cell: str) -> str:
    return cell.replace(r"\textless{}", "<").replace(r"\textgreater{}", ">").replace(r"\_", "_").replace(r"\&", "&")


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
        assert cells[6:8] == ["yes" if row.rope else "no", "yes" if row.bias else "no"]
        assert [_integer(c) for c in cells[8:12]] == [row.attn_params_per_layer, row.unidentified_qk_per_layer,
                                                     row.unidentified_ov_per_layer, row.unidentified_bias_per_layer]
        assert float(cells[12]) == pytest.approx(row.identified_fraction, abs=5e-5)
        assert [_integer(c) for c in cells_b[1:]] == [row.qk_if_mha_per_layer, row.qk_with_gqa_only_per_layer,
                                                      row.qk_with_rope_only_per_layer, row.unidentified_qk_per_layer,
                                                      row.total_attn_params, row.total_unidentified]

    null = pd.read_csv(theory_csvs / "nullity.csv")
    a2 = _table_rows(tex, "tab:a2-nullity")
    assert len(a2) == len(null)
    for cells, (_, row) in zip(a2, null.iterrows()):
        assert _unescape(cells[0]) == row.case
        assert [_integer(c) for c in cells[1:4]] == [row.n_params, row.theory, row.measured]
        if row.gap == float("inf"):
            assert cells[4] == r"$\infty$"
        else:
            mantissa, exponent = re.fullmatch(r"\$([\d.]+)\\times10\^\{(-?\d+)\}\$", cells[4]).groups()
            assert float(mantissa) * 10 ** int(exponent) == pytest.approx(row.gap, rel=0.06)
        assert cells[5] == ("yes" if row.passed else "no")

    single = pd.read_csv(theory_csvs / "single_head.csv")
    a3 = _table_rows(tex, "tab:a3-single-head")
    assert len(a3) == len(single)
    for cells, (_, row) in zip(a3, single.iterrows()):
        assert cells[0] == row.label
        assert [_integer(c) for c in cells[1:3]] == [row.n_embd, row.n_head]
        numbers = [float(c) for c in cells[3:]]
        expected = [row.e0_equal_identified, row.e0_ratio_equal_identified, row.param_ratio_equal_identified,
                    row.e0_half_identified, row.e0_ratio_half_identified, row.param_ratio_half_identified]
        assert numbers == pytest.approx(expected, abs=0.051)


def test_experiment_tables_and_figures_are_included(theory_csvs, tmp_path):
    tables, figures = tmp_path / "tables", tmp_path / "figs"
    tables.mkdir()
    figures.mkdir()
    (tables / "runs.tex").write_text("\\begin{tabular}{l}\\toprule runs-marker\\\\ \\bottomrule\\end{tabular}\n")
    (tables / "sweep.tex").write_text("sweep-marker\n")  # cases.tex absent: skipped
    for k in range(1, 5):
        (figures / f"fig{k}.pdf").write_bytes(b"%PDF-1.4 placeholder")
    out = tmp_path / "paper" / "appendix.tex"
    assert _render(theory_csvs, out, "--experiment-tables", str(tables), "--figures", str(figures)) == 0
    tex = out.read_text()
    assert "runs-marker" in tex and "sweep-marker" in tex and "cases.tex" not in tex
    assert tex.index("runs-marker") < tex.index("sweep-marker")
    for k in range(1, 5):
        assert rf"\includegraphics[width=0.85\linewidth]{{../figs/fig{k}.pdf}}" in tex


def test_missing_inputs_are_one_line_errors(theory_csvs, tmp_path, capsys):
    out = tmp_path / "appendix.tex"
    assert _render(theory_csvs, out, "--figures", str(tmp_path / "nothing")) == 2
    assert "fig1.pdf" in capsys.readouterr().err
    assert main(["appendix", "--counts", str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err
    assert not out.exists()


def test_pdf_compiles_or_says_latexmk_is_missing(theory_csvs, tmp_path, repo_root, capsys):
    paper = tmp_path / "paper"
    paper.mkdir()
    shutil.copy(repo_root / "paper" / "main.tex", paper / "main.tex")
    status = _render(theory_csvs, paper / "appendix.tex", "--pdf")
    if shutil.which("latexmk") is None:
        assert status == 2 and "latexmk not found" in capsys.readouterr().err
    else:
        assert status == 0, capsys.readouterr().err
        pdf = paper / "main.pdf"
        assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 10_000
        assert not list(paper.glob(".latexmk-*")), "scratch build folder left behind"


def test_helpers_escape_and_format():
    assert latex.thousands(1048576) == "1,048,576" and latex.thousands(131072.0) == "131,072"
    assert latex.tex_escape("a_b & 50% <x>") == r"a\_b \& 50\% \textless{}x\textgreater{}"
    assert latex.fixed(0.9375, 3) == "0.938" or latex.fixed(0.9375, 3) == "0.937"
    assert latex.scientific(2.8e13) == r"$2.8\times10^{13}$"
    text = latex.render_table("\\BLOCK{for row in rows}\\VAR{row.name | tex} & \\VAR{row.n | thousands} \\\\\n"
                              "\\BLOCK{endfor}", [{"name": "x_1", "n": 12345}, {"name": "y", "n": 7}])
    assert text == "x\\_1 & 12,345 \\\\\ny & 7 \\\\\n"
    with pytest.raises(Exception):
        latex.render_table("\\VAR{missing}\n", [])
