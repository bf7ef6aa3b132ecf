"""The README's and docs/quantization.md's quantization numbers are those of the kept tables
(docs/figures/quantization.csv of the default config's stage, quantization_smollm2.csv of SmolLM2), to the
digits shown: a regenerated table cannot silently leave the front page behind."""

from __future__ import annotations

import re

import pandas as pd
from pipeline_helpers import REPO

FIGURES = REPO / "docs" / "figures"
README = (REPO / "README.md").read_text()
PAGE = (REPO / "docs" / "quantization.md").read_text()


def kl(rows: pd.DataFrame, point: str, setting: str, model: str | None = None) -> float:
    hit = rows[(rows["point"] == point) & (rows["setting"] == setting)]
    if model is not None:
        hit = hit[hit["model"] == model]
    return float(hit["kl"].iloc[0])


def shown(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}g}"


def test_readme_smollm2_numbers_are_the_kept_table():
    rows = pd.read_csv(FIGURES / "quantization_smollm2.csv")
    sentence = " ".join(re.search(r"On SmolLM2-135M.*?\(\[more\]", README, re.S).group(0).split())
    a4 = (kl(rows, "shipped", "A4:qkv+up"), kl(rows, "R1 random", "A4:qkv+up"))
    v4 = (kl(rows, "shipped", "V4"), kl(rows, "R1+R2 random", "V4"))
    assert f"inputs {shown(a4[0])} → {shown(a4[1])}" in sentence, sentence
    assert f"V cache {shown(v4[0])} → {shown(v4[1])}" in sentence, sentence
    assert f"OV move gets {shown(kl(rows, 'R1+OV optimized', 'V4'))}" in sentence, sentence


def test_the_page_tables_are_the_kept_tables():
    for name in ("quantization.csv", "quantization_smollm2.csv"):
        rows = pd.read_csv(FIGURES / name)
        for row in rows[rows["setting"] != "float"].itertuples():
            line = next(
                (line for line in PAGE.splitlines() if line.startswith(f"| {row.model} | {row.point} |")),
                None,
            )
            assert line is not None, (name, row.model, row.point)
            before = PAGE.split(line)[0].splitlines()
            header = next(text for text in reversed(before) if text.startswith("| model | orbit point |"))
            columns = [cell.strip().strip("`") for cell in header.split("|")]
            cells = [cell.strip() for cell in line.split("|")]
            assert cells[columns.index(row.setting)] == f"{row.kl:.3g}", (name, row.point, row.setting)
