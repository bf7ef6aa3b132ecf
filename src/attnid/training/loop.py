"""The training loop of ``attnid train``: nanoGPT's step loop with the measurements of the paper's §5.

nanoGPT's ``train.py`` loop (:func:`get_lr`, its cosine schedule with linear warmup; gradient clipping;
periodic train/val evaluation), with the measurements after the optimizer step
(:meth:`TrainingLoop.train_step`), in the precision of ``--dtype`` (:mod:`attnid.training.precision`):

    loss = model(batch); prefetch the next batch   # the loss stays on the device until a log step
    scaler.scale(loss).backward(); scaler.unscale_(optimizer); clip
    scaler.step(optimizer); scaler.update()
    remove_orbit_component(model, pre)             # adamw_projected: the step's orbit part removed (§13)
    future = metrics.after_step(model, step, lr, row)   # every step: a copy of the attention weights for
        # the exact drift split D1, D2 (docs/design.md §7); on log rows also, from the same copies:
        #   rho of the step just taken (E1, E2), drift1, drift2, closure,
        #   tau by a probe rebalance on a copy of the model (every --tau-every rows), beta, mu
    rebalance steps: rebalancing.rebalancing_move(model, tracker, ...)  # orbit move in place (E3), after the
        # step's rho and drift columns; then drift.reset_reference(model), beta, mu; AdamW's moments
        # kept, the first transported, or reset (attnid.training.moments)
    row = head | future.result() | eval losses  # appended in step order

:class:`attnid.training.metrics_pipeline.MetricsPipeline` runs the metrics: on the training thread
(``--metrics-threads 0``) or on worker threads while training goes on, with the same rows. Setting a run
up and finishing it (``run.json``, the last checkpoint) is :class:`attnid.training.train.Run`'s.

The host waits for the device only at log steps, as in nanoGPT: a ``loss.item()`` or a ``.item()`` of the
gradient norm at every step would stall the host once per step and leave the GPU idle while the host
builds the next batch. :class:`LossWatch` keeps the training losses since the last host sync on the
device; at each sync (step 1 for the first loss, the steps with a metrics.csv row, checkpoint saves) they
are read in one transfer and checked for divergence, and the first bad one gives ``diverged_step`` and
``diverged_loss`` exactly as a per-step check would. The steps taken after it until the sync are
discarded from the record (their rows were never written); only the model weights in a diverged run's
final checkpoint are those of the sync step.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from attnid.measure import rebalancing
from attnid.measure.drift import attention_snapshot
from attnid.model.step_projection import remove_orbit_component
from attnid.training import moments, precision
from attnid.training.config import TrainConfig
from attnid.training.metrics_pipeline import RowRequest
from attnid.training.runtime import StopSignals, format_duration, say

if TYPE_CHECKING:
    from attnid.measure.drift import DriftTracker
    from attnid.measure.metrics import MetricTracker
    from attnid.model.gpt import GPT
    from attnid.training.batches import FixedEvalBatches, TrainBatches
    from attnid.training.cases import Case
    from attnid.training.metrics_pipeline import MetricsPipeline


def get_lr(it: int, cfg: Any) -> float:  # a resolved TrainConfig, or run.json's config as a namespace
    """nanoGPT's schedule for 0-based step ``it``: linear warmup, cosine decay to min_lr, then flat."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    decay_ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


class LossWatch:
    """The training losses since the last host sync, kept on the device, and the divergence check.

    :meth:`add` keeps a step's loss tensor; :meth:`check` reads every pending loss in one
    device-to-host transfer (the first one ever becomes :attr:`first_loss`, the reference of
    the default threshold, 3 x the first loss) and returns the first bad one.
    """

    def __init__(self, diverge_threshold: float | None, first_loss: float | None = None):
        self.diverge_threshold, self.first_loss = diverge_threshold, first_loss
        self.steps: list[int] = []
        self.losses: list[torch.Tensor] = []

    @property
    def needs_first_loss(self) -> bool:
        return self.first_loss is None

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.steps.append(step)
        self.losses.append(loss.detach())

    def sync(self) -> list[tuple[int, float]]:
        """``(step, loss)`` of every pending step, read in one transfer; empties the buffer."""
        if not self.losses:
            return []
        values = torch.stack(self.losses).tolist()
        pending = list(zip(self.steps, values, strict=True))
        self.steps, self.losses = [], []
        if self.first_loss is None:
            self.first_loss = pending[0][1]
        return pending

    def threshold(self) -> float:
        if self.diverge_threshold is not None:
            return self.diverge_threshold
        assert self.first_loss is not None, "threshold() before the first loss was read (sync)"
        return 3.0 * self.first_loss

    def check(self) -> tuple[int, float] | None:
        """Sync, then the first pending ``(step, loss)`` that is NaN/inf or above the threshold, or None."""
        pending = self.sync()
        for step, loss in pending:
            if not math.isfinite(loss) or loss > self.threshold():
                return step, loss
        return None


