"""Figures 1-6 (1-4 as in the paper, 5 the identification study, 6 the interventions), from the tables and
run logs.

    attnid figures --tables results/tables --runs-dir results/runs \\
                   --theory-dir results/theory --out-dir figures

1. Identification by design (T3, T5): identified fraction of an attention layer vs
   number of heads; closed forms for MHA, GQA and RoPE (``attnid.theory.counts``), the
   measured Jacobian nullity points, real architectures marked.
2. Loss and ρ vs step for every optimizer case (E1, E2): mean over seeds, band = min..max.
3. Per case, β split exactly into its first- and second-order parts (drift1, drift2,
   docs/design.md §7), with the SGD + weight-decay prediction overlaid on the first-order
   part; rebalancing shows as a sawtooth; μ per case below (E1-E3).
4. LR sweep: final β (both circuits) and mean ρ vs lr (log-log, fitted slopes
   annotated), final val loss vs lr; diverged points marked with a cross at the top.
5. The identification studies (:func:`figure_identification_study`).
6. The interventions on the orbit (:func:`figure_interventions`): each arm's val loss against adamw's with
   its CI, and the projected arm's ρ and first-order drift on their round-off floors; its caption is
   filled with the build's numbers.

A series at numerical round-off (:func:`at_round_off`: its largest value below 10x the
round-off floor of its runs' training precision) is never drawn as data in Figures 2 and
4, and never fitted: a labelled floor band marks where it sits instead.

Each is written as PNG and PDF. Only the Agg backend is used (no display needed).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import atomic_path, write_text_atomic
from attnid.reports.studies import STUDIES, head_sweep
from attnid.reports.tables import UNIT_ROUND_OFF, run_dtype
from attnid.training.cases import CASES
from attnid.training.rundir import initial_imbalance_scale, load_runs_by_case

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

P = ParamSpec("P")  # a styled drawing's parameters and result
R = TypeVar("R")

# One style for every figure: matplotlib rc settings, case colours and labels.
STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4,
    # TrueType (Type 42) fonts in PDF/PS: no Type 3 fonts in the appendix PDF
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}
PREDICTION_COLOR = "#777777"  # black is a case colour
BAND_ALPHA = 0.2
FLOOR_COLOR = "#BBBBBB"
# A relative quantity computed from weights trained in some precision has a round-off floor at that
# precision's unit round-off (tables.UNIT_ROUND_OFF); a series whose largest value is below this many
# floors is round-off, not data.
ROUND_OFF_MARGIN = 10.0
PANEL_WIDTH = 3.6  # inches per panel
PANEL_HEIGHT = 2.9


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def styled(draw: Callable[P, R]) -> Callable[P, R]:
    """Run a drawing (or saving) function under :data:`STYLE` in matplotlib's ``rc_context``: every figure
    gets the one style, and the caller's own matplotlib settings are left as they were."""

    @functools.wraps(draw)
    def in_style(*args: P.args, **kwargs: P.kwargs) -> R:
        with _pyplot().rc_context(STYLE):
            return draw(*args, **kwargs)

    return in_style


def case_style(case: str) -> dict:
    """color, label, linestyle and marker of a case (from :data:`attnid.training.cases.CASES`); gray
    for unknown ones."""
    if case in CASES:
        return CASES[case].style()
    return {"color": "gray", "label": str(case), "linestyle": "-", "marker": "o"}


@styled
def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.pdf`` atomically; returns both paths."""
    paths = []
    for suffix in ("png", "pdf"):
        path = Path(out_dir) / f"{name}.{suffix}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=suffix)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------- data helpers


def seed_band(runs: list[tuple[dict, pd.DataFrame]], column: str, positive: bool = False) -> pd.DataFrame:
    """Mean, min and max of ``column`` over seeds at every logged step (NaN rows dropped).

    With ``positive`` (for log axes) non-positive values are dropped too.
    """
    parts = []
    for seed_index, (_, metrics) in enumerate(runs):
        if column not in metrics:
            continue
        values = pd.to_numeric(metrics[column], errors="coerce").replace([np.inf, -np.inf], np.nan)
        part = pd.DataFrame({"step": metrics["step"], "value": values, "seed": seed_index}).dropna()
        if positive:
            part = part[part["value"] > 0]
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["step", "mean", "min", "max"])
    stacked = pd.concat(parts)
    band = stacked.groupby("step")["value"].agg(["mean", "min", "max"]).reset_index()
    return band


def plot_band(ax: Axes, band: pd.DataFrame, color: str, label: str | None, **line_kwargs: Any) -> None:
    if band.empty:
        return
    ax.plot(band["step"], band["mean"], color=color, label=label, **line_kwargs)
    ax.fill_between(band["step"], band["min"], band["max"], color=color, alpha=BAND_ALPHA, linewidth=0)


def coarsest_dtype(dtypes: Iterable[str]) -> str:
    """The precision with the highest round-off floor among ``dtypes`` (``float32`` when none is known)."""
    known = [d for d in dtypes if d in UNIT_ROUND_OFF]
    return max(known, key=lambda dtype: UNIT_ROUND_OFF[dtype]) if known else "float32"


def round_off_floor(dtype: str, order: int = 1) -> float:
    """The round-off floor of a relative quantity of weights stored in ``dtype``: its unit round-off, to the
    power ``order`` for a quantity that rounding moves only at that order (μ at its minimum, the balanced
    point: order 2), and never below float64's, in which the quantity is computed."""
    return max(UNIT_ROUND_OFF[dtype] ** order, UNIT_ROUND_OFF["float64"])


