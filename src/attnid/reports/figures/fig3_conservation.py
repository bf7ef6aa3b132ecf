"""Figure 3, the conserved imbalance split into its first- and second-order parts (claims E1-E3): per case
(columns), β_QK and β_OV split exactly into drift1 + drift2 (docs/design.md §7), with the SGD + weight-decay
prediction overlaid on the first-order part; rebalancing shows as a sawtooth; μ per case below."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from attnid.reports.figures.inputs import RUN_FILES, Drawing, Sources
from attnid.reports.figures.series import draw_floor_bands, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import (
    FLOOR_COLOR,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    PREDICTION_COLOR,
    case_style,
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
from its reference (solid), and its exact split :math:`I_t - I_\mathrm{ref} = D_1 + D_2` into the
first-order part :math:`\|D_1\|/N_0` (dashed) and the second-order part :math:`\|D_2\|/N_0` (dotted),
for the query-key and the output-value pairs (log scale). Plain SGD's first-order part is zero up to
float64 round-off (grey floor band): its whole drift is second order. For SGD + weight decay the thick
grey line is the prediction :math:`\|\sum_s -2\eta_s\lambda I_s\|/N_0` from the run's own imbalances, on
top of its first-order part. AdamW's drift is first order. Rebalancing resets :math:`\beta` to
:math:`\approx 0` (sawtooth). Bottom: :math:`\mu`, the weight norm in excess of the minimum-norm point
of each symmetry orbit. Lines are means over seeds, bands the range over seeds.
"""


def draw(sources: Sources) -> Drawing:
    """Figure 3 from the case runs."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    runs = sources.case_runs()
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
    return Drawing(fig, {})


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
        overlay_sgd_wd_prediction(ax, case_runs, circuit)  # runs without drift columns: the closed form
    draw_floor_bands(ax, floors, steps)
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
    from types import SimpleNamespace

    from attnid.training.loop import get_lr

    cfg = SimpleNamespace(**config)
    return lambda step: get_lr(step, cfg)


def overlay_sgd_wd_prediction(ax: Axes, sgd_wd_runs: list, circuit: str) -> None:
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
