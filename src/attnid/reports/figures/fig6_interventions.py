"""Figure 6, does identification change training? (beyond the paper), drawn from the interventions tables
(docs/design.md §11, §13-§15):

- every comparison of ``interventions.csv`` in its order (whatever arms the build has): the per-seed paired
  differences of ``interventions_seeds.csv`` as dots, their mean with the Student-t interval, the
  equivalence margin, and the verdict the rule wrote (``n too small`` where the seeds cannot decide);
- the 2 x 2 of starting point and frozen blocks, when the build has it (:data:`INTERACTION`): each cell's
  mean final loss, the effect of freezing in each row, and the interaction;
- ρ and the first-order drift of ``adamw`` and of the projected arm (and its float64 identity run), when the
  build has them, a series at round-off on its floor.

The caption is filled with the tables' numbers: per comparison Δ, its interval, n, the verdict and the
smallest detectable effect.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnid.common.errors import UserError
from attnid.plan.interventions import (
    AT_INIT_ARM,
    BASELINE_CASE,
    FROM_GAUGE_ARM,
    GAUGE_ARM,
    INTERACTION,
)
from attnid.reports.figures.inputs import RUN_FILES, Drawing, RunGroup, Sources
from attnid.reports.figures.series import Floors, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import (
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PREDICTION_COLOR,
    case_style,
    figure_legend,
    keep_texts_inside,
    pyplot,
)
from attnid.reports.interventions_table import load_runs_by_arm
from attnid.reports.latex import finite_or_none
from attnid.reports.round_off import at_round_off
from attnid.reports.statistics import N_TOO_SMALL, NO_LABEL, NOT_IN_FAMILY, smallest_sign_flip_p_value
from attnid.training.rundir import find_run_dirs, load_run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INPUTS = {
    "tables": ("interventions.csv", "interventions_seeds.csv"),
    "intervention_runs": RUN_FILES,
    "identity_runs": RUN_FILES,
}
STAGE = "interventions"
CAPTION = r"""**Figure 6 — does identification change training? (beyond the paper).** Each comparison of the
interventions: an arm trained exactly like ``adamw`` against ``adamw``'s run of the same seed (named
``arm - baseline``: against another arm{% if grid %}; and the interaction of the :math:`2 \times 2`{% endif
%}). Top:
:math:`\Delta`, the arm's final loss on the whole validation split minus the baseline's, one dot per seed
(below 0 the arm is better); the bar: their mean with its {{ confidence }} % Student-t interval{% if margin
%}; the grey band: the equivalence margin :math:`\pm` {{ fmt(margin) }}{% endif %}. On the right, the
verdict of the rule fixed before the runs: the exact sign-flip test, Holm over the {{ family_size }}
comparisons of the family at level {{ fmt(alpha) }}{% if margin %}, equivalent when the {{
equivalence_confidence }} % t-interval lies inside the margin{% endif %}; a verdict needs at least {{
min_seeds }} seed pairs.
{% if undecided %}
With {{ n_seeds }} seed pairs no comparison is decided: the smallest p the exact test can give is
{{ fmt(smallest_p) }}, so every row says n too small and its interval is shown, not judged.
{% endif %}
Per comparison, :math:`\Delta` [{{ confidence }} % CI] over n seeds, the verdict and the smallest effect
detectable with 80 % power:
{% for row in comparisons %}``{{ row.comparison }}`` {{ value(row.delta_mean) }} [{{ value(row.ci_low) }},
{{ value(row.ci_high) }}], n = {{ row.n_seeds }}, {{ row.verdict }}{% if row.p_holm is not none %} (Holm
p {{ fmt(row.p_holm) }}){% endif %}, detectable {{ row.detectable }}{{ "; " if not loop.last else "." }}
{% endfor %}
{% if grid %}
Bottom right: the :math:`2 \times 2` of starting point (the initialisation, the gauge point) and frozen
blocks (none, a :math:`D \times D` block of :math:`W_K` and of :math:`W_V` per group), the mean final loss
of each arm over the {{ grid.n_seeds }} seeds all four share, shaded by its difference from ``adamw``'s.
Freezing changes the loss by {{ value(grid.frozen_at_init) }} from the initialisation and by {{
value(grid.frozen_at_gauge) }} from the gauge point; the interaction, their difference, is {{
value(grid.interaction) }} [{{ value(grid.ci_low) }}, {{ value(grid.ci_high) }}], {{ grid.verdict }}.
{% endif %}
{% if orbit %}
Bottom left: :math:`\rho` and :math:`\|D_1\|/N_0`, the larger of the query-key and output-value circuits, of
``adamw`` (mean :math:`\rho_{QK}` {{ fmt(adamw_rho_mean) }}){% if projected_steps %} and of the projected
arm, whose steps have their orbit component removed: its :math:`\rho` is at most {{ fmt(projected_rho_max) }}
in {{ projected_dtype }} training{% endif %}{% if identity_steps %}; the float64 identity run of the
projected arm ({{ identity_steps }} steps) has :math:`\rho` at most {{ fmt(identity_rho_max) }} and
drift1/drift2 at most {{ fmt(identity_drift_ratio_max) }}{% endif %}. Round-off is drawn on the floor of its
grey band (a triangle: at or below), with its largest value written there.
{% endif %}
"""

PROJECTED_CASE = "adamw_projected"
SEED_DOT_COLOR = "#555555"
DECIDED_COLOR = "#000000"  # a comparison with a verdict: its mean and interval
UNDECIDED_COLOR = "#999999"  # no verdict (n too small, not in the family): shown, not judged
ROW_SPREAD = 0.22  # the seeds' dots of one comparison spread over +-this around its row
MARGIN_ALPHA = 0.12  # the equivalence margin: a light band under the rows
CELL_NAME_WIDTH = 14  # an arm's name in a cell of the 2 x 2, wrapped
INTERACTION_LABEL = "start x frozen (the 2 x 2's interaction)"
CONFIDENCE = 95  # interventions.csv's ci_low, ci_high: the 1 - alpha t-interval of alpha = 0.05
TABLE_COLUMNS = {
    "interventions.csv": {"comparison", "arm", "baseline", "n_seeds", "delta_mean", "ci_low", "ci_high"}
    | {"p_holm", "alpha", "equivalence_margin", "min_seeds", "detectable_effect", "in_family", "verdict"},
    "interventions_seeds.csv": {"comparison", "arm", "baseline", "seed", "arm_value", "baseline_value"}
    | {"difference"},
}


def draw(sources: Sources) -> Drawing:
    """Figure 6 from interventions.csv, interventions_seeds.csv, the interventions' runs and the float64
    identity run(s)."""
    table, seeds = (_read_table(sources, name) for name in TABLE_COLUMNS)
    arm_runs = load_runs_by_arm(None, sources.intervention_runs) if sources.intervention_runs else {}
    identity = [load_run(run_dir) for run_dir in find_run_dirs(None, sources.identity_runs or [])]
    return draw_interventions(table, seeds, arm_runs, identity)


def _read_table(sources: Sources, name: str) -> pd.DataFrame:
    path = sources.file("tables", name)
    frame = pd.read_csv(path)
    missing = sorted(TABLE_COLUMNS[name] - set(frame.columns))
    if missing:
        raise UserError(f"{path} has no column(s) {', '.join(missing)}: run attnid interventions-table again")
    return frame


@dataclass(frozen=True)
class Comparison:
    """One row of interventions.csv as Figure 6 draws it, with its seeds' differences."""

    comparison: str
    label: str  # its row's name in the figure
    differences: np.ndarray  # per seed, arm - baseline (finite ones)
    n_seeds: int
    delta_mean: float
    ci_low: float
    ci_high: float
    p_holm: float | None
    verdict: str
    verdict_label: str  # the verdict as its row shows it
    detectable: str  # the smallest detectable effect, or why there is none

    @property
    def decided(self) -> bool:
        """Whether the rule gave it a verdict (better, worse, equivalent, inconclusive)."""
        return self.verdict not in NO_LABEL


