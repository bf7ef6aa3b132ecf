"""``attnid rotate``: the moves asked for, refused where the census's classes say the architecture does not
admit them, chosen on calibration text where they are data-driven, and proved on a probe (docs/design.md
§16).

Order: ``fuse-norms`` (implied by ``residual``), ``residual`` (``R1``, one seed or the best of several on
calibration text), ``qk``, ``ov``, ``smooth``. The statistics of ``qk``, ``ov`` and ``smooth`` are taken once,
after the residual rotation: the queries, keys and values do not change under a stream rotation, and the
norms' outputs and the MLP's hidden units do not change under ``qk`` and ``ov``.

Repeated application: the canonicalising moves are their own fixed points (``fuse-norms`` leaves gains of
1; ``ov``/``qk`` ``optimized`` and ``smooth`` choose the identity at a point they chose); a seeded random
rotation (``residual``, ``ov``/``qk`` ``hadamard`` or ``random``) is a new element each time: twice is
``Q Q``, a different point of the same orbit with the same statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from attnid.common import progress
from attnid.common.errors import UserError
from attnid.edits.checkpoint_types import Checkpoint
from attnid.edits.options import ROTATE_MOVES
from attnid.edits.orbit_moves import (
    all_junctions,
    fuse_norms,
    move_query_key,
    move_value_output,
    optimized_pair_move,
    random_rope_commutant,
    rope_plane_scales,
    rotate_stream,
    scale_gated_hidden,
    scale_junctions,
    smoothing_scales,
)
from attnid.edits.orthogonal import haar_orthogonal, hadamard, random_signs, stream_rotation
from attnid.edits.quant_eval import (
    CalibrationStatistics,
    RunnableModel,
    calibration_statistics,
    kl_and_nll,
    next_token_log_probs,
    parse_setting,
    quantized,
    runnable_model,
)
from attnid.edits.whole_checkpoint import (
    WholeCheckpoint,
    checkpoint_copy,
    read_whole_checkpoint,
    untied,
    write_whole_checkpoint,
)
from attnid.theory import whole_model as theory
from attnid.theory.census import log_probs as census_log_probs

EXACT_PROBE_TOKENS = 64  # the float64 check's window (the census's forward is float64 throughout: slow)


@dataclass(frozen=True)
class RotateRequest:
    """What ``attnid rotate`` is asked to do (its flags)."""

    moves: tuple[str, ...]
    residual: str = "hadamard"
    seed: int = 0
    pick_seeds: int = 1  # R1: the best of seeds seed .. seed + pick_seeds - 1 on calibration text
    pick_setting: str = "A4"  # what "best" means: the lowest KL under this quantization setting
    ov: str = "optimized"
    qk: str = "optimized"
    keep_tied: bool = False
    group: int = 0


def requested_moves(names: list[str]) -> tuple[str, ...]:
    """The moves named, in the order they are made; ``residual`` implies ``fuse-norms``."""
    unknown = [name for name in names if name not in ROTATE_MOVES]
    if unknown or not names:
        raise UserError(f"--moves {','.join(names)}: choose among {', '.join(ROTATE_MOVES)}")
    chosen = set(names) | ({"fuse-norms"} if "residual" in names else set())
    return tuple(move for move in ROTATE_MOVES if move in chosen)


def refusal(shape: theory.WholeModelShape, request: RotateRequest) -> str | None:
    """Why the architecture does not admit a requested move (its census class), or None."""
    e, v = shape.attention.n_embd, shape.vocab_size
    if "residual" in request.moves and shape.tied and request.keep_tied:
        kept = theory.stream_rotation_dim(shape)
        full = theory.stream_rotation_dim(replace(shape, tied=False))
        return (
            f"residual: a tied model keeps {kept:,} of the {full:,} stream rotations (census class "
            f"stream_rotation, V={v}, E={e}): a rotation of the stream needs lm_head untied from wte "
            f"(+{v * e:,} parameters); drop --keep-tied"
        )
    if "residual" in request.moves and shape.block == "parallel":
        return "residual: a parallel block's shared norm is not covered by these moves"
    if request.residual == "hadamard" and "residual" in request.moves and hadamard(e) is None:
        return f"residual: no Hadamard matrix of order E={e} is built here; use --residual random"
    return None


def move_notes(shape: theory.WholeModelShape, request: RotateRequest) -> list[str]:
    """What each move is in the census's terms, for this architecture (docs/design.md §16)."""
    notes = []
    a = shape.attention
    if "fuse-norms" in request.moves and shape.tied and request.keep_tied:
        notes.append("fuse-norms: ln_f kept: its reader is the tied embedding (norm_gain counts free norms)")
    if "residual" in request.moves:
        dim = theory.stream_rotation_dim(replace(shape, tied=False))
        if shape.norm == "layernorm":
            notes.append(
                f"residual: LayerNorm admits the rotations that fix 1_E, so(E-1) ({dim:,} dimensions)"
            )
        else:
            notes.append(f"residual: class stream_rotation, so(E) ({dim:,} dimensions)")
    if "qk" in request.moves:
        per = "its RoPE commutant, a scale and a phase per plane" if a.rope else "GL_D"
        notes.append(
            f"qk: class attention_qk, {per} per key group ({theory.attention_qk_dim(shape):,} dimensions)"
        )
    if "ov" in request.moves:
        notes.append(
            f"ov: class attention_ov, GL_D per key/value group "
            f"({theory.attention_ov_dim(shape):,} dimensions)"
        )
    if "smooth" in request.moves:
        notes.append("smooth: the norms' gains against their readers' columns (class norm_gain)")
        if shape.mlp in theory.GATED_MLPS:
            notes.append("smooth: the gated MLP's hidden units (class gated_mlp_scale)")
        else:
            notes.append(
                f"smooth: down projection inputs left: a {shape.mlp} MLP has no gated_mlp_scale class"
            )
    return notes


