"""The metrics of a training run, computed off the training loop's critical path (docs/design.md §3.6).

After every optimizer step the loop hands :meth:`MetricsPipeline.after_step` the model; the
pipeline keeps a copy of the attention tensors (the pre-step point of the next step is this
step's post-step point, so one copy per step serves both) and, on a log row, what the row
measures (:class:`RowRequest`). A *job* per step then computes, from those copies and in
float64:

- every step: the drift split's terms ``L``, ``Q`` (docs/design.md §7), added to the
  :class:`attnid.measure.drift.DriftTracker`'s sums in step order;
- log rows: ρ of the step (§3.1) and the drift columns, τ by a probe rebalance on a copy of
  the model (§3.3; rows picked by ``--tau-every``), β and μ at the new weights (§3.2, §3.4).

With ``threads = 0`` each job runs at once on the training thread: the synchronous path.
With ``threads >= 1`` jobs go to that many worker threads and training goes on. Both paths
run the same code on the same numbers (the copies are exact), so their rows are identical.

- **Order.** The drift sums are added in step order whatever thread runs a job (a job waits
  for its turn), and :meth:`after_step` returns a future per log row that the loop resolves
  in step order.
- **Bounded.** At most ``queue_steps`` steps wait for a worker. When the workers fall behind,
  :meth:`after_step` blocks until one is free: training waits, and the waiting time is
  summed in :attr:`queue_wait_s` (``metrics_queue_wait_s`` in run.json).
- **Drained** (:meth:`drain`, time in :attr:`drain_s`) before anything reads the trackers'
  state: a checkpoint, a rebalance (which needs the step's ρ before it moves the weights and
  restarts the drift split), the end of the run.
- **τ's forward passes** run on a worker only when training has TF32 off (CPU, float32 and
  float64 on CUDA): TF32 is a process-wide switch that the probe needs off (``no_tf32``), so with
  bf16/fp16 training the training thread makes the probe itself, on the copy of the model.

Rebalancing runs rebalance on the training thread (:class:`attnid.training.train.Run`); their
other log rows go through the pipeline like any other.
"""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnid.measure import rebalancing
from attnid.measure.products import Point, steps_between
from attnid.model.layout import attention_tensors, layout_of
from attnid.training import precision

if TYPE_CHECKING:
    from attnid.measure.drift import DriftTracker
    from attnid.measure.metrics import MetricTracker


@dataclass(frozen=True)
class RowRequest:
    """What a log row measures after its step: ρ and the drift columns always; τ by a probe rebalance
    (``tau``); β and μ at the new weights (``state``; rebalance rows measure them after the move)."""

    tau: bool
    state: bool = True


@dataclass
class _Job:
    step: int
    lr: float
    pre: Point
    post: Point
    row: RowRequest | None
    weights: list[torch.Tensor] | None  # the whole model's, for a τ probe on a worker
    tau: tuple[dict, dict] | None  # τ's columns and μ's minima when the training thread probed
    future: Future | None


def queue_steps_for(log_every: int) -> int:
    """Steps that may wait for a worker: room for a log step's job and the steps up to the next one."""
    return 2 * log_every + 2


