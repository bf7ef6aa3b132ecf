"""claims.csv's theory rows, T1-T6 (docs/design.md §1, §10): each computed from ``attnid verify``'s
nullity.csv (:mod:`attnid.theory.nullity`), the float64 Jacobian nullity of small layers next to the closed
form of counts.py. A row counts the cases of its claim that show it (the Jacobian's nullity, with a resolved
rank, equals what the claim says), against how many there are; so a case that stops closing fails its claim.

- T1-T2 (Lemma 4.1-4.6): the factor pairs and plain attention layers, nullity = the closed form (``D^2`` per
  head in ``W_Q^T W_K`` and ``C^2`` in ``W_O W_V``);
- T3 (§4.5): plain attention with ``D = C = E/H``: the identified share is exactly ``1 - 1/(2H)``;
- T4 (§4.7): biases with an output bias and no RoPE (the paper's setting), nullity = the closed form;
- T5 (§4.9, Prop. 4.8): GQA and RoPE without biases: nullity = the closed form, and below plain
  multi-head attention's ``H (D^2 + C^2)`` wherever ``G < H`` or RoPE is on;
- T6 (§4.10): from the Jacobians alone (the single head's identified count per ``E^2`` and each plain
  layer's), ``(E_0 / E)^2`` is exactly ``2 - 1/H``: the paper's lemma. Its "roughly 60 %" is not this
  (docs/design.md §10), and no row claims it.

Each row is ``(claim, paper, measured, relation, threshold, detail)``; :mod:`attnid.reports.claims` makes
them rows of claims.csv, in float64 (the Jacobians' precision).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import pandas as pd

# what a row reads of nullity.csv
NULLITY_COLUMNS = (
    *("case", "kind", "n_embd", "n_head", "n_kv_head", "head_dim", "value_dim", "rope", "bias", "out_bias"),
    *("n_params", "theory", "measured", "passed"),
)
PLAIN, PAIR, SINGLE_HEAD = "attention", "pair", "single_head"
SHRINKING = ("gqa", "rope", "rope_gqa")  # T5's kinds: GQA and RoPE without biases
# a row: claim, paper, measured (cases that show it), relation, threshold (cases), detail
Row = tuple[str, str, float, str, int, str]


def _flag(values: pd.Series) -> pd.Series:
    """A True/False column as nullity.csv holds it (bool, or its text once read back)."""
    return values.astype(str).str.lower().eq("true")


def closes(nullity: pd.DataFrame) -> pd.Series:
    """Each case whose measured nullity is its closed form, with a resolved rank (verify's ``passed`` also
    holds the singular-value gap)."""
    return (nullity["theory"] == nullity["measured"]) & _flag(nullity["passed"])


def identified_share_is_paper_s(case: pd.Series) -> bool:
    """T3: ``(n_params - nullity) / n_params == 1 - 1/(2H)``, exactly."""
    return Fraction(int(case["n_params"]) - int(case["measured"]), int(case["n_params"])) == 1 - Fraction(
        1, 2 * int(case["n_head"])
    )


def shrinks(case: pd.Series) -> bool:
    """T5: below plain multi-head attention's ``H (D^2 + C^2)`` where GQA (``G < H``) or RoPE is on."""
    if int(case["n_kv_head"]) == int(case["n_head"]) and not _flag(pd.Series([case["rope"]])).iloc[0]:
        return True  # G = H without RoPE: plain attention, nothing to shrink
    return int(case["measured"]) < int(case["n_head"]) * (
        int(case["head_dim"]) ** 2 + int(case["value_dim"]) ** 2
    )


def e0_ratio_squared(layer: pd.Series, single_head: pd.Series) -> Fraction:
    """``(E_0 / E)^2`` of a single head that identifies as many weights as ``layer``, both counts measured:
    the single head identifies ``(3 E_0^2 - nullity) / E_0^2`` per ``E_0^2`` (docs/design.md §10)."""
    per_square = Fraction(
        int(single_head["n_params"]) - int(single_head["measured"]), int(single_head["n_embd"]) ** 2
    )
    identified = int(layer["n_params"]) - int(layer["measured"])
    return Fraction(identified) / (per_square * int(layer["n_embd"]) ** 2)


