"""Figure 7, the orbit as a quantization tool (docs/quantization.md): for each model the quantization stage
studied, the KL of the quantized model from the float one per setting (bit width and what is rounded), at
each point of the orbit, log scale; the same function at every point."""

from __future__ import annotations

import math

import pandas as pd

from attnid.reports.figures.inputs import Drawing, Sources
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, figure_legend, keep_texts_inside, pyplot

INPUTS = {"tables": ("quantization.csv",)}
STAGE = "quantization"
CAPTION = r"""**Figure 7 — the orbit as a quantization tool.** For each model of the quantization stage
({{ models }}), the mean KL divergence (nats per token, log scale) of the quantized model's next-token
distribution from the float model's on held-out text, per simulated round-to-nearest setting (``W``:
weights, ``A``: linear-layer inputs, ``KV``/``V``: the cache; the number is the bit width), at each
point of the model's symmetry orbit: as shipped, its norms fused, a residual rotation R1, R1 picked on
calibration text, R1 with a random per-head R2, R1 with attnid's optimized output-value move, and with the
query-key move and channel scales as well. Every point computes the same function (largest spread of the
float loss over the points: {{ value(float_spread) }}). Lower is better.
"""


def draw(sources: Sources) -> Drawing:
    """Figure 7 from quantization.csv."""
    rows = pd.read_csv(sources.file("tables", "quantization.csv"))
    models = list(dict.fromkeys(rows["model"]))
    fig, axes = pyplot().subplots(
        1, len(models), figsize=(1.6 * PANEL_WIDTH * len(models), 1.2 * PANEL_HEIGHT)
    )
    axes = [axes] if len(models) == 1 else list(axes)
    quantized = rows[rows["setting"] != "float"]
    settings = list(dict.fromkeys(quantized["setting"]))
    points = list(dict.fromkeys(quantized["point"]))
    width = 0.8 / max(1, len(points))
    colours = pyplot().get_cmap("viridis")
    for ax, model in zip(axes, models):
        mine = quantized[quantized["model"] == model]
        for index, point in enumerate(points):
            values = [
                float(mine[(mine["point"] == point) & (mine["setting"] == s)]["kl"].iloc[0])
                if len(mine[(mine["point"] == point) & (mine["setting"] == s)])
                else math.nan
                for s in settings
            ]
            shown = [max(v, 1e-9) if math.isfinite(v) else math.nan for v in values]
            positions = [i + (index - (len(points) - 1) / 2) * width for i in range(len(settings))]
            ax.bar(positions, shown, width, color=colours(index / max(1, len(points) - 1)), label=point)
        ax.set_yscale("log")
        ax.set_xticks(range(len(settings)))
        ax.set_xticklabels(settings, rotation=45, ha="right")
        ax.set_ylabel("KL(float || quantized), nats per token")
        ax.set_title(model)
    figure_legend(fig, axes[0])
    keep_texts_inside(fig)
    floats = rows[rows["setting"] == "float"]
    spread = float(floats.groupby("model")["loss"].agg(lambda x: x.max() - x.min()).max())
    return Drawing(fig, {"models": ", ".join(models), "float_spread": spread})