def comparisons_of(
    table: pd.DataFrame, seeds: pd.DataFrame, arm_runs: dict[str, RunGroup]
) -> list[Comparison]:
    """Each comparison of ``table`` (interventions.csv), in its order, with the differences of ``seeds``
    (interventions_seeds.csv)."""
    rows = []
    for row in table.to_dict("records"):
        name = str(row["comparison"])
        differences = pd.to_numeric(seeds.loc[seeds["comparison"] == name, "difference"], errors="coerce")
        p_holm = finite_or_none(row["p_holm"])
        verdict = str(row["verdict"])
        rows.append(
            Comparison(
                comparison=name,
                label=comparison_label(row, arm_runs),
                differences=differences[np.isfinite(differences)].to_numpy(dtype=float),
                n_seeds=int(row["n_seeds"]),
                delta_mean=float(row["delta_mean"]),
                ci_low=float(row["ci_low"]),
                ci_high=float(row["ci_high"]),
                p_holm=p_holm,
                verdict=verdict,
                verdict_label=verdict_label(row),
                detectable=_detectable(row),
            )
        )
    return rows


def comparison_label(row: dict, arm_runs: dict[str, RunGroup]) -> str:
    """A comparison's row name: the arm (against the table's baseline), ``arm - baseline``, or the
    interaction; an arm of the baseline's case at another learning rate says its ratio (the effective-step
    control, docs/design.md §14), read from the runs."""
    if row["comparison"] == INTERACTION:
        return INTERACTION_LABEL
    arm, baseline = str(row["arm"]), str(row["baseline"])
    label = arm if row["comparison"] == arm else f"{arm} - {baseline}"
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
    """The verdict as its row shows it: with Holm's p, the margin, or why there is none."""
    verdict = str(row["verdict"])
    if verdict == N_TOO_SMALL:
        return f"n too small ({int(row['n_seeds'])} < {int(row['min_seeds'])})"
    if verdict == NOT_IN_FAMILY:
        return NOT_IN_FAMILY
    p_holm = finite_or_none(row["p_holm"])
    return verdict if p_holm is None else f"{verdict}, Holm p {p_holm:.2g}"


