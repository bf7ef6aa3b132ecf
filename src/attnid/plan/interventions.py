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
verdict rule, the identity run (``adamw_projected`` in float64, short, where ρ and the first-order
drift sit at float64 round-off, §13), optionally the calibration (each listed arm again at its own best
lr, chosen on seeds of its own: :func:`calibrated_arms`, docs/design.md §6), and the run settings of the
whole stage (:func:`stage_settings`: e.g. its own ``max_iters``). A new arm is a case in
:mod:`attnid.training.cases` (or an option of one) and an entry under ``interventions/arms``; a new kind
of arm option is one :class:`ArmOption` in :data:`ARM_OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields, replace

from attnid.model.options import GAUGE_POINT, INITIAL_VALUES
from attnid.plan.rounds import refine_problems, robustness_problems
from attnid.training.cases import CASES, Case
from attnid.training.config import TrainConfig

# The baseline of the arms that train AdamW, and the table's: a comparison with it is named by the arm alone.
BASELINE_CASE = "adamw"
# The baselines: each arm is paired with the one whose optimizer it trains (arm_baseline).
BASELINE_CASES = (BASELINE_CASE, "sgd")
# What a baseline other than adamw takes from its own case section: its optimizer's settings (the rest of
# its runs' settings are adamw's, so SGD with and without the gauge differ from the stage in the optimizer).
OPTIMIZER_SETTINGS = ("lr", "weight_decay", "momentum", "beta1", "beta2")
# An arm at its own best lr (the calibration, docs/design.md §6) is named after its arm with this suffix,
# and compared with its baseline at the baseline's best lr.
CALIBRATED_SUFFIX = "_best_lr"
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
# The 2 x 2's main effects (docs/design.md §11.3): fixing the unidentified blocks, averaged over the two
# starting points (the question the stage asks), and starting at the gauge point, averaged over fixed and
# free.
FIXING_EFFECT, START_EFFECT = "fixing_main_effect", "start_main_effect"
TWO_BY_TWO_CELLS = (GAUGE_ARM, AT_INIT_ARM, FROM_GAUGE_ARM, BASELINE_CASE)
# The like-for-like control (docs/experiments.md): the arm with as many MLP entries frozen as the gauge arm
# fixes is also compared with the same blocks fixed at their initial values, which start where it starts
# (the initialisation); against adamw it differs in what is frozen and in nothing else only by accident.
FROZEN_MLP_ARM = "adamw_frozen_mlp"
LIKE_FOR_LIKE = {FROZEN_MLP_ARM: AT_INIT_ARM}


@dataclass(frozen=True)
class Contrast:
    """A comparison of the 2 x 2's four cells per seed (docs/design.md §11.3): the ``arm`` side's value
    minus the ``baseline`` side's, each a weighted sum of cells' losses, ``((weight, arm name), ...)``."""

    name: str
    arm_terms: tuple[tuple[float, str], ...]
    baseline_terms: tuple[tuple[float, str], ...]

    def with_suffix(self, suffix: str) -> Contrast:
        """The same contrast of the cells named with ``suffix`` (the arms at their best lr)."""

        def named(terms: tuple[tuple[float, str], ...]) -> tuple[tuple[float, str], ...]:
            return tuple((weight, arm + suffix) for weight, arm in terms)

        return Contrast(self.name + suffix, named(self.arm_terms), named(self.baseline_terms))

    @staticmethod
    def side_label(terms: tuple[tuple[float, str], ...]) -> str:
        """A side as the seeds table names it: ``a-b`` (a difference) or ``(a+b)/2`` (a mean)."""
        weights = {abs(weight) for weight, _ in terms}
        if weights == {1.0}:
            return "".join(
                ("-" if weight < 0 else "+" if i else "") + arm for i, (weight, arm) in enumerate(terms)
            )
        return "(" + "+".join(arm for _, arm in terms) + f")/{round(1 / weights.pop())}"

    @property
    def cells(self) -> tuple[str, ...]:
        return tuple(arm for _, arm in (*self.arm_terms, *self.baseline_terms))


CONTRASTS = (
    Contrast(
        FIXING_EFFECT, ((0.5, GAUGE_ARM), (0.5, AT_INIT_ARM)), ((0.5, FROM_GAUGE_ARM), (0.5, BASELINE_CASE))
    ),
    Contrast(
        START_EFFECT, ((0.5, GAUGE_ARM), (0.5, FROM_GAUGE_ARM)), ((0.5, AT_INIT_ARM), (0.5, BASELINE_CASE))
    ),
    Contrast(
        INTERACTION, ((1.0, GAUGE_ARM), (-1.0, FROM_GAUGE_ARM)), ((1.0, AT_INIT_ARM), (-1.0, BASELINE_CASE))
    ),
)
# The settings a rebalancing arm takes from its case's section of the config (the rest are adamw's).
REBALANCE_SETTINGS = ("rebalance_every", "rebalance_target")
# The identity run (docs/design.md §13): the projected arm trained in float64.
IDENTITY_CASE, IDENTITY_DTYPE = "adamw_projected", "float64"
# Keys of the identity section that are not settings of its run.
IDENTITY_GRID_KEYS = ("seeds",)
# Keys of the interventions section that are not settings of its runs (the rest are: stage_settings).
STAGE_GRID_KEYS = (
    "arms", "seeds", "verdict", "identity", "calibration", "plateau", "one_job_per_arm", "lockstep",
    "robustness",
)  # fmt: skip
# The verdict rule's margin may be a rule instead of a number (docs/design.md §11.3): this fraction of the
# baseline's mean final loss at its best lr on the calibration seeds, known before any comparison run ends.
MARGIN_FRACTION = "fraction_of_baseline_loss"
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


def baseline_case(case: str) -> str | None:
    """The baseline case (:data:`BASELINE_CASES`) that trains with ``case``'s optimizer: ``adamw`` for the
    AdamW cases, ``sgd`` for ``sgd_gauge_fixed``; None for a case of no baseline's optimizer (or unknown)."""
    if case not in CASES:
        return None
    optimizer = CASES[case].make_optimizer
    return next((base for base in BASELINE_CASES if CASES[base].make_optimizer is optimizer), None)


def is_calibrated(arm: str) -> bool:
    """Whether the arm named ``arm`` is at its own best lr (its name ends in :data:`CALIBRATED_SUFFIX`)."""
    return arm.endswith(CALIBRATED_SUFFIX)


def arm_baseline(arm: str, case: str) -> str:
    """The arm that ``arm`` (a run of ``case``) is compared with seed by seed: the baseline case of its
    optimizer (:func:`baseline_case`; ``adamw`` for a case of none), at its best lr when ``arm`` is at its
    own (``adamw_gauge_fixed_best_lr`` against ``adamw_best_lr``). A baseline's is itself."""
    base = baseline_case(case) or BASELINE_CASE
    return base + CALIBRATED_SUFFIX if is_calibrated(arm) else base


def kept_moments_arm(arm: str, case: str, options: Mapping[str, object]) -> str | None:
    """The arm an arm with moved AdamW moments is also compared with: its case's with the moments kept (at
    its best lr when ``arm`` is at its own); None for an arm whose moments are kept (docs/design.md §15)."""
    if not moved_moments(options):
        return None
    return case + CALIBRATED_SUFFIX if is_calibrated(arm) else case


def like_for_like_arm(arm: str) -> str | None:
    """The arm ``arm`` is also compared with as its like-for-like control (:data:`LIKE_FOR_LIKE`:
    ``adamw_frozen_mlp`` with ``adamw_gauge_fixed_at_init``), at its best lr when ``arm`` is at its own;
    None for the other arms."""
    other = LIKE_FOR_LIKE.get(arm.removesuffix(CALIBRATED_SUFFIX))
    if other is None:
        return None
    return other + CALIBRATED_SUFFIX if is_calibrated(arm) else other


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
    """One arm of the study: a case and its settings (:data:`ARM_SETTINGS`) over the ``adamw`` case's;
    ``calibrated``: the arm at its own best lr, from the calibration runs (docs/design.md §6)."""

    case: str
    options: tuple[tuple[str, object], ...] = ()  # (setting, value), as the config gives them
    calibrated: bool = False

    @property
    def name(self) -> str:
        name = arm_name(self.case, dict(self.options))
        return name + CALIBRATED_SUFFIX if self.calibrated else name

    @property
    def baseline(self) -> str:
        return arm_baseline(self.name, self.case)

    def settings(self) -> dict:
        """The arm's own `attnid train` settings: those that differ from TrainConfig's defaults, and the
        name of an arm at its best lr (its runs' ``--arm``)."""
        defaults = {f.name: f.default for f in fields(TrainConfig)}
        own = {key: value for key, value in self.options if value != defaults[key]}
        return (own | {ARM_NAME_SETTING: self.name}) if self.calibrated else own


def _listed_arms(section: dict) -> list[Arm]:
    return [
        Arm(spec["case"], tuple((key, spec[key]) for key in ARM_SETTINGS if key in spec))
        for spec in section["arms"]
    ]


def calibrated_arms(config: dict, arms: list[Arm]) -> list[Arm]:
    """The arms of ``arms`` that the section's ``calibration`` lists, each at its own best lr, with the
    baseline of each (calibrated with it: an arm at its best lr is compared with its baseline at the
    baseline's), baselines first; none without a calibration. Names that are no arm are left to
    :func:`check_interventions_config`."""
    calibration = config["interventions"].get("calibration")
    if not calibration:
        return []
    by_name = {arm.name: arm for arm in arms}
    chosen = [name for name in calibration["arms"] if name in by_name]
    bases = [
        base
        for base in BASELINE_CASES
        if base in by_name and any(by_name[name].baseline == base for name in chosen)
    ]
    order = bases + [name for name in chosen if name not in bases]
    return [replace(by_name[name], calibrated=True) for name in order]


def stage_arms(config: dict) -> list[Arm]:
    """The baselines first (``adamw``, and ``sgd`` when an arm trains SGD), then the config's arms in its
    order, each at the stage's lr; none without the section."""
    section = config.get("interventions")
    if not section:
        return []
    listed = _listed_arms(section)
    baselines = [
        Arm(base)
        for base in BASELINE_CASES
        if base == BASELINE_CASE or any(arm.baseline == base for arm in listed)
    ]
    return baselines + listed


def intervention_arms(config: dict) -> list[Arm]:
    """The arms whose comparison runs the stage trains: :func:`stage_arms`, then the calibrated arms
    (:func:`calibrated_arms`); only the calibrated ones where the calibration says ``at_stage_lr: false``
    (every arm compared at its own best lr alone; the stage's lr is then only the calibration grid's
    centre)."""
    arms = stage_arms(config)
    calibrated = calibrated_arms(config, arms)
    calibration = (config.get("interventions") or {}).get("calibration") or {}
    if calibrated and not calibration.get("at_stage_lr", True):
        return calibrated
    return arms + calibrated


def arm_origin(config: dict, arm: Arm) -> str:
    """The config key that asks for the arm's runs (for error messages)."""
    if arm.calibrated:
        return "interventions/calibration"
    names = [arm_name(spec["case"], spec) for spec in config["interventions"]["arms"]]
    return f"interventions/arms/{names.index(arm.name)}" if arm.name in names else "interventions"


def stage_settings(config: dict) -> dict:
    """The run settings the ``interventions`` section gives every run of the stage (its arms, baselines,
    calibration and identity runs), over the model, training and case sections: e.g. ``max_iters: 300``
    while the cases train 1,500 steps."""
    section = config["interventions"]
    return {key: value for key, value in section.items() if key not in STAGE_GRID_KEYS}


def optimizer_overrides(config: dict, arm: Arm) -> dict:
    """What an arm whose baseline is not ``adamw`` (``sgd_gauge_fixed``, ``sgd``) takes from its baseline's
    case section over the ``adamw`` case's: the optimizer's settings (:data:`OPTIMIZER_SETTINGS`)."""
    base = baseline_case(arm.case) or BASELINE_CASE
    if base == BASELINE_CASE:
        return {}
    own = config.get("cases", {}).get(base, {})
    return {key: own[key] for key in OPTIMIZER_SETTINGS if key in own}


# Every run the table pairs is evaluated on the whole val split at its end: the primary metric
# (attnid.reports.interventions_table.PRIMARY_METRIC, docs/design.md §11.5).
PRIMARY_METRIC_SETTINGS = {"full_val_eval": True}


def arm_overrides(config: dict, arm: Arm) -> dict:
    """What an arm's run sets over the model, training, ``adamw`` case and stage settings: the primary
    metric's evaluation, a rebalancing arm's rebalance settings (from its own case section, where the config
    has one) and the arm's settings."""
    overrides = dict(PRIMARY_METRIC_SETTINGS)
    if CASES[arm.case].rebalances:
        own = config.get("cases", {}).get(arm.case, {})
        overrides.update({key: own[key] for key in REBALANCE_SETTINGS if key in own})
    return overrides | arm.settings()


def identity_overrides(config: dict) -> dict:
    """The identity run's settings over the projected arm's: the stage's, its section's own (which win),
    and what it is for, whatever the stage says: float64 and its metrics (ρ and the drift split)."""
    section = config["interventions"]["identity"]
    own = {key: value for key, value in section.items() if key not in IDENTITY_GRID_KEYS}
    fixed = {"dtype": IDENTITY_DTYPE} | ({"metrics": True} if "metrics" in stage_settings(config) else {})
    return stage_settings(config) | own | fixed


def two_by_two_contrasts(arm_names: Collection[str]) -> list[Contrast]:
    """The 2 x 2's contrasts (:data:`CONTRASTS`) of every set of its four cells among ``arm_names``: at the
    stage's lr, and at each arm's own best lr (the cells named with :data:`CALIBRATED_SUFFIX`)."""
    return [
        contrast.with_suffix(suffix)
        for suffix in ("", CALIBRATED_SUFFIX)
        if all(cell + suffix in arm_names for cell in TWO_BY_TWO_CELLS)
        for contrast in CONTRASTS
    ]


def contrast_named(name: str) -> Contrast | None:
    """The 2 x 2 contrast a comparison's name stands for (at the stage's lr or at the arms' best), or None."""
    for contrast in CONTRASTS:
        for suffix in ("", CALIBRATED_SUFFIX):
            if name == contrast.name + suffix:
                return contrast.with_suffix(suffix)
    return None


def planned_comparisons(config: dict) -> list[str]:
    """The comparisons the table will make of the section's arms (attnid.reports.interventions_table): each
    arm against its baseline (:func:`arm_baseline`), an arm with moved moments also against its case's
    kept-moments arm and the frozen-MLP arm against its like-for-like control (:func:`like_for_like_arm`)
    when those are listed, and the 2 x 2's contrasts where its four cells are."""
    arms = intervention_arms(config)
    names = [arm.name for arm in arms]
    comparisons = []
    for arm in arms:
        if arm.baseline == arm.name:
            continue
        comparisons.append(comparison_name(arm.name, arm.baseline))
        kept = kept_moments_arm(arm.name, arm.case, dict(arm.options))
        like = like_for_like_arm(arm.name)
        comparisons += [comparison_name(arm.name, other) for other in (kept, like) if other in names]
    return comparisons + [contrast.name for contrast in two_by_two_contrasts(names)]


def margin_fraction(config: dict) -> float | None:
    """The verdict rule's margin as a fraction of the calibrated baseline's loss, or None for a number."""
    margin = config["interventions"]["verdict"]["equivalence_margin"]
    return float(margin[MARGIN_FRACTION]) if isinstance(margin, dict) else None


def verdict_options(
    config: dict, calibration_table: str | None = None, *, plateau_check: bool = True
) -> list[str]:
    """`attnid interventions-table`'s flags for the section's verdict rule (docs/design.md §11.3) and its
    plateau check: the level, the margin (a number, or a fraction of the calibrated baseline's loss, read
    from the calibration table the workflow passes with ``--calibration``), the primary comparison, the
    secondary family; ``calibration_table``: where the calibration writes calibration.csv.
    ``plateau_check=False``: the rule's flags alone (`attnid interventions-robustness` has no plateau
    check: it judges runs the table has already checked, or their neighbours at another lr)."""
    section = config["interventions"]
    rule = section["verdict"]
    fraction = margin_fraction(config)
    if fraction is not None and calibration_table is None:
        raise ValueError("a margin that is a fraction of the calibrated baseline's loss needs its table")
    margin = (
        ["--margin-fraction", str(fraction), "--calibration", str(calibration_table)]
        if fraction is not None
        else ["--equivalence-margin", str(rule["equivalence_margin"])]
    )
    primary = ["--primary", rule["primary"]] if rule.get("primary") else []
    plateau = section.get("plateau") if plateau_check else None
    plateau_options = (
        [
            "--plateau-last",
            str(plateau["last_fraction"]),
            "--plateau-improvement",
            str(plateau["improvement"]),
        ]
        if plateau
        else []
    )
    return ["--alpha", str(rule["alpha"]), *margin, *primary, *plateau_options, "--family", *rule["family"]]


def _arm_problems(config: dict) -> list[tuple[str, str]]:
    """Each listed arm: a case of a baseline's optimizer, named apart, with options its case takes."""
    section = config["interventions"]
    problems = []
    names = []
    for index, spec in enumerate(section["arms"]):
        case = CASES[spec["case"]]
        key = f"interventions/arms/{index}"
        name = arm_name(spec["case"], spec)
        unnamed = [setting for setting in NAMED_ARM_SETTINGS if setting in spec]
        if unnamed and not spec.get(ARM_NAME_SETTING):
            problems.append(
                (key, f"an arm that sets {', '.join(unnamed)} names itself ({ARM_NAME_SETTING}: NAME)")
            )
        elif name in BASELINE_CASES:
            problems.append(
                (key, f"'{name}' is a baseline (of the arms that train its optimizer), not an arm")
            )
        elif is_calibrated(name):
            problems.append((key, f"{name}: a name ending in {CALIBRATED_SUFFIX} is the calibration's"))
        elif baseline_case(case.name) is None:
            problems.append(
                (
                    key,
                    f"{case.name} trains the optimizer of no baseline ({', '.join(BASELINE_CASES)}): its "
                    f"runs would have nothing to be paired with",
                )
            )
        for option in ARM_OPTIONS:
            if spec.get(option.name) not in (None, option.default) and not option.applies_to(case):
                problems.append((key, f"{option.name} needs {option.needs}, not {case.name}"))
        names.append(name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        problems.append(("interventions/arms", f"{', '.join(repeated)} listed twice"))
    return problems


def _calibration_problems(config: dict) -> list[tuple[str, str]]:
    """The calibration names arms of the stage (or baselines), none that sets its own lr, on seeds of its
    own (docs/design.md §6)."""
    section = config["interventions"]
    calibration = section.get("calibration")
    if not calibration:
        return robustness_problems(section)
    arms = {arm.name: arm for arm in stage_arms(config)}
    problems = []
    unknown = [name for name in calibration["arms"] if name not in arms]
    if unknown:
        problems.append(
            (
                "interventions/calibration/arms",
                f"{', '.join(unknown)} is no arm of the stage (they are: {', '.join(arms)})",
            )
        )
    fixed = [name for name in calibration["arms"] if name in arms and "lr" in dict(arms[name].options)]
    if fixed:
        problems.append(
            (
                "interventions/calibration/arms",
                f"{', '.join(fixed)} sets its own lr: the calibration chooses an arm's lr",
            )
        )
    return problems + refine_problems(section)


def check_interventions_config(config: dict) -> list[tuple[str, str]]:
    """The cross-key rules of the ``interventions`` section that the schema cannot say: (key, problem)."""
    section = config.get("interventions")
    if not section:
        return []
    problems = _arm_problems(config)
    if problems:  # the baselines, the calibration and the family are judged against arms that are right
        return problems
    for base in dict.fromkeys(arm.baseline for arm in stage_arms(config)):
        if base not in config.get("cases", {}):
            problems.append(
                (
                    "interventions",
                    f"no case '{base}' under cases: the arms that train its optimizer are trained with its "
                    f"settings and compared with its runs",
                )
            )
    problems += _calibration_problems(config)
    if problems:
        return problems
    planned = planned_comparisons(config)
    verdict = section["verdict"]
    unplanned = [name for name in verdict["family"] if name not in planned]
    if unplanned:
        problems.append(
            (
                "interventions/verdict/family",
                f"{', '.join(unplanned)} is no comparison of the arms (they make: {', '.join(planned)})",
            )
        )
    primary = verdict.get("primary")
    if primary is not None and primary not in planned:
        problems.append(
            (
                "interventions/verdict/primary",
                f"{primary} is no comparison of the arms (they make: {', '.join(planned)})",
            )
        )
    elif primary is not None and primary in verdict["family"]:
        problems.append(
            (
                "interventions/verdict/primary",
                f"{primary} is also in the family: the primary comparison is tested alone, the family "
                f"after it",
            )
        )
    calibrated = [arm.name for arm in intervention_arms(config) if arm.calibrated]
    if margin_fraction(config) is not None and BASELINE_CASE + CALIBRATED_SUFFIX not in calibrated:
        problems.append(
            (
                "interventions/verdict/equivalence_margin",
                f"{MARGIN_FRACTION} needs {BASELINE_CASE} in the calibration: the margin is a fraction of "
                f"its loss on the calibration seeds, measured before the comparison",
            )
        )
    plateau = section.get("plateau")
    every = section.get("full_val_every")
    steps = section.get("max_iters", config["training"]["max_iters"])
    if plateau and (every is None or not _plateau_step_declared(steps, every, plateau["last_fraction"])):
        problems.append(
            (
                "interventions/plateau",
                f"the plateau check compares the whole-split val loss {plateau['last_fraction']:g} of the "
                f"run before its end ({steps} steps) with the end's: full_val_every ({every}) must divide "
                f"that step",
            )
        )
    return problems


def _plateau_step_declared(steps: int, every: int, last_fraction: float) -> bool:
    """Whether the step ``last_fraction`` of ``steps`` before the end is one of ``full_val_every``'s."""
    span = last_fraction * steps
    return float(span).is_integer() and (steps - int(span)) % int(every) == 0
