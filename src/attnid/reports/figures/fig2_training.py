"""Figure 2, loss and unidentified share of each step (claims E1, E2): the loss and ρ (QK, OV) of every
case against the step, mean over seeds with the seeds' range as a band."""

from __future__ import annotations

from attnid.reports.figures.inputs import RUN_FILES, Drawing, Sources
from attnid.reports.figures.series import Floors, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import (
    PANEL_HEIGHT,
    PANEL_WIDTH,
    case_style,
    figure_legend,
    keep_texts_inside,
    pyplot,
)
from attnid.reports.round_off import at_round_off

INPUTS = {"runs": RUN_FILES}
CAPTION = r"""**Figure 2 — loss and unidentified share of each step (claims E1, E2).** Left:
training-batch loss (lines) and validation loss (dots). Middle and right: :math:`\rho`, the share of
each optimizer step that lies along unidentified (symmetry-orbit) directions, for the query-key and
output-value pairs, log scale. Lines are means over seeds, bands the range over seeds. A case whose
:math:`\rho` is numerical round-off (below 10 times the round-off floor of its training precision:
float32 about 1e-7, float64 about 1e-16) is never drawn as data: it lies on the floor of a grey band
labelled with its precision (a triangle: at or below), its true level written there
{%- if rho_floors is defined and rho_floors %} ({% for label, level in rho_floors.items() %}{{ label }}:
:math:`\rho` at most {{ fmt(level) }}{{ "; " if not loop.last }}{% endfor %}){% endif %}.
Plain SGD (float64) sits there; weight decay and AdamW put a visible share of every step into
unidentified directions.
"""


def draw(sources: Sources) -> Drawing:
    """Figure 2 from the case runs."""
    fig, axes = pyplot().subplots(1, 3, figsize=(3 * PANEL_WIDTH, PANEL_HEIGHT))
    floors = {circuit: Floors(ax) for ax, circuit in zip(axes[1:], ("qk", "ov"))}
    rho_floors: dict[str, float] = {}  # case label -> largest round-off rho, both circuits (for the caption)
    for case, case_runs in sources.case_runs().items():
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
            line = {"color": style["color"], "label": style["label"], "linestyle": style["linestyle"]}
            if at_round_off(rho["max"], dtype):  # round-off: on its floor, never as data
                name = rf"{style['label']}: $\rho_{{{circuit.upper()}}}$"
                floors[circuit].draw(rho["step"], rho["max"], dtype, name, **line)
                rho_floors[style["label"]] = max(rho_floors.get(style["label"], 0.0), float(rho["max"].max()))
                continue
            plot_band(ax, seed_band(case_runs, f"rho_{circuit}", positive=True), **line)
    for floor in floors.values():
        floor.finish()
    axes[0].set_ylabel("loss (line: train batch, dots: val)")
    axes[0].set_title("loss")
    for ax, circuit in zip(axes[1:], ("QK", "OV")):
        ax.set_yscale("log")
        ax.set_ylabel(rf"$\rho_{{{circuit}}}$ (unidentified share of a step)")
        ax.set_title(rf"$\rho_{{{circuit}}}$")
    for ax in axes:
        ax.set_xlabel("step")
    figure_legend(fig, axes[0])
    keep_texts_inside(fig)
    return Drawing(fig, {"rho_floors": rho_floors})
