"""The run directory of ``attnid train``: what is in it, and how it is written and read.

A run directory holds

- ``metrics.csv``: one row per log step; :data:`BASE_COLUMNS` first, in that order,
  then any further columns in the order the loop first produced them (per-layer
  ``rho_qk_l0`` ...). A new quantity is a new key in the row dicts the loop appends;
  add it to :data:`BASE_COLUMNS` to give it a fixed place.
- ``run.json``: status and summary, written last (a run.json means the outputs are
  complete). It carries everything the tables and figures need, e.g.
  ``initial_imbalance_scale`` for Figure 3's prediction, so nothing but training reads
  the checkpoint.
- ``ckpt.pt``: nanoGPT's checkpoint keys (``model``, ``optimizer``, ``model_args``,
  ``iter_num``, ``best_val_loss``, ``config``) plus ours under ``attnid`` (RNG states,
  the metric rows so far, the metric tracker's state), so that rerunning the same
  command resumes exactly. Everything in it loads with ``torch.load(weights_only=True)``:
  tensors, dicts, lists, tuples, floats, ints, bools, str and None.

This module imports torch only inside the checkpoint functions: tables stay torch-free.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import reprlib
import subprocess
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pandas as pd

from attnid import __version__
from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import torch_save_atomic, write_csv_atomic, write_json_atomic
from attnid.common.paths import require_regular_file
from attnid.common.shapes import shape_problem
from attnid.training.cases import CASES

# metrics.csv: these columns first, in this order; per-layer columns (e.g. rho_qk_l0) follow.
BASE_COLUMNS = (
    "step",
    "lr",
    "train_loss",
    "eval_train_loss",
    "val_loss",
    "rho_qk",
    "rho_ov",
    "beta_qk",
    "beta_ov",
    "tau",
    "tau_logits",
    "mu_qk",
    "mu_ov",
    "grad_norm",
    "tokens_per_s",
    "wall_s",
    "rebalanced",
    "skipped_pairs",
    "drift1_qk",
    "drift1_ov",
    "drift2_qk",
    "drift2_ov",
    "closure_qk",
    "closure_ov",
)
# Columns that measure the clock, not the run: the only ones that differ between identical runs.
TIMING_COLUMNS = ("tokens_per_s", "wall_s")

METRICS_FILE, RUN_FILE, CHECKPOINT_FILE = "metrics.csv", "run.json", "ckpt.pt"
CHECKPOINT_FORMAT = 2  # 2: loadable with weights_only=True
RUN_JSON = outputs.json_report("status", "case")  # what a run.json of attnid train holds, at least


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_outputs(out: Path, rows: list[dict], summary: dict) -> None:
    """metrics.csv, then run.json last: a run.json means the run's outputs are complete."""
    frame = pd.DataFrame(rows)
    extra = [c for c in frame.columns if c not in BASE_COLUMNS]
    frame = frame.reindex(columns=list(BASE_COLUMNS) + extra)
    write_csv_atomic(Path(out) / METRICS_FILE, frame)
    write_json_atomic(Path(out) / RUN_FILE, {k: _finite_or_none(v) for k, v in summary.items()}, RUN_JSON)


def versions() -> dict:
    """Versions of what made the run, for run.json."""
    # lazy: torch, which the report commands read runs without
    import torch

    # str(): torch.__version__ is a TorchVersion, which weights_only loading refuses
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "numpy": str(np.__version__),
        "attnid": str(__version__),
    }


