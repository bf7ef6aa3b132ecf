"""Figure 8 (attnid.reports.figures.fig8_alignment) drawn from a synthetic alignment table: the loss above the
chord of the adamw pairs at the three levels, the continuous classes' share of the attention distance against
H beside 1/(2H), the distance left against the identified products' distance per case; every legend entry
visible, no label over another; the caption filled with the table's own numbers."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from figure_checks import invisible_legend_entries, overlapping_labels

from attnid.reports import figures
from attnid.reports.figures import fig8_alignment
from attnid.reports.figures.inputs import Sources

CASES = ("sgd", "adamw")
HEADS = (1, 2, 4, 8, 16)
TS = np.linspace(0, 1, 11)


def _tables(folder, heads=HEADS, cases=CASES) -> dict:
    rng = np.random.default_rng(0)
    rows, line = [], []
    groups = [("cases", case, 4) for case in cases] + [("heads", f"h{h}", h) for h in heads]
    for (study, group, n_head), (a, b) in itertools.product(groups, itertools.combinations(range(3), 2)):
        pair = f"seed{a}-seed{b}"
        shares = {"ov": 0.25 / n_head + 0.01 * rng.random(), "qk": 0.25 / n_head + 0.01 * rng.random()}
        for name, level in (("none", "none"), ("heads+mlp", "discrete"), ("heads", ""), ("mlp", ""),
                            ("ov", ""), ("qk", "all")):  # fmt: skip
            rows.append(
                {
                    "study": study, "group": group, "pair": pair, "n_head": n_head, "class": name,
                    "level": level, "distance": 10 - len(rows) % 6, "product_distance": 1 + rng.random(),
                    "attention_share_removed": shares.get(name, 0.0), "share_removed": 0.1,
                    "barrier": {"none": 0.5, "discrete": 0.2, "all": 0.05}.get(level, np.nan),
                    "exact_max_abs_dlogp": 1e-15 * (1 + len(rows) % 3),
                }
            )  # fmt: skip
        for level, height in (("none", 0.5), ("discrete", 0.2), ("all", 0.05)):
            for t in TS:
                bump = height * 4 * t * (1 - t)
                line.append({"study": study, "group": group, "pair": pair, "n_head": n_head, "level": level,
                             "t": t, "loss": 1.5 + bump, "above_chord": bump})  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "alignment.csv", index=False)
    pd.DataFrame(line).to_csv(folder / "alignment_line.csv", index=False)
    return {"rows": pd.DataFrame(rows), "line": pd.DataFrame(line)}


def test_figure8_draws_every_panel_from_the_table(tmp_path):
    tables = _tables(tmp_path / "tables")
    drawing = fig8_alignment.draw(Sources(tables=tmp_path / "tables"))
    fig, numbers = drawing.figure, drawing.numbers
    assert not invisible_legend_entries(fig) and not overlapping_labels(fig)
    line, share, left = fig.axes[:3]
    assert len(line.get_lines()) == 3 * 3 + 1  # three pairs per level, and the chord's zero
    assert numbers["line_group"] == "adamw"
    assert numbers["barrier_none"] == pytest.approx(0.5) and numbers["barrier_all"] == pytest.approx(0.05)
    assert numbers["exact"] == pytest.approx(tables["rows"]["exact_max_abs_dlogp"].max())
    unidentified = [ln for ln in share.get_lines() if ln.get_label().startswith("1/(2H)")][0]
    assert list(unidentified.get_xdata()) == list(HEADS)
    assert np.allclose(unidentified.get_ydata(), [1 / (2 * h) for h in HEADS])
    assert len(share.collections[0].get_offsets()) == len(HEADS) * 3
    assert sum(len(c.get_offsets()) for c in left.collections) == len(CASES) * 3


def test_figure8_without_heads_pairs_says_so_and_its_caption_fills(tmp_path):
    _tables(tmp_path / "tables", heads=())
    paths = figures.make_figure("fig8", Sources(tables=tmp_path / "tables"), tmp_path / "out")
    assert [p.name for p in paths] == ["fig8.png", "fig8.pdf", "fig8.rst"]
    caption = (tmp_path / "out" / "fig8.rst").read_text()
    assert caption.startswith("**Figure 8 — ") and "``adamw``" in caption and "{{" not in caption