class ScratchModel:
    """One runnable model (float32) whose weights are replaced by each candidate point of the orbit."""

    def __init__(self, checkpoint: Checkpoint, whole: WholeCheckpoint):
        self.checkpoint = checkpoint_copy(checkpoint)
        write_whole_checkpoint(self.checkpoint, whole)
        self.model: RunnableModel = runnable_model(self.checkpoint, torch.float32)

    def load(self, whole: WholeCheckpoint) -> RunnableModel:
        write_whole_checkpoint(self.checkpoint, whole)
        by_name = {key.removeprefix("_orig_mod."): key for key in self.checkpoint.tensors}
        with torch.no_grad():
            for name, tensor in self.model.module.state_dict(keep_vars=True).items():
                if name in by_name:
                    tensor.copy_(self.checkpoint.tensors[by_name[name]])
                    # the scratch copy shares the model's tensor again: one float32 copy of the model
                    self.checkpoint.tensors[by_name[name]] = tensor.detach()
        return self.model


def _pick_residual(
    whole: WholeCheckpoint, checkpoint: Checkpoint, request: RotateRequest, calibration: torch.Tensor | None
) -> tuple[WholeCheckpoint, dict]:
    """``R1`` of ``request.seed``, or the seed whose rotated model has the least calibration KL under
    ``request.pick_setting``."""
    e, layernorm = whole.shape.attention.n_embd, whole.shape.norm == "layernorm"
    seeds = list(range(request.seed, request.seed + request.pick_seeds))
    if len(seeds) == 1:
        rotation = stream_rotation(e, request.residual, seeds[0], layernorm)
        return rotate_stream(whole, rotation), {"residual_seed": seeds[0]}
    if calibration is None:
        raise UserError("--pick-seed needs calibration text: pass --text FILE")
    setting = parse_setting(request.pick_setting)
    scratch = ScratchModel(checkpoint, whole)
    reference = next_token_log_probs(scratch.model, calibration)
    scores = {}
    for index, seed in enumerate(seeds):
        progress.stage(f"scoring residual seed {seed} ({index + 1} of {len(seeds)})")
        rotation = stream_rotation(e, request.residual, seed, layernorm)
        model = scratch.load(rotate_stream(whole, rotation))
        with quantized(model, setting, request.group):
            scores[seed] = float(kl_and_nll(model, calibration, reference)[0].mean())
        rotate_stream(whole, rotation.T)  # back (the moves act in place)
    best = min(scores, key=lambda seed: scores[seed])
    rotation = stream_rotation(e, request.residual, best, layernorm)
    return rotate_stream(whole, rotation), {
        "residual_seed": best,
        "seed_scores": {str(seed): score for seed, score in scores.items()},
        "pick_setting": setting.name,
    }