def git_commit() -> str | None:
    """The commit of the attnid source tree, or None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def remove_outputs(out: Path) -> None:
    """Delete run.json and metrics.csv: they must never describe an older run while this one is unfinished."""
    for stale in (RUN_FILE, METRICS_FILE):
        with contextlib.suppress(FileNotFoundError):
            (Path(out) / stale).unlink()


# --------------------------------------------------------------------------------------
# the checkpoint
# --------------------------------------------------------------------------------------


def resume_key(config: dict, free_keys: Collection[str], device_type: str, meta: dict) -> dict:
    """What must agree between a checkpoint and the command resuming it (``config`` as a dict)."""
    key = {k: v for k, v in config.items() if k not in free_keys}
    key["device"] = device_type
    key["data"] = {k: meta.get(k) for k in ("vocab_size", "train_tokens", "val_tokens", "source_sha256")}
    return key


def save_run_checkpoint(
    path: Path,
    *,
    model_state: dict,
    optimizer_state: dict,
    model_args: dict,
    iter_num: int,
    best_val_loss: float,
    config: dict,
    ours: dict,
) -> None:
    """Write ``ckpt.pt`` atomically: nanoGPT's keys (nanoGPT and load_nanogpt_checkpoint read
    model_args + model), ours under ``attnid`` with the format number."""
    torch_save_atomic(
        path,
        {
            "model": model_state,
            "optimizer": optimizer_state,
            "model_args": model_args,
            "iter_num": iter_num,
            "best_val_loss": best_val_loss,
            "config": config,
            "attnid": {"format": CHECKPOINT_FORMAT, **ours},
        },
    )


def _move_aside(path: Path) -> Path:
    aside = path.with_name(path.name + ".corrupt")
    number = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt{number}")
        number += 1
    path.rename(aside)
    return aside


def load_run_checkpoint(path: Path, key: dict) -> dict:
    """The checkpoint at ``path`` if it belongs to the run ``key`` describes.

    An unreadable file (truncated, corrupted, not ours) is renamed to ``ckpt.pt.corrupt``
    (never overwritten) and reported in one line; the next run then starts over. A
    checkpoint of another configuration is left in place and reported.
    """
    # lazy: torch, which the report commands read runs without
    import torch

    try:
        # on the CPU: RNG states must stay CPU tensors; load_state_dict moves weights and moments to the
        # device
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        stored_format, stored_key = checkpoint["attnid"]["format"], checkpoint["attnid"]["resume_key"]
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file
        aside = _move_aside(path)
        raise UserError(
            f"{path} is not a readable attnid checkpoint ({type(err).__name__}); moved it to "
            f"{aside.name}; rerun to start over"
        ) from None
    if stored_format != CHECKPOINT_FORMAT:
        aside = _move_aside(path)
        raise UserError(
            f"{path} has checkpoint format {stored_format}, this attnid reads {CHECKPOINT_FORMAT}; "
            f"moved it to {aside.name}; rerun to start over"
        )
    if stored_key != key:
        differing = sorted(k for k in set(key) | set(stored_key) if key.get(k) != stored_key.get(k))
        shown = ", ".join(f"{k}: {stored_key.get(k)!r} in ckpt vs {key.get(k)!r} now" for k in differing[:3])
        raise CheckpointOfAnotherRun(
            f"{path} belongs to a run with another configuration ({shown}); "
            f"delete it or pass --fresh to start over",
            shown,
        )
    return checkpoint


class CheckpointOfAnotherRun(UserError):
    """A readable checkpoint at the run's path, written with other settings (``differences`` says which)."""

    def __init__(self, message: str, differences: str) -> None:
        super().__init__(message)
        self.differences = differences


# What resuming reads from a checkpoint besides model_args: nanoGPT's keys, and ours under 'attnid'
RESUME_KEYS = ("model", "optimizer", "iter_num", "best_val_loss")
RESUME_ATTNID_KEYS = ("rows", "batch_generator", "torch_rng", "first_loss", "wall_s", "resumed_at")


def check_resumable(checkpoint: dict, path: Path, model_shapes: dict) -> None:
    """One line saying what a checkpoint of this run lacks, or which stored weight does not fit the model
    (``model_shapes``: ``{name: shape}`` of the model being resumed), before anything is loaded from it."""
    ours = checkpoint.get("attnid")
    missing = [key for key in RESUME_KEYS if not isinstance(checkpoint.get(key), dict | int | float)]
    missing += [
        f"attnid.{key}" for key in RESUME_ATTNID_KEYS if not isinstance(ours, dict) or key not in ours
    ]
    if missing:
        raise UserError(
            f"{path} cannot be resumed: it lacks {', '.join(missing)} (optimizer state, RNG states, rows); "
            f"delete it or pass --fresh to start over"
        )
    stored = checkpoint["model"]
    if not all(isinstance(key, str) and hasattr(value, "shape") for key, value in stored.items()):
        raise UserError(f"{path} cannot be resumed: its 'model' is not a state dict of tensors")
    problem = shape_problem(
        model_shapes, {k: v.shape for k, v in stored.items()}, str(path), "this run's model"
    )
    if problem is not None:
        raise UserError(f"{problem}: it cannot be resumed; delete it or pass --fresh to start over")


def check_finished(checkpoint: dict, path: Path) -> None:
    """A finished run's checkpoint holds its summary (with a status) and its rows, from which a rerun
    rewrites metrics.csv and run.json."""
    summary, rows = checkpoint["attnid"].get("summary"), checkpoint["attnid"].get("rows")
    if (
        not isinstance(summary, dict)
        or not isinstance(summary.get("status"), str)
        or not isinstance(rows, list)
    ):
        raise UserError(
            f"{path} says its run finished but lacks its summary or rows; delete it or pass --fresh"
        )


def record_divergence(path: Path, rows: list[dict], summary: dict) -> bool:
    """A diverged run keeps its last good checkpoint (saved after a loss check, so finite weights): the
    summary and rows go into it, so that a rerun rewrites metrics.csv and run.json from it as for any
    finished run. False when there is none."""
    # lazy: torch, which the report commands read runs without
    import torch

    if not path.is_file():
        return False
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    checkpoint["attnid"] = {**checkpoint["attnid"], "rows": rows, "summary": summary}
    torch_save_atomic(path, checkpoint)
    return True


# --------------------------------------------------------------------------------------
# reading finished runs
# --------------------------------------------------------------------------------------