class TrainingLoop(ABC):
    """The steps of one run and the rows they log: what :class:`attnid.training.train.Run` does between
    setting up and finishing.

    :meth:`steps` calls :meth:`train_step` until the end, a divergence or a stop signal. A new per-step
    measurement goes into the metrics pipeline (log steps) and its column into the row.
    """

    # made by the set-up (Run.build, Run.start_clocks, Run.resume) before the first step
    case: Case
    model: GPT
    forward_model: GPT  # the compiled module where --compile, the model otherwise (the same tensors)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batches: TrainBatches
    evaluator: FixedEvalBatches
    tracker: MetricTracker | None
    drift: DriftTracker | None
    metrics: MetricsPipeline | None
    removed: dict[str, tuple[torch.Tensor, torch.Tensor]] | None  # adamw_projected: the last step's
    resumed_at: list[int]  # the steps this run was resumed at
    started: float
    last_row_time: float
    last_row_step: int
    last_progress: float

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rows: list[dict] = []
        # rows whose metric columns are still being computed: (head, future of the metrics, tail)
        self.pending_rows: list[tuple[dict, Future | None, dict]] = []
        self.step, self.best_val_loss = 0, 1e9
        self.status = "completed"
        self.diverged_step: int | None = None
        self.diverged_loss: float | None = None
        self.tokens_per_step = cfg.batch_size * cfg.block_size
        self.losses = LossWatch(cfg.diverge_threshold)

    @abstractmethod
    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision context of a forward pass (``--dtype``)."""

    @abstractmethod
    def wall_s(self) -> float:
        """Seconds the run has trained, over every process of it."""

    @abstractmethod
    def save_checkpoint(self, summary: dict | None = None) -> None:
        """``ckpt.pt``: the run as it is after this step."""

    @abstractmethod
    def full_split_loss(self) -> float:
        """The model's loss on the whole val split (docs/design.md §11.5)."""

    def is_full_eval(self, step: int) -> bool:
        """Whether ``step`` is one of ``--full-val-every``'s: step 0, every N-th and the last."""
        every = self.cfg.full_val_every
        return every is not None and (step % every == 0 or step == self.cfg.max_iters)

    def steps(self, stop: StopSignals) -> int | None:
        """Train until ``max_iters`` or a divergence (None), or until ``stop`` asks (the exit status)."""
        # a divergence found at a checkpoint's sync (stop_if_requested) ends the loop too
        while self.status != "diverged" and self.step < self.cfg.max_iters and self.train_step():
            exit_status = self.stop_if_requested(stop)
            if exit_status is not None:
                return exit_status
        return None

    # ----- logging and evaluation -----------------------------------------------------

    def finish_row(self, row: dict, metrics: Future | None = None, tail: dict | None = None) -> None:
        """Append ``row | metrics | tail | timing`` to the rows, in step order; ``metrics`` (a future of the
        row's metric columns) may still be being computed."""
        now = time.time()
        tail = dict(tail or {})
        elapsed = max(now - self.last_row_time, 1e-9)
        tail["tokens_per_s"] = (self.step - self.last_row_step) * self.tokens_per_step / elapsed
        tail["wall_s"] = self.wall_s()
        self.last_row_time, self.last_row_step = now, self.step
        self.pending_rows.append((row, metrics, tail))
        self.collect_rows(wait=False)

    def collect_rows(self, wait: bool = True) -> None:
        """Move finished rows, in order, from :attr:`pending_rows` to :attr:`rows`; with ``wait``, all of them
        (after the metrics pipeline is drained)."""
        if wait and self.metrics is not None:
            self.metrics.drain()
        while self.pending_rows:
            head, metrics, tail = self.pending_rows[0]
            if metrics is not None and not wait and not metrics.done():
                return
            self.rows.append(head | (metrics.result() if metrics is not None else {}) | tail)
            self.pending_rows.pop(0)

    def rows_logged(self) -> int:
        return len(self.rows) + len(self.pending_rows)

    def evaluate(self, row: dict) -> None:
        losses = self.evaluator.losses(self.forward_model, self.autocast)
        row["eval_train_loss"], row["val_loss"] = losses["train"], losses["val"]
        self.best_val_loss = min(self.best_val_loss, losses["val"])

    def log_initial_state(self) -> None:
        """Row 0: eval losses, beta = 0, mu and tau of the initialisation."""
        row: dict[str, float] = {"step": 0, "rebalanced": 0}
        if self.metrics is not None:
            row.update(self.metrics.initial_row(self.model, tau=not self.case.rebalances))
        self.evaluate(row)
        if self.is_full_eval(0):
            row["val_loss_full"] = self.full_split_loss()
        self.finish_row(row)

    def report_progress(self, loss_value: float, lr: float) -> None:
        now = time.time()
        if now - self.last_progress < self.cfg.progress_every:
            return
        self.last_progress = now
        since = self.resumed_at[-1] if self.resumed_at else 0
        rate = (self.step - since) * self.tokens_per_step / max(now - self.started, 1e-9)
        eta = (self.cfg.max_iters - self.step) * self.tokens_per_step / max(rate, 1e-9)
        say(
            f"step {self.step}/{self.cfg.max_iters} loss {loss_value:.4f} lr {lr:.2e} {rate:,.0f} tok/s "
            f"eta {format_duration(eta)}"
        )

    # ----- one step -------------------------------------------------------------------

    def forward_backward(self, lr: float, sync: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Loss and clipped gradient norm of the next batch, as device tensors. With ``sync`` (and at
        step 1, for the first loss) the pending losses are read and checked first: None (status
        'diverged') when one of them is bad, before this step's update."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.batches.next()
        with self.autocast():
            _, loss = self.forward_model(x, y)
        self.batches.prefetch()  # as nanoGPT: the host builds the next batch while the device computes
        self.losses.add(self.step + 1, loss)
        if (sync or self.losses.needs_first_loss) and not self.check_losses():
            return None
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)  # fp16: clip the true gradient
        clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        return loss.detach(), torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)

    def check_losses(self) -> bool:
        """Read and check the pending losses (one host sync); False at the first bad one, which sets the
        status, ``diverged_step``/``diverged_loss`` and ``step`` exactly as a check at every step would."""
        bad = self.losses.check()
        if bad is not None:
            self.status, (self.diverged_step, self.diverged_loss) = "diverged", bad
            # the steps after it until this sync are not part of the record
            self.step = self.diverged_step - 1
            say(
                f"loss {self.diverged_loss:.4g} at step {self.diverged_step} (threshold "
                f"{self.losses.threshold():.4g}): run diverged"
            )
        return bad is None

    def check_weights(self, step: int, lr: float) -> bool:
        """Whether the weights after the update of ``step`` are finite, and so are their squares in float64
        (every Gram and product the metrics take is a sum of such products, docs/design.md §3): one host
        sync. If not, that update is where the run diverged (status, ``diverged_step``, ``step`` set as for
        a bad loss), whatever the metrics were about to compute; False."""
        norms = torch.stack(
            [torch.linalg.vector_norm(p.detach(), dtype=torch.float64) for p in self.model.parameters()]
        )
        if bool(torch.isfinite(norms.square().sum())):
            return True
        if self.check_losses():  # no earlier loss was bad: this update is where the run diverged
            self.status, self.diverged_step, self.diverged_loss = "diverged", step, math.inf
            self.step = step - 1
            say(f"the update of step {step} at lr {lr:.4g} leaves non-finite weights: run diverged")
        return False

    def train_step(self) -> bool:
        """One optimizer step, with its measurements and row on log steps; False when the run diverged.

        Steps without a row make no host sync: their loss waits in :attr:`losses`."""
        cfg = self.cfg
        lr = get_lr(self.step, cfg)
        step = self.step + 1  # the update being made: theta_{step-1} -> theta_step
        is_rebalance = self.case.rebalances and step % cfg.rebalance_every == 0
        is_eval = step % cfg.eval_every == 0 or step == cfg.max_iters
        is_full_eval = self.is_full_eval(step)
        is_row = step % cfg.log_every == 0 or is_eval or is_full_eval or is_rebalance
        result = self.forward_backward(lr, sync=is_row)
        if result is None:
            return False
        loss, grad_norm = result
        self.step = step
        # adamw_projected removes the orbit part of the realised step, which needs the pre-step weights
        pre = attention_snapshot(self.model) if self.case.projects_steps else None
        try:
            self.scaler.step(self.optimizer)
        except RuntimeError as err:  # an lr like 1e308 makes the update itself unrepresentable
            if "overflow" not in str(err):
                raise
            if self.check_losses():  # no earlier loss was bad: this update is where the run diverged
                self.status, self.diverged_step, self.diverged_loss = "diverged", step, math.inf
                self.step = step - 1
                say(f"the update of step {step} overflows at lr {lr:.4g}: run diverged")
            return False
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if pre is not None:  # before the drift split and rho see the step (docs/design.md §13)
            with precision.no_tf32():
                self.removed = remove_orbit_component(self.model, pre)
        if is_row and not self.check_weights(step, lr):  # before the row's metrics see them
            return False
        metrics = None  # the optimizer's step only, before any rebalance: every step for the drift split
        if self.metrics is not None:
            metrics = self.metrics.after_step(self.model, step, lr, self.row_request(is_row, is_rebalance))
        if not is_row:
            return True
        loss_value = loss.item()
        row = {
            "step": step,
            "lr": lr,
            "train_loss": loss_value,
            "grad_norm": grad_norm.item(),
            "rebalanced": 0,
        }
        if self.removed is not None:
            for circuit, (removed_sq, step_sq) in self.removed.items():
                whole = float(step_sq)
                row[f"projected_out_{circuit}"] = float(removed_sq) / whole if whole > 0 else 0.0
        if is_rebalance:
            with precision.no_tf32():
                self.rebalancing_step(row, metrics)
            metrics = None
        tail: dict[str, float] = {}
        if is_eval:
            self.evaluate(tail)
        if is_full_eval:
            tail["val_loss_full"] = self.full_split_loss()
        self.finish_row(row, metrics, tail)
        self.report_progress(loss_value, lr)
        return True

    def row_request(self, is_row: bool, is_rebalance: bool) -> RowRequest | None:
        """What this step's row measures: tau by a probe on every --tau-every-th row of a run that does not
        rebalance; a rebalance row takes beta and mu after its move (:meth:`rebalancing_step`)."""
        if not is_row:
            return None
        if is_rebalance:
            return RowRequest(tau=False, state=False)
        probe = not self.case.rebalances and self.rows_logged() % self.cfg.tau_every == 0
        return RowRequest(tau=probe)

    def rebalancing_step(self, row: dict, metrics: Future | None) -> None:
        """The rebalancing cases' orbit move (rho and the drift split up to it measured before it, the rest
        after; the drift's reference becomes the rebalanced imbalance), row marked."""
        assert self.tracker is not None  # build makes one for every case that rebalances
        if metrics is not None:
            assert self.metrics is not None  # the future of a row's metrics comes from the pipeline
            self.metrics.drain()
            row.update(metrics.result())
        before = attention_snapshot(self.model) if self.cfg.rebalance_moments == "first-moment" else None
        row.update(rebalancing.rebalancing_move(self.model, self.tracker, target=self.cfg.rebalance_target))
        if self.drift is not None:
            self.drift.reset_reference(self.model)
        row["rebalanced"] = 1
        if before is not None:  # the first moment maps with the move (docs/design.md §15)
            moments.transport_first_moment(self.optimizer, self.model, before)
        elif self.cfg.rebalance_moments == "reset":  # the moved tensors' moments point the old way
            moments.reset_moments(self.optimizer, self.model)
        if self.metrics is not None:
            row.update(self.tracker.state_metrics(self.model))
            self.metrics.restart(self.model, self.step)  # the next step starts from the rebalanced weights

    def stop_if_requested(self, stop: StopSignals) -> int | None:
        """After a step: on SIGTERM/SIGINT (or --stop-after) save a checkpoint and return the exit status;
        save the periodic checkpoint otherwise."""
        cfg, step = self.cfg, self.step
        stop_requested = stop.signum is not None or (cfg.stop_after is not None and step == cfg.stop_after)
        saving = step < cfg.max_iters and (stop_requested or step % cfg.ckpt_every == 0)
        # never checkpoint a run that has diverged since the last row, nor weights that are not finite
        if saving and not (self.check_losses() and self.check_weights(step, get_lr(step - 1, cfg))):
            return None
        if stop_requested and step < cfg.max_iters:
            self.save_checkpoint()
            signum = stop.signum if stop.signum is not None else signal.SIGTERM
            say(
                f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint saved, "
                f"rerun the same command to resume"
            )
            return 128 + int(signum)
        if step % cfg.ckpt_every == 0 and step < cfg.max_iters:
            self.save_checkpoint()
        return None
