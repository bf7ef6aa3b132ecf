"""What Figure 6 (:mod:`.fig6_interventions`) reads of the interventions' tables (docs/design.md §11,
§13-§15): each comparison of ``interventions.csv`` as one row (its seeds' differences, a readable label, its
role and verdict), the 2 x 2 of starting point and fixed blocks, each contrast's effect along training
(``interventions_along.csv``) and each calibrated arm's curve (``calibration.csv``).

The 2 x 2's contrasts are the plan's (:func:`attnid.plan.interventions.two_by_two_contrasts`,
:func:`~attnid.plan.interventions.contrast_named`), at the stage's lr or at each arm's best lr, whichever the
table has (the primary comparison's set first).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnid.plan.interventions import (
    AT_INIT_ARM,
    BASELINE_CASE,
    CALIBRATED_SUFFIX,
    FIXING_EFFECT,
    FROM_GAUGE_ARM,
    FROZEN_MLP_ARM,
    GAUGE_ARM,
    INTERACTION,
    START_EFFECT,
    contrast_named,
    is_calibrated,
    two_by_two_contrasts,
)
from attnid.reports.figures.inputs import RunGroup
from attnid.reports.interventions_table import DESCRIPTIVE, PRIMARY, SECONDARY
from attnid.reports.latex import finite_or_none
from attnid.reports.statistics import N_TOO_SMALL, NO_LABEL, NOT_IN_FAMILY

# The 2 x 2's contrasts as the figure names them (docs/design.md §11.3).
CONTRAST_LABELS = {
    FIXING_EFFECT: "main effect of fixing",
    START_EFFECT: "main effect of the start",
    INTERACTION: "interaction, start x fixing",
}
AT_BEST_LRS = "at best lrs"  # what a comparison of arms at their own best lr says after its name
PRIMARY_MARK = " (primary)"
ROLE_ORDER = (PRIMARY, SECONDARY, DESCRIPTIVE)  # the rows' order: the primary on top


def base_name(name: str) -> str:
    """An arm's or a comparison's name without the suffix of the arms at their best lr."""
    return name.removesuffix(CALIBRATED_SUFFIX) if is_calibrated(name) else name


@dataclass(frozen=True)
class Comparison:
    """One row of interventions.csv as Figure 6 draws it, with its seeds' differences."""

    comparison: str
    arm: str
    baseline: str
    name_label: str  # what it compares, in words (without "at best lrs" or "primary")
    at_best_lr: bool  # a comparison of arms each at its own best lr
    role: str  # primary, secondary or descriptive (interventions.csv's role)
    differences: np.ndarray  # per seed, arm - baseline (finite ones)
    n_seeds: int
    delta_mean: float
    ci_low: float
    ci_high: float
    p_holm: float | None  # Holm's p in the secondary family, the test's own p for the primary
    verdict: str
    verdict_label: str  # the verdict as its row shows it
    detectable: str  # the smallest detectable effect, or why there is none
    power_at_margin: float | None

    @property
    def decided(self) -> bool:
        """Whether the rule gave it a verdict (better, worse, equivalent, inconclusive)."""
        return self.verdict not in NO_LABEL

    @property
    def primary(self) -> bool:
        return self.role == PRIMARY

    @property
    def label(self) -> str:
        """Its row's name in the figure: what it compares, at which lrs, and whether it is the primary."""
        return self.short_label(at_lrs=True)

    def short_label(self, at_lrs: bool = False) -> str:
        """What it compares, ``at best lrs`` where ``at_lrs`` and it is, `` (primary)`` for the primary (a
        panel whose comparisons are all at best lrs says so once, in its title)."""
        tag = f", {AT_BEST_LRS}" if at_lrs and self.at_best_lr else ""
        return self.name_label + tag + (PRIMARY_MARK if self.primary else "")


