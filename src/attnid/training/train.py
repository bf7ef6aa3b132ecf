"""``attnid train``: one training run (optimizer case, learning rate, seed) with ρ, β, τ, μ logged.

:func:`train` sets a run up (:class:`Run`: the data, the model and its variant, the optimizer case, the
gauge, every source of randomness seeded from ``--seed``, or all of it resumed from ``ckpt.pt``), trains
it (the step loop, :class:`attnid.training.loop.TrainingLoop`, which :class:`Run` is) and finishes it:
the last checkpoint, ``metrics.csv`` and ``run.json`` (:meth:`Run.summary`).

The options are :class:`attnid.training.config.TrainConfig`, the optimizer cases
:data:`attnid.training.cases.CASES`, and the run directory (``metrics.csv``, ``run.json``,
``ckpt.pt``, resuming) :mod:`attnid.training.rundir`. See the README's "experiments" section.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import torch

from attnid.common import progress
from attnid.common.errors import UserError
from attnid.common.memory import format_size, require_memory
from attnid.measure.drift import DriftTracker
from attnid.measure.metrics import MetricTracker
from attnid.model import gauge
from attnid.model.footprint import training_footprint
from attnid.model.gpt import GPT, GPTConfig, parameter_count
from attnid.model.options import GAUGE_POINT
from attnid.training import gpu_slots, precision, rundir, runtime
from attnid.training.batches import (
    FixedEvalBatches,
    TrainBatches,
    batch_from_starts,
    random_starts,
    split_loss,
)
from attnid.training.cases import get_case
from attnid.training.config import TrainConfig, resume_free_keys
from attnid.training.data import load_meta, load_split
from attnid.training.loop import TrainingLoop
from attnid.training.metrics_pipeline import MetricsPipeline, queue_steps_for
from attnid.training.runtime import StopSignals, resolve_device, say

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


class Run(TrainingLoop):
    """One training run: its data, model, optimizer, tracker, the metric rows, the step and the clocks.

    :func:`train` calls set-up (``__init__``, :meth:`load_checkpoint`, :meth:`build`,
    :meth:`resume`, :meth:`start_clocks`), then the loop's :meth:`steps`, then :meth:`finish`.
    """

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.case = get_case(cfg.case)
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
        self.metrics_waited = {"queue": 0.0, "drain": 0.0}  # before this process (resumed runs)
        self.wall_before = 0.0
        self.final_val_loss_full: float | None = None  # the final model on the whole val split (finish)
        self.resumed_at = []
        self.metrics_device = runtime.resolve_metrics_device(cfg.metrics_device, self.device)
        self.device_name = runtime.device_name(self.device)
        self.checkpointed = False  # ckpt.pt holds this run (saved or resumed from): a diverged run keeps it

    def check_memory(self) -> None:
        """Refuse, before allocating, a model or batch that needs more memory than the device has free
        (the lower-bound estimate of docs/design.md §6.2)."""
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
        try:
            return rundir.load_run_checkpoint(self.ckpt_path, self.key)
        except rundir.CheckpointOfAnotherRun as err:
            if not self.cfg.restart_if_changed:
                raise
            # the workflow's job reruns because the run's settings changed: its old checkpoint is not this
            # run's, and the first checkpoint of this one replaces it (docs/design.md §6)
            say(f"{self.ckpt_path} was written with other settings ({err.differences}): starting over")
            return None

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
        self.gauge = None
        if self.case.gauge_fixed or cfg.initial_point == GAUGE_POINT:
            point, fixed = cfg.initial_point, self.case.gauge_fixed
            assert point is not None  # resolve_config sets it from the case
            self.gauge = start = gauge.start_at_gauge(self.model, probe_batch[0], point, fixed)
            what = (
                f"blocks fixed at the {point} point" if fixed else "moved to the gauge point, nothing fixed"
            )
            say(
                f"gauge: {what}, block condition number <= {start['condition']:.3g}, probe logits changed by "
                f"{start['logit_change']:.2e} (relative)"
            )
        # the control outside attention: as many MLP entries frozen as the gauge fixes (docs/design.md §14)
        self.frozen = gauge.freeze_random_mlp_entries(self.model, cfg.seed) if cfg.freeze_mlp else None
        # the compiled module trains and evaluates; checkpoints and metrics use the plain one (same tensors)
        self.compiled = runtime.resolve_compile(cfg.compile, self.device)
        # torch.compile's wrapper forwards the GPT's calls and attributes to it
        self.forward_model = cast(GPT, torch.compile(self.model)) if self.compiled else self.model
        self.optimizer = self.case.make_optimizer(self.model, cfg, self.device.type)
        if self.frozen is not None:  # weight decay moved the frozen entries: put them back
            frozen = self.frozen
            self.optimizer.register_step_post_hook(lambda *_: frozen.restore())
        self.scaler = precision.grad_scaler(self.dtype, self.device)
        self.batches = TrainBatches(
            self.splits["train"], cfg.batch_size, cfg.block_size, self.device, cfg.seed
        )
        self.evaluator = FixedEvalBatches(self.splits, cfg, self.device)
        self.tracker, self.drift, self.metrics = None, None, None
        if cfg.metrics or self.case.rebalances:
            # records I_0 from the initial weights
            self.tracker = MetricTracker(
                self.model, probe_batch=probe_batch, metrics_device=self.metrics_device
            )
        if cfg.metrics:
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

    def resume(self, checkpoint: dict) -> None:
        shapes = {name: tensor.shape for name, tensor in self.model.state_dict().items()}
        rundir.check_resumable(checkpoint, self.ckpt_path, shapes)
        ours = checkpoint["attnid"]
        try:  # what check_resumable cannot see: optimizer groups, tracker states of another shape
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
        except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise UserError(
                f"{self.ckpt_path} cannot be resumed ({type(err).__name__}: {first}); delete it or pass "
                f"--fresh to start over"
            ) from None
        self.checkpointed = True
        self.rows, self.step = list(ours["rows"]), int(checkpoint["iter_num"])
        self.best_val_loss, self.losses.first_loss = checkpoint["best_val_loss"], ours["first_loss"]
        self.wall_before, self.resumed_at = ours["wall_s"], ours["resumed_at"] + [self.step]
        self.metrics_waited = dict(ours.get("metrics_waited") or self.metrics_waited)
        say(f"resuming from {self.ckpt_path} at step {self.step}/{self.cfg.max_iters}")
        warning = runtime.other_gpu_warning(ours.get("device_name"), self.device_name)
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
        self.checkpointed = True
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

    def full_split_loss(self) -> float:
        # the plain module: a compiled one would compile again for the last, shorter batch
        cfg, val = self.cfg, self.splits["val"]
        return split_loss(self.model, val, cfg.block_size, cfg.batch_size, self.device, self.autocast)

    def finish(self) -> int:
        self.check_losses()  # nothing is pending after the last step (it has a row) or a divergence
        self.collect_rows()
        wanted = self.cfg.full_val_eval or self.cfg.full_val_every is not None
        if self.status == "completed" and wanted:  # the interventions' metric (§11.5)
            last = self.rows[-1] if self.rows else {}
            if last.get("step") == self.step and not _isnan(last.get("val_loss_full")):
                self.final_val_loss_full = float(last["val_loss_full"])  # --full-val-every's last row
            else:
                progress.stage("evaluating the final model on the whole val split")
                self.final_val_loss_full = self.full_split_loss()
        summary = self.summary()
        if self.status != "diverged":
            self.save_checkpoint(summary)
        elif not (self.checkpointed and rundir.record_divergence(self.ckpt_path, self.rows, summary)):
            # no good checkpoint of this run: none is kept (a --fresh run's older one is not this run's)
            self.ckpt_path.unlink(missing_ok=True)
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
    if rundir.rewrite_if_finished(checkpoint, run.ckpt_path, run.out):
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
        # a line when steps are slow (a large model): progress.Heartbeat reads it between the loop's lines
        progress.stage(lambda: f"step {run.step}/{cfg.max_iters}")
        with StopSignals() as stop:
            exit_status = run.steps(stop)
        return exit_status if exit_status is not None else run.finish()
    finally:
        if run.metrics is not None:
            run.metrics.close()