def _detectable(row: dict) -> str:
    value = pd.to_numeric(row["detectable_effect"], errors="coerce")
    if pd.isna(value):
        return "n/a"
    return "none at this n" if math.isinf(value) else f"{value:.2g}"


# ---------------------------------------------------------------------------- the 2 x 2


@dataclass(frozen=True)
class TwoByTwo:
    """The 2 x 2 of starting point and frozen blocks (docs/design.md §14) over the seeds all four arms
    share: ``means[start][frozen]`` of the final loss, the arms in those cells, the effect of freezing from
    each start, and the interaction's row of the table."""

    arms: tuple[tuple[str, str], tuple[str, str]]  # (init, gauge point) x (nothing frozen, frozen)
    means: np.ndarray  # 2 x 2
    n_seeds: int
    interaction: Comparison

    @property
    def frozen_effects(self) -> tuple[float, float]:
        """The mean effect of freezing from the initialisation, and from the gauge point."""
        return float(self.means[0, 1] - self.means[0, 0]), float(self.means[1, 1] - self.means[1, 0])


def two_by_two(seeds: pd.DataFrame, comparisons: list[Comparison]) -> TwoByTwo | None:
    """The 2 x 2 from interventions_seeds.csv, when the table has its interaction; else None."""
    interaction = next((row for row in comparisons if row.comparison == INTERACTION), None)
    if interaction is None:
        return None
    arms = ((BASELINE_CASE, AT_INIT_ARM), (FROM_GAUGE_ARM, GAUGE_ARM))
    against_baseline = seeds[seeds["baseline"] == BASELINE_CASE]
    values: dict[str, dict[int, float]] = {}
    for row in against_baseline.to_dict("records"):
        values.setdefault(str(row["arm"]), {})[int(row["seed"])] = float(row["arm_value"])
        values.setdefault(BASELINE_CASE, {})[int(row["seed"])] = float(row["baseline_value"])
    shared = seeds.loc[seeds["comparison"] == INTERACTION, ["seed", "difference"]]
    common = [
        int(s)
        for s, d in zip(shared["seed"], pd.to_numeric(shared["difference"], errors="coerce"))
        if np.isfinite(d)
    ]
    if not common or any(arm not in values for pair in arms for arm in pair):
        return None
    means = np.array([[np.mean([values[arm][seed] for seed in common]) for arm in pair] for pair in arms])
    return TwoByTwo(arms, means, len(common), interaction)


