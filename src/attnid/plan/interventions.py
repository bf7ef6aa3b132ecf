"""Does identification change training? The interventions' arms, their runs and their comparisons
(docs/experiments.md).

The identification studies (:mod:`attnid.plan.studies`) compare architectures, which differ in more than
identification. The interventions change *only* what training does along the symmetry orbit, with the
same model, the same initial function, the same batches and the ``adamw`` case's optimizer settings, and
each arm's run with seed ``s`` is compared with ``adamw``'s run with seed ``s``
(:mod:`attnid.reports.interventions_table`):

* ``adamw_projected``: every step's orbit component removed (docs/design.md §13);
* ``adamw_gauge_fixed``: the identified parametrisation (§14), and its controls: the same blocks fixed at
  their initial values (``adamw_gauge_fixed_at_init``), plain AdamW from the gauge arm's starting point
  (``adamw_from_gauge_point``), as many entries frozen outside attention (``adamw_frozen_mlp``), and
  ``adamw`` at a larger learning rate (an arm that names itself, e.g. ``adamw_lr2x``);
* ``adamw_rebalance``: the paper's rebalancing with AdamW's moments kept, and with them moved across each
  move (§15).

A pipeline config's ``interventions`` section lists the arms (a case of the registry and its options,
:data:`ARM_OPTIONS`, or settings with a name of its own, :data:`NAMED_ARM_SETTINGS`), the seeds, the
verdict rule and the identity run: ``adamw_projected`` in float64, short, where ρ and the first-order
drift sit at float64 round-off (§13). A new arm is a case in :mod:`attnid.training.cases` (or an option
of one) and an entry under ``interventions/arms``; a new kind of arm option is one :class:`ArmOption` in
:data:`ARM_OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from attnid.model.options import GAUGE_POINT, INITIAL_VALUES
from attnid.training.cases import CASES, Case
from attnid.training.config import TrainConfig

# The paired baseline of every arm.
BASELINE_CASE = "adamw"
# A rebalancing arm whose AdamW moments are kept is named after its case alone (docs/design.md §15).
DEFAULT_MOMENTS = "keep"
# The 2 x 2 of docs/design.md §14, one arm per cell (starting point on the orbit x blocks frozen), and its
# interaction per seed: the effect of freezing at the gauge point minus the effect of freezing at the
# initialisation, (gauge_fixed - from_gauge_point) - (gauge_fixed_at_init - adamw). Negative: freezing
# helps more (or hurts less) at the gauge point.
GAUGE_ARM, AT_INIT_ARM, FROM_GAUGE_ARM = (
    "adamw_gauge_fixed",
    "adamw_gauge_fixed_at_init",
    "adamw_from_gauge_point",
)
INTERACTION = "start_x_frozen"
INTERACTION_TERMS = ((GAUGE_ARM, FROM_GAUGE_ARM), (AT_INIT_ARM, BASELINE_CASE))
# The settings a rebalancing arm takes from its case's section of the config (the rest are adamw's).
REBALANCE_SETTINGS = ("rebalance_every", "rebalance_target")
# The identity run (docs/design.md §13): the projected arm trained in float64.
IDENTITY_CASE, IDENTITY_DTYPE = "adamw_projected", "float64"
# Keys of the identity section that are not settings of its run.
IDENTITY_GRID_KEYS = ("seeds",)
# The setting that names an arm itself (attnid train --arm): needed by an arm that sets what its name
# cannot say (NAMED_ARM_SETTINGS), such as adamw at another learning rate.
ARM_NAME_SETTING = "arm"
NAMED_ARM_SETTINGS = ("lr",)


def _moments_suffix(case: Case, value: object) -> str:
    """``_first_moment``: a name joins its words with ``_``, as a comparison joins arms with ``-``."""
    return "" if value in (None, DEFAULT_MOMENTS) else "_" + str(value).replace("-", "_")


def _start_suffix(case: Case, value: object) -> str:
    """A start off the case's own: the gauge-fixed case at its initial values, another at the gauge point."""
    if case.gauge_fixed:
        return "_at_init" if value == INITIAL_VALUES else ""
    return "_from_gauge_point" if value == GAUGE_POINT else ""


def _frozen_suffix(case: Case, value: object) -> str:
    return "_frozen_mlp" if value else ""


@dataclass(frozen=True)
class ArmOption:
    """A setting an arm may give on top of its case (a TrainConfig field), the cases it applies to, and
    the suffix a value gives the arm's name (empty for the case's own default)."""

    name: str
    applies_to: Callable[[Case], bool]
    needs: str  # completes "<name> needs ...", for a case it does not apply to
    suffix: Callable[[Case, object], str]

    @property
    def default(self) -> object:
        """TrainConfig's default: an arm that leaves it there is named after its case alone."""
        return next(f.default for f in fields(TrainConfig) if f.name == self.name)


# What an arm may set over its case: a rebalancing case's AdamW moments (docs/design.md §15), where on
# the orbit training starts and whether MLP entries are frozen (the gauge arm's controls, §14).
ARM_OPTIONS = (
    ArmOption("rebalance_moments", lambda case: case.rebalances, "a rebalancing case", _moments_suffix),
    ArmOption("initial_point", lambda case: True, "", _start_suffix),
    ArmOption("freeze_mlp", lambda case: True, "", _frozen_suffix),
)
# Every setting an arm's entry may hold besides its case.
ARM_SETTINGS = (*(option.name for option in ARM_OPTIONS), *NAMED_ARM_SETTINGS, ARM_NAME_SETTING)