def comparisons_of(
    table: pd.DataFrame, seeds: pd.DataFrame, arm_runs: dict[str, RunGroup]
) -> list[Comparison]:
    """Each comparison of ``table`` (interventions.csv) with the differences of ``seeds``
    (interventions_seeds.csv): the primary first, then the secondary family, then the rest, each in the
    table's order."""
    rows = []
    for row in table.to_dict("records"):
        name = str(row["comparison"])
        differences = pd.to_numeric(seeds.loc[seeds["comparison"] == name, "difference"], errors="coerce")
        role = str(row["role"])
        rows.append(
            Comparison(
                comparison=name,
                arm=str(row["arm"]),
                baseline=str(row["baseline"]),
                name_label=comparison_label(row, arm_runs),
                at_best_lr=compares_best_lrs(row),
                role=role,
                differences=differences[np.isfinite(differences)].to_numpy(dtype=float),
                n_seeds=int(row["n_seeds"]),
                delta_mean=float(row["delta_mean"]),
                ci_low=float(row["ci_low"]),
                ci_high=float(row["ci_high"]),
                p_holm=finite_or_none(row["p_holm"]),
                verdict=str(row["verdict"]),
                verdict_label=verdict_label(row),
                detectable=_detectable(row),
                power_at_margin=finite_or_none(row["power_at_margin"]),
            )
        )
    order = {role: position for position, role in enumerate(ROLE_ORDER)}
    return sorted(rows, key=lambda row: order.get(row.role, len(order)))


def compares_best_lrs(row: dict) -> bool:
    """Whether a row of interventions.csv compares arms each at its own best lr (a contrast of the cells
    named with the suffix, or an arm at its best lr against its baseline at the baseline's)."""
    name = str(row["comparison"])
    if contrast_named(name) is not None:
        return is_calibrated(name)
    return is_calibrated(str(row["arm"])) and is_calibrated(str(row["baseline"]))


def comparison_label(row: dict, arm_runs: dict[str, RunGroup]) -> str:
    """What a comparison compares, in words: a 2 x 2 contrast by what it measures
    (:data:`CONTRAST_LABELS`); an arm against the table's baseline by the arm, against another by ``arm -
    baseline``, arms at their own best lr without their suffix (:func:`compares_best_lrs` says that); an arm
    of the baseline's case at another lr says its ratio (the effective-step control, docs/design.md §14),
    read from the runs."""
    name = str(row["comparison"])
    if contrast_named(name) is not None:
        return CONTRAST_LABELS.get(base_name(name), base_name(name).replace("_", " "))
    arm, baseline = str(row["arm"]), str(row["baseline"])
    if compares_best_lrs(row):
        return f"{base_name(arm)} - {base_name(baseline)}"
    label = arm if name == arm else f"{arm} - {baseline}"
    lr, base_lr = _run_lr(arm_runs.get(arm)), _run_lr(arm_runs.get(baseline))
    if lr is not None and base_lr and lr != base_lr:
        label += f" (lr x{lr / base_lr:g})"
    return label


def _run_lr(runs: RunGroup | None) -> float | None:
    if not runs:
        return None
    info = runs[0][0]
    value = (info.get("config") or {}).get("lr", info.get("lr"))
    return float(value) if value is not None else None


def verdict_label(row: dict) -> str:
    """The verdict as its row shows it, the outcome of its two tests (docs/design.md §11.3): with the
    difference test's p (Holm's in the secondary family, the test's own for the primary, which is tested
    alone) and the equivalence test's (TOST p, where the table has it), or why there is none."""
    verdict = str(row["verdict"])
    if verdict == N_TOO_SMALL:
        return f"n too small ({int(row['n_seeds'])} < {int(row['min_seeds'])})"
    if verdict == NOT_IN_FAMILY:
        return NOT_IN_FAMILY
    p_holm = finite_or_none(row["p_holm"])
    if p_holm is None:
        return verdict
    tests = f"{'p' if row['role'] == PRIMARY else 'Holm p'} {p_holm:.2g}"
    p_equivalence = finite_or_none(row.get("p_equivalence", math.nan))
    if p_equivalence is not None:
        tests += f", TOST p {p_equivalence:.2g}"
    return f"{verdict}; {tests}"