# ---------------------------------------------------------------------------- drawing


def draw_interventions(
    table: pd.DataFrame,
    seeds: pd.DataFrame,
    arm_runs: dict[str, RunGroup],
    identity_runs: RunGroup,
) -> Drawing:
    """Figure 6 (see the module): the comparisons' paired differences, the 2 x 2 when the table has it,
    and ρ and drift1 of ``adamw`` and the projected runs when there are any."""
    if table.empty:
        raise UserError(
            "interventions.csv has no comparison: run attnid interventions-table on the arms' runs"
        )
    comparisons = comparisons_of(table, seeds, arm_runs)
    grid = two_by_two(seeds, comparisons)
    projected = arm_runs.get(PROJECTED_CASE, [])
    orbit = bool(arm_runs.get(BASELINE_CASE)) and bool(projected or identity_runs)

    # the comparisons across the top; below them the orbit panels and the 2 x 2, those the build has. Each
    # row is laid out on its own (subfigures): the comparisons' long names widen the top panel's margin only.
    top_height = max(PANEL_HEIGHT, 0.38 * len(comparisons) + 1.3)
    below = orbit or grid is not None
    fig = pyplot().figure(
        figsize=(3 * PANEL_WIDTH, top_height + (PANEL_HEIGHT if below else 0)), layout="constrained"
    )
    top, bottom = fig.subfigures(2, 1, height_ratios=[top_height, PANEL_HEIGHT]) if below else (fig, None)
    ax_differences = top.add_subplot()
    margin = finite_or_none(table["equivalence_margin"].iloc[0])
    _draw_differences(ax_differences, comparisons, margin)
    if bottom is not None:
        panels = bottom.add_gridspec(1, 3)
        if orbit:
            series = _orbit_series(arm_runs[BASELINE_CASE], projected, identity_runs)
            for position, (column, label, title) in enumerate(
                (
                    ("rho", r"$\rho$ (larger circuit)", r"unidentified share $\rho$"),
                    ("drift1", r"$\|D_1\|/N_0$ (larger circuit)", "first-order drift"),
                )
            ):
                ax = bottom.add_subplot(panels[0, position])
                _draw_orbit_panel(ax, column, series)
                ax.set_xlabel("step")
                ax.set_ylabel(label)
                ax.set_title(title)
        if grid is not None:
            _draw_two_by_two(bottom.add_subplot(panels[0, 2]), grid)
    figure_legend(fig, ax_differences, ncol=3)
    keep_texts_inside(fig)
    return Drawing(fig, caption_numbers(table, comparisons, grid, arm_runs, identity_runs))


