"""Does identification change training? The interventions study, planned (docs/experiments.md).

The identification studies (:mod:`attnid.reports.studies`) compare architectures, which differ in more
than identification. The interventions change *only* what training does along the symmetry orbit, with
the same model, the same initial function, the same batches and the ``adamw`` case's optimizer settings,
and each arm's run with seed ``s`` is compared with ``adamw``'s run with seed ``s``
(:mod:`attnid.reports.interventions_table`):

* ``adamw_projected``: every step's orbit component removed (docs/design.md §13);
* ``adamw_gauge_fixed``: the identified parametrisation (§14);
* ``adamw_rebalance``: the paper's rebalancing with AdamW's moments kept, and
  ``adamw_rebalance_first-moment`` with the first moment transported across each move (§15).

A pipeline config's ``interventions`` section lists the arms (a case and its options), the seeds and
the identity run: ``adamw_projected`` in float64, short, where ρ and the first-order drift sit at float64
round-off (§13). This module is pure Python: workflow/rules/common.smk lays out the jobs from it, and
reuses a case run (``runs/<case>/seed<N>``) wherever an arm's run is exactly that run.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnid.reports.interventions_table import BASELINE_CASE, DEFAULT_MOMENTS, arm_name
from attnid.training.cases import CASES

# The settings a rebalancing arm takes from its case's section of the config (the rest are adamw's).
REBALANCE_SETTINGS = ("rebalance_every", "rebalance_target")
# The identity run (docs/design.md §13): the projected arm trained in float64.
IDENTITY_CASE, IDENTITY_DTYPE = "adamw_projected", "float64"
# Keys of the identity section that are not settings of its run.
IDENTITY_GRID_KEYS = ("seeds",)


@dataclass(frozen=True)
class Arm:
    """One arm of the study: a case and its options over the ``adamw`` case's settings."""

    case: str
    rebalance_moments: str | None = None

    @property
    def name(self) -> str:
        return arm_name(self.case, self.rebalance_moments)

    def options(self) -> dict:
        """The arm's own `attnid train` settings (none for the default, kept moments)."""
        moments = self.rebalance_moments
        return {} if moments in (None, DEFAULT_MOMENTS) else {"rebalance_moments": moments}


def intervention_arms(config: dict) -> list[Arm]:
    """The baseline ``adamw`` first, then the config's arms in its order (none without the section)."""
    section = config.get("interventions")
    if not section:
        return []
    arms = [Arm(spec["case"], spec.get("rebalance_moments")) for spec in section["arms"]]
    return [Arm(BASELINE_CASE)] + arms


def arm_overrides(config: dict, arm: Arm) -> dict:
    """What an arm's run sets over the model, training and ``adamw`` case sections: a rebalancing arm's
    rebalance settings (from its own case section, where the config has one) and the arm's options."""
    overrides = {}
    if CASES[arm.case].rebalances:
        own = config.get("cases", {}).get(arm.case, {})
        overrides.update({key: own[key] for key in REBALANCE_SETTINGS if key in own})
    return overrides | arm.options()


def identity_overrides(config: dict) -> dict:
    """The identity run's settings over the projected arm's: float64, and the section's own."""
    section = config["interventions"]["identity"]
    return {key: value for key, value in section.items() if key not in IDENTITY_GRID_KEYS} | {
        "dtype": IDENTITY_DTYPE
    }


def check_interventions_config(config: dict) -> list[str]:
    """The cross-key rules of the ``interventions`` section that the schema cannot say, one line each."""
    section = config.get("interventions")
    if not section:
        return []
    problems = []
    if BASELINE_CASE not in config.get("cases", {}):
        problems.append(
            f"interventions: no case '{BASELINE_CASE}' under cases: every arm is trained with "
            f"its settings and compared with its runs"
        )
    names = []
    for index, spec in enumerate(section["arms"]):
        case = CASES[spec["case"]]
        if case.name == BASELINE_CASE:
            problems.append(
                f"interventions/arms/{index}: '{BASELINE_CASE}' is the baseline of every arm, not an arm"
            )
        if spec.get("rebalance_moments") not in (None, DEFAULT_MOMENTS) and not case.rebalances:
            problems.append(
                f"interventions/arms/{index}: rebalance_moments needs a rebalancing case, not {case.name}"
            )
        if case.gauge_fixed and config["model"].get("rope"):
            problems.append(f"interventions/arms/{index}: {case.name} does not support a RoPE model")
        names.append(arm_name(spec["case"], spec.get("rebalance_moments")))
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        problems.append(f"interventions/arms: {', '.join(repeated)} listed twice")
    return problems
