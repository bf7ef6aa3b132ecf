"""The calibration's two rounds and the robustness variants (docs/design.md §6, docs/experiments.md,
"Robustness, kept").

Round 1 trains each calibrated arm at each lr of its grid on ``calibration/seeds``. Round 2
(``calibration/refine: {top, seeds}``) trains the arm's ``top`` best lrs of round 1 again on ``seeds``
more (``calibration/<arm>/top<k>/seed<N>``: the run at the k-th best lr of round 1, whose lr
``attnid calibration-table`` writes into its spec once round 1 is done), and the arm's pick is the lowest
mean over both rounds' seeds at those lrs. No calibration seed is a comparison seed.

The robustness variants (:data:`ROBUSTNESS_VARIANTS`) compare the arms again at other lrs than their final
picks: the stage's lr, the pick of round 1's first seed alone, round 1's pick. ``attnid calibration-table``
lists each arm's picks in ``calibration_picks.csv`` (:data:`PICK_COLUMNS`); a variant's runs are the final
runs where its lr is the final pick, the stage's runs at its lr where the stage has them, else runs of
their own, ``robustness/<arm>/lr<lr>/seed<N>`` (:meth:`attnid.plan.runs.Plan.robustness_runs`).
"""

from __future__ import annotations

import csv
import os

from attnid.common.errors import UserError

STAGE_LR, ONE_SEED, ROUND_ONE = "stage_lr", "one_seed", "round1"
ROBUSTNESS_VARIANTS = (STAGE_LR, ONE_SEED, ROUND_ONE)
# The picks calibration_picks.csv lists per arm: the final one (round 2's, or round 1's without it), round
# 1's, and that of round 1's first seed alone.
FINAL = "final"
PICKS = (FINAL, ROUND_ONE, ONE_SEED)
PICK_COLUMNS = ("arm", "pick", "lr", "n_seeds")
# calibration/<arm>/top<k>/seed<N>: a round-2 run at the k-th best lr of round 1
REFINE_PREFIX = "top"
ROBUSTNESS_DIR = "robustness"


def refine_dir(results_dir: str, arm: str, rank: int) -> str:
    return f"{results_dir}/calibration/{arm}/{REFINE_PREFIX}{rank}"


def robustness_dir(results_dir: str, arm: str, lr_label: str) -> str:
    return f"{results_dir}/{ROBUSTNESS_DIR}/{arm}/lr{lr_label}"


def _disjoint(section: dict, key: str, seeds: list) -> list[tuple[str, str]]:
    shared = sorted(set(seeds) & set(section["seeds"]))
    if not shared:
        return []
    return [
        (
            f"interventions/calibration/{key}",
            f"seed(s) {', '.join(map(str, shared))} are also comparison seeds: the lr is chosen on "
            f"seeds of its own",
        )
    ]


def refine_problems(section: dict) -> list[tuple[str, str]]:
    """Both rounds' seeds are apart from the comparison seeds and from each other; round 2 refines fewer
    lrs than the grid has; and the robustness variants' own rules (:func:`robustness_problems`)."""
    calibration = section["calibration"]
    refine = calibration.get("refine")
    problems = _disjoint(section, "seeds", calibration["seeds"])
    if refine:
        problems += _disjoint(section, "refine/seeds", refine["seeds"])
        again = sorted(set(refine["seeds"]) & set(calibration["seeds"]))
        if again:
            problems.append(
                (
                    "interventions/calibration/refine/seeds",
                    f"seed(s) {', '.join(map(str, again))} are round 1's too: round 2 adds seeds of its own",
                )
            )
        if refine["top"] > len(calibration["lr_factors"]):
            problems.append(
                (
                    "interventions/calibration/refine/top",
                    f"the {refine['top']} best of a grid of {len(calibration['lr_factors'])} lrs",
                )
            )
    return problems + robustness_problems(section)


def robustness_problems(section: dict) -> list[tuple[str, str]]:
    """A robustness variant moves the calibrated arms' lrs: it needs the calibration, and ``round1`` its
    second round (without one, round 1's pick is the final pick)."""
    variants = (section.get("robustness") or {}).get("variants", [])
    calibration = section.get("calibration") or {}
    if variants and not calibration:
        return [("interventions/robustness", "its variants move the calibrated arms' lrs: no calibration")]
    if ROUND_ONE in variants and not calibration.get("refine"):
        return [
            (
                "interventions/robustness/variants",
                f"{ROUND_ONE} is the final pick without calibration/refine: declare refine, or drop it",
            )
        ]
    return []


def read_picks(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """{pick: {arm: lr}} from ``calibration_picks.csv``; anything else is one :class:`UserError`."""
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as err:
        raise UserError(f"cannot read the calibration's picks {path} ({err.strerror})") from None
    if not rows or not set(PICK_COLUMNS) <= set(rows[0]):
        raise UserError(
            f"{path}: no columns {', '.join(PICK_COLUMNS)}; write it with attnid calibration-table"
        )
    picks: dict[str, dict[str, float]] = {}
    for row in rows:
        picks.setdefault(row["pick"], {})[row["arm"]] = float(row["lr"])
    return picks