class MetricsPipeline:
    """The per-step and log-row metrics of one run, on ``threads`` worker threads (0: synchronous).

    ``tracker`` and ``drift`` are the run's :class:`attnid.measure.metrics.MetricTracker` and
    :class:`attnid.measure.drift.DriftTracker`; the pipeline reads them when a job runs, so a resumed
    tracker state is what it continues from. ``tf32_training``: whether training runs with TF32 on
    (then τ's forward passes stay on the training thread). Call :meth:`restart` before the first step.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tracker: MetricTracker,
        drift: DriftTracker,
        *,
        threads: int,
        queue_steps: int,
        tf32_training: bool,
        probes: bool,
        tau_target: str = rebalancing.PROBE_TARGET,
    ) -> None:
        self.tracker, self.drift, self.threads, self.tau_target = tracker, drift, threads, tau_target
        self.layout = layout_of(model)
        self.probe_on_worker = threads > 0 and not tf32_training
        self.queue_wait_s = self.drain_s = 0.0
        self.queue_waits = 0
        # τ's probe moves this copy, never the model: the probe may run while the model trains on
        self._probe_model = copy.deepcopy(model).requires_grad_(False) if probes else None
        self._probe_lock = threading.Lock()  # one probe at a time on that copy
        self._last: Point | None = None
        self._next_step = 1
        self._error: BaseException | None = None
        self._order = threading.Condition()
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max(1, queue_steps))
        self._workers: list[threading.Thread] = []

    # ----- the training thread's calls --------------------------------------------------

    def restart(self, model: torch.nn.Module, step: int) -> None:
        """The model's current weights become the next step's pre-step point (the start, a resume, after a
        rebalance). Drains first."""
        self.drain()
        self._last = Point(_copy_tensors(attention_tensors(model)), self.layout)
        self._next_step = step + 1
        if self._probe_model is not None:
            self.tracker.rebalance_targets(self.tau_target)  # prepared here (after a resume), not by a worker

    def after_step(
        self, model: torch.nn.Module, step: int, lr: float, row: RowRequest | None
    ) -> Future | None:
        """Hand over optimizer step ``step`` (just taken, at rate ``lr``); returns the future of the row's
        metric columns when ``row`` asks for them (resolved in the order steps were handed over)."""
        self._raise_if_failed()
        if self._last is None:
            raise RuntimeError("MetricsPipeline.restart was not called before the first step")
        tensors = attention_tensors(model)
        post = Point(_copy_tensors(tensors) if self.threads else tensors, self.layout)
        weights = tau = None
        if row is not None and row.tau:
            if self.threads == 0 or self.probe_on_worker:
                weights = rebalancing.model_weights(model, copy=self.threads > 0)
            else:
                with precision.no_tf32():
                    tau = self._probe(rebalancing.model_weights(model, copy=False), post)
        job = _Job(step, lr, self._last, post, row, weights, tau, Future() if row is not None else None)
        self._last = post
        if self.threads == 0:
            with torch.no_grad(), precision.no_tf32():
                self._execute(job)
        else:
            self._put(job)
        return job.future

    def initial_row(self, model: torch.nn.Module, tau: bool) -> dict[str, float]:
        """The metric columns of row 0, at the model's current weights (after :meth:`restart`): τ of a probe
        rebalance (``tau``), β and μ, the drift columns (all zero but the closure)."""
        self.drain()
        point = self._last
        if point is None:
            raise RuntimeError("MetricsPipeline.restart was not called before initial_row")
        columns: dict[str, float] = {}
        minima: dict | None = None
        with torch.no_grad(), precision.no_tf32():
            if tau:
                columns, minima = self._probe(rebalancing.model_weights(model, copy=False), point)
            columns |= self.tracker.state_row(point.pairs(self.tracker.compute_device), minima)
            columns |= self.drift.row_at(point.pairs())
        return columns

    def drain(self) -> None:
        """Wait until every handed-over step is done (its sums added, its row's columns ready)."""
        if self._workers:
            start = time.perf_counter()
            self._queue.join()
            self.drain_s += time.perf_counter() - start
        self._raise_if_failed()

    def close(self) -> None:
        """Stop the workers (after the jobs already handed over)."""
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            worker.join()
        self._workers = []

    # ----- the jobs ------------------------------------------------------------------------

    def _execute(self, job: _Job) -> None:
        try:
            result = self._run(job)
        except BaseException as err:
            self._fail(err)
            if job.future is not None:
                job.future.set_exception(err)
            if self.threads == 0:
                raise
        else:
            if job.future is not None:
                job.future.set_result(result)

    def _run(self, job: _Job) -> dict[str, float] | None:
        drift_steps = steps_between(job.pre.pairs(), job.post.pairs())
        for step in drift_steps.values():  # the D x n products, outside the turn (workers share them out)
            step.cross_a, step.cross_b, step.step_gram_a, step.step_gram_b  # noqa: B018
        with self._turn(job.step):
            self.drift.add_step(drift_steps, job.lr)
            if job.row is None:
                return None
            drift_row = self.drift.row_at(job.post.pairs())
        device = self.tracker.compute_device
        steps = drift_steps  # the same pairs unless the metrics run on another device: reuse their products
        if job.post.pairs(device) is not job.post.pairs():
            steps = steps_between(job.pre.pairs(device), job.post.pairs(device))
        columns = self.tracker.step_row(steps) | drift_row
        minima = None
        if job.row.tau:
            if job.tau is not None:
                tau_columns, minima = job.tau
            else:
                assert job.weights is not None  # after_step takes the weights whenever it does not probe
                tau_columns, minima = self._probe(job.weights, job.post)
            columns |= tau_columns
        if job.row.state:
            columns |= self.tracker.state_row(job.post.pairs(device), minima)
        return columns

    def _probe(self, weights: list[torch.Tensor], point: Point) -> tuple[dict, dict]:
        """τ of a probe rebalance at ``weights`` (the whole model's), on the pipeline's copy of the model."""
        if self._probe_model is None:
            raise RuntimeError("MetricsPipeline made without probes was asked for tau")
        pairs = point.pairs(self.tracker.compute_device)
        with self._probe_lock:
            return rebalancing.tau_probe_on_copy(
                self._probe_model, weights, self.tracker, self.tau_target, pairs=pairs
            )

    @contextlib.contextmanager
    def _turn(self, step: int):
        """Step ``step``'s turn to add to the drift sums: after step ``step - 1``'s."""
        with self._order:
            while self._next_step != step and self._error is None:
                self._order.wait()
            self._raise_if_failed()
            try:
                yield
            finally:
                self._next_step = step + 1
                self._order.notify_all()

    # ----- the workers ---------------------------------------------------------------------

    def _put(self, job: _Job) -> None:
        if not self._workers:
            self._workers = [
                threading.Thread(target=self._work, name=f"attnid-metrics-{i}", daemon=True)
                for i in range(self.threads)
            ]
            for worker in self._workers:
                worker.start()
        try:
            self._queue.put_nowait(job)
            return
        except queue.Full:
            pass
        start = time.perf_counter()
        while True:  # blocked: the workers are behind; training waits for a free place
            self._raise_if_failed()
            try:
                self._queue.put(job, timeout=1.0)
                break
            except queue.Full:
                continue
        self.queue_wait_s += time.perf_counter() - start
        self.queue_waits += 1

    def _work(self) -> None:
        if sys.platform.startswith("linux"):  # per-thread niceness (a thread id is no process id elsewhere)
            # where cores are short the training thread goes first; the bounded queue makes it wait if the
            # workers fall too far behind
            with contextlib.suppress(OSError):
                nice = os.getpriority(os.PRIO_PROCESS, 0) + 5
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                with torch.no_grad():
                    self._execute(job)
            finally:
                self._queue.task_done()

    def _fail(self, err: BaseException) -> None:
        with self._order:
            if self._error is None:
                self._error = err
            self._order.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            error = self._error
            raise RuntimeError(f"the metrics failed: {type(error).__name__}: {error}") from error


def _copy_tensors(tensors_per_layer):
    """Copies (same dtype and device) of per-layer attention tensors."""
    return [tuple(None if t is None else t.detach().clone() for t in layer) for layer in tensors_per_layer]
