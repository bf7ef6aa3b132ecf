"""Does identification change training? The interventions' arms and their runs (docs/experiments.md).

The identification studies (:mod:`attnid.plan.studies`) compare architectures, which differ in more than
identification. The interventions change *only* what training does along the symmetry orbit, with the
same model, the same initial function, the same batches and the ``adamw`` case's optimizer settings, and
each arm's run with seed ``s`` is compared with ``adamw``'s run with seed ``s``
(:mod:`attnid.reports.interventions_table`):

* ``adamw_projected``: every step's orbit component removed (docs/design.md §13);
* ``adamw_gauge_fixed``: the identified parametrisation (§14);
* ``adamw_rebalance``: the paper's rebalancing with AdamW's moments kept, and
  ``adamw_rebalance_transport`` with them transported across each move (§15).

A pipeline config's ``interventions`` section lists the arms (a case of the registry and its options,
:data:`ARM_OPTIONS`), the seeds and the identity run: ``adamw_projected`` in float64, short, where ρ and
the first-order drift sit at float64 round-off (§13). A new arm is a case in
:mod:`attnid.training.cases` and an entry under ``interventions/arms``; a new kind of arm option is one
:class:`ArmOption` in :data:`ARM_OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from attnid.training.cases import CASES, Case
from attnid.training.config import TrainConfig

# The paired baseline of every arm.
BASELINE_CASE = "adamw"
# The settings a rebalancing arm takes from its case's section of the config (the rest are adamw's).
REBALANCE_SETTINGS = ("rebalance_every", "rebalance_target")
# The identity run (docs/design.md §13): the projected arm trained in float64.
IDENTITY_CASE, IDENTITY_DTYPE = "adamw_projected", "float64"
# Keys of the identity section that are not settings of its run.
IDENTITY_GRID_KEYS = ("seeds",)


@dataclass(frozen=True)
class ArmOption:
    """A setting an arm may give on top of its case (a TrainConfig field), and the cases it applies to."""

    name: str
    applies_to: Callable[[Case], bool]
    needs: str  # completes "<name> needs ...", for a case it does not apply to

    @property
    def default(self) -> object:
        """TrainConfig's default: an arm that leaves it there is named after its case alone."""
        return next(f.default for f in fields(TrainConfig) if f.name == self.name)


# What an arm may set over its case: a rebalancing case's AdamW moments (docs/design.md §15).
ARM_OPTIONS = (ArmOption("rebalance_moments", lambda case: case.rebalances, "a rebalancing case"),)


def arm_name(case: str, options: Mapping[str, object] | None = None) -> str:
    """An arm's name in the run directories, the tables and the figures: its case, with ``_<value>`` for
    each :data:`ARM_OPTIONS` set to other than its default (``adamw_rebalance_transport``,
    docs/design.md §15). ``options`` may hold other keys (a run.json's whole config): they are ignored."""
    chosen = options or {}
    suffixes = [
        str(chosen[option.name])
        for option in ARM_OPTIONS
        if chosen.get(option.name) not in (None, option.default)
    ]
    return "_".join([case, *suffixes])


@dataclass(frozen=True)
class Arm:
    """One arm of the study: a case and its options over the ``adamw`` case's settings."""

    case: str
    options: tuple[tuple[str, object], ...] = ()  # (ARM_OPTIONS name, value), as the config gives them

    @property
    def name(self) -> str:
        return arm_name(self.case, dict(self.options))

    def settings(self) -> dict:
        """The arm's own `attnid train` settings: its options that differ from the defaults."""
        defaults = {option.name: option.default for option in ARM_OPTIONS}
        return {key: value for key, value in self.options if value != defaults[key]}


def intervention_arms(config: dict) -> list[Arm]:
    """The baseline ``adamw`` first, then the config's arms in its order (none without the section)."""
    section = config.get("interventions")
    if not section:
        return []
    arms = [
        Arm(
            spec["case"],
            tuple((option.name, spec[option.name]) for option in ARM_OPTIONS if option.name in spec),
        )
        for spec in section["arms"]
    ]
    return [Arm(BASELINE_CASE)] + arms


def arm_overrides(config: dict, arm: Arm) -> dict:
    """What an arm's run sets over the model, training and ``adamw`` case sections: a rebalancing arm's
    rebalance settings (from its own case section, where the config has one) and the arm's options."""
    overrides = {}
    if CASES[arm.case].rebalances:
        own = config.get("cases", {}).get(arm.case, {})
        overrides.update({key: own[key] for key in REBALANCE_SETTINGS if key in own})
    return overrides | arm.settings()


def identity_overrides(config: dict) -> dict:
    """The identity run's settings over the projected arm's: float64, and the section's own."""
    section = config["interventions"]["identity"]
    return {key: value for key, value in section.items() if key not in IDENTITY_GRID_KEYS} | {
        "dtype": IDENTITY_DTYPE
    }


def check_interventions_config(config: dict) -> list[tuple[str, str]]:
    """The cross-key rules of the ``interventions`` section that the schema cannot say: (key, problem)."""
    section = config.get("interventions")
    if not section:
        return []
    problems = []
    if BASELINE_CASE not in config.get("cases", {}):
        problems.append(
            (
                "interventions",
                f"no case '{BASELINE_CASE}' under cases: every arm is trained with its settings and "
                f"compared with its runs",
            )
        )
    names = []
    for index, spec in enumerate(section["arms"]):
        case = CASES[spec["case"]]
        key = f"interventions/arms/{index}"
        if case.name == BASELINE_CASE:
            problems.append((key, f"'{BASELINE_CASE}' is the baseline of every arm, not an arm"))
        for option in ARM_OPTIONS:
            if spec.get(option.name) not in (None, option.default) and not option.applies_to(case):
                problems.append((key, f"{option.name} needs {option.needs}, not {case.name}"))
        names.append(arm_name(spec["case"], spec))
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        problems.append(("interventions/arms", f"{', '.join(repeated)} listed twice"))
    return problems
