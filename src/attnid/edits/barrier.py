"""``attnid barrier`` and the held-out side of ``attnid compare`` (docs/design.md §18): the loss along the
straight line between two checkpoints, at three alignment levels, and the functional distance between them.

- The levels (:func:`alignment_levels`): ``none`` (B as it is), ``discrete`` (B after the head and MLP
  permutations alone, and the stream's where asked, weight matching as Git Re-Basin does: the anchor) and
  ``all`` (B after the asked classes of :func:`attnid.edits.alignment.align_whole`, by default every class
  the architecture has; ``--classes``).
- The line: ``theta(t) = (1 - t) theta_A + t theta_B`` for every parameter, norm gains and biases included
  (they interpolate as parameters like any other), computed in float64 in the census's names and written
  into a copy of B in B's stored dtype; its loss is the mean next-token cross-entropy on the held-out batch
  (:func:`attnid.edits.heldout.evaluate`, the format's own model as it loads from disk: nanoGPT's, or
  ``transformers``' for a GPT-2 or Llama-family folder, whose forward runs RoPE, grouped heads, the gated
  MLP and RMSNorm as the family does).
- The barrier: ``max_t [L(t) - ((1 - t) L(0) + t L(1))]``, the largest loss above the chord joining the
  end points (0 when the path never rises above it).
- The functional distance: the mean over the held-out positions of ``KL(p_A || p_B)``, the next-token
  distributions; B and B aligned compute the same function, so the two KLs agree: a check of the moves.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from attnid.common.errors import UserError
from attnid.edits.alignment import DEFAULT_CLASSES, align_whole
from attnid.edits.checkpoint_types import NANOGPT, Checkpoint
from attnid.edits.heldout import evaluate
from attnid.edits.quant_moves import ScratchModel
from attnid.edits.whole_checkpoint import (
    WholeCheckpoint,
    checkpoint_copy,
    read_whole_checkpoint,
    write_whole_checkpoint,
)
from attnid.measure.line import barrier_height
from attnid.measure.quantization import kl_per_token
from attnid.model.gpt import model_from_checkpoint, strip_compiled_prefix


def alignment_levels(classes: tuple = DEFAULT_CLASSES) -> dict[str, tuple]:
    """The levels of :func:`barrier_report` when its ``all`` level aligns ``classes``: the discrete level is
    their permutations (Git Re-Basin's anchor; the head and MLP permutations at least)."""
    discrete = (("stream",) if "stream" in classes else ()) + ("heads", "mlp")
    return {"none": (), "discrete": discrete, "all": classes}


MIN_POINTS, MAX_POINTS = 2, 1001


def check_points(points: int) -> None:
    if not MIN_POINTS <= points <= MAX_POINTS:
        raise UserError(
            f"--points {points}: choose between {MIN_POINTS} and {MAX_POINTS} points along the line"
        )


def t_values(points: int) -> list[float]:
    """``points`` evenly spaced values of ``t`` from 0 to 1, both included."""
    check_points(points)
    return [i / (points - 1) for i in range(points)]


def interpolate(a: WholeCheckpoint, b: WholeCheckpoint, t: float) -> WholeCheckpoint:
    """``(1 - t) a + t b`` for every parameter (float64), norm gains included."""
    params = {name: (1 - t) * tensor + t * b.params[name] for name, tensor in a.params.items()}
    return WholeCheckpoint(a.shape, params, a.gain_offset, a.rope_base)


def as_checkpoint(template: Checkpoint, whole: WholeCheckpoint) -> Checkpoint:
    """A copy of ``template`` (nothing written) holding ``whole``'s parameters in its stored dtype."""
    copy = checkpoint_copy(template)
    write_whole_checkpoint(copy, whole)
    return copy


class LineEvaluator:
    """The held-out loss and logits of points of one architecture: the format's own model, built once from
    ``template`` (nanoGPT: :func:`~attnid.edits.heldout.load_for_eval`'s; a Hugging Face folder:
    ``transformers``' in float32, :class:`~attnid.edits.quant_moves.ScratchModel`), its weights replaced by
    each point's as stored in ``template``'s format and dtype (a line of 11 points builds one model, not
    33)."""

    def __init__(self, template: Checkpoint, batch: torch.Tensor):
        self.template, self.batch = template, batch
        self.scratch = None
        if template.kind == NANOGPT:
            self.model = model_from_checkpoint(dict(template.payload, model=template.tensors)).eval()
        else:  # transformers' model of the folder (RoPE, GQA, SwiGLU, RMSNorm, Gemma's scale: its own)
            self.scratch = ScratchModel(template, read_whole_checkpoint(template))

    def __call__(self, whole: WholeCheckpoint) -> tuple[float, torch.Tensor]:
        if self.scratch is not None:
            model = self.scratch.load(whole)
            return evaluate(model.logits, self.batch)
        stored = as_checkpoint(self.template, whole).tensors
        self.model.load_state_dict(strip_compiled_prefix(stored))
        return evaluate(lambda ids: self.model(ids, full_logits=True)[0], self.batch)


def mean_kl(logits_p: torch.Tensor, logits_q: torch.Tensor) -> float:
    """Mean over positions of ``KL(softmax(p) || softmax(q))`` in nats, computed in float64."""
    log_p = F.log_softmax(logits_p.double(), dim=-1)
    return float(kl_per_token(log_p, F.log_softmax(logits_q.double(), dim=-1)).mean())


def loss_line(
    evaluator: LineEvaluator, a: WholeCheckpoint, b: WholeCheckpoint, ts: list[float], start: float
) -> tuple[list[float], torch.Tensor]:
    """The losses at every ``t`` (``start``: A's, at ``t = 0``) and the logits at ``t = 1``."""
    losses, logits = [start], None
    for t in ts[1:]:
        loss, logits = evaluator(b if t == 1 else interpolate(a, b, t))
        losses.append(loss)
    assert logits is not None
    return losses, logits


def functional_distance(logits_a: torch.Tensor, logits_b: torch.Tensor, logits_aligned: torch.Tensor) -> dict:
    """``KL(p_A || p_B)`` before and after the alignment (equal up to the stored dtype's round-off: the
    alignment keeps B's function) and the largest change of B's log-probabilities it makes."""
    kl_before, kl_after = mean_kl(logits_a, logits_b), mean_kl(logits_a, logits_aligned)
    dlogp = F.log_softmax(logits_aligned.double(), -1) - F.log_softmax(logits_b.double(), -1)
    return {
        "kl_before": kl_before,
        "kl_after": kl_after,
        "kl_change": abs(kl_after - kl_before),
        "max_abs_dlogp_aligned": float(dlogp.abs().max()),
    }


def barrier_report(
    template: Checkpoint,
    a: WholeCheckpoint,
    b: WholeCheckpoint,
    points: int,
    batch: torch.Tensor,
    seed: int = 0,
    classes: tuple = DEFAULT_CLASSES,
) -> dict:
    """The loss along the line A-B at each level of :func:`alignment_levels` and its barrier;
    ``alignment``: the report of the ``all`` level's alignment
    (:func:`~attnid.edits.alignment.align_whole`) with its functional distance (what ``attnid compare``
    reports)."""
    ts = t_values(points)
    evaluator = LineEvaluator(template, batch)
    loss_a, logits_a = evaluator(a)
    levels: dict[str, dict] = {}
    ends: dict[str, torch.Tensor] = {}
    last: dict[str, float] = {}  # each level's loss at t = 1
    alignment = None
    for level, asked in alignment_levels(classes).items():
        moved, report = align_whole(a, b, asked, seed) if asked else (b, None)
        losses, ends[level] = loss_line(evaluator, a, moved, ts, loss_a)
        levels[level] = {
            "classes": [] if report is None else report["classes"],
            "loss": losses,
            "barrier": barrier_height(ts, losses),
            "distance": None if report is None else report["distance_after"],
            "products": None if report is None else report["steps"][-1]["products"],
            "exact_max_abs_dlogp": None if report is None else report["exact_max_abs_dlogp"],
        }
        last[level] = losses[-1]
        if level == "all":
            alignment = report
    assert alignment is not None
    alignment["functional"] = functional_distance(logits_a, ends["none"], ends["all"])
    endpoints = [abs(loss - last["none"]) for loss in last.values()]
    return {
        "n_head": a.shape.attention.n_head,
        "t": ts,
        "levels": levels,
        "endpoint_loss_change": max(endpoints),  # the aligned B's loss against B's (same function)
        "alignment": alignment,
    }
