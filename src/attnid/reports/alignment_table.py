"""The alignment stage's tables and claim (docs/design.md §18, docs/experiments.md "The alignment stage"):
``attnid barrier`` reports, one per pair of seeds (``alignment/<study>/<group>/seed<i>-seed<j>.json``),
gathered into

- ``alignment.csv``: per pair and class, the distance left after that class (total and per parameter
  group), the share of the pair's squared distance it removes, the share of the attention factors' squared
  distance it removes, the identified products' distance after it, and the barrier of each level on the
  row that ends the level (``none``: before alignment; ``discrete``: the anchor's row, head and MLP
  permutations alone; ``all``: the last class);
- ``alignment_line.csv``: the held-out loss along ``(1 - t) A + t B`` per pair, level and ``t``;
- ``alignment.tex``: per case or point, the mean and the seeds' spread over its pairs.

Every number is recomputed here from the reports' own fields (distances per group, losses along the line):
nothing is copied from a summary.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import read_json, write_csv_atomic, write_text_atomic
from attnid.measure.line import barrier_height as barrier
from attnid.measure.line import chord_gap
from attnid.reports.latex import render_table

TABLE_GROUPS = ("embedding", "attention_qk", "attention_ov", "mlp", "norms")
ATTENTION = ("attention_qk", "attention_ov")
ANCHOR_CLASS = "heads+mlp"  # the discrete level's alignment (Git Re-Basin's permutations alone)
CONTINUOUS = ("ov", "qk", "ov_gl", "qk_gl")
ALIGNMENT_EXACT_MAX = 1e-10  # the claim: every pair's moves change log p by at most this (float64)
# the planted element's claims (docs/design.md §18): the relative distance left and the barrier after it
PLANTED_DISTANCE_MAX, PLANTED_BARRIER_MAX = 1e-6, 1e-4
BARRIER_KEYS = ("levels", "t", "alignment")


def pair_label(path: Path) -> tuple[str, str, str]:
    """``(study, group, pair)`` of ``alignment/<study>/<group>/<pair>.json``."""
    return path.parent.parent.name, path.parent.name, path.stem


def _squared(distance: dict, names: tuple[str, ...]) -> float:
    return sum(float(distance[g]) ** 2 for g in names)


def _row(study, group, pair, n_head, name, level, distance, before, previous, products, line, report) -> dict:
    total_before, attention_before = _squared(before, TABLE_GROUPS), _squared(before, ATTENTION)
    removed = _squared(previous, TABLE_GROUPS) - _squared(distance, TABLE_GROUPS)
    attention_removed = _squared(previous, ATTENTION) - _squared(distance, ATTENTION)
    row = {
        "study": study,
        "group": group,
        "pair": pair,
        "n_head": n_head,
        "class": name,
        "level": level,
        "distance": math.sqrt(_squared(distance, TABLE_GROUPS)),
        **{f"distance_{g}": float(distance[g]) for g in TABLE_GROUPS},
        "relative_distance": math.sqrt(_squared(distance, TABLE_GROUPS)) / report["norm_a"],
        "share_removed": removed / total_before if total_before else 0.0,
        "attention_share_removed": attention_removed / attention_before if attention_before else 0.0,
        "product_qk": math.nan if products is None else float(products["qk"]),
        "product_ov": math.nan if products is None else float(products["ov"]),
        "barrier": math.nan if line is None else barrier(*line),
    }
    row["product_distance"] = math.hypot(row["product_qk"], row["product_ov"])
    return row


def pair_rows(path: Path, report: dict) -> tuple[list[dict], list[dict]]:
    """The rows of one pair's report in ``alignment.csv`` and in ``alignment_line.csv``."""
    study, group, pair = pair_label(path)
    ts, levels, alignment = report["t"], report["levels"], report["alignment"]
    before = alignment["distance_before"]
    n_head = int(report["n_head"])
    common = (study, group, pair, n_head)
    rows = [
        _row(*common, "none", "none", before, before, before, alignment["products_before"], None, alignment)
        | {"barrier": barrier(ts, levels["none"]["loss"])}
    ]
    anchor = levels["discrete"]
    rows.append(
        _row(
            *common,
            ANCHOR_CLASS,
            "discrete",
            anchor["distance"],
            before,
            before,
            anchor["products"],
            None,
            alignment,
        )
    )
    # the anchor is its own alignment from B: its shares are of the whole distance it removes
    rows[-1]["share_removed"] = 1 - _squared(anchor["distance"], TABLE_GROUPS) / _squared(
        before, TABLE_GROUPS
    )
    attention = _squared(anchor["distance"], ATTENTION) / _squared(before, ATTENTION)
    rows[-1]["attention_share_removed"] = 1 - attention
    rows[-1]["barrier"] = barrier(ts, anchor["loss"])
    previous = before
    for index, step in enumerate(alignment["steps"]):
        last = index == len(alignment["steps"]) - 1
        line = (ts, levels["all"]["loss"]) if last else None
        rows.append(
            _row(
                *common,
                step["class"],
                "all" if last else "",
                step["distance"],
                before,
                previous,
                step["products"],
                line,
                alignment,
            )
        )
        previous = step["distance"]
    for row in rows:
        row["exact_max_abs_dlogp"] = float(alignment["exact_max_abs_dlogp"])
        row["kl_before"] = float(alignment["functional"]["kl_before"])
        row["kl_after"] = float(alignment["functional"]["kl_after"])
    line_rows = [
        {
            "study": study,
            "group": group,
            "pair": pair,
            "n_head": n_head,
            "level": level,
            "t": t,
            "loss": loss,
            "above_chord": gap,
        }
        for level, values in levels.items()
        for t, loss, gap in zip(ts, values["loss"], chord_gap(ts, values["loss"]), strict=True)
    ]
    return rows, line_rows


