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
- **τ's probe** runs on a worker, from the copies the step's job holds: the attention tensors (copied at
  every step for the drift split) and, on a probed row only, the rest of the model's weights
  (:class:`attnid.measure.rebalancing.ProbeCopy`). Its two forward passes need TF32 off, and TF32 is a
  process-wide switch (``no_tf32``) that only the training thread may turn (a worker turning it would
  change what the training thread's kernels and ``torch.compile``'s guards see). So with bf16/fp16
  training on CUDA the worker makes the move (the probe's linear algebra) and the training thread, at
  its next step, the two small forward passes on the copy; elsewhere (CPU; float32, float64) the worker
  makes both. The numbers are the same wherever each part runs.

Rebalancing runs rebalance on the training thread (:class:`attnid.training.loop.TrainingLoop`); their
other log rows go through the pipeline like any other.
"""

from __future__ import annotations

import collections
import contextlib
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
from attnid.measure.products import CircuitPairs, Point, steps_between
from attnid.model.layout import attention_tensors, layout_of
from attnid.theory.circuits import CIRCUITS
from attnid.training import precision

if TYPE_CHECKING:
    from attnid.measure.drift import DriftTracker
    from attnid.measure.metrics import MetricTracker
    from attnid.model.moves import Move


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
    others: list[torch.Tensor] | None  # a probed row: the weights outside attention (ProbeCopy.others)
    future: Future | None


@dataclass
class _WaitingProbe:
    """A probed row whose move a worker has made and whose forward passes wait for the training thread."""

    job: _Job
    columns: dict[str, float]  # the row's columns before τ's
    moves: dict[str, Move]
    state: dict[str, float]  # β and μ, after τ's columns


def queue_steps_for(log_every: int) -> int:
    """Steps that may wait for a worker: room for a log step's job and the steps up to the next one."""
    return 2 * log_every + 2


class MetricsPipeline:
    """The per-step and log-row metrics of one run, on ``threads`` worker threads (0: synchronous).

    ``tracker`` and ``drift`` are the run's :class:`attnid.measure.metrics.MetricTracker` and
    :class:`attnid.measure.drift.DriftTracker`; the pipeline reads them when a job runs, so a resumed
    tracker state is what it continues from. ``tf32_training``: whether training runs with TF32 on
    (then τ's forward passes are the training thread's, its move a worker's). Call :meth:`restart` before
    the first step.
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
        self.forwards_on_worker = threads > 0 and not tf32_training
        self.queue_wait_s = self.drain_s = 0.0
        self.queue_waits = 0
        # τ's probe moves this copy, never the model: the probe may run while the model trains on
        self._probe = rebalancing.ProbeCopy(model) if probes else None
        self._probe_lock = threading.Lock()  # one probe at a time on that copy
        self._waiting: collections.deque[_WaitingProbe] = collections.deque()  # for the training thread
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
        if self._probe is not None:
            self.tracker.rebalance_targets(self.tau_target)  # prepared here (after a resume), not by a worker

    def after_step(
        self, model: torch.nn.Module, step: int, lr: float, row: RowRequest | None
    ) -> Future | None:
        """Hand over optimizer step ``step`` (just taken, at rate ``lr``); returns the future of the row's
        metric columns when ``row`` asks for them (resolved in the order steps were handed over)."""
        self._raise_if_failed()
        if self._last is None:
            raise RuntimeError("MetricsPipeline.restart was not called before the first step")
        self._measure_waiting_probes()
        tensors = attention_tensors(model)
        post = Point(_copy_tensors(tensors) if self.threads else tensors, self.layout)
        others = None
        if row is not None and row.tau:
            # the attention tensors are in `post`; a worker needs the rest as they are now
            others = self._probe_copy().others(model, copy=self.threads > 0)
        job = _Job(step, lr, self._last, post, row, others, Future() if row is not None else None)
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
        device = self.tracker.compute_device
        with torch.no_grad(), precision.no_tf32():
            if tau:
                moves = self._plan_probe(point.pairs(device))
                minima = {circuit: move.minimum for circuit, move in moves.items()}
                job = _Job(0, 0.0, point, point, None, self._probe_copy().others(model, copy=False), None)
                columns = self._measure_probe(job, moves)
            columns |= self.tracker.state_row(point.pairs(device), minima)
            columns |= self.drift.row_at(point.pairs())
        return columns

    def drain(self) -> None:
        """Wait until every handed-over step is done (its sums added, its row's columns ready)."""
        if self._workers:
            start = time.perf_counter()
            self._queue.join()
            self._measure_waiting_probes()
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
            if job.future is not None and result is not None:  # None: a probe waits for its forwards
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
        if not job.row.tau:
            return columns | (self.tracker.state_row(job.post.pairs(device)) if job.row.state else {})
        moves = self._plan_probe(job.post.pairs(device))  # μ reuses the move's orbit minimum
        minima = {circuit: move.minimum for circuit, move in moves.items()}
        state = self.tracker.state_row(job.post.pairs(device), minima) if job.row.state else {}
        if self.threads and not self.forwards_on_worker:  # TF32 training: the training thread's forwards
            with self._order:
                self._waiting.append(_WaitingProbe(job, columns, moves, state))
            return None
        return columns | self._measure_probe(job, moves) | state

    def _probe_copy(self) -> rebalancing.ProbeCopy:
        if self._probe is None:
            raise RuntimeError("MetricsPipeline made without probes was asked for tau")
        return self._probe

    def _plan_probe(self, pairs: dict[str, CircuitPairs]) -> dict[str, Move]:
        """The probe rebalance's moves at these pairs: the maths, nothing written (any thread)."""
        self._probe_copy()
        stacked = {circuit: (pairs[circuit].pair_a, pairs[circuit].pair_b) for circuit in CIRCUITS}
        return rebalancing.plan_moves(self.tracker, stacked, self.tau_target)

    def _measure_probe(self, job: _Job, moves: dict[str, Move]) -> dict[str, float]:
        """τ across ``moves`` at the job's weights, on the pipeline's copy of the model."""
        assert job.others is not None  # after_step takes them for every probed row
        with self._probe_lock:
            return self._probe_copy().measure(job.others, job.post.tensors, self.tracker, moves)

    def _measure_waiting_probes(self) -> None:
        """On the training thread: the forward passes of the probes whose moves the workers have made
        (TF32 training), which completes their rows."""
        while True:
            with self._order:
                if not self._waiting:
                    return
                waiting = self._waiting.popleft()
            future = waiting.job.future
            assert future is not None  # a probed row's job has one
            try:
                with torch.no_grad(), precision.no_tf32():
                    tau = self._measure_probe(waiting.job, waiting.moves)
            except BaseException as err:
                self._fail(err)
                future.set_exception(err)
                raise
            future.set_result(waiting.columns | tau | waiting.state)

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