def round_off_ceiling(dtype: str, steps: int = 1, order: int = 1) -> float:
    """The largest value still counted as round-off: ``ROUND_OFF_MARGIN`` floors, times ``sqrt(steps)`` for a
    sum of ``steps`` per-step terms each rounded independently (the drift parts, docs/design.md §7)."""
    return ROUND_OFF_MARGIN * round_off_floor(dtype, order) * math.sqrt(max(int(steps), 1))


def at_round_off(values: ArrayLike, dtype: str, steps: int = 1) -> bool:
    """Whether a relative quantity is numerical round-off for runs trained in ``dtype``: its largest
    finite value is below :func:`round_off_ceiling` (all zero counts as round-off)."""
    values = (
        pd.to_numeric(pd.Series(values, dtype=float), errors="coerce")
        .replace([np.inf, -np.inf], np.nan)
        .dropna()
    )
    if not len(values):
        return False
    return float(values.abs().max()) < round_off_ceiling(dtype, steps)


def draw_floor_bands(ax: Axes, floors: dict[str, list[str]], steps: int = 1, order: int = 1) -> None:
    """One labelled band per precision, floor/10 .. :func:`round_off_ceiling`, naming the series at its
    round-off (on a log y axis, extended down to show the whole band); ``order``: see
    :func:`round_off_floor`."""
    from matplotlib.transforms import blended_transform_factory

    for dtype, labels in floors.items():
        if not labels:
            continue
        floor, ceiling = round_off_floor(dtype, order), round_off_ceiling(dtype, steps, order)
        ax.set_yscale("log")
        bottom, top = ax.get_ylim()
        ax.set_ylim(min(bottom, floor / ROUND_OFF_MARGIN / 3), max(top, ceiling * 10))
        ax.axhspan(floor / ROUND_OFF_MARGIN, ceiling, color=FLOOR_COLOR, alpha=0.35, linewidth=0, zorder=0)
        summed = f", summed over {steps:,} steps" if steps > 1 else ""
        squared = "" if order == 1 else f" to order {order}"
        ax.text(
            0.02,
            ceiling,
            f"{dtype} round-off{squared}{summed}: {', '.join(dict.fromkeys(labels))}",
            transform=blended_transform_factory(ax.transAxes, ax.transData),
            fontsize=6,
            color="#555555",
            va="bottom",
            ha="left",
        )


def runs_dtype(runs: list[tuple[dict, pd.DataFrame]]) -> str:
    """The coarsest training precision of a case's runs (run.json ``dtype``)."""
    return coarsest_dtype([run_dtype(info) for info, _ in runs])


def sgd_wd_imbalance_factor(
    steps: ArrayLike, lr_at: Callable[[int], float], weight_decay: float
) -> np.ndarray:
    """``c_t = Π_{s<t} (1 - lr_s λ)^2``: coupled L2 weight decay shrinks both factors of
    every pair by ``(1 - lr λ)`` per step, so ``I_t ≈ c_t I_0`` (docs/design.md §3; Lemma 5.1
    says the gradient part conserves ``I`` up to O(lr²)). ``lr_at(s)`` is the
    learning rate of 0-based step ``s``; ``steps`` are the logged step counts."""
    steps = np.asarray(steps, dtype=int)
    horizon = int(steps.max()) if steps.size else 0
    log_factor = np.zeros(horizon + 1)
    for s in range(horizon):
        log_factor[s + 1] = log_factor[s] + 2.0 * math.log1p(-lr_at(s) * weight_decay)
    return np.exp(log_factor[steps])


def predicted_beta_sgd_wd(
    steps: ArrayLike, lr_at: Callable[[int], float], weight_decay: float, scale: float
) -> np.ndarray:
    """β_t predicted for SGD + weight decay: ``|c_t - 1| · ||I_0||_F / N`` with
    ``scale = ||I_0||_F / N`` (N = β's normaliser, docs/design.md §3)."""
    return np.abs(sgd_wd_imbalance_factor(steps, lr_at, weight_decay) - 1.0) * scale


def lr_schedule(config: dict) -> Callable[[int], float]:
    """The run's learning rate as a function of the 0-based step (nanoGPT's schedule)."""
    from types import SimpleNamespace

    from attnid.training.loop import get_lr

    cfg = SimpleNamespace(**config)
    return lambda step: get_lr(step, cfg)


# ---------------------------------------------------------------------------- figure 1


