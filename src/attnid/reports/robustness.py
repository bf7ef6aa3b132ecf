"""The interventions' robustness variants, kept (docs/experiments.md, "Robustness, kept").

Each variant (:data:`attnid.plan.rounds.ROBUSTNESS_VARIANTS`, and ``final``: the final runs themselves) is
a set of runs on the comparison seeds with every calibrated arm at the variant's lr; its comparisons are
made exactly as interventions.csv's (:func:`attnid.reports.interventions_table.paired_seed_table`, then
:func:`~attnid.reports.interventions_table.comparisons_table`, the same verdict rule: the primary alone at
alpha, Holm over the family, the same margin), and the primary's and the family's rows are kept:

    attnid interventions-robustness --variant NAME RUN_DIR... [--variant ...] --out-dir results/tables
                                    VERDICT FLAGS (as attnid interventions-table's)

writes ``interventions_robustness.csv`` (:data:`ROBUSTNESS_COLUMNS`): per variant and comparison, the
seeds, the mean difference, its t-interval, p (the primary's own, the family's Holm-adjusted), the
outcome and the number of seeds whose difference is positive (the arm's loss higher); and
``interventions_robustness_seeds.csv`` (:data:`ROBUSTNESS_SEED_COLUMNS`), each of those rows' per-seed
values, from which a reader recomputes every number of the first (as interventions_seeds.csv does for
interventions.csv).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.plan.interventions import BASELINE_CASE, CALIBRATED_SUFFIX, is_calibrated
from attnid.reports.interventions_table import (
    DESCRIPTIVE,
    comparisons_table,
    load_runs_by_arm,
    paired_seed_table,
)

ROBUSTNESS_COLUMNS = (
    "variant", "comparison", "role", "n", "delta", "ci_low", "ci_high", "p", "outcome", "seeds_positive"
)  # fmt: skip
# the per-seed table: a kept row's pairs, as paired_seed_table makes them, under the variant's name
ROBUSTNESS_SEED_COLUMNS = (
    "variant", "comparison", "arm", "baseline", "seed", "arm_value", "baseline_value", "difference"
)  # fmt: skip


def variant_rows(
    name: str,
    runs: Sequence[str],
    alpha: float,
    equivalence_margin: float | None,
    family: Sequence[str] | None,
    primary: str | None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One variant's rows and their per-seed values: its runs paired as the final table pairs them (an
    arm's runs at the stage's lr, named without the suffix, stand for the arm at the variant's lr:
    ``<arm>_best_lr``), under the rule's primary and family as far as the calibrated arms make them (Holm
    over those)."""
    loaded = load_runs_by_arm(None, list(runs))
    by_arm: dict[str, list] = {}
    for arm, arm_runs in loaded.items():
        by_arm.setdefault(arm if is_calibrated(arm) else arm + CALIBRATED_SUFFIX, []).extend(arm_runs)
    seeds, _ = paired_seed_table(by_arm, BASELINE_CASE)
    # the rule's comparisons that the calibrated arms make (all of them in the default config; an arm at
    # the stage's lr alone, or of another baseline, has no variant)
    made = set(seeds["comparison"])
    family = [name for name in family if name in made] if family is not None else None
    primary = primary if primary in made else None
    table = comparisons_table(seeds, alpha, equivalence_margin, family, None, primary)
    kept = table[table["role"] != DESCRIPTIVE].to_dict("records")
    order = [primary, *(family or [])]  # the primary first, then the family as declared
    kept.sort(key=lambda row: order.index(row["comparison"]) if row["comparison"] in order else len(order))
    rows = []
    for row in kept:
        differences = seeds.loc[seeds["comparison"] == row["comparison"], "difference"].astype(float)
        rows.append(
            {
                "variant": name,
                "comparison": row["comparison"],
                "role": row["role"],
                "n": row["n_seeds"],
                "delta": row["delta_mean"],
                "ci_low": row["ci_low"],
                "ci_high": row["ci_high"],
                "p": row["p_holm"],
                "outcome": row["verdict"],
                "seeds_positive": int((differences[np.isfinite(differences)] > 0).sum()),
            }
        )
    kept_seeds = seeds[seeds["comparison"].isin([row["comparison"] for row in kept])].assign(variant=name)
    return (
        pd.DataFrame(rows, columns=list(ROBUSTNESS_COLUMNS)),
        kept_seeds.reindex(columns=list(ROBUSTNESS_SEED_COLUMNS)).reset_index(drop=True),
    )


def robustness_table(
    variants: Sequence[tuple[str, Sequence[str]]],
    alpha: float,
    equivalence_margin: float | None = None,
    family: Sequence[str] | None = None,
    primary: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """interventions_robustness.csv and its per-seed values: :func:`variant_rows` of each ``(variant, its
    run directories)``."""
    names = [name for name, _ in variants]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"variant {', '.join(repeated)} given twice: name each variant once")
    frames = [variant_rows(name, runs, alpha, equivalence_margin, family, primary) for name, runs in variants]
    if not frames:
        empty = pd.DataFrame(columns=list(ROBUSTNESS_COLUMNS))
        return empty, pd.DataFrame(columns=list(ROBUSTNESS_SEED_COLUMNS))
    return (
        pd.concat([rows for rows, _ in frames], ignore_index=True),
        pd.concat([seeds for _, seeds in frames], ignore_index=True),
    )