def _detectable(row: dict) -> str:
    value = pd.to_numeric(row["detectable_effect"], errors="coerce")
    if pd.isna(value):
        return "n/a"
    return "none at this n" if math.isinf(value) else f"{value:.2g}"


# ---------------------------------------------------------------------------- the 2 x 2


@dataclass(frozen=True)
class TwoByTwo:
    """The 2 x 2 of starting point and fixed blocks (docs/design.md §14) over the seeds all four arms
    share: ``means[start][fixed]`` of the final loss, the arms in those cells (at the stage's lr, or each at
    its best lr: ``suffix``), and the rows of its contrasts that the table has, by base name."""

    suffix: str
    arms: tuple[tuple[str, str], tuple[str, str]]  # (init, gauge point) x (nothing fixed, fixed)
    means: np.ndarray  # 2 x 2
    n_seeds: int
    contrasts: dict[str, Comparison]  # FIXING_EFFECT, START_EFFECT, INTERACTION -> its row

    @property
    def at_best_lr(self) -> bool:
        return self.suffix == CALIBRATED_SUFFIX

    @property
    def fixing_effects(self) -> tuple[float, float]:
        """The mean effect of fixing from the initialisation, and from the gauge point."""
        return float(self.means[0, 1] - self.means[0, 0]), float(self.means[1, 1] - self.means[1, 0])

    @property
    def interaction(self) -> Comparison | None:
        return self.contrasts.get(INTERACTION)


def _seed_values(seeds: pd.DataFrame) -> dict[str, dict[int, float]]:
    """{arm: {seed: final loss}} of every arm the seeds table pairs directly (not a contrast's sides)."""
    values: dict[str, dict[int, float]] = {}
    for row in seeds.to_dict("records"):
        if contrast_named(str(row["comparison"])) is not None:
            continue
        values.setdefault(str(row["arm"]), {})[int(row["seed"])] = float(row["arm_value"])
        values.setdefault(str(row["baseline"]), {})[int(row["seed"])] = float(row["baseline_value"])
    return values


def two_by_two(seeds: pd.DataFrame, comparisons: list[Comparison]) -> TwoByTwo | None:
    """The 2 x 2 from interventions_seeds.csv, over the seeds on which all four cells have a loss, when
    the table has one of its contrasts: the set of the primary comparison, else the arms at their best lr,
    else at the stage's lr; None without."""
    values = _seed_values(seeds)
    by_name = {row.comparison: row for row in comparisons}
    sets: dict[str, dict[str, Comparison]] = {}
    for contrast in two_by_two_contrasts(values):
        if contrast.name in by_name:
            suffix = CALIBRATED_SUFFIX if is_calibrated(contrast.name) else ""
            sets.setdefault(suffix, {})[base_name(contrast.name)] = by_name[contrast.name]
    if not sets:
        return None
    primary = [suffix for suffix, rows in sets.items() if any(row.primary for row in rows.values())]
    suffix = (primary or sorted(sets, key=lambda s: s != CALIBRATED_SUFFIX))[0]
    arms = (
        (BASELINE_CASE + suffix, AT_INIT_ARM + suffix),
        (FROM_GAUGE_ARM + suffix, GAUGE_ARM + suffix),
    )
    cells = [values[arm] for pair in arms for arm in pair]
    common = sorted(
        seed
        for seed in set.intersection(*(set(cell) for cell in cells))
        if all(np.isfinite(c[seed]) for c in cells)
    )
    if not common:
        return None
    means = np.array([[np.mean([values[arm][seed] for seed in common]) for arm in pair] for pair in arms])
    return TwoByTwo(suffix, arms, means, len(common), sets[suffix])


# ---------------------------------------------------------------------------- along training


@dataclass(frozen=True)
class AlongSeries:
    """One comparison's mean difference at each declared step of training, with its t-interval
    (interventions_along.csv)."""

    row: Comparison
    steps: np.ndarray
    delta_mean: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n_seeds: int  # at the last step


