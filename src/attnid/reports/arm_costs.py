"""Each intervention arm's cost per step as a ratio to ``adamw``'s, as ``benchmarks/arms_cost.py`` measures it
and keeps it (``benchmarks/arms_cost.csv``), shown beside the interventions' verdicts
(:mod:`attnid.reports.interventions_table`; docs/experiments.md, "Cost, not the wall clock")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnid.common.errors import UserError


@dataclass(frozen=True)
class ArmCosts:
    """Each arm's per-step cost as a ratio to ``adamw``'s (benchmarks/arms_cost.py), and where it was
    measured (the kept file's machine and date)."""

    ratio: dict[str, float]
    source: str

    def of(self, arm: str, baseline: str) -> float:
        """The arm's cost per step over the baseline's; NaN where either was not measured."""
        if arm not in self.ratio or baseline not in self.ratio:
            return math.nan
        return self.ratio[arm] / self.ratio[baseline]


def read_arm_costs(path: str | Path) -> ArmCosts:
    """The kept output of benchmarks/arms_cost.py: columns ``arm`` and ``ratio_to_adamw``, and the machine
    (``platform``, ``cpu``, ``torch``) and ``date`` it was measured on."""
    try:
        table = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(f"cannot read the arm costs {path} ({type(err).__name__}: {err})") from None
    missing = [c for c in ("arm", "ratio_to_adamw", "cpu", "torch", "date") if c not in table]
    if missing:
        raise UserError(f"{path}: no column(s) {', '.join(missing)}; write it with benchmarks/arms_cost.py")
    first = table.iloc[0]
    source = f"{Path(path).name}: {first['cpu']}, torch {first['torch']}, {first['date']}"
    return ArmCosts(dict(zip(table["arm"], table["ratio_to_adamw"].astype(float), strict=True)), source)