def _group_moves(
    whole: WholeCheckpoint, kind: str, stats: CalibrationStatistics | None, seed: int, circuit: str
):
    """Per layer ``(G, D, D)``: the ``ov`` move (``M`` on values) or the ``qk`` move (``A`` on queries)."""
    a = whole.shape.attention
    g, d = a.n_kv_head, a.head_dim
    generator = torch.Generator().manual_seed(seed)
    matrices = []
    for layer in range(whole.shape.n_layer):
        moves = []
        for group in range(g):
            if kind == "optimized":
                assert stats is not None
                if circuit == "ov":
                    w_o = whole.params[f"h{layer}.attn.w_o"]
                    heads = range(group * a.heads_per_group, (group + 1) * a.heads_per_group)
                    columns = [w_o[:, h * d : (h + 1) * d] for h in heads]
                    amplifier = torch.stack([c.T @ c for c in columns]).sum(dim=0)
                    moves.append(optimized_pair_move(stats.values[layer][group], amplifier))
                elif a.rope:
                    moves.append(rope_plane_scales(stats.keys[layer][group], stats.queries[layer][group]))
                else:  # keys are rounded: B on them, A = B^-T on the queries
                    key_move = optimized_pair_move(stats.keys[layer][group], stats.queries[layer][group])
                    moves.append(torch.linalg.inv(key_move).T)
            elif circuit == "qk" and a.rope:
                moves.append(random_rope_commutant(d, generator))
            elif kind == "hadamard":
                spread = hadamard(d)
                if spread is None:
                    raise UserError(f"--ov hadamard: no Hadamard matrix of order D={d} is built here")
                moves.append(spread * random_signs(d, generator)[None, :])
            else:
                moves.append(haar_orthogonal(d, generator) if circuit == "ov" else _random_gl(d, generator))
        matrices.append(torch.stack(moves))
    return matrices


def _random_gl(d: int, generator: torch.Generator) -> torch.Tensor:
    """A well-conditioned random element of GL_D: a rotation times scales in [0.5, 2]."""
    scales = 2 ** (torch.rand(d, generator=generator, dtype=torch.float64) * 2 - 1)
    return haar_orthogonal(d, generator) * scales[None, :]


def _smooth(whole: WholeCheckpoint, stats: CalibrationStatistics) -> WholeCheckpoint:
    """SmoothQuant's scales on the orbit: a gated MLP's hidden units first (they change the up rows that the
    second norm's scales read), then every norm against its readers; both their own fixed points."""
    if whole.shape.mlp in theory.GATED_MLPS:
        hidden = [
            smoothing_scales(
                stats.input_max[("down", layer)], whole.params[f"h{layer}.mlp.w_down"].abs().amax(dim=0)
            )
            for layer in range(whole.shape.n_layer)
        ]
        whole = scale_gated_hidden(whole, hidden)
    junction_scales = {}
    for norm, readers in all_junctions(whole).items():
        if norm == "ln_f":
            continue
        layer, name = int(norm.split(".")[0][1:]), norm.split(".")[1]
        site = "qkv" if name == "ln_1" else "up"
        weight_max = torch.cat([whole.params[r] for r in readers]).abs().amax(dim=0)
        junction_scales[norm] = smoothing_scales(stats.input_max[(site, layer)], weight_max)
    return scale_junctions(whole, junction_scales)


