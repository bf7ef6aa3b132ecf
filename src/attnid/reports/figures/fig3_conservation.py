"""Figure 3, the conserved imbalance split into its first- and second-order parts (claims E1-E3): per case
(columns), β_QK and β_OV split exactly into drift1 + drift2 (docs/design.md §7), with the SGD + weight-decay
prediction overlaid on the first-order part; rebalancing shows as a sawtooth; μ per case below."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from attnid.reports.figures.inputs import RUN_FILES, Drawing, Sources
from attnid.reports.figures.series import FLOOR_MARKER, Floors, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import (
    FLOOR_COLOR,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PREDICTION_COLOR,
    case_style,
    keep_texts_inside,
    pyplot,
)
from attnid.reports.round_off import at_round_off
from attnid.training.cases import CASES
from attnid.training.rundir import initial_imbalance_scale

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INPUTS = {"runs": RUN_FILES}
CAPTION = r"""**Figure 3 — the conserved imbalance split into its first- and second-order parts (claims
E1–E3).** One column per case. Top two rows: :math:`\beta`, the drift of :math:`I = A A^\top - B B^\top`
from its reference (thick pale line), and its exact split :math:`I_t - I_\mathrm{ref} = D_1 + D_2` into the
first-order part :math:`\|D_1\|/N_0` (dashed) and the second-order part :math:`\|D_2\|/N_0` (dotted),
for the query-key and the output-value pairs (log scale); where a part equals :math:`\beta` it runs
inside the pale line. Plain SGD's first-order part is zero up to float64 round-off: it lies on the
floor of the grey band (a triangle: at or below), its largest value written there; its whole drift is
second order. For SGD + weight decay the grey circles are the prediction
:math:`\|\sum_s -2\eta_s\lambda I_s\|/N_0` from the run's own imbalances, on its first-order part.
AdamW's drift is first order. Rebalancing resets :math:`\beta` to :math:`\approx 0` (sawtooth). Bottom:
:math:`\mu`, the weight norm in excess of the minimum-norm point of each symmetry orbit (filled circles:
query-key, hollow: output-value). Lines are means over seeds, bands the range over seeds.
"""


# One look per quantity in every panel (a line style means one thing): β is a thick pale line under its
# parts, so that a part equal to it never hides it; drift1 dashed, drift2 dotted; the SGD + weight-decay
# prediction of drift1 grey circles on it; μ a plain line, filled circles for QK and hollow ones for OV.
BETA_LINE: dict[str, Any] = {"linestyle": "-", "linewidth": 3.2, "alpha": 0.4, "zorder": 1}
PART_LINESTYLES: dict[int, Any] = {1: "--", 2: ":"}
PREDICTION_MARKERS: dict[str, Any] = {
    "marker": "o",
    "linestyle": "none",
    "markersize": 4,
    "markerfacecolor": "none",
}
MU_MARKERS: dict[str, dict[str, Any]] = {
    "qk": {"marker": "o"},
    "ov": {"marker": "o", "markerfacecolor": "white"},
}
MARKED_POINTS = 8  # markers on about this many points of a line


def draw(sources: Sources) -> Drawing:
    """Figure 3 from the case runs."""
    runs = sources.case_runs()
    n_cases = max(len(runs), 1)
    fig, axes = pyplot().subplots(
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
        for circuit, markers in MU_MARKERS.items():
            band = seed_band(case_runs, f"mu_{circuit}")
            plot_band(ax_mu, band, style["color"], None, linestyle="-", markevery=_every(band), **markers)
        axes[0][column].set_title(style["label"], color=style["color"])
        ax_mu.set_xlabel("step")
    for row, label in enumerate(
        (
            r"$\beta_{QK}$ and its parts",
            r"$\beta_{OV}$ and its parts",
            r"$\mu_{QK}$ (filled), $\mu_{OV}$ (hollow)",
        )
    ):
        axes[row][0].set_ylabel(label)
    fig.legend(handles=_legend_handles(), loc="upper center", ncol=3, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout()
    keep_texts_inside(fig)
    return Drawing(fig, {})


def _every(band: pd.DataFrame) -> int:
    return max(1, len(band) // MARKED_POINTS)


def _legend_handles() -> list:
    # lazy: matplotlib, which reading the figure registry (the workflow, --help) does not load
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Line2D([], [], color="black", label=r"$\beta$ = drift of $I$", **BETA_LINE),
        Line2D([], [], color="black", linestyle=PART_LINESTYLES[1], label="first-order part (drift1)"),
        Line2D([], [], color="black", linestyle=PART_LINESTYLES[2], label="second-order part (drift2)"),
        Line2D(
            [],
            [],
            color=PREDICTION_COLOR,
            label=r"SGD + wd prediction of drift1: $\|\sum_s -2\eta_s\lambda I_s\|/N_0$",
            **PREDICTION_MARKERS,
        ),
        Patch(color=FLOOR_COLOR, alpha=0.35, label="round-off floor of the run's dtype"),
        Line2D(
            [], [], color="black", marker=FLOOR_MARKER, linestyle="none", label="on the floor: at or below"
        ),
        Line2D([], [], color="black", label=r"$\mu_{QK}$ (filled), $\mu_{OV}$ (hollow)", **MU_MARKERS["qk"]),
    ]


def _draw_drift_split(ax: Axes, case: str, case_runs: list, circuit: str) -> None:
    """β and its exact parts for one case and circuit (log scale); a part at round-off lies on its floor."""
    style = case_style(case)
    dtype = runs_dtype(case_runs)
    plot_band(ax, seed_band(case_runs, f"beta_{circuit}", positive=True), style["color"], None, **BETA_LINE)
    floors = Floors(ax)
    for order, linestyle in PART_LINESTYLES.items():
        band = seed_band(case_runs, f"drift{order}_{circuit}", positive=True)
        if band.empty:
            continue
        # a drift part sums one rounded term per step since its reference: its round-off grows like sqrt(t)
        band_steps = int(band["step"].max())
        if at_round_off(band["max"], dtype, steps=band_steps):
            floors.draw(
                band["step"],
                band["max"],
                dtype,
                f"drift{order}",
                band_steps,
                color=style["color"],
                linestyle=linestyle,
                zorder=3,
            )
        else:
            plot_band(ax, band, style["color"], None, linestyle=linestyle, zorder=3)
    prediction = seed_band(case_runs, f"drift1_pred_{circuit}", positive=True)
    if not prediction.empty:  # the prediction from the run's own imbalances (docs/design.md §7)
        ax.plot(
            prediction["step"],
            prediction["mean"],
            color=PREDICTION_COLOR,
            markevery=_every(prediction),
            zorder=4,
            **PREDICTION_MARKERS,
        )
    elif CASES.get(case) is not None and CASES[case].coupled_weight_decay:
        overlay_sgd_wd_prediction(ax, case_runs, circuit)  # runs without drift columns: the closed form
    floors.finish()
    ax.set_yscale("log")


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
    # lazy: torch (training.loop's top), which drawing the figures from the logs runs without
    from attnid.training.loop import get_lr

    cfg = SimpleNamespace(**config)
    return lambda step: get_lr(step, cfg)


def overlay_sgd_wd_prediction(ax: Axes, sgd_wd_runs: list, circuit: str) -> None:
    """Mean over seeds of the predicted β of the SGD + weight-decay runs, as grey circles.

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
    ax.plot(mean.index, mean.to_numpy(), color=PREDICTION_COLOR, label=label, **PREDICTION_MARKERS)
    ax.legend(handles=ax.get_lines()[-1:], loc="lower right", fontsize=7)
