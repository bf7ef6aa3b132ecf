"""claims.csv's three groups, its ``kind`` column (docs/experiments.md, the claims and how the tables
compute them):

- ``paper``: the paper's claims (T1-T6, from the theory stage's Jacobians, and E1-E3), replicated
  (``pass``) or not (``fail``, loud): a ``paper`` column that opens with its label (``T3, Section 4.5``);
- ``finding``: a hypothesis of ours (the census, the quantization stage's targets, the interventions'
  verdicts), with its outcome as measured: ``holds`` or ``rejected`` for a threshold, the verdict rule's
  label (docs/design.md §11.3) as interventions.csv has it for a comparison. A rejected finding is an
  answer, never a failure of the build;
- ``check``: what makes a build trustworthy (round-off floors, exactness, the protocol's declared
  conditions); a failing check is as loud as a paper claim that does not replicate.

The README's claims section and the report's landing page show the groups apart, each under
:func:`group_summary`.
"""

from __future__ import annotations

import re

import pandas as pd

from attnid.reports.quantization_table import QUANTIZATION_FINDINGS

PAPER, FINDING, CHECK = "paper", "finding", "check"
KINDS = (PAPER, FINDING, CHECK)  # the order the README and the report show them in
HOLDS, REJECTED = "holds", "rejected"
OUTCOME_OF = {"pass": HOLDS, "fail": REJECTED}  # a finding's pass or fail, as its outcome
PAPER_LABEL = re.compile(r"[TE]\d")  # "E1, Lemma 5.1", "T1-T2, Lemma 4.1-4.6": a claim of the paper
CENSUS_SOURCE, VERDICT_SOURCE = "census (ours)", "interventions (ours)"  # paper columns of findings only
# what a verdict's row reads of interventions.csv
VERDICT_COLUMNS = (
    *("comparison", "arm", "baseline", "metric", "role", "in_family", "n_seeds", "alpha", "delta_mean"),
    *("ci_low", "ci_high", "p_holm", "equivalence_margin", "detectable_effect", "verdict"),
)


def claim_kind(claim: str, paper: str = "") -> str:
    """``paper``, ``finding`` or ``check`` for a row of claims.csv, from its claim and paper columns."""
    if PAPER_LABEL.match(str(paper or claim)):
        return PAPER
    if paper in (CENSUS_SOURCE, VERDICT_SOURCE) or claim in QUANTIZATION_FINDINGS:
        return FINDING
    return CHECK


def with_kinds(claims: pd.DataFrame) -> pd.DataFrame:
    """``claims`` with its ``kind`` column (second, after ``claim``) and each finding's pass or fail
    written as its outcome; both recomputed from the claim and paper columns, so that a claims.csv written
    before the column existed is brought up to date the same way."""
    claims = claims.drop(columns=["kind"], errors="ignore")
    papers = claims["paper"].fillna("") if "paper" in claims else pd.Series("", index=claims.index)
    claims.insert(1, "kind", [claim_kind(claim, paper) for claim, paper in zip(claims["claim"], papers)])
    finding = claims["kind"] == FINDING
    claims.loc[finding, "result"] = claims.loc[finding, "result"].replace(OUTCOME_OF)
    return claims


def verdict_claims(comparisons: pd.DataFrame) -> list[dict]:
    """The interventions' verdicts as findings: each comparison of interventions.csv (``attnid
    interventions-table``) in the verdict rule's family (its primary and secondary comparisons,
    docs/design.md §11.3). Its hypothesis: the arm changes the metric; its outcome: the rule's label as the
    table has it; measured: the mean paired difference, against the equivalence margin."""
    family = comparisons[comparisons["in_family"].astype(str).str.lower() == "true"]
    return [
        {
            "claim": f"interventions: {row['comparison']} changes {row['metric']} ({row['role']})",
            "paper": VERDICT_SOURCE,
            "measured": float(row["delta_mean"]),
            "relation": "±",
            "threshold": f"{float(row['equivalence_margin']):.3g}",
            "dtype": "",
            "result": str(row["verdict"]),
            "detail": f"mean difference {row['arm']} - {row['baseline']} over {row['n_seeds']} seed pairs, "
            f"{1 - float(row['alpha']):.0%} t-CI [{float(row['ci_low']):.3g}, {float(row['ci_high']):.3g}], "
            f"Holm p {float(row['p_holm']):.3g}, detectable {float(row['detectable_effect']):.3g} "
            f"(interventions.csv)",
        }
        for row in comparisons.loc[family.index].to_dict("records")
    ]


def group_summary(kind: str, results: pd.Series) -> str:
    """One group's count line: "the paper's 9 claims: 9 replicate"; "our 3 findings: 1 holds, 2 rejected"
    (holds, rejected, then the other outcomes as they come); "checks: 10 of 10 hold"; a paper claim or check
    that did not pass is named in brackets ("(1 fail)")."""
    results = results.astype(str)
    counts = results.value_counts()
    if kind == FINDING:
        order = dict.fromkeys([HOLDS, REJECTED, *results])  # holds, rejected, then as they come
        told = ", ".join(f"{counts[result]} {result}" for result in order if result in counts)
        return f"our {len(results)} finding{'s' * (len(results) != 1)}: {told or 'none'}"
    passed = int(counts.get("pass", 0))
    others = ", ".join(f"{count} {result}" for result, count in counts.items() if result != "pass")
    text = (
        f"the paper's {len(results)} claim{'s' * (len(results) != 1)}: {passed} replicate"
        if kind == PAPER
        else f"checks: {passed} of {len(results)} hold"
    )
    return text + (f" ({others})" if others else "")