def along_series(
    along: pd.DataFrame, comparisons: list[Comparison], grid: TwoByTwo | None
) -> list[AlongSeries]:
    """The comparisons Figure 6 follows along training, those ``along`` has: the 2 x 2's contrasts and the
    frozen-MLP control (of the 2 x 2's lr), else the primary and the secondary family."""
    wanted = [] if grid is None else list(grid.contrasts.values())
    frozen = (
        [FROZEN_MLP_ARM + grid.suffix]
        if grid is not None
        else [FROZEN_MLP_ARM, FROZEN_MLP_ARM + CALIBRATED_SUFFIX]
    )
    wanted += [row for row in comparisons if row.arm in frozen]
    if not wanted:
        wanted = [row for row in comparisons if row.role in (PRIMARY, SECONDARY)]
    series = []
    for row in wanted:
        part = along[along["comparison"] == row.comparison].sort_values("step")
        if part.empty:
            continue
        column = {
            name: pd.to_numeric(part[name], errors="coerce").to_numpy(dtype=float)
            for name in ("step", "n_seeds", "delta_mean", "ci_low", "ci_high")
        }
        series.append(
            AlongSeries(
                row,
                column["step"],
                column["delta_mean"],
                column["ci_low"],
                column["ci_high"],
                int(column["n_seeds"][-1]),
            )
        )
    return series


# ---------------------------------------------------------------------------- the calibration


@dataclass(frozen=True)
class CalibrationCurve:
    """One calibrated arm's mean final loss over round 1's calibration seeds at each lr of its grid
    (calibration.csv; NaN where a run diverged), round 2's means over both rounds' seeds at the lrs it
    refined (none without a round 2), and the lr chosen."""

    arm: str
    lrs: np.ndarray
    means: np.ndarray
    n_seeds: int
    best_lr: float | None
    best_mean: float
    at_edge: bool
    refined_lrs: np.ndarray = field(default_factory=lambda: np.array([]))
    refined_means: np.ndarray = field(default_factory=lambda: np.array([]))
    refined_seeds: int = 0

    @property
    def diverged_lrs(self) -> np.ndarray:
        return self.lrs[~np.isfinite(self.means)]


def calibration_curves(table: pd.DataFrame, compared: Iterable[str]) -> list[CalibrationCurve]:
    """Each arm of calibration.csv whose arm at its best lr is among ``compared`` (the arms the
    interventions table pairs: a calibration of another build is not this figure's), in the table's order."""
    arms = {base_name(name) for name in compared if is_calibrated(name)}
    curves = []
    for arm in dict.fromkeys(table["arm"].astype(str)):
        if arm not in arms:
            continue
        of_arm = table[table["arm"].astype(str) == arm].sort_values("lr")
        # round 1, the whole grid; round 2 (a table of two rounds), the lrs it refined
        rounds = of_arm["round"] if "round" in of_arm else pd.Series(1, index=of_arm.index)
        rows, refined = of_arm[rounds == 1], of_arm[rounds == 2]
        best = of_arm[_truthy(of_arm["best"])]
        curves.append(
            CalibrationCurve(
                arm=arm,
                lrs=rows["lr"].to_numpy(dtype=float),
                means=pd.to_numeric(rows["mean"], errors="coerce").to_numpy(dtype=float),
                n_seeds=int(rows["n_seeds"].max()),
                best_lr=float(best["lr"].iloc[0]) if len(best) else None,
                best_mean=float(best["mean"].iloc[0]) if len(best) else math.nan,
                at_edge=bool(_truthy(best["at_edge"]).any()),
                refined_lrs=refined["lr"].to_numpy(dtype=float),
                refined_means=pd.to_numeric(refined["mean"], errors="coerce").to_numpy(dtype=float),
                refined_seeds=int(refined["n_seeds"].max()) if len(refined) else 0,
            )
        )
    return curves


def _truthy(column: pd.Series) -> pd.Series:
    """A CSV's boolean column (True/False, read as bool or as text)."""
    return column.astype(str).str.lower().isin(("true", "1"))


def compared_arms(seeds: pd.DataFrame) -> Collection[str]:
    """Every arm the seeds table pairs directly, on either side."""
    return set(_seed_values(seeds))
