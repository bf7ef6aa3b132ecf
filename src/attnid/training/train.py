"""``attnid train``: one training run (optimizer case, learning rate, seed) with ρ, β, τ, μ logged.

The loop is nanoGPT's ``train.py`` (cosine schedule with linear warmup, gradient
clipping, periodic train/val evaluation) with the measurements of the paper's §5
after the optimizer step (:meth:`Run.train_step`), in the precision of ``--dtype``
(:mod:`attnid.training.precision`):

    loss = model(batch); prefetch the next batch   # the loss stays on the device until a log step
    scaler.scale(loss).backward(); scaler.unscale_(optimizer); clip
    scaler.step(optimizer); scaler.update()
    remove_orbit_component(model, pre)             # adamw_projected: the step's orbit part removed (§13)
    future = metrics.after_step(model, step, lr, row)   # every step: a copy of the attention weights for
        # the exact drift split D1, D2 (docs/design.md §7); on log rows also, from the same copies:
        #   rho of the step just taken (E1, E2), drift1, drift2, closure,
        #   tau by a probe rebalance on a copy of the model (every --tau-every rows), beta, mu
    rebalance steps: rebalancing.rebalance(model, tracker, ...)  # orbit move in place (E3), after the
        # step's rho and drift columns; then drift.reset_reference(model), beta, mu; AdamW's moments
        # kept, the first transported, or reset (attnid.training.moments)
    row = head | future.result() | eval losses  # appended in step order

:class:`attnid.training.metrics_pipeline.MetricsPipeline` runs the metrics: on the training
thread (``--metrics-threads 0``) or on worker threads while training goes on, with the same rows.

The options are :class:`attnid.training.config.TrainConfig`, the optimizer cases
:data:`attnid.training.cases.CASES`, and the run directory (``metrics.csv``, ``run.json``,
``ckpt.pt``, resuming) :mod:`attnid.training.rundir`. See the README's "experiments" section.
Host syncs only at log steps, batch prefetch, ``--compile``, ``--metrics-device``:
:mod:`attnid.training.loop`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from concurrent.futures import Future
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import torch

from attnid.common import progress
from attnid.common.errors import UserError
from attnid.measure import rebalancing
from attnid.measure.drift import attention_snapshot
from attnid.model import gauge
from attnid.model.gpt import GPT, GPTConfig
from attnid.model.options import GAUGE_POINT
from attnid.model.step_projection import remove_orbit_component
from attnid.training import gpu_slots, loop, moments, precision, rundir
from attnid.training.batches import (
    FixedEvalBatches,
    TrainBatches,
    batch_from_starts,
    random_starts,
    split_loss,
)
from attnid.training.cases import get_case
from attnid.training.config import TrainConfig, resume_free_keys
from attnid.training.loop import get_lr
from attnid.training.metrics_pipeline import MetricsPipeline, RowRequest, queue_steps_for
from attnid.training.runtime import StopSignals, format_duration, resolve_device, say

# Offset that gives the fixed probe batch its own seed, apart from the training batches'.
PROBE_SEED_OFFSET = 7_919
# Sequences in the fixed probe batch of tau: round-off shows on a few sequences as well as on many,
# and the probe's two forward passes at every log step are most of the metrics' cost.
PROBE_SEQUENCES = 2


def _isnan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------


class Run:
    """One training run: its data, model, optimizer, tracker, the metric rows, the step and the clocks.

    :func:`train` calls set-up (``__init__``, :meth:`load_checkpoint`, :meth:`build`,
    :meth:`resume`), then :meth:`train_step` until the end, then :meth:`finish`. A new
    per-step measurement goes into :meth:`measure` (log steps) and its column into the row.
    """

    def __init__(self, cfg: TrainConfig):
        from attnid.training.data import load_meta, load_split

        self.cfg, self.case = cfg, get_case(cfg.case)
        torch.set_num_threads(cfg.threads)
        self.device = resolve_device(cfg.device)
        self.dtype = precision.resolve_dtype(cfg.dtype, self.device)
        precision.configure_tf32(self.dtype)
        if self.dtype == "float64":
            precision.warn_if_slow_float64(self.device)
        if cfg.data is None or cfg.out is None:
            raise ValueError("Run needs a TrainConfig from attnid.training.config.resolve_config")
        self.meta = load_meta(cfg.data)
        self.splits = {"train": load_split(cfg.data, "train"), "val": load_split(cfg.data, "val")}
        for name, data in self.splits.items():
            if len(data) <= cfg.block_size + 1:
                raise UserError(
                    f"{name}.bin has {len(data)} tokens, fewer than --block-size {cfg.block_size} + 2"
                )
        self.model_config = GPTConfig(
            block_size=cfg.block_size,
            vocab_size=int(self.meta["vocab_size"]),
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_embd=cfg.n_embd,
            dropout=cfg.dropout,
            bias=cfg.bias,
            n_kv_head=cfg.n_kv_head,
            rope=cfg.rope,
            head_dim=cfg.head_dim,
        )
        self.check_memory()
        self.out = Path(cfg.out)
        self.ckpt_path = self.out / rundir.CHECKPOINT_FILE
        # the resolved dtype: '--dtype auto' and the dtype it stands for resume each other
        self.key = rundir.resume_key(
            asdict(cfg) | {"dtype": self.dtype}, resume_free_keys(), self.device.type, self.meta
        )
        self.rows: list[dict] = []
        # rows whose metric columns are still being computed: (head, future of the metrics, tail)
        self.pending_rows: list[tuple[dict, Future | None, dict]] = []
        self.metrics_waited = {"queue": 0.0, "drain": 0.0}  # before this process (resumed runs)
        self.step, self.best_val_loss, self.wall_before = 0, 1e9, 0.0
        self.final_val_loss_full: float | None = None  # the final model on the whole val split (finish)
        self.resumed_at: list[int] = []  # the steps this run was resumed at
        self.status = "completed"
        self.diverged_step: int | None = None
        self.diverged_loss: float | None = None
        self.tokens_per_step = cfg.batch_size * cfg.block_size
        self.metrics_device = loop.resolve_metrics_device(cfg.metrics_device, self.device)
        self.losses, self.device_name = loop.LossWatch(cfg.diverge_threshold), loop.device_name(self.device)

    def check_memory(self) -> None:
        """Refuse, before allocating, a model or batch that needs more memory than the device has free
        (the lower-bound estimate of docs/design.md §6.2)."""
        from attnid.common.memory import format_size, require_memory
        from attnid.model.footprint import training_footprint
        from attnid.model.gpt import parameter_count

        cfg = self.cfg
        parts = training_footprint(self.model_config, cfg.batch_size, self.dtype, self.case.optimizer_states)
        what = (
            f"--batch-size {cfg.batch_size} x --block-size {cfg.block_size} with this model "
            f"({format_size(parameter_count(self.model_config), ' parameters')}, {self.dtype})"
        )
        require_memory(parts, self.device, what, "lower --batch-size, --block-size or the model's size")

    def autocast(self) -> contextlib.AbstractContextManager:
        return precision.autocast_context(self.dtype, self.device)

    def load_checkpoint(self) -> dict | None:
        if self.cfg.fresh or not self.ckpt_path.exists():
            return None
        return rundir.load_run_checkpoint(self.ckpt_path, self.key)

    def build(self) -> None:
        """Model, optimizer and every source of randomness, seeded from --seed."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.model = precision.apply_model_dtype(GPT(self.model_config).to(self.device), self.dtype)
        self.model.train()
        # adamw_projected: the last step's removed and whole squared norms per circuit
        self.removed: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        probe_generator = torch.Generator().manual_seed(cfg.seed + PROBE_SEED_OFFSET)
        train_data = self.splits["train"]
        probe_starts = random_starts(
            len(train_data), min(cfg.batch_size, PROBE_SEQUENCES), cfg.block_size, probe_generator
        )
        probe_batch = batch_from_starts(train_data, probe_starts, cfg.block_size, self.device)
        on_orbit = self.case.gauge_fixed or cfg.initial_point == GAUGE_POINT
        self.gauge = self.fix_gauge(probe_batch) if on_orbit else None
        # the control outside attention: as many MLP entries frozen as the gauge fixes (docs/design.md §14)
        self.frozen = gauge.freeze_random_mlp_entries(self.model, cfg.seed) if cfg.freeze_mlp else None
        # the compiled module trains and evaluates; checkpoints and metrics use the plain one (same tensors)
        self.compiled = loop.resolve_compile(cfg.compile, self.device)
        # torch.compile's wrapper forwards the GPT's calls and attributes to it
        self.forward_model = cast(GPT, torch.compile(self.model)) if self.compiled else self.model
        self.optimizer = self.case.make_optimizer(self.model, cfg, self.device.type)
        if self.frozen is not None:  # weight decay moved the frozen entries: put them back
            self.optimizer.register_step_post_hook(lambda *_: self.frozen.restore())
        self.scaler = precision.grad_scaler(self.dtype, self.device)
        self.batches = TrainBatches(
            self.splits["train"], cfg.batch_size, cfg.block_size, self.device, cfg.seed
        )
        self.evaluator = FixedEvalBatches(self.splits, cfg, self.device)
        self.tracker, self.drift, self.metrics = None, None, None
        if cfg.metrics or self.case.rebalances:
            from attnid.measure.metrics import MetricTracker

            # records I_0 from the initial weights
            self.tracker = MetricTracker(
                self.model, probe_batch=probe_batch, metrics_device=self.metrics_device
            )
        if cfg.metrics:
            from attnid.measure.drift import DriftTracker

            assert self.tracker is not None  # made above: cfg.metrics makes one
            decay = cfg.weight_decay if self.case.coupled_weight_decay else None
            self.drift = DriftTracker(self.model, coupled_weight_decay=decay)  # I_ref = I_0
            self.metrics = MetricsPipeline(
                self.model,
                self.tracker,
                self.drift,
                threads=cfg.metrics_threads,
                queue_steps=queue_steps_for(cfg.log_every),
                tf32_training=precision.trains_with_tf32(self.dtype, self.device),
                probes=not self.case.rebalances,
            )

    @torch.no_grad()
    def fix_gauge(self, probe_batch: tuple[torch.Tensor, torch.Tensor]) -> dict:
        """adamw_gauge_fixed: fix one block per key and value group, at the gauge point (the initial weights
        moved there) or at their initial values; --initial-point gauge of another case: the move alone
        (docs/design.md §14). Before the optimizer, the tracker's I_0 and torch.compile see the model.
        Returns what run.json records of it: the initial point, whether blocks are fixed, the largest
        condition number of the blocks (inverted, or fixed where they are: a gauge only if invertible), and
        the change of the probe batch's logits (eval mode), max-abs over max-abs."""
        point, fixed = self.cfg.initial_point, self.case.gauge_fixed
        assert point is not None  # resolve_config sets it from the case
        self.model.eval()
        before = self.model(probe_batch[0], full_logits=True)[0]
        if fixed:
            condition = gauge.fix_gauge(self.model, at=point)
        else:
            condition = gauge.move_to_gauge_point(self.model)
        after = self.model(probe_batch[0], full_logits=True)[0]
        self.model.train()
        change = float((after - before).abs().max() / before.abs().max())
        what = f"blocks fixed at the {point} point" if fixed else "moved to the gauge point, nothing fixed"
        say(
            f"gauge: {what}, block condition number <= {condition:.3g}, probe logits changed by "
            f"{change:.2e} (relative)"
        )
        return {"initial_point": point, "fixed": fixed, "condition": condition, "logit_change": change}

    def resume(self, checkpoint: dict) -> None:
        ours = checkpoint["attnid"]
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if ours.get("scaler"):
            self.scaler.load_state_dict(ours["scaler"])
        self.batches.set_generator_state(ours["batch_generator"])
        torch.set_rng_state(ours["torch_rng"])
        if self.device.type == "cuda" and ours.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ours["cuda_rng"], self.device)
        if self.tracker is not None:
            self.tracker.load_state_dict(ours["tracker"])
        if self.drift is not None:
            self.drift.load_state_dict(ours["drift"])
        self.rows, self.step = list(ours["rows"]), int(checkpoint["iter_num"])
        self.best_val_loss, self.losses.first_loss = checkpoint["best_val_loss"], ours["first_loss"]
        self.wall_before, self.resumed_at = ours["wall_s"], ours["resumed_at"] + [self.step]
        self.metrics_waited = dict(ours.get("metrics_waited") or self.metrics_waited)
        say(f"resuming from {self.ckpt_path} at step {self.step}/{self.cfg.max_iters}")
        warning = loop.other_gpu_warning(ours.get("device_name"), self.device_name)
        if warning is not None:
            say(warning)

    def start_clocks(self) -> None:
        cfg, device = self.cfg, self.device
        if self.metrics is not None:
            self.metrics.restart(self.model, self.step)  # this step's weights: the first pre-step point
        self.started = self.last_row_time = self.last_progress = time.time()
        self.last_row_step = self.step
        overlap = self.metrics is not None and cfg.metrics_threads
        metrics = f" + {cfg.metrics_threads} metrics" if overlap else ""
        say(
            f"case {cfg.case}, lr {cfg.lr:g}, seed {cfg.seed}, "
            f"{self.model.get_num_params() / 1e6:.2f}M parameters, "
            f"{device.type} ({precision.describe(self.dtype)}), {cfg.threads}{metrics} thread(s), "
            f"{cfg.max_iters} steps -> {self.out}"
        )

    def wall_s(self) -> float:
        return self.wall_before + time.time() - self.started

    def metrics_wait(self) -> dict[str, float]:
        """Seconds training waited for the metrics, over every process of the run: for a place in the
        pipeline's queue, and for the queue to empty (checkpoints, rebalances, the end)."""
        queue_s, drain_s = (self.metrics.queue_wait_s, self.metrics.drain_s) if self.metrics else (0.0, 0.0)
        before = self.metrics_waited
        return {"queue": before["queue"] + queue_s, "drain": before["drain"] + drain_s}

    def save_checkpoint(self, summary: dict | None = None) -> None:
        self.collect_rows()  # the trackers' state and every row up to this step
        device = self.device
        rundir.save_run_checkpoint(
            self.ckpt_path,
            model_state=self.model.state_dict(),
            optimizer_state=self.optimizer.state_dict(),
            model_args=self.model_config.model_args(),
            iter_num=self.step,
            best_val_loss=self.best_val_loss,
            config=asdict(self.cfg),
            ours={
                "resume_key": self.key,
                "rows": self.rows,
                "summary": summary,
                "batch_generator": self.batches.generator_state(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                "tracker": self.tracker.state_dict() if self.tracker is not None else None,
                "drift": self.drift.state_dict() if self.drift is not None else None,
                "scaler": self.scaler.state_dict(),
                "first_loss": self.losses.first_loss,
                "wall_s": self.wall_s(),
                "resumed_at": self.resumed_at,
                "device_name": self.device_name,
                "metrics_waited": self.metrics_wait(),
            },
        )

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

    def train_step(self) -> bool:
        """One optimizer step, with its measurements and row on log steps; False when the run diverged.

        Steps without a row make no host sync: their loss waits in :attr:`losses`."""
        cfg = self.cfg
        lr = get_lr(self.step, cfg)
        step = self.step + 1  # the update being made: theta_{step-1} -> theta_step
        is_rebalance = self.case.rebalances and step % cfg.rebalance_every == 0
        is_eval = step % cfg.eval_every == 0 or step == cfg.max_iters
        is_row = step % cfg.log_every == 0 or is_eval or is_rebalance or step == cfg.max_iters
        result = self.forward_backward(lr, sync=is_row)
        if result is None:
            return False
        loss, grad_norm = result
        self.step = step
        # adamw_projected removes the orbit part of the realised step, which needs the pre-step weights
        pre = attention_snapshot(self.model) if self.case.projects_steps else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if pre is not None:  # before the drift split and rho see the step (docs/design.md §13)
            with precision.no_tf32():
                self.removed = remove_orbit_component(self.model, pre)
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
                self.rebalance(row, metrics)
            metrics = None
        tail: dict[str, float] = {}
        if is_eval:
            self.evaluate(tail)
        self.finish_row(row, metrics, tail)
        self.report_progress(loss_value, lr)
        return True

    def row_request(self, is_row: bool, is_rebalance: bool) -> RowRequest | None:
        """What this step's row measures: tau by a probe on every --tau-every-th row of a run that does not
        rebalance; a rebalance row takes beta and mu after its move (:meth:`rebalance`)."""
        if not is_row:
            return None
        if is_rebalance:
            return RowRequest(tau=False, state=False)
        probe = not self.case.rebalances and self.rows_logged() % self.cfg.tau_every == 0
        return RowRequest(tau=probe)

    def rebalance(self, row: dict, metrics: Future | None) -> None:
        """The rebalancing cases' orbit move (rho and the drift split up to it measured before it, the rest
        after; the drift's reference becomes the rebalanced imbalance), row marked."""
        assert self.tracker is not None  # build makes one for every case that rebalances
        if metrics is not None:
            assert self.metrics is not None  # the future of a row's metrics comes from the pipeline
            self.metrics.drain()
            row.update(metrics.result())
        before = attention_snapshot(self.model) if self.cfg.rebalance_moments == "first-moment" else None
        row.update(rebalancing.rebalance(self.model, self.tracker, target=self.cfg.rebalance_target))
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
        if saving and not self.check_losses():  # never checkpoint a run that has diverged since the last row
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

    # ----- the end ----------------------------------------------------------------------

    def summary(self) -> dict:
        """run.json: status, final losses, what the figures need, and how the run was made."""
        cfg, device = self.cfg, self.device
        waited = self.metrics_wait()
        last_eval: dict = next((r for r in reversed(self.rows) if not _isnan(r.get("val_loss"))), {})
        scale = self.tracker.initial_imbalance_scale() if self.tracker is not None and cfg.metrics else None
        return {
            "status": self.status,
            "case": cfg.case,
            "lr": cfg.lr,
            "seed": cfg.seed,
            "steps_completed": self.step,
            "max_iters": cfg.max_iters,
            "diverged_step": self.diverged_step,
            "diverged_loss": self.diverged_loss,
            "final_train_loss": last_eval.get("eval_train_loss"),
            "final_val_loss": last_eval.get("val_loss"),
            "final_eval_step": last_eval.get("step"),
            "final_val_loss_full": self.final_val_loss_full,
            "wall_time_s": self.wall_s(),
            "device": device.type,
            "dtype": self.dtype,
            "metrics_device": self.metrics_device,
            "compiled": self.compiled,
            "device_name": self.device_name,
            "threads": cfg.threads,
            "n_params": self.model.get_num_params(),
            "resumed_at": self.resumed_at,
            "trained_attention_params": gauge.trainable_attention_params(self.model),
            "gauge": self.gauge,
            "frozen_mlp_entries": self.frozen.count if self.frozen is not None else None,
            "metrics_threads": cfg.metrics_threads if self.metrics is not None else None,
            "metrics_queue_wait_s": waited["queue"],
            "metrics_drain_s": waited["drain"],
            "initial_imbalance_scale": scale,
            "finished_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": rundir.versions(),
            "git_commit": rundir.git_commit(),
            "config": asdict(cfg),
        }

    def finish(self) -> int:
        self.check_losses()  # nothing is pending after the last step (it has a row) or a divergence
        self.collect_rows()
        if self.status == "completed" and self.cfg.full_val_eval:  # the interventions' metric (§11.5)
            progress.stage("evaluating the final model on the whole val split")
            # the plain module: a compiled one would compile again for the last, shorter batch
            self.final_val_loss_full = split_loss(
                self.model,
                self.splits["val"],
                self.cfg.block_size,
                self.cfg.batch_size,
                self.device,
                self.autocast,
            )
        summary = self.summary()
        self.save_checkpoint(summary)
        rundir.write_outputs(self.out, self.rows, summary)
        say(
            f"{self.status} at step {self.step}: final val loss {summary['final_val_loss']}, "
            f"{summary['wall_time_s']:.1f} s -> {self.out / rundir.METRICS_FILE}, "
            f"{self.out / rundir.RUN_FILE}"
        )
        return 0


def train(cfg: TrainConfig) -> int:
    """Run (or resume) one training run; returns the exit status (0 also for a diverged run)."""
    if cfg.device != "cpu" and not torch.cuda.is_initialized():
        gpu_slots.acquire_gpu_slot()  # before CUDA starts: this job's own GPU on a multi-GPU machine
    progress.stage(f"reading the data in {cfg.data}")
    run = Run(cfg)
    progress.stage(f"reading {run.ckpt_path}")
    checkpoint = run.load_checkpoint()
    if checkpoint is not None and checkpoint["attnid"].get("summary") is not None:
        say(
            f"{run.ckpt_path} holds a finished run ({checkpoint['attnid']['summary']['status']}); "
            f"rewriting metrics.csv and run.json from it"
        )
        rundir.write_outputs(run.out, checkpoint["attnid"]["rows"], checkpoint["attnid"]["summary"])
        return 0
    rundir.remove_outputs(run.out)
    progress.stage("building the model")
    run.build()
    if checkpoint is not None:
        run.resume(checkpoint)
    try:
        run.start_clocks()
        if run.step == 0:
            progress.stage("evaluating the initial model")
            run.log_initial_state()
        # a line when steps are slow (a large model): progress.Heartbeat reads this between the loop's
        # own lines
        progress.stage(lambda: f"step {run.step}/{cfg.max_iters}")
        with StopSignals() as stop:
            # a divergence found at a checkpoint's sync (stop_if_requested) ends the loop too
            while run.status != "diverged" and run.step < cfg.max_iters and run.train_step():
                exit_status = run.stop_if_requested(stop)
                if exit_status is not None:
                    return exit_status
        return run.finish()
    finally:
        if run.metrics is not None:
            run.metrics.close()
