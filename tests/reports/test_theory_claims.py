"""claims.csv's theory rows T1-T6 from `attnid verify`'s nullity.csv: each counts the verify cases of its
claim that show it, fails when one stops showing it, and T3's and T6's exact fractions are the paper's."""

from __future__ import annotations

import math
from fractions import Fraction

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_runs import write_study

from attnid.reports import tables, theory_claims
from attnid.theory.nullity import default_cases, parameter_shapes, theory_nullity

T_CLAIMS = ("T1-T2", "T3", "T4", "T5", "T6")


def verify_table() -> pd.DataFrame:
    """nullity.csv as `attnid verify` writes it for a Jacobian that measures every closed form exactly (the
    default cases' shapes and closed forms, not measured here)."""
    rows = []
    for case in default_cases():
        shape = case.attention
        theory = theory_nullity(case)
        rows.append(
            {
                "case": case.name,
                "kind": case.kind,
                **{name: getattr(shape, name) for name in ("n_embd", "n_head", "n_kv_head", "head_dim")},
                **{name: getattr(shape, name) for name in ("value_dim", "rope", "bias", "out_bias")},
                "rope_pairing": case.rope_pairing or "",
                "n_params": sum(math.prod(size) for size in parameter_shapes(case).values()),
                "n_outputs": 0,
                "theory": theory,
                "measured": theory,
                "gap": 1e9,
                "passed": True,
            }
        )
    return pd.DataFrame(rows)


def theory_results(tmp_path, nullity: pd.DataFrame) -> pd.DataFrame:
    """claims.csv's T rows of `attnid tables` given ``nullity`` as its --nullity file."""
    runs_dir, sweep_dir = write_study(tmp_path)
    nullity.to_csv(tmp_path / "nullity.csv", index=False)
    claims = tables.write_tables(
        runs_dir, sweep_dir, tmp_path / "tables", nullity_csv=tmp_path / "nullity.csv"
    )
    written = pd.read_csv(tmp_path / "tables" / "claims.csv")
    assert written["claim"].head(len(T_CLAIMS)).str.split(" ").str[0].tolist() == list(T_CLAIMS)
    return claims["claims"].head(len(T_CLAIMS)).set_index(pd.Index(T_CLAIMS))


def test_each_theory_claim_counts_its_cases_that_show_it(tmp_path):
    nullity = verify_table()
    claims = theory_results(tmp_path, nullity)
    assert (claims["kind"] == "paper").all() and (claims["dtype"] == "float64").all()
    assert (claims["result"] == "pass").all(), claims[["measured", "threshold", "result"]]
    plain = int((nullity["kind"] == "attention").sum())
    assert claims.loc["T1-T2", "measured"] == plain + (nullity["kind"] == "pair").sum()
    assert claims.loc["T3", "measured"] == claims.loc["T6", "measured"] == plain
    assert claims.loc["T4", "measured"] == (nullity["bias"] & nullity["out_bias"] & ~nullity["rope"]).sum()
    assert claims.loc["T5", "measured"] == nullity["kind"].isin(["gqa", "rope", "rope_gqa"]).sum()
    assert claims["threshold"].astype(float).tolist() == claims["measured"].tolist()
    widest = nullity["n_head"][nullity["kind"] == "attention"].max()
    assert f"E_0/E = {math.sqrt(2 - 1 / widest):.4g} at H = {widest}" in claims.loc["T6", "detail"]


def test_a_case_that_stops_closing_fails_the_claims_it_belongs_to(tmp_path):
    nullity = verify_table()
    widest = nullity.index[nullity["case"] == "attention E=12 H=12"]
    nullity.loc[widest, "measured"] += 1  # one more null direction than the closed form
    results = theory_results(tmp_path / "one", nullity)["result"]
    assert results.to_dict() == {"T1-T2": "fail", "T3": "fail", "T4": "pass", "T5": "pass", "T6": "fail"}
    nullity = verify_table()
    nullity.loc[nullity["case"] == "RoPE interleaved E=12 H=3", "passed"] = False  # an unresolved rank
    assert theory_results(tmp_path / "two", nullity)["result"]["T5"] == "fail"


def test_t5_asks_gqa_and_rope_to_shrink_the_set_not_only_to_close(tmp_path):
    """A GQA layer whose closed form and nullity were plain attention's (H (D^2 + C^2)) closes, but shows no
    shrinking: T5 fails; the G = H control needs none."""
    nullity = verify_table()
    gqa = nullity["case"] == "GQA E=12 H=4 G=2 D=3"
    mha = int(nullity.loc[gqa, "n_head"].iloc[0]) * (3**2 + 3**2)
    nullity.loc[gqa, ["theory", "measured"]] = mha
    assert theory_results(tmp_path, nullity)["result"]["T5"] == "fail"


def test_a_nullity_table_without_a_column_is_one_line(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    verify_table().drop(columns="passed").to_csv(tmp_path / "nullity.csv", index=False)
    with pytest.raises(tables.UserError, match=r"nullity.csv has no column\(s\) passed"):
        tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables", nullity_csv=tmp_path / "nullity.csv")


@settings(max_examples=60, deadline=None, database=None, derandomize=True)  # the project's property runs
@given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 64), st.integers(0, 3))
def test_t3_and_t6_hold_exactly_at_the_closed_forms_and_nowhere_else(n_head, head_dim, e0, off):
    """With ``D = C = E/H`` a plain layer identifies ``4E^2 - 2HD^2`` weights: share ``1 - 1/(2H)``; a
    single head of width ``E_0`` identifies ``2 E_0^2`` of ``3 E_0^2``: ``(E_0/E)^2 = 2 - 1/H``. One null
    direction more (``off``) breaks both."""
    n_embd = n_head * head_dim
    layer = pd.Series(
        {
            "n_embd": n_embd,
            "n_head": n_head,
            "n_params": 4 * n_embd**2,
            "measured": 2 * n_head * head_dim**2 + off,
        }
    )
    single = pd.Series({"n_embd": e0, "n_params": 3 * e0**2, "measured": e0**2})
    assert theory_claims.identified_share_is_paper_s(layer) == (off == 0)
    assert (theory_claims.e0_ratio_squared(layer, single) == 2 - Fraction(1, n_head)) == (off == 0)