def find_run_dirs(root: str | Path | None, listed: list[str] | None = None) -> list[Path]:
    """The run directories to gather: ``listed`` when given, else every one under ``root``.

    The pipeline passes the runs its config asks for (``listed``), so runs left over from
    an older config in the same ``results/`` folder never leak into tables or figures.
    A listed directory without ``run.json`` is an error, not a silent gap.
    """
    if listed:
        seen: dict[Path, str] = {}  # resolved -> as listed
        for run_dir in listed:
            resolved = Path(run_dir).resolve()
            if resolved in seen:
                raise UserError(
                    f"the run {run_dir} is listed twice (also as {seen[resolved]}): each run counts once"
                )
            seen[resolved] = str(run_dir)
        missing = [d for d in listed if not (Path(d) / RUN_FILE).is_file()]
        if missing:
            raise UserError(
                f"no run.json in {missing[0]} ({len(missing)} listed runs unfinished); "
                "run the training jobs first (snakemake --cores all)"
            )
        return [Path(d) for d in listed]
    if root is None or not Path(root).is_dir():
        return []
    return sorted(path.parent for path in Path(root).rglob(RUN_FILE))


# run.json fields the reports compute with, and what each must be when present: (test, what it is)
RUN_FIELDS = {
    "status": (lambda v: isinstance(v, str), "a string"),
    "case": (lambda v: isinstance(v, str), "a string"),
    "lr": (lambda v: _is_number(v) and math.isfinite(v) and v > 0, "a positive finite number"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    "steps_completed": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "a non-negative integer",
    ),
    "final_val_loss": (
        lambda v: v is None or (_is_number(v) and math.isfinite(v)),
        "a finite number or null",
    ),
    "final_train_loss": (
        lambda v: v is None or (_is_number(v) and math.isfinite(v)),
        "a finite number or null",
    ),
}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_run_info(info: object, path: Path) -> None:
    """run.json is an object whose fields (:data:`RUN_FIELDS`) are of the kind attnid train writes; one line
    naming the first that is not."""
    if not isinstance(info, dict):
        raise UserError(f"{path} is not a JSON object: not a run.json of attnid train")
    for name, (valid, what) in RUN_FIELDS.items():
        if name in info and not valid(info[name]):
            raise UserError(
                f"{path}: {name} is {reprlib.repr(info[name])}, not {what}: not what attnid train writes; "
                f"rerun that training job"
            )


def load_run(run_dir: str | Path) -> tuple[dict, pd.DataFrame]:
    """``run.json`` as a dict (plus ``run_dir``) and ``metrics.csv`` as a frame (one row per logged step)."""
    run_dir = Path(run_dir)
    for name in (RUN_FILE, METRICS_FILE):  # found by --runs-dir too, where no rule declared them
        require_regular_file(run_dir / name, "run file")
    try:
        info = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise UserError(f"cannot read {run_dir / RUN_FILE}: {err}; rerun that training job") from err
    check_run_info(info, run_dir / RUN_FILE)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise UserError(f"{metrics_path} is missing; rerun that training job")
    metrics = pd.read_csv(metrics_path)
    info.setdefault("run_dir", str(run_dir))
    return info, metrics


def load_runs_by_case(
    runs_dir: str | Path | None, listed: list[str] | None = None
) -> dict[str, list[tuple[dict, pd.DataFrame]]]:
    """{case: [(run.json, metrics.csv) per seed]} for the listed runs (or every run under ``runs_dir``),
    in the case registry's order (unknown cases last)."""
    by_case: dict[str, list] = {}
    for run_dir in find_run_dirs(runs_dir, listed):
        info, metrics = load_run(run_dir)
        by_case.setdefault(str(info.get("case")), []).append((info, metrics))
    order = {case: i for i, case in enumerate(CASES)}
    return dict(sorted(by_case.items(), key=lambda item: order.get(item[0], len(order))))


def initial_imbalance_scale(info: dict, circuit: str) -> float | None:
    """``||I_0||_F / N`` of a run's ``circuit`` from its run.json (N = β's normaliser, docs/design.md §3).

    None for a run trained without metrics (it logged no β to compare with); a run.json
    that lacks the entry altogether comes from an older attnid and is an error.
    """
    if "initial_imbalance_scale" not in info:
        raise UserError(
            f"{Path(info.get('run_dir', '?')) / RUN_FILE} has no initial_imbalance_scale "
            f"(written by an older attnid); rerun that training job"
        )
    scales = info["initial_imbalance_scale"]
    return None if scales is None else float(scales[circuit])


def rewrite_if_finished(checkpoint: dict | None, ckpt_path: Path, out: Path) -> bool:
    """Whether ``checkpoint`` holds a finished run; if so its metrics.csv and run.json are written again
    from it in ``out`` (nothing is trained: ``attnid train`` and ``train-runs --lockstep`` alike)."""
    # lazy: torch (runtime imports it), which the reports that read run directories do not need
    from attnid.training.runtime import say

    if checkpoint is None or checkpoint["attnid"].get("summary") is None:
        return False
    check_finished(checkpoint, ckpt_path)
    say(
        f"{ckpt_path} holds a finished run ({checkpoint['attnid']['summary']['status']}); "
        f"rewriting metrics.csv and run.json from it"
    )
    write_outputs(out, checkpoint["attnid"]["rows"], checkpoint["attnid"]["summary"])
    return True
