"""``attnid inspect --plot``: μ per layer for both circuits, each on the model's own orbit
(docs/design.md §3.4, §8).

μ is zero at a balanced point and never negative, so rounding the weights of a balanced model to the
precision they are stored in moves μ at second order: its round-off floor is the square of that
precision's unit round-off (:func:`attnid.reports.round_off.round_off_floor` with ``order=2``; never below
float64's, in which μ is computed). As in Figures 2-4, values at round-off are not drawn as data: a
labelled floor band names the circuits that sit there (a balanced model's μ).
"""

from __future__ import annotations

from pathlib import Path

from attnid.common.files import atomic_path
from attnid.reports.figures.series import draw_floor_bands
from attnid.reports.figures.style import PANEL_HEIGHT, PANEL_WIDTH, pyplot, styled
from attnid.reports.round_off import round_off_ceiling

MU_ROUND_OFF_ORDER = 2  # μ sits at its minimum when balanced: rounding moves it at second order

# torch's dtype names -> the precision names of UNIT_ROUND_OFF
PRECISION_OF_DTYPE = {"float64": "float64", "float32": "float32", "bfloat16": "bf16", "float16": "fp16"}
ORBIT_LABELS = {"gl": "GL_D", "rope": "RoPE commutant"}
CIRCUIT_STYLE = {"qk": {"color": "#1f77b4", "marker": "o"}, "ov": {"color": "#d62728", "marker": "s"}}


@styled
def plot_inspection(report: dict, path: str | Path, title: str = "") -> Path:
    """Draw μ_QK and μ_OV against the layer index (log scale) from an ``attnid inspect`` report; write
    ``path`` (PNG) atomically."""
    # lazy: matplotlib, which `attnid inspect` loads only to draw (--plot)
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    precision = PRECISION_OF_DTYPE.get(str(report.get("dtype")), "float32")
    ceiling = round_off_ceiling(precision, order=MU_ROUND_OFF_ORDER)
    fig, ax = plt.subplots(figsize=(1.4 * PANEL_WIDTH, PANEL_HEIGHT))
    floors: dict[str, list[str]] = {precision: []}
    for circuit, style in CIRCUIT_STYLE.items():
        rows = report["layers"]
        orbit = rows[0][f"orbit_{circuit}"]
        label = f"μ_{circuit.upper()} on {ORBIT_LABELS.get(orbit, orbit)}"
        above = [(row["layer"], row[f"mu_{circuit}"]) for row in rows if row[f"mu_{circuit}"] >= ceiling]
        if len(above) < len(rows):  # some (or all) layers at round-off: on the band, not as points
            floors[precision].append(label if not above else f"{label} (other layers)")
        if above:
            ax.plot(*zip(*above), label=label, linestyle="-", **style)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("μ (excess attention norm)")
    if any(line.get_label() for line in ax.get_lines()):
        ax.legend(loc="best")
    draw_floor_bands(ax, floors, order=MU_ROUND_OFF_ORDER)
    ax.set_xlim(-0.5, max(len(report["layers"]) - 0.5, 0.5))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        ax.set_title(f"{title} (stored as {report.get('dtype', 'float32')})", fontsize=8)
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