def gather_reports(paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(rows, line)`` of every report (one per pair)."""
    rows, line = [], []
    for path in paths:
        report = read_barrier_report(path)
        mine, along = pair_rows(Path(path), report)
        rows += mine
        line += along
    return pd.DataFrame(rows), pd.DataFrame(line)


def continuous_share(rows: pd.DataFrame) -> pd.DataFrame:
    """Per pair: the share of the attention factors' squared distance the continuous classes remove."""
    continuous = rows[rows["class"].isin(CONTINUOUS)]
    return (
        continuous.groupby(["study", "group", "pair", "n_head"], sort=False)["attention_share_removed"]
        .sum()
        .reset_index()
    )


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per study and group: mean and sample sd over its pairs of the numbers alignment.tex shows."""
    by_level = rows[rows["level"] != ""].pivot_table(
        index=["study", "group", "pair"], columns="level", values=["distance", "barrier"], sort=False
    )
    by_level.columns = [f"{column[0]}_{column[1]}" for column in by_level.columns]  # (value, level)
    last = rows[rows["level"] == "all"].set_index(["study", "group", "pair"])
    by_level["product_distance"] = last["product_distance"]
    by_level["continuous_share"] = continuous_share(rows).set_index(["study", "group", "pair"])[
        "attention_share_removed"
    ]
    grouped = by_level.reset_index().groupby(["study", "group"], sort=False)
    table = (
        grouped.mean(numeric_only=True)
        .add_suffix("_mean")
        .join(grouped.std(numeric_only=True).add_suffix("_sd"))
    )
    table["n_pairs"] = grouped.size()
    return table.reset_index()


def alignment_claim_values(rows: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """``{claim key: (measured, detail)}``: the largest float64 change of log p of any pair's moves."""
    pairs = rows.drop_duplicates(["study", "group", "pair"])
    return {
        "exact": (
            float(pairs["exact_max_abs_dlogp"].max()) if len(pairs) else math.nan,
            f"largest max |delta log p| of the alignment's moves, float64 (the census's forward), "
            f"{len(pairs)} pairs",
        )
    }


def read_barrier_report(path: Path) -> dict:
    """One ``attnid barrier --json`` report, or a UserError naming what it lacks."""
    report = read_json(path, "barrier report")
    missing = [key for key in BARRIER_KEYS if not isinstance(report, dict) or key not in report]
    if missing or report.get("command") != "barrier":
        raise UserError(
            f"{path} is not a report of attnid barrier --json (no {', '.join(missing) or 'command'})"
        )
    return report


def planted_claim_values(report: dict) -> dict[str, tuple[float, str]]:
    """``{claim key: (measured, detail)}`` of the planted element's ``attnid barrier`` report, each number
    recomputed from its fields: the relative distance left after its ``all`` level, and that level's
    barrier along the line."""
    alignment, level = report["alignment"], report["levels"]["all"]
    left = math.sqrt(_squared(alignment["distance_after"], TABLE_GROUPS)) / alignment["norm_a"]
    before = math.sqrt(_squared(alignment["distance_before"], TABLE_GROUPS)) / alignment["norm_a"]
    classes = ", ".join(alignment["classes"])
    return {
        "distance": (left, f"relative distance {before:.3g} before ({classes}), float64"),
        "barrier": (
            barrier(report["t"], level["loss"]),
            f"held-out loss at {len(report['t'])} points after every class; {report.get('tokens', '')}",
        ),
    }


def write_alignment_tables(paths: list[Path], out_dir: Path) -> pd.DataFrame:
    """``alignment.csv``, ``alignment_line.csv`` and ``alignment.tex`` in ``out_dir``; the rows."""
    rows, line = gather_reports(paths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out_dir / "alignment.csv", rows)
    write_csv_atomic(out_dir / "alignment_line.csv", line)
    write_text_atomic(out_dir / "alignment.tex", render_table("alignment.tex.j2", summary(rows)))
    return rows