@torch.no_grad()
def exact_log_probs(whole: WholeCheckpoint, probe: torch.Tensor) -> torch.Tensor:
    """The census's own float64 forward (:func:`attnid.theory.census.log_probs`, every operation in
    float64, unlike ``transformers``' RMSNorm) of the probe's inputs: what the moves' exactness is
    measured on. It is the family's model up to what no move touches (Gemma's embedding scale and tanh
    GELU)."""
    window = probe[:1, : EXACT_PROBE_TOKENS + 1]
    return census_log_probs(whole.params, window[:, :-1], whole.shape, whole.rope_base)


def rotate_whole(
    checkpoint: Checkpoint,
    request: RotateRequest,
    calibration: torch.Tensor | None,
    probe: torch.Tensor | None = None,
) -> tuple[WholeCheckpoint, dict]:
    """The checkpoint's model moved as ``request`` asks (not written), and the report of the moves; with a
    ``probe``, the moves' own change of the log-probabilities in float64 (``exact_max_abs_dlogp``)."""
    whole = read_whole_checkpoint(checkpoint)
    reason = refusal(whole.shape, request)
    if reason is not None:
        raise UserError(reason)
    before = None if probe is None else exact_log_probs(whole, probe)
    report: dict = {"moves": list(request.moves), "notes": move_notes(whole.shape, request)}
    report["params_before"] = sum(t.numel() for t in whole.params.values())
    untie = "residual" in request.moves or ("fuse-norms" in request.moves and not request.keep_tied)
    if whole.shape.tied and untie:
        whole = untied(whole)
    report["untied_params"] = sum(t.numel() for t in whole.params.values()) - report["params_before"]
    if "fuse-norms" in request.moves:
        whole = fuse_norms(whole)
    if "residual" in request.moves:
        progress.stage("rotating the residual stream")
        whole, picked = _pick_residual(whole, checkpoint, request, calibration)
        report.update(picked)
    data_driven = "smooth" in request.moves or any(
        move in request.moves and kind == "optimized"
        for move, kind in (("qk", request.qk), ("ov", request.ov))
    )
    stats = None
    if data_driven:
        if calibration is None:
            raise UserError(
                "the optimized moves (--ov, --qk optimized) and smooth need calibration text: pass "
                "--text FILE"
            )
        progress.stage("calibration statistics")
        stats = calibration_statistics(ScratchModel(checkpoint, whole).model, calibration)
    if "qk" in request.moves:
        whole = move_query_key(whole, _group_moves(whole, request.qk, stats, request.seed, "qk"))
    if "ov" in request.moves:
        whole = move_value_output(whole, _group_moves(whole, request.ov, stats, request.seed, "ov"))
    if "smooth" in request.moves:
        assert stats is not None
        whole = _smooth(whole, stats)
    if before is not None and probe is not None:
        report["exact_max_abs_dlogp"] = float((exact_log_probs(whole, probe) - before).abs().max())
    return whole, report


@torch.no_grad()
def probe_change(before: Checkpoint, after: Checkpoint, probe: torch.Tensor) -> float:
    """``max |log p_after - log p_before|`` over the probe's positions and the vocabulary, both the format's
    own model computing in float32 with its stored tensors (the rounding to the stored dtype is part of
    the change), as the edits prove theirs (docs/design.md §9)."""
    reference = next_token_log_probs(runnable_model(before, torch.float32), probe)
    moved = next_token_log_probs(runnable_model(after, torch.float32), probe)
    change = float((moved - reference).abs().max())
    return change if math.isfinite(change) else math.inf