def _draw_differences(ax: Axes, comparisons: list[Comparison], margin: float | None) -> None:
    """One row per comparison: its seeds' differences as dots, the mean with its t-interval (grey where the
    rule gives no verdict), the zero line and the equivalence margin; the verdicts on the right."""
    ax.axvline(0.0, color=PREDICTION_COLOR, linewidth=0.8, zorder=1)
    if margin is not None:
        ax.axvspan(
            -margin,
            margin,
            color=PREDICTION_COLOR,
            alpha=MARGIN_ALPHA,
            linewidth=0,
            zorder=0,
            label=f"equivalence margin ±{margin:g}",
        )
    xs, ys = [], []
    for position, row in enumerate(comparisons):
        spread = (
            np.linspace(-ROW_SPREAD, ROW_SPREAD, row.differences.size) if row.differences.size > 1 else 0.0
        )
        xs.append(row.differences)
        ys.append(position + np.zeros(row.differences.size) + spread)
    if any(x.size for x in xs):
        ax.scatter(
            np.concatenate(xs),
            np.concatenate(ys),
            s=11,
            color=SEED_DOT_COLOR,
            alpha=0.75,
            linewidths=0,
            zorder=3,
            label="one seed's difference",
        )
    shown = set()
    for position, row in enumerate(comparisons):
        if not (math.isfinite(row.delta_mean) and math.isfinite(row.ci_low) and math.isfinite(row.ci_high)):
            continue
        decided = row.decided
        label = f"mean, {CONFIDENCE} % t-interval" + ("" if decided else " (no verdict)")
        ax.errorbar(
            row.delta_mean,
            position,
            xerr=[[row.delta_mean - row.ci_low], [row.ci_high - row.delta_mean]],
            fmt="o",
            color=DECIDED_COLOR if decided else UNDECIDED_COLOR,
            markerfacecolor=DECIDED_COLOR if decided else "white",
            markersize=5,
            capsize=3,
            linewidth=1.2,
            zorder=4,
            label=None if label in shown else label,
        )
        shown.add(label)
    _set_difference_limits(ax, comparisons, margin)
    positions = list(range(len(comparisons)))
    ax.set_ylim(len(comparisons) - 0.5, -0.5)  # the first comparison on top
    ax.set_yticks(positions, [row.label for row in comparisons])
    ax.grid(False, axis="y")
    verdicts = ax.twinx()
    verdicts.set_ylim(ax.get_ylim())
    verdicts.set_yticks(positions, [row.verdict_label for row in comparisons])
    verdicts.grid(False)
    for tick, row in zip(verdicts.get_yticklabels(), comparisons):
        tick.set_color(DECIDED_COLOR if row.decided else UNDECIDED_COLOR)
        tick.set_fontweight("bold" if row.verdict in ("better", "worse") else "normal")
    ax.set_xlabel("final val loss (whole split), arm minus baseline, same seed")
    ax.set_title("paired differences per seed, and the verdicts")


def _set_difference_limits(ax: Axes, comparisons: list[Comparison], margin: float | None) -> None:
    """x limits that hold every dot, mean and margin, and the intervals of the rows with a verdict: a wider
    interval (a handful of seeds, no verdict) runs off the side, with an arrow there."""
    values = [0.0] + ([-margin, margin] if margin is not None else [])
    for row in comparisons:
        values += row.differences.tolist() + [row.delta_mean]
        if row.decided:
            values += [row.ci_low, row.ci_high]
    finite = np.array([v for v in values if math.isfinite(v)])
    low, high = float(finite.min()), float(finite.max())
    pad = 0.08 * (high - low) or 1e-3
    low, high = low - pad, high + pad
    ax.set_xlim(low, high)
    for position, row in enumerate(comparisons):
        for end, edge, marker in ((row.ci_low, low, "<"), (row.ci_high, high, ">")):
            if math.isfinite(end) and (end < low if marker == "<" else end > high):
                ax.plot(
                    [edge],
                    [position],
                    marker=marker,
                    color=UNDECIDED_COLOR,
                    markersize=4,
                    clip_on=False,
                    zorder=4,
                )


