"""Figure 7, the orbit as a quantization tool (docs/quantization.md): for each model the quantization stage
studied, (a) the kurtosis of every linear layer's inputs, per site and layer, at each point of the orbit
(what a rotation changes, visible on a model without outliers too), and (b) the KL of the quantized model
from the float one per setting (bit width and what is rounded) at each point, log scale; the same function
at every point."""

from __future__ import annotations

import math

import pandas as pd

from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, figure_legend, pyplot
from attnid.reports.quantization_table import (
    GAUSSIAN_KURTOSIS,
    OUTLIER_KURTOSIS,
    R1_PICKED,
    SHIPPED,
    SITE_NAMES,
    SMOLLM2,
    largest_kurtosis,
)

INPUTS = {"tables": ("quantization.csv", "quantization_activations.csv")}
STAGE = "quantization"
CAPTION = r"""**Figure 7 — the orbit as a quantization tool.** For each model of the quantization stage
({{ models }}), at each point of the model's symmetry orbit: as shipped, its norms fused, a residual
rotation R1, R1 picked on calibration text, R1 with a random per-head R2, R1 with attnid's optimized
output-value move, and with the query-key move and channel scales as well. (a) The Pearson kurtosis of each
linear layer's inputs on held-out text, per layer, at the query/key/value, output, MLP and down projections
(log scale where it spans a decade; a Gaussian's is 3, dotted; the points a little aside): what a move
changes. (b) The mean KL divergence (nats per token, log scale) of the quantized model's next-token
distribution from the float model's on held-out text, per simulated round-to-nearest setting (``W``:
weights, ``A``: linear-layer inputs, ``KV``/``V``: the cache; the number is the bit width); lower is better.
Every point computes the same function (largest spread of the float loss over the points: {{
value(float_spread) }}).
{%- if smollm2 %} SmolLM2's q/k/v and MLP inputs have a largest kurtosis of {{ fmt(smollm2_shipped, 3) }}
as shipped and {{ fmt(smollm2_r1, 3) }} after R1 (picked).{% endif %}
{%- if no_outliers %} The build's own checkpoints have no outliers to remove: their q/k/v and MLP inputs'
kurtosis is at most {{ fmt(build_largest, 3) }} at every orbit point (outliers: above {{ fmt(outlier) }}).
{%- elif build_largest is not none %} The build's own checkpoints have outliers: their q/k/v and MLP
inputs' largest kurtosis is {{ fmt(build_shipped, 3) }} as shipped and {{ fmt(build_r1, 3) }} after R1
(picked).
{%- endif %}
"""


def _kurtosis_panels(fig, cell, model: str, activations: pd.DataFrame, points: list[str], colours) -> list:
    """One small panel per site of ``activations`` (one model's): kurtosis against layer, a line per point
    (each a little aside, so that equal values stay visible); each panel on its own scale, log where it
    spans a decade, so that a spread of 2.9 to 3.1 shows as well as one of 3 to 400."""
    sites = [site for site in SITE_NAMES if site in set(activations["site"])]
    inner = cell.subgridspec(1, max(1, len(sites)))
    axes = []
    aside = 0.5 / max(1, len(points))
    for index, site in enumerate(sites):
        ax = fig.add_subplot(inner[0, index])
        mine = activations[activations["site"] == site]
        for number, point in enumerate(points):
            at = mine[mine["point"] == point].sort_values("layer")
            if at.empty:
                continue
            ax.plot(
                at["layer"] + (number - (len(points) - 1) / 2) * aside,
                at["kurtosis"],
                marker="os^vDPX"[number % 7],
                markersize=3.5,
                linewidth=1.0,
                color=colours(number / max(1, len(points) - 1)),
                label=point,
            )
        ax.axhline(GAUSSIAN_KURTOSIS, color="#777777", linestyle=":", linewidth=1.0, label="Gaussian (3)")
        low, high = float(mine["kurtosis"].min()), float(mine["kurtosis"].max())
        if low > 0 and high / low > 10:
            ax.set_yscale("log")
        ax.set_xlim(mine["layer"].min() - 0.5, mine["layer"].max() + 0.5)
        layers = sorted(set(mine["layer"]))
        if len(layers) <= 4:
            ax.set_xticks(layers)
        else:
            ax.locator_params(axis="x", integer=True, nbins=4)
        ax.set_title(SITE_NAMES[site], fontsize="small")
        ax.set_xlabel("layer", fontsize="small")
        ax.tick_params(labelsize="x-small")
        if index == 0:
            ax.set_ylabel(f"{model}\n(a) input kurtosis")
        axes.append(ax)
    return axes