def _each(cases: pd.DataFrame, test: Callable[[pd.Series], bool]) -> pd.Series:
    """``test`` of each case, a boolean column of ``cases`` (empty for none)."""
    return pd.Series([test(case) for _, case in cases.iterrows()], index=cases.index, dtype=bool)


def _count(claim: str, paper: str, shown: pd.Series, detail: str) -> Row:
    """A claim's row: how many of its cases show it (NaN, so missing, for a claim without cases)."""
    measured = float(shown.sum()) if len(shown) else math.nan
    return (claim, paper, measured, "=", len(shown), f"{detail}, of {len(shown)} verify cases")


def theory_claim_rows(nullity: pd.DataFrame) -> list[Row]:
    """T1-T6 from nullity.csv (the module's docstring)."""
    kind = nullity["kind"]
    closing = closes(nullity)
    plain = nullity[kind == PLAIN]
    plain_closing = closing[kind == PLAIN]
    papers_bias = _flag(nullity["bias"]) & _flag(nullity["out_bias"]) & ~_flag(nullity["rope"])
    shrinking = nullity[kind.isin(SHRINKING)]
    single = nullity[kind == SINGLE_HEAD]
    shares = _each(plain, identified_share_is_paper_s) & plain_closing
    rows = [
        _count(
            "T1-T2 D^2 unidentified weights per head in W_Q^T W_K and in W_O W_V",
            "T1-T2, Lemma 4.1-4.6",
            closing[kind.isin([PAIR, PLAIN])],
            "factor pairs (D < E, = E, > E) and plain attention layers whose float64 Jacobian nullity is the "
            "closed form",
        ),
        _count(
            "T3 identified share 1 - 1/(2H), exact",
            "T3, Section 4.5",
            shares,
            f"plain attention layers (E = {_listed(plain['n_embd'])}, H = {_listed(plain['n_head'])}) whose "
            f"measured identified share is 1 - 1/(2H) exactly",
        ),
        _count(
            "T4 key biases do nothing, value biases only pooled",
            "T4, Section 4.7",
            closing[papers_bias],
            "layers with query, key, value and output biases, no RoPE, whose nullity is the closed form "
            "(every key bias unidentified, the value biases only through W_O b_V + b_O)",
        ),
        _count(
            "T5 GQA and RoPE shrink the set",
            "T5, Section 4.9, Prop. 4.8",
            closing[kind.isin(SHRINKING)] & _each(shrinking, shrinks),
            "GQA and RoPE layers without biases whose nullity is the closed form and, where G < H or RoPE, "
            "below plain attention's H (D^2 + C^2)",
        ),
    ]
    return rows + [_single_head_row(plain, plain_closing, single, closing[kind == SINGLE_HEAD])]


def _single_head_row(
    plain: pd.DataFrame, plain_closing: pd.Series, single: pd.DataFrame, single_closing: pd.Series
) -> Row:
    """T6: each plain layer's ``(E_0/E)^2`` from the Jacobians against ``2 - 1/H``; the detail names the
    widest ``H``'s ``E_0/E``."""
    if single.empty or not single_closing.all():
        shown = pd.Series(False, index=plain.index)
    else:
        ratios = [e0_ratio_squared(layer, single.iloc[0]) for _, layer in plain.iterrows()]
        shown = plain_closing & pd.Series(
            [ratio == 2 - Fraction(1, int(h)) for ratio, h in zip(ratios, plain["n_head"])], index=plain.index
        )
    row = _count(
        "T6 a single head needs E_0 = E sqrt(2 - 1/H)",
        "T6, Section 4.10",
        shown,
        "plain attention layers whose (E_0/E)^2, from the Jacobians of the layer and of the paper's single "
        "head, is 2 - 1/H exactly",
    )
    if plain.empty or single.empty:
        return row
    widest = plain.sort_values("n_head", key=lambda heads: heads.astype(int)).iloc[-1]
    ratio = math.sqrt(e0_ratio_squared(widest, single.iloc[0]))
    claim, paper, measured, relation, threshold, detail = row
    detail += f"; E_0/E = {ratio:.4g} at H = {int(widest['n_head'])} (not the paper's 60 %)"
    return claim, paper, measured, relation, threshold, detail


def _listed(values: pd.Series) -> str:
    return ", ".join(str(value) for value in dict.fromkeys(int(v) for v in values)) or "none"