def _draw_two_by_two(ax: Axes, grid: TwoByTwo) -> None:
    """The four cells' mean final loss, shaded by their difference from ``adamw``'s; each frozen cell says
    the effect of freezing from its start, the panel's foot the interaction."""
    shift = grid.means - grid.means[0, 0]
    limit = float(np.abs(shift).max()) or 1.0
    ax.imshow(shift, cmap="RdBu_r", vmin=-2 * limit, vmax=2 * limit, aspect="auto")  # pale: the text reads
    effects = grid.frozen_effects
    for start in range(2):
        for frozen in range(2):
            name = textwrap.fill(grid.arms[start][frozen].replace("_", " "), CELL_NAME_WIDTH)
            lines = [name, f"{grid.means[start, frozen]:.4f}"]
            if frozen:
                lines.append(f"freezing {effects[start]:+.2g}")
            ax.text(frozen, start, "\n".join(lines), ha="center", va="center", fontsize=6.5)
    ax.set_xticks([0, 1], ["nothing\nfrozen", "D x D blocks\nfrozen"])
    ax.set_yticks([0, 1], ["from the\ninitialisation", "from the\ngauge point"])
    ax.tick_params(length=0)
    ax.grid(False)
    row = grid.interaction
    ax.set_xlabel(
        f"interaction {row.delta_mean:+.2g} [{row.ci_low:.2g}, {row.ci_high:.2g}]\n{row.verdict_label}"
    )
    ax.set_title(f"2 x 2: start x frozen, {grid.n_seeds} seeds")


def _larger_circuit(runs: RunGroup, column: str) -> RunGroup:
    """Each run with ``column`` = the larger of its query-key and output-value values at every step."""
    out = []
    for info, metrics in runs:
        parts = [
            pd.to_numeric(metrics[f"{column}_{c}"], errors="coerce").abs()
            for c in ("qk", "ov")
            if f"{column}_{c}" in metrics
        ]
        frame = metrics.copy()
        frame[column] = pd.concat(parts, axis=1).max(axis=1, skipna=False) if parts else np.nan
        out.append((info, frame))
    return out


def _orbit_series(
    baseline: RunGroup, projected: RunGroup, identity: RunGroup
) -> list[tuple[str, dict, RunGroup]]:
    """(label, look, runs) of each run group of the orbit panels, in its case's style (as everywhere in the
    figures) with a ``short`` name for its floor's text; the float64 identity run of the projected arm with
    a marker at every point."""
    adamw, projected_style = case_style(BASELINE_CASE), case_style(PROJECTED_CASE)
    series = [(adamw["label"], adamw | {"short": adamw["label"]}, baseline)]
    if projected:
        dtype = runs_dtype(projected)
        look = projected_style | {"short": f"projected ({dtype})"}
        series.append((f"{projected_style['label']} ({dtype})", look, projected))
    if identity:
        dtype = runs_dtype(identity)
        look = projected_style | {"short": f"identity run ({dtype})", "every_point": True}
        series.append((f"{projected_style['label']} ({dtype} identity run)", look, identity))
    return series


def _draw_orbit_panel(ax: Axes, column: str, series: list[tuple[str, dict, RunGroup]]) -> None:
    """The larger circuit's ρ or drift1 of each run group on a log axis; a group at its precision's round-off
    lies on its floor, never as data (docs/design.md §13)."""
    floors = Floors(ax)
    symbol = r"$\rho$" if column == "rho" else "drift1"
    for label, style, runs in series:
        dtype = runs_dtype(runs)
        larger = _larger_circuit(runs, column)
        band = seed_band(larger, column, positive=True)
        every = seed_band(larger, column)
        if every.empty:
            continue
        line = {"color": style["color"], "label": label, "linestyle": style["linestyle"]}
        # a drift sums one rounded term per step: its round-off grows like sqrt(steps) (Figure 3)
        band_steps = int(every["step"].max()) if column.startswith("drift") else 1
        if at_round_off(every["max"], dtype, steps=band_steps):
            marker = {"marker": style["marker"]} if style.get("every_point") else {}
            floors.draw(
                every["step"],
                every["max"],
                dtype,
                f"{style['short']}: {symbol}",
                band_steps,
                **line,
                **marker,
            )
            continue
        plot_band(ax, band, **line)
    floors.finish()
    ax.set_yscale("log")


# ---------------------------------------------------------------------------- the caption's numbers


def _max_of(runs: RunGroup, columns: list[str]) -> float:
    values = [
        pd.to_numeric(metrics[c], errors="coerce").abs().max()
        for _, metrics in runs
        for c in columns
        if c in metrics
    ]
    values = [v for v in values if pd.notna(v)]
    return float(max(values)) if values else math.nan


