"""The README's numbers are those of the default build whose outputs docs/figures/ keeps: the claims
table row by row (measured value to the digits shown, precision, result) and the study's pooled rank
correlation, so a regenerated docs/figures/ cannot silently leave the front page behind."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from pipeline_helpers import REPO

README = (REPO / "README.md").read_text()
FIGURES = REPO / "docs" / "figures"


def readme_claim_rows() -> dict[str, list[str]]:
    """{claim: [paper, measured, threshold, precision, result]} from the README's experiment claims table."""
    rows = {}
    for line in README.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.match(r"(E[123] |drift split)", cells[0]):
            rows[cells[0]] = cells[1:]
    return rows


def agrees_to_shown_digits(shown: str, value: float) -> bool:
    """``shown`` (e.g. ``7e-15``, ``2.2e-24``, ``0.0315``, ``21.2``) is ``value`` rounded to its digits."""
    number = float(shown)
    mantissa = shown.lower().split("e")[0].lstrip("-")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(shown.lower().split("e")[1]) if "e" in shown.lower() else 0
    return math.isclose(number, value, abs_tol=0.5 * 10 ** (exponent - decimals) * 1.0001)


def test_readme_claims_table_is_the_kept_default_build():
    claims = pd.read_csv(FIGURES / "claims.csv")
    rows = readme_claim_rows()
    assert set(rows) == set(claims["claim"]), set(rows) ^ set(claims["claim"])
    for claim in claims.itertuples():
        paper, measured, _threshold, precision, result = rows[claim.claim]
        assert paper == claim.paper and precision == claim.dtype and result == claim.result
        assert agrees_to_shown_digits(measured, claim.measured), (claim.claim, measured, claim.measured)


def test_readme_pooled_correlation_is_the_kept_default_build():
    table = pd.read_csv(FIGURES / "identification_correlation.csv")
    pooled = table[(table["study"] == "all") & (table["quantity"] == "final_val_loss")].iloc[0]
    match = re.search(r"Across the (\d+)\s+distinct points the rank correlation between identified fraction "
                      r"and val loss is −(\d\.\d+) ± (\d\.\d+)", README)
    assert match, "the README states the pooled correlation of the study"
    assert int(match.group(1)) == pooled.n_points
    assert agrees_to_shown_digits("-" + match.group(2), pooled.spearman_per_seed_mean)
    assert agrees_to_shown_digits(match.group(3), pooled.spearman_per_seed_sd)


@pytest.mark.parametrize("shown, value, expected", [("7e-15", 6.96e-15, True), ("7e-15", 7.6e-15, False),
                                                     ("0.0315", 0.031514, True), ("21.2", 21.3, False)])
def test_digit_agreement(shown, value, expected):
    assert agrees_to_shown_digits(shown, value) is expected
