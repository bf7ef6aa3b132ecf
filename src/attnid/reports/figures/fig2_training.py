"""Figure 2, loss and unidentified share of each step (claims E1, E2): the loss and ρ (QK, OV) of every
case against the step, mean over seeds with the seeds' range as a band."""

from __future__ import annotations

from attnid.reports.figures.inputs import RUN_FILES, Drawing, Sources
from attnid.reports.figures.series import draw_floor_bands, plot_band, runs_dtype, seed_band
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, case_style, figure_legend, pyplot
from attnid.reports.round_off import UNIT_ROUND_OFF, at_round_off

INPUTS = {"runs": RUN_FILES}
CAPTION = r"""**Figure 2 — loss and unidentified share of each step (claims E1, E2).** Left:
training-batch loss (lines) and validation loss (dots). Middle and right: :math:`\rho`, the share of
each optimizer step that lies along unidentified (symmetry-orbit) directions, for the query-key and
output-value pairs, log scale. Lines are means over seeds, bands the range over seeds. A case whose
:math:`\rho` is numerical round-off (below 10 times the round-off floor of its training precision:
float32 about 1e-7, float64 about 1e-16) is not drawn as data: a grey band labelled with the precision
and the case marks the floor it sits on. Plain SGD (float64) sits there; weight decay and AdamW put a
visible share of every step into unidentified directions.
"""


def draw(sources: Sources) -> Drawing:
    """Figure 2 from the case runs."""
    fig, axes = pyplot().subplots(1, 3, figsize=(3 * PANEL_WIDTH, PANEL_HEIGHT))
    floors: dict[str, dict[str, list[str]]] = {
        circuit: {dtype: [] for dtype in UNIT_ROUND_OFF} for circuit in ("qk", "ov")
    }  # circuit -> dtype -> labels of the cases at that round-off
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
    figure_legend(fig, axes[0])
    return Drawing(fig, {})