def _drift_ratio_max(runs: RunGroup) -> float:
    """The largest drift1 / drift2 on any logged row, both circuits (docs/design.md §7, §13)."""
    ratios = []
    for _, metrics in runs:
        for circuit in ("qk", "ov"):
            if f"drift1_{circuit}" in metrics and f"drift2_{circuit}" in metrics:
                first = pd.to_numeric(metrics[f"drift1_{circuit}"], errors="coerce")
                second = pd.to_numeric(metrics[f"drift2_{circuit}"], errors="coerce")
                ratio = (first / second)[second > 0].dropna()
                if len(ratio):
                    ratios.append(float(ratio.max()))
    return max(ratios) if ratios else math.nan


def caption_numbers(
    table: pd.DataFrame,
    comparisons: list[Comparison],
    grid: TwoByTwo | None,
    arm_runs: dict[str, RunGroup],
    identity_runs: RunGroup,
) -> dict:
    """The numbers Figure 6's caption is filled with: the rule's (``alpha``, ``margin``, ``family_size``,
    ``min_seeds``), ``n_seeds`` and whether nothing is ``undecided``; per comparison its row
    (``comparisons``); the 2 x 2 (``grid``); the orbit panels' (``orbit``, the projected arm's and the
    identity run's largest ρ and drift ratio, ``adamw``'s mean ρ_QK)."""
    first = table.iloc[0]
    alpha = float(first["alpha"])
    n_seeds = int(table["n_seeds"].max())
    projected = arm_runs.get(PROJECTED_CASE, [])
    baseline = arm_runs.get(BASELINE_CASE, [])
    interaction = grid.interaction if grid is not None else None
    rho_means = [
        float(pd.to_numeric(m["rho_qk"], errors="coerce").mean()) for _, m in baseline if "rho_qk" in m
    ]
    return {
        "alpha": alpha,
        "confidence": round(100 * (1 - alpha)),
        "equivalence_confidence": round(100 * (1 - 2 * alpha)),
        "margin": finite_or_none(first["equivalence_margin"]),
        "family_size": int(table["in_family"].astype(str).str.lower().eq("true").sum()),
        "min_seeds": int(first["min_seeds"]),
        "n_seeds": n_seeds,
        "smallest_p": smallest_sign_flip_p_value(n_seeds),
        "undecided": not any(row.decided for row in comparisons),
        "comparisons": [
            {
                "comparison": row.comparison,
                "delta_mean": row.delta_mean,
                "ci_low": row.ci_low,
                "ci_high": row.ci_high,
                "n_seeds": row.n_seeds,
                "verdict": row.verdict,
                "p_holm": row.p_holm if row.decided else None,  # no test is reported where none decides
                "detectable": row.detectable,
            }
            for row in comparisons
        ],
        "grid": None
        if grid is None or interaction is None
        else {
            "n_seeds": grid.n_seeds,
            "frozen_at_init": grid.frozen_effects[0],
            "frozen_at_gauge": grid.frozen_effects[1],
            "interaction": interaction.delta_mean,
            "ci_low": interaction.ci_low,
            "ci_high": interaction.ci_high,
            "verdict": interaction.verdict,
        },
        "orbit": bool(baseline) and bool(projected or identity_runs),
        "projected_steps": max((int(m["step"].max()) for _, m in projected), default=0),
        "projected_rho_max": _max_of(projected, ["rho_qk", "rho_ov"]),
        "projected_dtype": runs_dtype(projected) if projected else "",
        "identity_steps": max((int(m["step"].max()) for _, m in identity_runs), default=0),
        "identity_rho_max": _max_of(identity_runs, ["rho_qk", "rho_ov"]),
        "identity_drift_ratio_max": _drift_ratio_max(identity_runs),
        "adamw_rho_mean": float(np.mean(rho_means)) if rho_means else math.nan,
    }
