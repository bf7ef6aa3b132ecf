"""The metrics pipeline (``--metrics-threads``, ``--tau-every``): rows identical with and without worker
threads, resumes, the bounded queue and its logged waits, τ's cadence, and failures that surface."""

from __future__ import annotations

import copy
import json
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_runs import train

from attnid.measure import rebalancing
from attnid.measure.drift import DriftTracker
from attnid.measure.metrics import MetricTracker
from attnid.model import moves
from attnid.model.gpt import GPT, GPTConfig
from attnid.theory.circuits import CIRCUITS
from attnid.training import precision
from attnid.training.metrics_pipeline import MetricsPipeline, RowRequest, queue_steps_for
from attnid.training.rundir import TIMING_COLUMNS

# the tolerance the issue states for "identical": every metric column to 1e-12 (they are bit-identical)
RTOL = 1e-12


def rows(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv").drop(columns=list(TIMING_COLUMNS))


def run_json(out) -> dict:
    return json.loads((out / "run.json").read_text())


def assert_same_rows(actual: pd.DataFrame, expected: pd.DataFrame, rtol: float = RTOL) -> None:
    """Same columns in the same order, the same empty cells, every value equal to ``rtol``."""
    assert list(actual.columns) == list(expected.columns)
    assert len(actual) == len(expected)
    for column in expected.columns:
        got, want = actual[column].to_numpy(float), expected[column].to_numpy(float)
        assert (np.isnan(got) == np.isnan(want)).all(), column
        np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True, err_msg=column)


