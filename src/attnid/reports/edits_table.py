"""``attnid edits-table``: the JSON reports of ``attnid prune-biases`` and ``attnid balance``
gathered into ``prune.csv``, ``prune_summary.csv`` and ``prune.tex`` (docs/design.md §9).

- ``prune.csv``: one row per report (edit and checkpoint), every number the command printed,
  plus the run's ``case`` and ``seed`` when its ``run.json`` sits next to the checkpoint.
- ``prune_summary.csv``: one row per edit and model shape: the parameters made redundant and
  their share of the attention parameters (a closed form of the shape, the same for every run),
  mean and sample standard deviation over the runs of the loss and of mu and the attention
  weight norm before and after, and the largest loss and logit change over the runs.
- ``prune.tex``: that summary as a table for the appendix (``templates/prune.tex.j2``).

Both edits are exact in real arithmetic (bias pruning: §4.7, claim T4; balancing: Lemmas 4.1
and 4.6), so the loss and logit changes measure float32 round-off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import write_csv_atomic, write_text_atomic
from attnid.reports.latex import records, render_table

EDITS = ("prune-biases", "balance")
SHAPE = ["edit", "format", "n_layer", "n_head", "n_embd", "bias"]
# Columns of prune.csv, in order; a report lacks those of the other edit (left empty).
PRUNE_COLUMNS = SHAPE + [
    "case",
    "seed",
    "input",
    "output",
    "redundant_params",
    "attention_params",
    "redundant_share",
    "rope",
    "nonzero_key_biases_zeroed",
    "nonzero_value_biases_folded",
    "target",
    "skipped_pairs",
    "mu_qk_before",
    "mu_qk_after",
    "mu_ov_before",
    "mu_ov_after",
    "attn_norm_before",
    "attn_norm_after",
    "attn_norm_reduction",
    "loss_before",
    "loss_after",
    "loss_change",
    "max_rel_logit_change",
    "tokens",
    "sequences",
    "length",
]
NEEDED = (
    "command",
    "input",
    "format",
    "n_layer",
    "n_head",
    "n_embd",
    "bias",
    "loss_before",
    "loss_after",
    "loss_change",
    "max_rel_logit_change",
)
INTEGERS = (
    "n_layer",
    "n_head",
    "n_embd",
    "seed",
    "redundant_params",
    "attention_params",
    "nonzero_key_biases_zeroed",
    "nonzero_value_biases_folded",
    "skipped_pairs",
    "sequences",
    "length",
)
# Averaged over the runs of one edit and shape (mean and sample sd).
AVERAGED = (
    "loss_before",
    "loss_change",
    "mu_qk_before",
    "mu_qk_after",
    "mu_ov_before",
    "mu_ov_after",
    "attn_norm_before",
    "attn_norm_after",
    "attn_norm_reduction",
)
# The same for every run of one shape: closed forms of the shape (attnid.theory.counts).
PER_SHAPE = ("redundant_params", "attention_params", "redundant_share")


def read_report(path: Path) -> dict:
    """One edit report, with the run's case and seed when its run.json is next to the checkpoint."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{path} not found: run attnid prune-biases or attnid balance with --json first"
        ) from None
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is not a JSON report: {err}") from None
    if not isinstance(report, dict) or report.get("command") not in EDITS:
        raise UserError(
            f"{path} is not a report of attnid prune-biases or attnid balance (its 'command' field)"
        )
    missing = [key for key in NEEDED if key not in report]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}: rerun the edit with this version of attnid")
    row = {"edit": report.pop("command"), **report}
    run_json = Path(report["input"]).parent / "run.json"
    if run_json.is_file():
        try:
            run = json.loads(run_json.read_text(encoding="utf-8"))
            row.update(case=run.get("case"), seed=run.get("seed"))
        except ValueError:
            pass  # a run.json that does not parse names no case; the row keeps its input path
    return row


def per_run_table(paths: list[Path]) -> pd.DataFrame:
    """prune.csv: one row per report, ordered by edit, case and seed."""
    if not paths:
        raise UserError("no --json reports given")
    frame = pd.DataFrame([read_report(path) for path in paths])
    frame = frame.reindex(columns=PRUNE_COLUMNS + [c for c in frame.columns if c not in PRUNE_COLUMNS])
    frame["attn_norm_reduction"] = (
        1 - frame["attn_norm_after"] / frame["attn_norm_before"]
    )  # balance rows only
    for column in INTEGERS:  # counts stay integers where the other edit's rows leave them empty
        frame[column] = frame[column].astype("Int64")
    frame["edit_order"] = frame["edit"].map(EDITS.index)
    frame = frame.sort_values(["edit_order", "case", "seed", "input"], na_position="last", kind="stable")
    return frame.drop(columns="edit_order").reset_index(drop=True)


def _sample_sd(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.std(ddof=1)) if len(values) > 1 else float("nan")


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """prune_summary.csv: one row per edit and model shape."""
    rows = []
    for key, group in runs.groupby(SHAPE, sort=False, dropna=False):
        row = dict(zip(SHAPE, key, strict=True))
        row["cases"] = " ".join(sorted({str(c) for c in group["case"].dropna()}))
        row["n_runs"] = len(group)
        for column in PER_SHAPE:
            values = group[column].dropna().unique()
            row[column] = values[0] if len(values) == 1 else None
        for column in AVERAGED:
            row[f"{column}_mean"] = float(group[column].mean())
            row[f"{column}_sd"] = _sample_sd(group[column])
        row["max_abs_loss_change"] = float(group["loss_change"].abs().max())
        row["max_rel_logit_change"] = float(group["max_rel_logit_change"].max())
        row["skipped_pairs"] = group["skipped_pairs"].sum() if group["skipped_pairs"].notna().any() else None
        rows.append(row)
    summary = pd.DataFrame(rows)
    for column in ("redundant_params", "attention_params", "skipped_pairs"):
        summary[column] = summary[column].astype("Int64")
    return summary


def write_edits_table(paths: list[Path], out_dir: Path) -> dict[str, pd.DataFrame]:
    runs = per_run_table(paths)
    summary = summary_table(runs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out_dir / "prune.csv", runs)
    write_csv_atomic(out_dir / "prune_summary.csv", summary)
    rows = records(summary)
    text = render_table(
        "prune.tex.j2",
        prune=[r for r in rows if r["edit"] == "prune-biases"],
        balance=[r for r in rows if r["edit"] == "balance"],
    )
    write_text_atomic(out_dir / "prune.tex", text)
    return {"runs": runs, "summary": summary}