def arm_name(case: str, options: Mapping[str, object] | None = None) -> str:
    """An arm's name in the run directories, the tables and the figures: the name it gives itself
    (``arm``), else its case with the suffix of each :data:`ARM_OPTIONS` value off the case's default
    (``adamw_rebalance_first_moment``, ``adamw_gauge_fixed_at_init``; docs/design.md §14, §15). ``options``
    may hold other keys (a run.json's whole config): they are ignored."""
    chosen = options or {}
    if chosen.get(ARM_NAME_SETTING):
        return str(chosen[ARM_NAME_SETTING])
    if case not in CASES:  # a run of a case this version does not know: named by its case alone
        return case
    return case + "".join(option.suffix(CASES[case], chosen.get(option.name)) for option in ARM_OPTIONS)


def comparison_name(arm: str, baseline: str, table_baseline: str = BASELINE_CASE) -> str:
    """A comparison's name (the verdict family lists these): the arm's name against the table's baseline,
    ``arm-baseline`` against another one."""
    return arm if baseline == table_baseline else f"{arm}-{baseline}"


def moved_moments(options: Mapping[str, object]) -> bool:
    """Whether an arm's rebalancing moves or drops AdamW's moments (it is then also compared with its
    case's arm that keeps them, docs/design.md §15)."""
    return options.get("rebalance_moments") not in (None, DEFAULT_MOMENTS)


@dataclass(frozen=True)
class Arm:
    """One arm of the study: a case and its settings (:data:`ARM_SETTINGS`) over the ``adamw`` case's."""

    case: str
    options: tuple[tuple[str, object], ...] = ()  # (setting, value), as the config gives them

    @property
    def name(self) -> str:
        return arm_name(self.case, dict(self.options))

    def settings(self) -> dict:
        """The arm's own `attnid train` settings: those that differ from TrainConfig's defaults."""
        defaults = {f.name: f.default for f in fields(TrainConfig)}
        return {key: value for key, value in self.options if value != defaults[key]}


def intervention_arms(config: dict) -> list[Arm]:
    """The baseline ``adamw`` first, then the config's arms in its order (none without the section)."""
    section = config.get("interventions")
    if not section:
        return []
    arms = [
        Arm(spec["case"], tuple((key, spec[key]) for key in ARM_SETTINGS if key in spec))
        for spec in section["arms"]
    ]
    return [Arm(BASELINE_CASE)] + arms


# Every run the table pairs is evaluated on the whole val split at its end: the primary metric
# (attnid.reports.interventions_table.PRIMARY_METRIC, docs/design.md §11.5).
PRIMARY_METRIC_SETTINGS = {"full_val_eval": True}


def arm_overrides(config: dict, arm: Arm) -> dict:
    """What an arm's run sets over the model, training and ``adamw`` case sections: the primary metric's
    evaluation, a rebalancing arm's rebalance settings (from its own case section, where the config has
    one) and the arm's settings."""
    overrides = dict(PRIMARY_METRIC_SETTINGS)
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


def planned_comparisons(config: dict) -> list[str]:
    """The comparisons the table will make of the section's arms (attnid.reports.interventions_table): each
    arm against adamw, an arm with moved moments also against its case's kept-moments arm when that is
    listed, and the 2 x 2's interaction when its three arms are."""
    arms = intervention_arms(config)[1:]
    names = [arm.name for arm in arms]
    comparisons = []
    for arm in arms:
        comparisons.append(arm.name)
        if moved_moments(dict(arm.options)) and arm.case in names:
            comparisons.append(comparison_name(arm.name, arm.case))
    if {GAUGE_ARM, AT_INIT_ARM, FROM_GAUGE_ARM} <= set(names):
        comparisons.append(INTERACTION)
    return comparisons


def verdict_options(config: dict) -> list[str]:
    """`attnid interventions-table`'s flags for the section's verdict rule (docs/design.md §11.3)."""
    rule = config["interventions"]["verdict"]
    return [
        "--alpha",
        str(rule["alpha"]),
        "--equivalence-margin",
        str(rule["equivalence_margin"]),
        "--family",
        *rule["family"],
    ]


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
        unnamed = [setting for setting in NAMED_ARM_SETTINGS if setting in spec]
        if unnamed and not spec.get(ARM_NAME_SETTING):
            problems.append(
                (key, f"an arm that sets {', '.join(unnamed)} names itself ({ARM_NAME_SETTING}: NAME)")
            )
        elif arm_name(spec["case"], spec) == BASELINE_CASE:
            problems.append((key, f"'{BASELINE_CASE}' is the baseline of every arm, not an arm"))
        for option in ARM_OPTIONS:
            if spec.get(option.name) not in (None, option.default) and not option.applies_to(case):
                problems.append((key, f"{option.name} needs {option.needs}, not {case.name}"))
        names.append(arm_name(spec["case"], spec))
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        problems.append(("interventions/arms", f"{', '.join(repeated)} listed twice"))
    if problems:  # the family is judged against arms that are right
        return problems
    planned = planned_comparisons(config)
    unplanned = [name for name in section["verdict"]["family"] if name not in planned]
    if unplanned:
        problems.append(
            (
                "interventions/verdict/family",
                f"{', '.join(unplanned)} is no comparison of the arms (they make: {', '.join(planned)})",
            )
        )
    return problems