def _kl_panel(ax, quantized: pd.DataFrame, settings: list[str], points: list[str], colours) -> None:
    width = 0.8 / max(1, len(points))
    for index, point in enumerate(points):
        values = []
        for setting in settings:
            hit = quantized[(quantized["point"] == point) & (quantized["setting"] == setting)]["kl"]
            values.append(float(hit.iloc[0]) if len(hit) else math.nan)
        shown = [max(v, 1e-9) if math.isfinite(v) else math.nan for v in values]
        positions = [i + (index - (len(points) - 1) / 2) * width for i in range(len(settings))]
        ax.bar(positions, shown, width, color=colours(index / max(1, len(points) - 1)), label=point)
    ax.set_yscale("log")
    ax.set_xticks(range(len(settings)))
    ax.set_xticklabels(settings, rotation=45, ha="right")
    ax.set_ylabel("(b) KL(float || quantized),\nnats per token")


def outlier_numbers(activations: pd.DataFrame) -> dict:
    """The caption's numbers: SmolLM2's largest q/k/v and MLP input kurtosis as shipped and after R1
    (picked), and the build's own checkpoints' (the largest over them: at any point, as shipped, after R1),
    with whether they have no outliers (:data:`OUTLIER_KURTOSIS`) at any point."""
    numbers: dict = {"smollm2": SMOLLM2 in set(activations["model"]), "outlier": OUTLIER_KURTOSIS}
    if numbers["smollm2"]:
        smollm2 = activations[activations["model"] == SMOLLM2]
        numbers["smollm2_shipped"] = largest_kurtosis(smollm2, SHIPPED)
        numbers["smollm2_r1"] = largest_kurtosis(smollm2, R1_PICKED)
    build = activations[activations["model"] != SMOLLM2]
    largest = largest_kurtosis(build)
    numbers["build_largest"] = largest if math.isfinite(largest) else None
    numbers["no_outliers"] = math.isfinite(largest) and largest <= OUTLIER_KURTOSIS
    numbers["build_shipped"] = largest_kurtosis(build, SHIPPED)
    numbers["build_r1"] = largest_kurtosis(build, R1_PICKED)
    return numbers


def draw(sources: Sources) -> Drawing:
    """Figure 7 from quantization.csv and quantization_activations.csv."""
    rows = pd.read_csv(sources.file("tables", "quantization.csv"))
    activations = pd.read_csv(sources.file("tables", "quantization_activations.csv"))
    models = list(dict.fromkeys(rows["model"]))
    plt = pyplot()
    fig = plt.figure(figsize=(1.9 * PANEL_WIDTH * len(models), 2.1 * PANEL_HEIGHT), layout="constrained")
    grid = fig.add_gridspec(2, len(models), height_ratios=(1, 1.25))
    quantized = rows[rows["setting"] != "float"]
    settings = list(dict.fromkeys(quantized["setting"]))
    points = list(dict.fromkeys(quantized["point"]))
    colours = plt.get_cmap("viridis")
    bars = []
    for column, model in enumerate(models):
        mine = activations[activations["model"] == model]
        _kurtosis_panels(fig, grid[0, column], model, mine, points, colours)
        ax = fig.add_subplot(grid[1, column])
        _kl_panel(ax, quantized[quantized["model"] == model], settings, points, colours)
        ax.set_title(f"{model}: quantized", fontsize="small")
        bars.append(ax)
    figure_legend(fig, bars[0])
    floats = rows[rows["setting"] == "float"]
    spread = float(floats.groupby("model")["loss"].agg(lambda x: x.max() - x.min()).max())
    return Drawing(fig, {"models": ", ".join(models), "float_spread": spread, **outlier_numbers(activations)})
