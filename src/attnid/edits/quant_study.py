"""``attnid quant-report``: a model's error under simulated quantization, as given or at the orbit points of
docs/design.md §16, on evaluation text disjoint from the calibration text its moves were chosen on.

:data:`ORBIT_POINTS` are the points compared (QuaRot's random rotations as the baseline): the model as
shipped; its norms fused; a residual rotation ``R1`` of one seed; ``R1`` picked among seeds on
calibration text; ``R1`` with a randomized Hadamard ``R2`` per key/value group; ``R1`` with attnid's
optimized output-value move; and that with the optimized query-key move and the channel scales.
The seed study rotates with each of ``seeds`` seeds and reports, for the setting the pick is made for,
the calibration score and the evaluation KL of every seed.
"""

from __future__ import annotations

import statistics

import torch

from attnid.common import progress
from attnid.edits.checkpoint_types import Checkpoint
from attnid.edits.orbit_moves import fuse_norms, rotate_stream
from attnid.edits.orthogonal import stream_rotation
from attnid.edits.quant_eval import (
    QuantSetting,
    evaluate_settings,
    kl_and_nll,
    next_token_log_probs,
    parse_setting,
    quantized,
    runnable_model,
)
from attnid.edits.quant_moves import RotateRequest, ScratchModel, rotate_whole
from attnid.edits.whole_checkpoint import (
    WholeCheckpoint,
    checkpoint_copy,
    read_whole_checkpoint,
    untied,
    write_whole_checkpoint,
)

AS_GIVEN = "as given"
# name -> the rotate request's moves and choices (R1: seed 0 of the randomized Hadamard transform)
ORBIT_POINTS: dict[str, dict] = {
    "shipped": {"moves": ()},
    "fuse-norms": {"moves": ("fuse-norms",)},
    "R1 random": {"moves": ("fuse-norms", "residual")},
    "R1 picked": {"moves": ("fuse-norms", "residual"), "pick": True},
    "R1+R2 random": {"moves": ("fuse-norms", "residual", "ov"), "ov": "hadamard"},
    "R1+OV optimized": {"moves": ("fuse-norms", "residual", "ov"), "ov": "optimized"},
    "R1+QK+OV+smooth": {"moves": ("fuse-norms", "residual", "qk", "ov", "smooth"), "ov": "optimized"},
}


def point_request(name: str, picked_seed: int, group: int) -> RotateRequest:
    """The :class:`RotateRequest` of an orbit point (``R1 picked``: the seed the seed study picked)."""
    point = ORBIT_POINTS[name]
    return RotateRequest(
        moves=point["moves"],
        ov=point.get("ov", "optimized"),
        seed=picked_seed if point.get("pick") else 0,
        group=group,
    )


def _rows_of(
    checkpoint: Checkpoint, evaluation: torch.Tensor, settings: list[QuantSetting], group: int, point: str
):
    model = runnable_model(checkpoint, torch.float32)
    found, shapes = evaluate_settings(model, evaluation, settings, group)
    return [{"point": point, **row} for row in found], [{"point": point, **row} for row in shapes]


def report_as_given(
    checkpoint: Checkpoint, evaluation: torch.Tensor, settings: list[QuantSetting], group: int
) -> dict:
    """The model as given: one row per setting, and its activations' kurtosis and max/rms."""
    rows, activations = _rows_of(checkpoint, evaluation, settings, group, AS_GIVEN)
    return {"rows": rows, "activations": activations}


def _moved_checkpoint(checkpoint: Checkpoint, whole: WholeCheckpoint) -> Checkpoint:
    moved = checkpoint_copy(checkpoint)
    write_whole_checkpoint(moved, whole)
    return moved


def orbit_study(
    checkpoint: Checkpoint,
    calibration: torch.Tensor,
    evaluation: torch.Tensor,
    settings: list[QuantSetting],
    group: int,
    seeds: int,
    pick_setting: str,
    names: list[str] | None = None,
) -> dict:
    """The orbit points ``names`` (default: all) with their rows and activations, and the seed study of
    ``seeds`` seeds (none for 0; ``R1 picked`` is then seed 0) (module docstring)."""
    rows, activations, points = [], [], {}
    names = list(ORBIT_POINTS) if names is None else names
    seeds_found = (
        seed_study(checkpoint, calibration, evaluation, seeds, parse_setting(pick_setting), group)
        if seeds
        else None
    )
    for index, name in enumerate(names):
        progress.stage(f"orbit point {name} ({index + 1} of {len(names)})")
        request = point_request(name, seeds_found["picked_seed"] if seeds_found else 0, group)
        whole, report = rotate_whole(checkpoint, request, calibration, probe=evaluation[:1])
        points[name] = {key: value for key, value in report.items() if key != "notes"}
        moved = _moved_checkpoint(checkpoint, whole)
        del whole
        found, shapes = _rows_of(moved, evaluation, settings, group, name)
        rows += found
        activations += shapes
    return {
        "rows": rows,
        "activations": activations,
        "points": points,
        **({"seeds": seeds_found} if seeds_found else {}),
    }


def seed_study(
    checkpoint: Checkpoint,
    calibration: torch.Tensor,
    evaluation: torch.Tensor,
    seeds: int,
    setting: QuantSetting,
    group: int,
) -> dict:
    """For each ``R1`` seed: the calibration KL (what the pick minimises) and the evaluation KL under
    ``setting``; the picked seed's evaluation KL against the median seed's."""
    progress.stage("seed study: the float model on calibration and evaluation text")
    whole = fuse_norms(untied(read_whole_checkpoint(checkpoint)))
    scratch = ScratchModel(checkpoint, whole)
    references = {
        name: next_token_log_probs(scratch.model, windows)
        for name, windows in (("calibration", calibration), ("evaluation", evaluation))
    }
    e, layernorm = whole.shape.attention.n_embd, whole.shape.norm == "layernorm"
    per_seed = []
    for seed in range(seeds):
        progress.stage(f"seed study: seed {seed + 1} of {seeds}")
        rotation = stream_rotation(e, "hadamard", seed, layernorm)
        model = scratch.load(rotate_stream(whole, rotation))
        row: dict = {"seed": seed}
        with quantized(model, setting, group):
            for name, windows in (("calibration", calibration), ("evaluation", evaluation)):
                row[f"{name}_kl"] = float(kl_and_nll(model, windows, references[name])[0].mean())
        rotate_stream(whole, rotation.T)  # back (the moves act in place)
        per_seed.append(row)
    picked = min(per_seed, key=lambda row: row["calibration_kl"])
    median = statistics.median(row["evaluation_kl"] for row in per_seed)
    return {
        "setting": setting.name,
        "per_seed": per_seed,
        "picked_seed": picked["seed"],
        "picked_evaluation_kl": picked["evaluation_kl"],
        "median_evaluation_kl": median,
        "median_over_picked": median / picked["evaluation_kl"]
        if picked["evaluation_kl"] > 0
        else float("inf"),
    }