@styled
def figure_identification(theory_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Figure 1 (T3, T5): identified fraction vs heads, closed forms + nullity + real models."""
    from attnid.theory.counts import identified_fraction

    plt = _pyplot()
    theory_dir = Path(theory_dir)
    counts = pd.read_csv(theory_dir / "counts.csv")
    nullity = pd.read_csv(theory_dir / "nullity.csv")

    fig, (ax, ax_log) = plt.subplots(1, 2, figsize=(3 * PANEL_WIDTH, 1.3 * PANEL_HEIGHT))
    n_embd = 8192  # wide enough that every power-of-two head count up to 128 divides it
    heads = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    curves: list[tuple[str, dict[str, Any], str, str]] = [
        ("MHA: $1 - 1/(2H)$", {}, "-", "#0072B2"),
        ("GQA, 8 query heads per key/value head", {"gqa": 8}, "--", "#D55E00"),
        ("MHA + RoPE", {"rope": True}, ":", "#009E73"),
        ("GQA (8 per group) + RoPE", {"gqa": 8, "rope": True}, "-.", "#CC79A7"),
    ]
    for label, kind, linestyle, color in curves:
        values = np.array(
            [
                identified_fraction(
                    n_embd,
                    h,
                    n_kv_head=max(1, h // kind["gqa"]) if "gqa" in kind else None,
                    rope=kind.get("rope", False),
                )
                for h in heads
            ]
        )
        ax.plot(heads, values, linestyle=linestyle, color=color, label=f"closed form: {label}, E = {n_embd}")
        ax_log.plot(heads, 1.0 - values, linestyle=linestyle, color=color)

    attention = nullity[nullity["kind"] == "attention"].copy()
    if not attention.empty:
        attention["measured_fraction"] = 1.0 - attention["measured"] / attention["n_params"]
        for axis, points in (
            (ax, attention["measured_fraction"]),
            (ax_log, 1.0 - attention["measured_fraction"]),
        ):
            axis.scatter(
                attention["n_head"],
                points,
                marker="o",
                facecolors="none",
                edgecolors="black",
                s=30,
                zorder=3,
                label=f"measured: Jacobian nullity of random MHA layers, E = "
                f"{', '.join(str(e) for e in sorted(attention['n_embd'].unique()))}",
            )

    if "identified_fraction" in counts:
        for axis, points in (
            (ax, counts["identified_fraction"]),
            (ax_log, 1.0 - counts["identified_fraction"]),
        ):
            axis.scatter(
                counts["n_head"],
                points,
                marker="*",
                color="#E69F00",
                s=80,
                zorder=4,
                edgecolors="black",
                linewidths=0.4,
                label="real architectures (named on the right)",
            )
        # one label per distinct point: models with the same attention shape share it
        shared = counts.groupby(["n_head", "identified_fraction"], sort=True)["architecture"].apply(", ".join)
        # names in a column right of the curves, spread apart in log space, with leader lines
        # groupby's keys are typed Hashable: here each is (n_head, identified_fraction)
        by_shape = cast(list[tuple[tuple[int, float], str]], list(shared.items()))
        ordered = sorted(by_shape, key=lambda item: -(1.0 - item[0][1]))
        label_log_y: list[float] = []
        min_gap = 0.16
        for (_, fraction), _ in ordered:
            wanted = math.log10(1.0 - fraction)
            label_log_y.append(min(wanted, label_log_y[-1] - min_gap) if label_log_y else wanted)
        for ((n_head, fraction), names), log_y in zip(ordered, label_log_y):
            ax_log.annotate(
                names,
                xy=(n_head, 1.0 - fraction),
                xytext=(190, 10**log_y),
                textcoords="data",
                fontsize=6,
                color="#333333",
                va="center",
                arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.5},
            )
    for axis in (ax, ax_log):
        axis.set_xscale("log", base=2)
        axis.set_xticks(heads, [str(h) for h in heads])
        axis.set_xlabel("number of heads $H$")
    ax.set_ylabel("identified fraction of attention parameters")
    ax.set_ylim(0.45, 1.01)
    ax.set_title("identified fraction vs heads")
    ax_log.set_yscale("log")
    ax_log.set_ylabel("unidentified fraction (log)")
    ax_log.set_title("unidentified fraction: real architectures")
    ax_log.set_xlim(0.8, 1400)  # room for the names
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    paths = save_figure(fig, out_dir, "fig1")
    plt.close(fig)
    return paths


# ---------------------------------------------------------------------------- figure 2


@styled
def figure_training(runs: dict, out_dir: str | Path) -> list[Path]:
    """Figure 2 (E1, E2): loss and ρ (QK, OV) vs step for every case."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(3 * PANEL_WIDTH, PANEL_HEIGHT))
    floors: dict[str, dict[str, list[str]]] = {
        circuit: {dtype: [] for dtype in UNIT_ROUND_OFF} for circuit in ("qk", "ov")
    }  # circuit -> dtype -> labels of the cases at that round-off
    for case, case_runs in runs.items():
        style = case_style(case)
        plot_band(
            axes[0],
            seed_band(case_runs, "train_loss"),
            style["color"],
            style["label"],
            alpha=0.8,
            linestyle=style["linestyle"],
        )
        val = seed_band(case_runs, "val_loss")
        if not val.empty:
            axes[0].plot(val["step"], val["mean"], style["marker"], color=style["color"], markersize=3)
        dtype = runs_dtype(case_runs)
        for ax, circuit in zip(axes[1:], ("qk", "ov")):
            rho = seed_band(case_runs, f"rho_{circuit}")
            if at_round_off(rho["max"], dtype):  # round-off is marked, not drawn as data
                floors[circuit][dtype].append(style["label"])
                continue
            plot_band(
                ax,
                seed_band(case_runs, f"rho_{circuit}", positive=True),
                style["color"],
                style["label"],
                linestyle=style["linestyle"],
            )
    for ax, circuit in zip(axes[1:], ("qk", "ov")):
        draw_floor_bands(ax, floors[circuit])
    axes[0].set_ylabel("loss (line: train batch, dots: val)")
    axes[0].set_title("loss")
    for ax, circuit in zip(axes[1:], ("QK", "OV")):
        ax.set_yscale("log")
        ax.set_ylabel(rf"$\rho_{{{circuit}}}$ (unidentified share of a step)")
        ax.set_title(rf"$\rho_{{{circuit}}}$")
    for ax in axes:
        ax.set_xlabel("step")
    _figure_legend(fig, axes[0])
    paths = save_figure(fig, out_dir, "fig2")
    plt.close(fig)
    return paths


def _figure_legend(fig: Figure, ax: Axes, ncol: int = 6) -> None:
    """One legend for the whole figure, below the panels, without repeated labels (``ax``'s first,
    then any other panel's: a series drawn as a round-off band is absent from its panel)."""
    unique: dict[str, Any] = {}  # label -> handle
    for axis in [ax] + [other for other in fig.axes if other is not ax]:
        handles, labels = axis.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            unique.setdefault(label, handle)
    if not unique:
        fig.tight_layout()
        return
    # lay the panels out first, then hang the legend below the figure: its top edge at the figure's
    # bottom, so a legend of several rows never covers the x labels (savefig's tight box takes it in)
    fig.tight_layout()
    fig.legend(
        unique.values(),
        unique.keys(),
        loc="upper center",
        ncol=min(len(unique), ncol),
        bbox_to_anchor=(0.5, 0.0),
    )


# ---------------------------------------------------------------------------- figure 3


@styled
def figure_conservation(runs: dict, out_dir: str | Path) -> list[Path]:
    """Figure 3 (E1-E3): per case (columns), β_QK and β_OV split into drift1 + drift2, and μ."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    n_cases = max(len(runs), 1)
    fig, axes = plt.subplots(
        3,
        n_cases,
        figsize=(n_cases * 0.8 * PANEL_WIDTH + 0.4, 2.6 * PANEL_HEIGHT),
        sharex="col",
        squeeze=False,
    )
    for column, (case, case_runs) in enumerate(runs.items()):
        style = case_style(case)
        for row, circuit in enumerate(("qk", "ov")):
            _draw_drift_split(axes[row][column], case, case_runs, circuit)
        ax_mu = axes[2][column]
        for circuit, linestyle in (("qk", "-"), ("ov", "--")):
            plot_band(ax_mu, seed_band(case_runs, f"mu_{circuit}"), style["color"], None, linestyle=linestyle)
        axes[0][column].set_title(style["label"], color=style["color"])
        ax_mu.set_xlabel("step")
    for row, label in enumerate(
        (
            r"$\beta_{QK}$ and its parts",
            r"$\beta_{OV}$ and its parts",
            r"$\mu_{QK}$ (solid), $\mu_{OV}$ (dashed)",
        )
    ):
        axes[row][0].set_ylabel(label)
    handles = [
        Line2D([], [], color="black", linestyle="-", label=r"$\beta$ = drift of $I$"),
        Line2D([], [], color="black", linestyle="--", label="first-order part (drift1)"),
        Line2D([], [], color="black", linestyle=":", label="second-order part (drift2)"),
        Line2D(
            [],
            [],
            color=PREDICTION_COLOR,
            linestyle="-",
            linewidth=3,
            alpha=0.6,
            label=r"SGD + wd prediction of drift1: $\|\sum_s -2\eta_s\lambda I_s\|/N_0$",
        ),
        plt.Rectangle(
            (0, 0), 1, 1, color=FLOOR_COLOR, alpha=0.35, label="round-off floor of the run's dtype"
        ),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.06))
    fig.tight_layout()
    paths = save_figure(fig, out_dir, "fig3")
    plt.close(fig)
    return paths


def _draw_drift_split(ax: Axes, case: str, case_runs: list, circuit: str) -> None:
    """β and its exact parts for one case and circuit (log scale); parts at round-off sit on a floor band."""
    style = case_style(case)
    dtype = runs_dtype(case_runs)
    plot_band(ax, seed_band(case_runs, f"beta_{circuit}", positive=True), style["color"], None, linestyle="-")
    floors: dict[str, list[str]] = {dtype: []}
    steps = 1
    for order, linestyle in ((1, "--"), (2, ":")):
        band = seed_band(case_runs, f"drift{order}_{circuit}", positive=True)
        plot_band(ax, band, style["color"], None, linestyle=linestyle)
        if band.empty:
            continue
        # a drift part sums one rounded term per step since its reference: its round-off grows like sqrt(t)
        band_steps = int(band["step"].max())
        if at_round_off(band["max"], dtype, steps=band_steps):
            floors[dtype].append(f"drift{order}")
            steps = max(steps, band_steps)
    prediction = seed_band(case_runs, f"drift1_pred_{circuit}", positive=True)
    if not prediction.empty:  # the prediction from the run's own imbalances (docs/design.md §7)
        ax.plot(
            prediction["step"], prediction["mean"], color=PREDICTION_COLOR, linewidth=3, alpha=0.6, zorder=1
        )
    elif CASES.get(case) is not None and CASES[case].coupled_weight_decay:
        _overlay_sgd_wd_prediction(ax, case_runs, circuit)  # runs without drift columns: the closed form
    draw_floor_bands(ax, floors, steps)
    ax.set_yscale("log")


def _overlay_sgd_wd_prediction(ax: Axes, sgd_wd_runs: list, circuit: str) -> None:
    """Mean over seeds of the predicted β of the SGD + weight-decay runs, dashed.

    The scale ``||I_0|| / N`` is the one training wrote into each run.json; runs trained
    without metrics (scale None, no β logged) have nothing to predict and are left out.
    """
    predictions = []
    for info, metrics in sgd_wd_runs:
        config = info.get("config") or {}
        if info.get("status") == "diverged" or not config.get("weight_decay"):
            continue
        scale = initial_imbalance_scale(info, circuit)
        if scale is None:
            continue
        steps = metrics["step"].to_numpy(dtype=int)
        factor = np.abs(
            sgd_wd_imbalance_factor(steps, lr_schedule(config), float(config["weight_decay"])) - 1.0
        )
        predictions.append(pd.Series(factor * scale, index=steps))
    if not predictions:
        return
    mean = pd.concat(predictions, axis=1).mean(axis=1)
    mean = mean[mean > 0]
    label = r"prediction, SGD + wd: $|\prod_s(1-\eta_s\lambda)^2 - 1|\,\|I_0\|/N$"
    ax.plot(mean.index, mean.to_numpy(), linestyle="--", color=PREDICTION_COLOR, linewidth=1.0, label=label)
    ax.legend(handles=ax.get_lines()[-1:], loc="lower right", fontsize=7)


# ---------------------------------------------------------------------------- figure 4


def figure_sweep(tables_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Figure 4 (E1, E2): final β, mean ρ and final val loss vs lr; slopes annotated, diverged marked."""
    fig = draw_sweep(
        pd.read_csv(Path(tables_dir) / "sweep.csv"), pd.read_csv(Path(tables_dir) / "sweep_slopes.csv")
    )
    paths = save_figure(fig, out_dir, "fig4")
    _pyplot().close(fig)
    return paths


@styled
def draw_sweep(sweep: pd.DataFrame, slopes: pd.DataFrame) -> Figure:
    """Figure 4 from the sweep and slope tables; returns the matplotlib figure."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(2 * PANEL_WIDTH + 0.6, 2 * PANEL_HEIGHT))
    axes = axes.ravel()
    # both circuits' beta carry the O(lr^2) claim (the SGD sweep trains in float64, where beta_QK is data)
    panels = [
        ("beta_qk_final", r"final $\beta_{QK}$", True),
        ("beta_ov_final", r"final $\beta_{OV}$", True),
        ("rho_qk_mean", r"mean $\rho_{QK}$", True),
        ("final_val_loss", "final val loss", False),
    ]
    floors: list[dict[str, list[str]]] = [{dtype: [] for dtype in UNIT_ROUND_OFF} for _ in panels]
    for optimizer, group in sweep.groupby("optimizer", sort=False):
        style = case_style(str(optimizer))
        group = group.sort_values("lr")
        done = group[group["status"] != "diverged"]
        diverged = group[group["status"] == "diverged"]
        listed: pd.Series | list[str] = done["dtype"].dropna().astype(str) if "dtype" in done else []
        dtype = coarsest_dtype([name for value in listed for name in value.split("+")])
        for ax, floor, (column, _, log_y) in zip(axes, floors, panels):
            rounded = log_y and at_round_off(done[column], dtype)
            if rounded:  # round-off: a floor band, no points, no fit
                floor[dtype].append(style["label"])
            else:
                ax.plot(
                    done["lr"],
                    done[column],
                    marker=style["marker"],
                    linestyle=style["linestyle"],
                    color=style["color"],
                    label=style["label"],
                )
            if log_y and not rounded:
                fit = slopes[(slopes["optimizer"] == optimizer) & (slopes["quantity"] == column)]
                if len(fit) and np.isfinite(fit["slope"].iloc[0]):
                    slope, intercept = float(fit["slope"].iloc[0]), float(fit["intercept"].iloc[0])
                    xs = np.array([done["lr"].min(), done["lr"].max()])
                    ax.plot(
                        xs, 10 ** (intercept + slope * np.log10(xs)), ":", color=style["color"], linewidth=1
                    )
                    ax.annotate(
                        f"slope {slope:.2f}",
                        (xs[-1], 10 ** (intercept + slope * np.log10(xs[-1]))),
                        xytext=(-4, 6),
                        textcoords="offset points",
                        ha="right",
                        fontsize=7,
                        color=style["color"],
                    )
            if len(diverged):
                # diverged points have no value: a cross at the top edge, at their lr
                ax.plot(
                    diverged["lr"],
                    np.full(len(diverged), 0.97),
                    "x",
                    color=style["color"],
                    markersize=7,
                    markeredgewidth=1.8,
                    transform=ax.get_xaxis_transform(),
                    clip_on=False,
                    label=f"{style['label']}: diverged",
                )
    for ax, floor, (_, label, log_y) in zip(axes, floors, panels):
        draw_floor_bands(ax, floor)
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(label)
        ax.set_title(label + " vs learning rate")
    _figure_legend(fig, axes[0])
    return fig


# ---------------------------------------------------------------------------- command line


def make_figures(
    tables_dir: str | Path,
    runs_dir: str | Path,
    theory_dir: str | Path,
    out_dir: str | Path,
    listed_runs: list[str] | None = None,
    studies: bool = True,
    intervention_runs: list[str] | None = None,
    identity_runs: list[str] | None = None,
) -> list[Path]:
    """Draw figures 1-4 (and 5 when the study tables exist, 6 with the interventions' runs) into ``out_dir``;
    returns the written paths (the sweep is read from the tables)."""
    for needed in [
        Path(tables_dir) / "sweep.csv",
        Path(theory_dir) / "counts.csv",
        Path(theory_dir) / "nullity.csv",
    ]:
        if not needed.is_file():
            raise UserError(
                f"{needed} not found; run 'attnid tables' and 'attnid counts'/'attnid verify' first "
                f"(or simply snakemake --cores all)"
            )
    runs = load_runs_by_case(runs_dir, listed_runs)
    if not runs:
        raise UserError(f"no runs (run.json) under {runs_dir}; run the training jobs first")
    paths = figure_identification(theory_dir, out_dir)
    paths += figure_training(runs, out_dir)
    paths += figure_conservation(runs, out_dir)
    paths += figure_sweep(tables_dir, out_dir)
    if studies and any(
        (Path(tables_dir) / f"{study}.csv").is_file() for study in STUDIES
    ):  # a config with the studies
        paths += figure_identification_study(tables_dir, out_dir)
    if intervention_runs:
        from attnid.reports.interventions_table import load_runs_by_arm
        from attnid.training.rundir import find_run_dirs, load_run

        identity = [load_run(run_dir) for run_dir in find_run_dirs(None, identity_runs or [])]
        paths += figure_interventions(load_runs_by_arm(None, intervention_runs), identity, out_dir)
    return paths


# ---------------------------------------------------------------------------- figure 5

VARIANT_COLORS = ("#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999")
HEADS_COLOR, MATCHED_COLOR = "#0072B2", "#000000"


def figure_identification_study(tables_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Figure 5 (does identification buy anything?): from heads.csv and variants.csv (``attnid studies``)."""
    frames = {}
    for study in STUDIES:
        path = Path(tables_dir) / f"{study}.csv"
        if path.is_file():
            frames[study] = pd.read_csv(path)
    if not frames:
        raise UserError(
            f"neither {' nor '.join(f'{study}.csv' for study in STUDIES)} in {tables_dir}; "
            f"run 'attnid studies' first"
        )
    fig = draw_identification_study(frames.get("heads"), frames.get("variants"))
    paths = save_figure(fig, out_dir, "fig5")
    _pyplot().close(fig)
    return paths


def _study_series(heads: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The head sweep (the points at the most common embedding, by identified fraction) and the
    labelled extra points (the matched single head, at its own embedding)."""

    if heads is None or heads.empty:
        return pd.DataFrame(), pd.DataFrame()
    sweep = head_sweep(heads)
    return heads[sweep].sort_values("identified_fraction"), heads[~sweep]


@styled
def draw_identification_study(heads: pd.DataFrame | None, variants: pd.DataFrame | None) -> Figure:
    """Figure 5 from the study tables: (a) the closed-form identified fraction ``1 - 1/(2H)`` of MHA
    against ``H`` (T3) with every trained point at its own closed form; (b) final val loss and (c) mean ρ
    against the identified fraction: the head sweep as one series (band: ± the seeds' sample sd, a spread),
    the matched single head and the variants as labelled points with bars of the same spread. (c) also
    draws ``ρ = 1 - f``,
    the unidentified share of a step that is isotropic in the attention parameters."""
    plt = _pyplot()
    series, extras = _study_series(heads)
    labelled = [(row, MATCHED_COLOR, "s") for _, row in extras.iterrows()]
    if variants is not None:
        labelled += [
            (row, VARIANT_COLORS[i % len(VARIANT_COLORS)], "D")
            for i, (_, row) in enumerate(variants.iterrows())
        ]
    fig, axes = plt.subplots(1, 3, figsize=(3 * PANEL_WIDTH, 1.1 * PANEL_HEIGHT))
    _draw_fraction_panel(axes[0], series, labelled)
    panels = [
        (axes[1], "final_val_loss", "final val loss", False),
        (axes[2], "rho_qk_mean", r"mean $\rho$", True),
    ]
    for ax, column, ylabel, log_y in panels:
        if not series.empty:
            _draw_series(ax, series, column, HEADS_COLOR, "head sweep $H$ (at $E$, $D = E/H$)")
            if log_y:
                _draw_series(
                    ax,
                    series,
                    "rho_ov_mean",
                    HEADS_COLOR,
                    r"head sweep, $\rho_{OV}$ (right)",
                    linestyle="--",
                    hollow=True,
                )
        for row, color, marker in labelled:
            _draw_point(ax, row, column, color, marker, label=_point_label(row))
            if log_y:
                _draw_point(ax, row, "rho_ov_mean", color, marker, hollow=True)
        ax.set_xlabel(r"identified fraction $f_\mathrm{id}$ (closed form)")
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
    fractions = np.linspace(0.45, 1.0, 50)
    axes[2].plot(
        fractions,
        1.0 - fractions,
        ":",
        color=PREDICTION_COLOR,
        linewidth=1.0,
        label=r"$1 - f_\mathrm{id}$ (isotropic step)",
    )
    axes[1].set_title("val loss vs identified fraction")
    axes[2].set_title(r"$\rho$ vs identified fraction (filled: QK, hollow: OV)")
    _figure_legend(fig, axes[2], ncol=4)
    return fig


def spread_positions(values: list[float], min_gap: float) -> list[float]:
    """Positions for labels of sorted ``values``: in the same order, at least ``min_gap`` apart, as close to
    the values as that allows (pushed apart upwards, then the block re-centred on the values' mean)."""
    positions: list[float] = []
    for value in values:
        positions.append(value if not positions else max(value, positions[-1] + min_gap))
    shift = (sum(values) - sum(positions)) / len(values) if values else 0.0
    return [position + shift for position in positions]


def _point_label(row) -> str:
    return f"{row['point']}: {row['label']}" + (f", E={int(row['n_embd'])}" if "n_embd" in row else "")


def _draw_fraction_panel(ax: Axes, series: pd.DataFrame, labelled: list) -> None:
    trained = [int(h) for h in series.get("n_head", [])] + [int(row["n_head"]) for row, _, _ in labelled]
    heads = np.geomspace(1, max([2] + trained), 60)
    ax.plot(heads, 1.0 - 1.0 / (2.0 * heads), color=PREDICTION_COLOR, label=r"MHA: $1 - 1/(2H)$")
    if not series.empty:
        ax.plot(series["n_head"], series["identified_fraction"], "o", color=HEADS_COLOR)
    for row, color, marker in labelled:
        ax.plot(row["n_head"], row["identified_fraction"], marker, color=color, markerfacecolor="none")
    ax.set_xscale("log", base=2)
    ax.autoscale_view()
    low, high = ax.get_ylim()
    # the labels of points at one head count (the variants all sit at the model's H) stacked in a column
    # right of them, at least a label's height apart, each tied to its point by a thin line
    by_heads: dict[int, list] = {}
    for row, color, _ in labelled:
        by_heads.setdefault(int(row["n_head"]), []).append(
            (float(row["identified_fraction"]), row["point"], color)
        )
    for n_head, points in by_heads.items():
        points.sort()
        label_ys = spread_positions([y for y, _, _ in points], min_gap=0.045 * (high - low))
        for (y, name, color), label_y in zip(points, label_ys):
            ax.annotate(
                name,
                (n_head, y),
                xytext=(14, label_y),
                textcoords=("offset points", "data"),
                fontsize=6,
                color=color,
                va="center",
                arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.5, "shrinkA": 0, "shrinkB": 3},
            )
    ax.set_xlabel("query heads $H$")
    ax.set_ylabel(r"identified fraction $f_\mathrm{id}$")
    ax.set_title("closed form, every trained shape")


def _draw_series(
    ax: Axes,
    series: pd.DataFrame,
    column: str,
    color: str,
    label: str,
    linestyle: str = "-",
    hollow: bool = False,
) -> None:
    x = series["identified_fraction"].to_numpy(dtype=float)
    mean = series[f"{column}_mean"].to_numpy(dtype=float)
    sd = np.nan_to_num(series[f"{column}_sd"].to_numpy(dtype=float))
    ax.plot(
        x,
        mean,
        marker="o",
        linestyle=linestyle,
        color=color,
        label=label,
        markerfacecolor="none" if hollow else color,
    )
    ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=BAND_ALPHA, linewidth=0)
    for index, (xi, yi, name) in enumerate(zip(x, mean, series["n_head"])):
        if np.isfinite(yi) and not hollow:  # above and below in turn: neighbours at large H sit close
            ax.annotate(
                f"H={int(name)}",
                (xi, yi),
                xytext=(0, 5 if index % 2 == 0 else -5),
                textcoords="offset points",
                fontsize=6,
                color=color,
                ha="center",
                va="bottom" if index % 2 == 0 else "top",
            )


def _draw_point(
    ax: Axes, row, column: str, color: str, marker: str, label: str | None = None, hollow: bool = False
) -> None:
    mean, sd = float(row[f"{column}_mean"]), float(row[f"{column}_sd"])
    if not np.isfinite(mean):
        return
    ax.errorbar(
        [row["identified_fraction"]],
        [mean],
        yerr=[[sd] if np.isfinite(sd) else [0.0]] * 2,
        fmt=marker,
        color=color,
        markerfacecolor="none" if hollow else color,
        capsize=2,
        label=label,
        elinewidth=0.8,
    )


# ---------------------------------------------------------------------------- figure 6

# A caption attnid figures filled in (Figure 6's): an earlier build's may be replaced, nothing else.
FILLED_CAPTION = outputs.Format(
    "a figure caption written by attnid figures", outputs.starts_with(b"**Figure 6 ")
)
# The arms' style in Figure 6: the case's; an arm with transported or reset moments its case's colour,
# dotted (docs/design.md §15).
MOVED_MOMENTS_LINESTYLE = ":"


def arm_style(arm: str, case: str) -> dict:
    """color, label, linestyle and marker of an interventions arm: its case's (and
    :data:`MOVED_MOMENTS_LINESTYLE` for moved moments)."""
    style = dict(case_style(case))
    if arm != case:
        moments = arm.removeprefix(case + "_")
        style.update(linestyle=MOVED_MOMENTS_LINESTYLE, label=f"{style['label']}, {moments}")
    return style


def paired_eval_differences(arm_runs: list, baseline_runs: list) -> pd.DataFrame:
    """Per evaluated step logged by every seed pair: the mean over seeds of ``arm - baseline`` val loss with
    its 95 % bootstrap CI (:func:`attnid.reports.statistics.mean_confidence_interval`, docs/design.md §11.1);
    columns ``step, n_seeds, mean, low, high``. Diverged runs are left out, as in the interventions table."""
    from attnid.reports.interventions_table import eval_rows
    from attnid.reports.statistics import MIN_PAIRED_SEEDS, mean_confidence_interval

    def by_seed(runs):
        return {
            int(info["seed"]): eval_rows(metrics).set_index("step")["val_loss"]
            for info, metrics in runs
            if info.get("status") != "diverged" and info.get("seed") is not None
        }

    arm, baseline = by_seed(arm_runs), by_seed(baseline_runs)
    seeds = sorted(set(arm) & set(baseline))
    rows = []
    if not seeds:
        return pd.DataFrame(columns=["step", "n_seeds", "mean", "low", "high"])
    steps = sorted(set.intersection(*(set(arm[s].index) & set(baseline[s].index) for s in seeds)))
    for step in steps:
        differences = np.array([arm[s][step] - baseline[s][step] for s in seeds])
        enough = len(seeds) >= MIN_PAIRED_SEEDS
        low, high = mean_confidence_interval(differences) if enough else (math.nan, math.nan)
        rows.append(
            {"step": step, "n_seeds": len(seeds), "mean": float(differences.mean()), "low": low, "high": high}
        )
    return pd.DataFrame(rows)


def _max_of(runs: list, columns: list[str]) -> float:
    values = [
        pd.to_numeric(metrics[c], errors="coerce").abs().max()
        for _, metrics in runs
        for c in columns
        if c in metrics
    ]
    values = [v for v in values if pd.notna(v)]
    return float(max(values)) if values else math.nan


def _drift_ratio_max(runs: list) -> float:
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


def _draw_orbit_panel(ax: Axes, column: str, series: list[tuple[str, dict, list]]) -> None:
    """One circuit-pair quantity (ρ or drift1) of each run group, both circuits (QK solid, OV dashed), on
    a log axis; a group at its precision's round-off is a labelled floor band, never data (design §13)."""
    # dtype -> (labels, steps summed)
    floors: dict[str, tuple[list[str], int]] = {dtype: ([], 1) for dtype in UNIT_ROUND_OFF}
    for label, style, runs in series:
        dtype = runs_dtype(runs)
        for circuit, linestyle in (("qk", "-"), ("ov", "--")):
            band = seed_band(runs, f"{column}_{circuit}", positive=True)
            if band.empty:
                continue
            # a drift sums one rounded term per step: its round-off grows like sqrt(steps) (Figure 3)
            band_steps = int(band["step"].max()) if column.startswith("drift") else 1
            if at_round_off(seed_band(runs, f"{column}_{circuit}")["max"], dtype, steps=band_steps):
                labels, steps = floors[dtype]
                floors[dtype] = (labels + [label], max(steps, band_steps))
                continue
            plot_band(ax, band, style["color"], label if circuit == "qk" else None, linestyle=linestyle)
    for dtype, (labels, steps) in floors.items():
        draw_floor_bands(ax, {dtype: labels}, steps)
    ax.set_yscale("log")


@styled
def figure_interventions(
    arm_runs: dict, identity_runs: list, out_dir: str | Path, caption_template: str | Path | None = None
) -> list[Path]:
    """Figure 6 (does identification change training?): per arm, its val loss minus ``adamw``'s of the same
    seed against the step, mean over seeds with a 95 % bootstrap CI band; ρ and the first-order drift of the
    projected arm (float32, and the float64 identity run) on their round-off floors beside ``adamw``'s.

    ``arm_runs`` is :func:`attnid.reports.interventions_table.load_runs_by_arm`'s {arm: runs} (with the
    baseline). The caption is the package's ``captions/fig6.rst`` template filled with this build's numbers
    (the interventions table's final-val-loss rows, the identities' residuals) and written as ``fig6.rst``
    next to the figure: the appendix and the Snakemake report show that one.
    """
    from attnid.reports.interventions_table import BASELINE_CASE, interventions_table

    if BASELINE_CASE not in arm_runs:
        raise UserError(f"Figure 6 needs the {BASELINE_CASE} runs of the interventions")
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(3 * PANEL_WIDTH, PANEL_HEIGHT))
    baseline = arm_runs[BASELINE_CASE]
    axes[0].axhline(0.0, color=PREDICTION_COLOR, linewidth=0.8)
    for arm, runs in arm_runs.items():
        if arm == BASELINE_CASE:
            continue
        style = arm_style(arm, str(runs[0][0].get("case")))
        differences = paired_eval_differences(runs, baseline).dropna(subset=["mean"])
        if differences.empty:
            continue
        axes[0].plot(
            differences["step"],
            differences["mean"],
            color=style["color"],
            label=style["label"],
            linestyle=style["linestyle"],
            marker=style["marker"],
            markersize=3,
        )
        axes[0].fill_between(
            differences["step"],
            differences["low"],
            differences["high"],
            color=style["color"],
            alpha=BAND_ALPHA,
            linewidth=0,
        )
    axes[0].set_xlabel("step")
    axes[0].set_ylabel(f"val loss minus {BASELINE_CASE}'s (same seed)")
    axes[0].set_title("val loss against adamw (95 % CI)")
    projected = arm_runs.get("adamw_projected", [])
    adamw_style = case_style(BASELINE_CASE)
    projected_style = case_style("adamw_projected")
    series = [
        (adamw_style["label"], adamw_style, baseline),
        (f"{projected_style['label']} ({runs_dtype(projected)})", projected_style, projected),
        (
            f"{projected_style['label']} ({runs_dtype(identity_runs)})",
            projected_style | {"linestyle": "-."},
            identity_runs,
        ),
    ]
    series = [entry for entry in series if entry[2]]
    for ax, column, label in ((axes[1], "rho", r"$\rho$"), (axes[2], "drift1", r"$\|D_1\|/N_0$")):
        _draw_orbit_panel(ax, column, series)
        ax.set_xlabel("step")
        ax.set_ylabel(label + " (QK solid, OV dashed)")
    axes[1].set_title(r"unidentified share $\rho$ of a step")
    axes[2].set_title("first-order drift of the imbalance")
    _figure_legend(fig, axes[0], ncol=4)
    paths = save_figure(fig, out_dir, "fig6")
    plt.close(fig)

    table, _ = interventions_table(arm_runs)
    final = [
        row | {"label": arm_style(row["arm"], str(arm_runs[row["arm"]][0][0].get("case")))["label"]}
        for row in table[table["metric"] == "final_val_loss"].to_dict("records")
    ]
    numbers = {
        "n_seeds": int(table["n_seeds"].max()) if len(table) else 0,
        "final": final,
        "identity_steps": max((int(m["step"].max()) for _, m in identity_runs), default=0),
        "identity_rho_max": _max_of(identity_runs, ["rho_qk", "rho_ov"]),
        "identity_drift_ratio_max": _drift_ratio_max(identity_runs),
        "projected_rho_max": _max_of(projected, ["rho_qk", "rho_ov"]),
        "projected_dtype": runs_dtype(projected) if projected else "float32",
        "adamw_rho_mean": float(
            np.nanmean(
                [pd.to_numeric(m["rho_qk"], errors="coerce").mean() for _, m in baseline if "rho_qk" in m]
                or [math.nan]
            )
        ),
    }
    caption_path = Path(out_dir) / "fig6.rst"
    write_text_atomic(caption_path, interventions_caption(numbers, caption_template), FILLED_CAPTION)
    return paths + [caption_path]


def interventions_caption(numbers: dict, template_path: str | Path | None = None) -> str:
    """Figure 6's caption: the package's ``captions/fig6.rst`` (a jinja2 template) filled with ``numbers``
    (``n_seeds``; ``final``, the interventions table's final-val-loss rows with a ``label``; the identity
    run's
    ``identity_steps``, ``identity_rho_max``, ``identity_drift_ratio_max``; ``projected_rho_max``,
    ``projected_dtype`` and ``adamw_rho_mean``)."""
    from jinja2 import StrictUndefined, Template

    from attnid.reports.latex import caption_file

    template = Path(template_path or caption_file("fig6")).read_text(encoding="utf-8")
    return Template(
        template, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    ).render(**numbers, fmt=_caption_number)


def _caption_number(value: float, digits: int = 2) -> str:
    """A number for a caption: ``g`` format, NaN as "n/a" (e.g. no run of that kind)."""
    if value is None or not math.isfinite(float(value)):
        return "n/a"
    return f"{float(value):.{digits}g}"