CASES = {
    "adamw": [
        "--case",
        "adamw",
        "--max-iters",
        "30",
        "--log-every",
        "3",
        "--eval-every",
        "10",
        "--tau-every",
        "2",
    ],
    "sgd_wd float64": [
        "--case",
        "sgd_wd",
        "--lr",
        "0.3",
        "--dtype",
        "float64",
        "--max-iters",
        "20",
        "--log-every",
        "2",
        "--eval-every",
        "10",
    ],
    "adamw_rebalance": [
        "--case",
        "adamw_rebalance",
        "--max-iters",
        "30",
        "--log-every",
        "3",
        "--rebalance-every",
        "10",
        "--dropout",
        "0.1",
        "--eval-every",
        "15",
    ],
    "rope gqa": [
        "--case",
        "sgd_momentum",
        "--rope",
        "--n-kv-head",
        "2",
        "--bias",
        "--max-iters",
        "20",
        "--log-every",
        "1",
        "--eval-every",
        "10",
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_rows_with_metric_threads_equal_the_synchronous_rows(prepared_data_dir, tmp_path, case):
    """The same run on the training thread and on 1 or 2 worker threads: every column equal (timing aside)."""
    flags = CASES[case]
    assert train(prepared_data_dir, tmp_path / "sync", *flags, "--metrics-threads", "0") == 0
    synchronous = rows(tmp_path / "sync")
    assert {"rho_qk", "drift1_qk", "closure_ov", "beta_ov", "mu_qk", "tau"} <= set(synchronous.columns)
    for threads in (1, 2):
        out = tmp_path / f"threads{threads}"
        assert train(prepared_data_dir, out, *flags, "--metrics-threads", threads) == 0
        assert_same_rows(rows(out), synchronous)
        info = run_json(out)
        assert info["metrics_threads"] == threads
        assert info["metrics_queue_wait_s"] >= 0 and info["metrics_drain_s"] >= 0
    assert run_json(tmp_path / "sync")["metrics_threads"] == 0


@pytest.mark.parametrize("stop_after", [7, 10])  # between rows; at a row, a rebalance and a checkpoint
def test_resume_with_metric_threads_equals_the_uninterrupted_synchronous_run(
    prepared_data_dir, tmp_path, stop_after
):
    """Stopped (as on SIGTERM) while the workers may be behind, resumed with another thread count: the rows
    are those of the uninterrupted run on the training thread (the checkpoint waits for the queue)."""
    flags = [
        "--case",
        "adamw_rebalance",
        "--rebalance-every",
        "10",
        "--max-iters",
        "20",
        "--log-every",
        "2",
        "--eval-every",
        "10",
        "--ckpt-every",
        "4",
        "--seed",
        "3",
    ]
    assert train(prepared_data_dir, tmp_path / "straight", *flags) == 0
    stopped = tmp_path / "stopped"
    assert (
        train(prepared_data_dir, stopped, *flags, "--metrics-threads", "2", "--stop-after", stop_after)
        == 128 + signal.SIGTERM
    )
    assert train(prepared_data_dir, stopped, *flags, "--metrics-threads", "1") == 0
    assert run_json(stopped)["resumed_at"] == [stop_after]
    assert_same_rows(rows(stopped), rows(tmp_path / "straight"))

    plain = [
        "--case",
        "adamw",
        "--max-iters",
        "12",
        "--log-every",
        "1",
        "--eval-every",
        "6",
        "--ckpt-every",
        "5",
        "--tau-every",
        "4",
    ]
    assert train(prepared_data_dir, tmp_path / "plain", *plain) == 0
    resumed = tmp_path / "resumed"
    assert (
        train(prepared_data_dir, resumed, *plain, "--metrics-threads", "1", "--stop-after", stop_after)
        == 128 + signal.SIGTERM
    )
    assert train(prepared_data_dir, resumed, *plain, "--metrics-threads", "1") == 0
    assert_same_rows(rows(resumed), rows(tmp_path / "plain"))


def test_tau_every_probes_every_nth_row_and_changes_nothing_else(prepared_data_dir, tmp_path):
    flags = ["--case", "adamw", "--max-iters", "24", "--log-every", "2", "--eval-every", "5"]
    assert train(prepared_data_dir, tmp_path / "every", *flags) == 0
    third_flags = [*flags, "--tau-every", "3", "--metrics-threads", "1"]
    assert train(prepared_data_dir, tmp_path / "third", *third_flags) == 0
    every, third = rows(tmp_path / "every"), rows(tmp_path / "third")
    probed = third.tau.notna().to_numpy()
    assert probed.tolist() == [index % 3 == 0 for index in range(len(third))]  # row 0 included
    assert every.tau.notna().all()
    # tau (and skipped_pairs, the move's size) on the probed rows are the every-row run's; the training is
    # the same
    probe_columns = ["tau", "tau_logits", "skipped_pairs", "move_qk", "move_ov"]
    assert_same_rows(
        third[probed][probe_columns].reset_index(drop=True),
        every[probed][probe_columns].reset_index(drop=True),
    )
    # mu takes its orbit minimum from the probe's move on probed rows and from the Gram matrices on the
    # others: the same number to round-off
    assert_same_rows(third.drop(columns=probe_columns), every.drop(columns=probe_columns), rtol=1e-12)
    assert run_json(tmp_path / "third")["config"]["tau_every"] == 3


# --------------------------------------------------------------------------------------
# The pipeline on its own
# --------------------------------------------------------------------------------------


def tiny_model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=17, n_layer=2, n_head=2, n_embd=16, block_size=8, dropout=0.0, bias=False)
    return GPT(config)


def pipeline_for(model, threads: int, queue_steps: int) -> MetricsPipeline:
    batch = (torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
    pipeline = MetricsPipeline(
        model,
        MetricTracker(model, batch),
        DriftTracker(model),
        threads=threads,
        queue_steps=queue_steps,
        tf32_training=False,
        probes=True,
    )
    pipeline.restart(model, 0)
    return pipeline


def nudge(model, step: int) -> None:
    with torch.no_grad():
        for param in model.parameters():
            wave = torch.sin(torch.arange(param.numel(), dtype=param.dtype) + step).reshape(param.shape)
            param.add_(1e-3 * wave)


def test_a_slow_worker_makes_training_wait_within_the_bound_and_the_wait_is_counted(monkeypatch):
    model = tiny_model()
    pipeline = pipeline_for(model, threads=1, queue_steps=2)
    release, slow = threading.Event(), pipeline._run
    waiting = []

    def held(job):  # the worker is stuck until released: the queue fills up
        release.wait(timeout=30)
        return slow(job)

    monkeypatch.setattr(pipeline, "_run", held)
    futures = []
    for step in range(1, 4):  # one job taken by the worker, two waiting: the queue is full
        nudge(model, step)
        futures.append(pipeline.after_step(model, step, 1e-3, RowRequest(tau=False)))
        while step == 1 and pipeline._queue.qsize():  # the worker has taken the first job
            time.sleep(0.01)
        waiting.append(pipeline._queue.qsize())
    assert max(waiting) <= 2 and pipeline.queue_waits == 0
    threading.Timer(0.3, release.set).start()
    nudge(model, 4)
    started = time.perf_counter()
    futures.append(pipeline.after_step(model, 4, 1e-3, RowRequest(tau=True)))  # blocks until the worker moves
    assert time.perf_counter() - started >= 0.2
    assert pipeline.queue_waits == 1 and pipeline.queue_wait_s >= 0.2
    pipeline.drain()
    assert all(future.done() for future in futures) and "tau" in futures[-1].result()
    pipeline.close()


def test_a_failing_worker_surfaces_in_the_training_thread_and_does_not_hang(monkeypatch):
    model = tiny_model()
    pipeline = pipeline_for(model, threads=2, queue_steps=4)

    def broken(steps, lr=None):
        raise FloatingPointError("broken sums")

    monkeypatch.setattr(pipeline.drift, "add_step", broken)
    nudge(model, 1)
    future = pipeline.after_step(model, 1, 1e-3, RowRequest(tau=False))
    with pytest.raises(FloatingPointError):
        future.result(timeout=30)
    with pytest.raises(RuntimeError, match="broken sums"):
        for step in range(2, 10):
            pipeline.after_step(model, step, 1e-3, None)
            time.sleep(0.05)
    with pytest.raises(RuntimeError, match="broken sums"):
        pipeline.drain()
    pipeline.close()


def test_the_synchronous_pipeline_equals_the_trackers_own_methods():
    """--metrics-threads 0 gives the trackers' step_metrics, drift.row, tau_probe, state_metrics."""
    model = tiny_model()
    pipeline = pipeline_for(model, threads=0, queue_steps=1)
    batch = pipeline.tracker.probe_batch
    tracker, drift = MetricTracker(model, batch), DriftTracker(model)
    for step in (1, 2, 3):
        pre = drift.before_step(model)
        nudge(model, step)
        drift.after_step(model, lr=1e-3)
        columns = pipeline.after_step(model, step, 1e-3, RowRequest(tau=True)).result()
        expected = tracker.step_metrics(model, pre) | drift.row(model)
        expected |= rebalancing.tau_probe(model, tracker) | tracker.state_metrics(model)
        assert list(columns) == list(expected)
        for key, value in expected.items():
            assert columns[key] == pytest.approx(value, rel=RTOL, abs=0), key


def test_queue_bound_and_bad_values():
    assert queue_steps_for(10) == 22 and queue_steps_for(1) == 4
    with pytest.raises(RuntimeError, match="restart"):
        model = tiny_model()
        batch = (torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
        MetricsPipeline(
            model,
            MetricTracker(model, batch),
            DriftTracker(model),
            threads=0,
            queue_steps=1,
            tf32_training=False,
            probes=False,
        ).after_step(model, 1, 1e-3, None)


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--metrics-threads", "-1"], "--metrics-threads must be >= 0"),
        (["--tau-every", "0"], "--tau-every must be positive"),
    ],
)
def test_bad_pipeline_flags_are_one_line(prepared_data_dir, tmp_path, capsys, flags, expected):
    assert train(prepared_data_dir, tmp_path / "run", "--max-iters", "2", *flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_the_probe_moves_on_a_worker_and_its_forwards_run_where_tf32_allows(monkeypatch):
    """A worker makes τ's probe whenever there is one; TF32 is process-wide, so with bf16/fp16 on CUDA
    (tf32_training) the training thread makes the probe's two forward passes, at its next step or drain.
    Wherever the parts run, the row is the synchronous one, bit for bit."""
    assert precision.trains_with_tf32("bf16", "cuda") and precision.trains_with_tf32("fp16", "cuda")
    assert not precision.trains_with_tf32("float32", "cuda")
    assert not precision.trains_with_tf32("float64", "cpu")
    ran: dict[str, list[bool]] = {"move": [], "forwards": []}
    plan, measure = rebalancing.plan_moves, rebalancing.ProbeCopy.measure

    def on_main(part):
        ran[part].append(threading.current_thread() is threading.main_thread())

    monkeypatch.setattr(rebalancing, "plan_moves", lambda *args: on_main("move") or plan(*args))
    monkeypatch.setattr(rebalancing.ProbeCopy, "measure", lambda *args: on_main("forwards") or measure(*args))
    rows_of = {}
    for threads, tf32, (move_here, forwards_here) in (
        (0, False, (True, True)),
        (1, False, (False, False)),
        (1, True, (False, True)),
    ):
        model = tiny_model()
        batch = (torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
        pipeline = MetricsPipeline(
            model,
            MetricTracker(model, batch),
            DriftTracker(model),
            threads=threads,
            queue_steps=2,
            tf32_training=tf32,
            probes=True,
        )
        assert pipeline.forwards_on_worker is (threads > 0 and not tf32)
        pipeline.restart(model, 0)
        ran["move"].clear(), ran["forwards"].clear()
        futures = []
        for step in (1, 2, 3):
            nudge(model, step)
            futures.append(pipeline.after_step(model, step, 1e-3, RowRequest(tau=step != 2)))
        pipeline.drain()  # the waiting forwards are made here at the latest
        rows_of[threads, tf32] = [future.result(timeout=60) for future in futures]
        assert ran == {"move": [move_here] * 2, "forwards": [forwards_here] * 2}
        assert rows_of[threads, tf32][0]["tau"] < 1e-5  # the probe ran, wherever it ran
        pipeline.close()
    for columns in (rows_of[1, False], rows_of[1, True]):
        assert columns == rows_of[0, False]  # every column of every row, bit for bit, in the same order


def reference_tau(model: GPT, tracker: MetricTracker) -> dict[str, float]:
    """τ's columns as the probe measured them before it moved to the metrics thread: a copy of the whole
    model, rebalanced in place to its nearest balanced point and probed before and after."""
    probed = copy.deepcopy(model)
    before = tracker.probe(probed)
    done = {
        circuit: moves.rebalance_model(probed, circuit, None, compute_device=tracker.compute_device)
        for circuit in CIRCUITS
    }
    after = tracker.probe(probed)
    skipped = {"skipped_pairs": sum(move.skipped for move in done.values())}
    return (
        tracker.tau(before, after) | skipped | {f"move_{c}": move.relative_move for c, move in done.items()}
    )


@pytest.mark.parametrize("threads, tf32", [(0, False), (1, False), (1, True)])
def test_tau_columns_are_those_of_the_probe_on_a_copy_of_the_model(
    prepared_data_dir, tmp_path, monkeypatch, threads, tf32
):
    """A small run's τ columns, on the training thread, on a worker, and split between them as under TF32
    training: on the same rows (every --tau-every-th, row 0 included) the very numbers of
    :func:`reference_tau` at the weights of each probed row."""
    monkeypatch.setattr(precision, "trains_with_tf32", lambda *_: tf32)
    probed: dict[int, tuple[GPT, MetricTracker]] = {}
    after_step, initial_row = MetricsPipeline.after_step, MetricsPipeline.initial_row

    def keep(pipeline, model, step):
        probed[step] = (copy.deepcopy(model), pipeline.tracker)

    def after_step_kept(self, model, step, lr, row):
        if row is not None and row.tau:
            keep(self, model, step)
        return after_step(self, model, step, lr, row)

    def initial_row_kept(self, model, tau):
        if tau:
            keep(self, model, 0)
        return initial_row(self, model, tau)

    monkeypatch.setattr(MetricsPipeline, "after_step", after_step_kept)
    monkeypatch.setattr(MetricsPipeline, "initial_row", initial_row_kept)
    flags = ["--case", "adamw", "--max-iters", "15", "--log-every", "2", "--eval-every", "100"]
    assert (
        train(prepared_data_dir, tmp_path / "run", *flags, "--tau-every", "2", "--metrics-threads", threads)
        == 0
    )
    frame = rows(tmp_path / "run")
    assert frame.step[frame.tau.notna()].tolist() == [0, 4, 8, 12, 15] == sorted(probed)
    probe_columns = ["tau", "tau_logits", "skipped_pairs", "move_qk", "move_ov"]
    logit_changes = []
    for step, (model, tracker) in probed.items():
        logged = frame[frame.step == step].iloc[0]
        expected = reference_tau(model, tracker)
        assert {column: float(logged[column]) for column in probe_columns} == expected, step
        assert expected["tau"] < 1e-5 and expected["move_qk"] > 0 and expected["move_ov"] > 0
        logit_changes.append(expected["tau_logits"])
    assert 0 < max(logit_changes) < 1e-5  # round-off, not zero: the rows compare real numbers
