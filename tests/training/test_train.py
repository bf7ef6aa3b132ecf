"""attnid train on tiny runs: the paper's E1-E3 signatures, resume, divergence, and one-line errors.

Every run here is a real training run on tiny shakespeare (2 layers, E=32, block 32,
batch 8, tens of steps), run in-process through the CLI entry point.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from tiny_runs import TINY_TRAIN_FLAGS, train

from attnid.cli import build_parser, main
from attnid.cli.train import config_from_args
from attnid.common.errors import UserError
from attnid.model.gpt import load_nanogpt_checkpoint
from attnid.training.cases import CASES
from attnid.training.config import resolve_config
from attnid.training.loop import get_lr
from attnid.training.rundir import BASE_COLUMNS, TIMING_COLUMNS


def metrics(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv")


def run_json(out) -> dict:
    return json.loads((out / "run.json").read_text())


def without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=list(TIMING_COLUMNS))


def test_lr_schedule_is_nanogpts():
    cfg = resolve_config(dict(data="d", out="o", lr=1e-3, max_iters=1000, warmup_iters=100))
    assert get_lr(0, cfg) == pytest.approx(1e-3 / 101)
    assert get_lr(99, cfg) == pytest.approx(1e-3 * 100 / 101)
    assert get_lr(100, cfg) == pytest.approx(1e-3)  # peak right after warmup
    assert get_lr(550, cfg) == pytest.approx((1e-3 + 1e-4) / 2)  # cosine midpoint
    assert get_lr(1000, cfg) == pytest.approx(1e-4) and get_lr(5000, cfg) == pytest.approx(1e-4)
    tiny = resolve_config(dict(data="d", out="o", max_iters=30))
    assert tiny.warmup_iters == 3 and tiny.lr_decay_iters == 30 and tiny.min_lr == pytest.approx(tiny.lr / 10)


def test_sgd_step_is_identified_adamw_is_not(prepared_data_dir, tmp_path):
    """E1/E2: plain SGD puts ~no weight in unidentified directions; AdamW clearly does."""
    assert (
        train(
            prepared_data_dir,
            tmp_path / "sgd",
            "--case",
            "sgd",
            "--lr",
            "0.2",
            "--max-iters",
            "40",
            "--log-every",
            "10",
            "--eval-every",
            "20",
        )
        == 0
    )
    assert (
        train(
            prepared_data_dir,
            tmp_path / "adamw",
            "--case",
            "adamw",
            "--lr",
            "1e-3",
            "--max-iters",
            "40",
            "--log-every",
            "10",
            "--eval-every",
            "20",
        )
        == 0
    )
    sgd, adamw = metrics(tmp_path / "sgd"), metrics(tmp_path / "adamw")

    assert list(sgd.columns[: len(BASE_COLUMNS)]) == list(BASE_COLUMNS)
    assert {"rho_qk_l0", "rho_qk_l1", "beta_ov_l1", "mu_qk_l0"} <= set(sgd.columns)
    assert sgd.step.tolist() == [0, 10, 20, 30, 40]
    stepped = sgd[sgd.step > 0]
    assert stepped.rho_qk.max() < 1e-6 and stepped.rho_ov.max() < 1e-6
    assert adamw[adamw.step > 0].rho_qk.min() > 1e-3
    # eval losses only at eval steps, a minibatch loss at every step row
    assert sgd.val_loss.notna().tolist() == [True, False, True, False, True]
    assert stepped.train_loss.notna().all() and math.isnan(sgd.train_loss[0])
    assert sgd.val_loss.iloc[-1] < sgd.val_loss.iloc[0]  # it learns
    assert sgd.beta_qk[0] == 0.0 and (stepped.tau < 1e-5).all()

    info = run_json(tmp_path / "sgd")
    assert info["status"] == "completed" and info["steps_completed"] == 40 and info["case"] == "sgd"
    assert info["final_val_loss"] == pytest.approx(sgd.val_loss.iloc[-1])
    assert info["config"]["lr"] == 0.2 and info["seed"] == 1337 and info["device"] == "cpu"
    assert set(info["versions"]) >= {"python", "torch", "attnid"} and "git_commit" in info
    # the run's ckpt.pt is a nanoGPT checkpoint of the final weights
    final = load_nanogpt_checkpoint(tmp_path / "sgd" / "ckpt.pt")
    assert final.config.n_embd == 32 and final.config.vocab_size == 65
    assert torch.load(tmp_path / "sgd" / "ckpt.pt", weights_only=False)["iter_num"] == 40


def test_sgd_imbalance_drift_scales_like_lr_squared(prepared_data_dir, tmp_path):
    """E1: SGD moves I = A A^T - B B^T only at second order, so halving lr divides beta by ~4.

    (At this size beta_qk sits at float32 round-off, so the output-value circuit carries the test.)
    """
    betas = {}
    for lr in (0.002, 0.001):
        assert (
            train(
                prepared_data_dir,
                tmp_path / str(lr),
                "--case",
                "sgd",
                "--lr",
                lr,
                "--max-iters",
                "40",
                "--log-every",
                "40",
                "--eval-every",
                "1000",
            )
            == 0
        )
        betas[lr] = metrics(tmp_path / str(lr)).beta_ov.iloc[-1]
    assert 3.0 <= betas[0.002] / betas[0.001] <= 5.3


def test_rebalancing_keeps_the_function_and_resets_beta(prepared_data_dir, tmp_path):
    """E3: every rebalance leaves the probe loss unchanged (tau) and brings I back to I_0 (beta ~ 0)."""
    out = tmp_path / "rebalance"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "adamw_rebalance",
            "--lr",
            "3e-3",
            "--max-iters",
            "40",
            "--log-every",
            "5",
            "--rebalance-every",
            "10",
            "--eval-every",
            "1000",
        )
        == 0
    )
    frame = metrics(out)
    rebalanced = frame[frame.rebalanced == 1]
    assert rebalanced.step.tolist() == [10, 20, 30, 40]
    assert (rebalanced.tau < 1e-5).all() and (rebalanced.tau_logits < 1e-4).all()
    assert frame[(frame.rebalanced == 0) & (frame.step > 0)].tau.isna().all()  # no probe in rebalancing runs
    for step in (20, 30, 40):
        before = frame[frame.step == step - 5].iloc[0]
        after = frame[frame.step == step].iloc[0]
        assert before.beta_qk > 1e-4 and before.beta_ov > 1e-4
        assert after.beta_qk < 0.01 * before.beta_qk and after.beta_ov < 0.01 * before.beta_ov

    balanced = tmp_path / "balanced"
    assert (
        train(
            prepared_data_dir,
            balanced,
            "--case",
            "adamw_rebalance",
            "--max-iters",
            "20",
            "--log-every",
            "10",
            "--rebalance-every",
            "10",
            "--rebalance-target",
            "balanced",
            "--rebalance-moments",
            "reset",
            "--eval-every",
            "1000",
        )
        == 0
    )
    rows = metrics(balanced)
    assert (rows[rows.rebalanced == 1].mu_qk < 1e-6).all() and (rows[rows.rebalanced == 1].mu_ov < 1e-6).all()
    assert (rows[rows.rebalanced == 1].tau < 1e-5).all()
    assert rows.mu_qk[0] > 1e-3  # the random init is not balanced


def test_resume_after_stop_equals_uninterrupted_run(prepared_data_dir, tmp_path, capsys):
    """Stopped at step 15 (as on SIGTERM) and rerun: metrics.csv equals the uninterrupted run's."""
    flags = [
        "--case",
        "adamw_rebalance",
        "--rebalance-every",
        "10",
        "--dropout",
        "0.1",
        "--max-iters",
        "30",
        "--log-every",
        "5",
        "--eval-every",
        "10",
        "--ckpt-every",
        "10",
        "--seed",
        "7",
    ]
    assert train(prepared_data_dir, tmp_path / "straight", *flags) == 0

    stopped = tmp_path / "stopped"
    assert train(prepared_data_dir, stopped, *flags, "--stop-after", "15") == 128 + signal.SIGTERM
    assert (stopped / "ckpt.pt").is_file() and not (stopped / "run.json").exists()
    assert torch.load(stopped / "ckpt.pt", weights_only=False)["iter_num"] == 15
    capsys.readouterr()
    assert train(prepared_data_dir, stopped, *flags, "--lr", "5e-3") == 2  # another lr cannot resume it
    assert "--fresh" in capsys.readouterr().err
    assert train(prepared_data_dir, stopped, *flags) == 0
    assert run_json(stopped)["resumed_at"] == [15]
    pd.testing.assert_frame_equal(
        without_timing(metrics(stopped)), without_timing(metrics(tmp_path / "straight")), check_exact=True
    )

    # a finished run's outputs come back from ckpt.pt without training again
    expected = (stopped / "metrics.csv").read_text()
    (stopped / "metrics.csv").unlink()
    (stopped / "run.json").unlink()
    assert train(prepared_data_dir, stopped, *flags) == 0
    assert (stopped / "metrics.csv").read_text() == expected and run_json(stopped)["status"] == "completed"


def test_sigterm_checkpoints_and_exits_nonzero(prepared_data_dir, tmp_path):
    out = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "attnid",
        "train",
        "--data",
        str(prepared_data_dir),
        "--out",
        str(out),
        *TINY_TRAIN_FLAGS,
        "--case",
        "sgd",
        "--max-iters",
        "1000000",
        "--ckpt-every",
        "1000000",
        "--log-every",
        "1000",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    started = process.stderr.readline()  # printed once the model is built and training begins
    while started.startswith("attnid train: still working"):  # a slow start-up reports progress first
        started = process.stderr.readline()
    assert "case sgd" in started, started
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM" in stderr and "resume" in stderr
    checkpoint = torch.load(out / "ckpt.pt", weights_only=False)
    assert 0 < checkpoint["iter_num"] < 1000000
    assert not (out / "run.json").exists() and not (out / "metrics.csv").exists()


def test_divergence_is_a_status_not_a_crash(prepared_data_dir, tmp_path):
    out = tmp_path / "diverged"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "sgd",
            "--lr",
            "1000",
            "--max-iters",
            "50",
            "--log-every",
            "1",
            "--eval-every",
            "1000",
            "--warmup-iters",
            "0",
            "--full-val-eval",
        )
        == 0
    )
    info = run_json(out)
    assert info["status"] == "diverged" and info["final_val_loss_full"] is None
    assert 1 < info["diverged_step"] <= 50 and info["steps_completed"] == info["diverged_step"] - 1
    frame = metrics(out)
    assert frame.step.max() == info["diverged_step"] - 1  # rows up to the last good step
    assert frame.train_loss.dropna().max() <= 3 * frame.train_loss.iloc[1]


@pytest.mark.parametrize(
    "case, dtype, flags",
    [
        ("adamw", "float32", ["--log-every", "1"]),  # the row of step 1 would measure non-finite weights
        ("sgd", "float64", ["--log-every", "1", "--metrics-threads", "1"]),  # ... on a metrics thread
        ("adamw_projected", "float64", ["--log-every", "3", "--ckpt-every", "1"]),  # a checkpoint, no row
        ("adamw_rebalance", "float64", ["--log-every", "1", "--rebalance-every", "1"]),
    ],
)
def test_an_update_that_leaves_non_finite_weights_ends_the_run_as_diverged(
    case, dtype, flags, prepared_data_dir, tmp_path, capsys
):
    """lr 1e308: the first update leaves weights that are not finite (or whose float64 squares are not),
    while its loss, taken before the update, is finite. The run ends there as diverged, in one line,
    whatever the metrics (eigendecompositions of those weights' Grams) or the checkpoint were about to do;
    no checkpoint of such weights is kept."""
    out = tmp_path / "run"
    status = train(
        prepared_data_dir, out, "--case", case, "--lr", "1e308", "--dtype", dtype, "--max-iters", "6",
        "--warmup-iters", "0", *flags,
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0, err
    assert "Traceback" not in err and "LinAlgError" not in err
    reason = [line for line in err.splitlines() if "diverged" in line and "non-finite weights" in line]
    assert len(reason) == 1 and "the update of step 1 at lr 1e+308" in reason[0], err
    info = run_json(out)
    assert info["status"] == "diverged" and info["diverged_step"] == 1 and info["steps_completed"] == 0
    assert metrics(out).step.tolist() == [0]  # the initial row only
    assert not (out / "ckpt.pt").exists()


def test_a_checkpoint_of_other_settings_is_refused_or_with_restart_if_changed_replaced(
    prepared_data_dir, tmp_path, capsys
):
    """A finished run trained again with another setting (the workflow's job rerun because the run's
    settings changed): refused in one line without --restart-if-changed; with it, the run starts over
    and its checkpoint replaces the old one; rerun once more, it is the finished run and only gives its
    outputs back. A killed run of the same settings still resumes with the flag."""
    out = tmp_path / "run"
    common = [
        "--case",
        "sgd",
        "--max-iters",
        "6",
        "--log-every",
        "2",
        "--ckpt-every",
        "2",
        "--warmup-iters",
        "0",
    ]
    assert train(prepared_data_dir, out, *common, "--weight-decay", "0.1") == 0
    capsys.readouterr()
    changed = [*common, "--weight-decay", "0.3"]
    assert train(prepared_data_dir, out, *changed) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another configuration (weight_decay: 0.1 in ckpt vs 0.3 now)" in err, err
    assert train(prepared_data_dir, out, *changed, "--restart-if-changed") == 0
    err = capsys.readouterr().err
    assert "written with other settings (weight_decay: 0.1 in ckpt vs 0.3 now): starting over" in err, err
    info = run_json(out)
    assert info["status"] == "completed" and info["config"]["weight_decay"] == 0.3 and not info["resumed_at"]
    assert train(prepared_data_dir, out, *changed, "--restart-if-changed") == 0
    assert "holds a finished run" in capsys.readouterr().err
    # a run of the same settings stopped after a checkpoint resumes, flag or not
    stopped = tmp_path / "stopped"
    assert train(prepared_data_dir, stopped, *changed, "--stop-after", "2") == 128 + signal.SIGTERM
    assert train(prepared_data_dir, stopped, *changed, "--restart-if-changed") == 0
    assert run_json(stopped)["resumed_at"] == [2]


def test_no_metrics_logs_losses_only_and_progress_lines(prepared_data_dir, tmp_path, capsys):
    out = tmp_path / "plain"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "sgd_momentum",
            "--no-metrics",
            "--max-iters",
            "20",
            "--log-every",
            "10",
            "--eval-every",
            "10",
            "--progress-every",
            "1e-6",
        )
        == 0
    )
    frame = metrics(out)
    assert frame.step.tolist() == [0, 10, 20] and frame.val_loss.notna().all()
    assert frame[["rho_qk", "beta_qk", "tau", "mu_ov"]].isna().all().all()
    progress = [line for line in capsys.readouterr().err.splitlines() if " tok/s eta " in line]
    assert progress and progress[-1].startswith("attnid train: step 20/20 loss ")


def test_the_final_model_is_evaluated_on_the_whole_val_split(prepared_data_dir, tmp_path):
    """run.json's final_val_loss_full is the final checkpoint's mean next-token loss over every token of the
    val split, counted once (consecutive windows; docs/design.md §11.5), not the sampled eval batches."""
    import numpy as np
    from torch.nn import functional as F

    out, without = tmp_path / "full", tmp_path / "without"
    assert train(prepared_data_dir, without, "--case", "adamw", "--no-metrics", "--max-iters", "6") == 0
    assert run_json(without)["final_val_loss_full"] is None  # only when asked: the interventions ask
    flags = ("--case", "adamw", "--no-metrics", "--max-iters", "6", "--full-val-eval")
    assert train(prepared_data_dir, out, *flags) == 0
    info = run_json(out)
    model = load_nanogpt_checkpoint(out / "ckpt.pt")
    val = np.fromfile(prepared_data_dir / "val.bin", dtype=np.uint16).astype(np.int64)
    block = 32  # TINY_TRAIN_FLAGS
    n_windows = (len(val) - 1) // block
    x = torch.from_numpy(val[: n_windows * block].reshape(n_windows, block))
    y = torch.from_numpy(val[1 : n_windows * block + 1].reshape(n_windows, block))
    total = 0.0
    with torch.no_grad():
        for first in range(0, n_windows, 512):
            logits, _ = model(x[first : first + 512], full_logits=True)  # (B, T, V)
            total += float(
                F.cross_entropy(logits.flatten(0, 1), y[first : first + 512].flatten(), reduction="sum")
            )
    assert info["final_val_loss_full"] == pytest.approx(total / y.numel(), rel=1e-5)
    assert info["final_val_loss_full"] != info["final_val_loss"]  # 2 sampled batches are not the split


def test_the_whole_split_along_training(prepared_data_dir, tmp_path):
    """--full-val-every N: the whole val split at step 0, every N-th step and the last, in metrics.csv's
    val_loss_full; the last is run.json's final_val_loss_full, the number a final-only evaluation gives
    (the same model: --full-val-every changes no step of the training)."""
    along, final_only = tmp_path / "along", tmp_path / "final"
    flags = ("--case", "adamw", "--no-metrics", "--max-iters", "14", "--log-every", "7", "--eval-every", "14")
    assert train(prepared_data_dir, along, *flags, "--full-val-every", "4") == 0
    assert train(prepared_data_dir, final_only, *flags, "--full-val-eval") == 0
    rows = metrics(along).dropna(subset=["val_loss_full"])
    assert rows["step"].tolist() == [0, 4, 8, 12, 14]
    assert rows["val_loss_full"].iloc[0] > rows["val_loss_full"].iloc[-1]  # the model learns
    assert run_json(along)["final_val_loss_full"] == rows["val_loss_full"].iloc[-1]
    assert run_json(along)["final_val_loss_full"] == run_json(final_only)["final_val_loss_full"]
    # the same training: every other column of the rows both runs log is the same
    shared = metrics(final_only)["step"]
    steps = metrics(along).set_index("step").loc[shared, ["train_loss", "grad_norm"]]
    pd.testing.assert_frame_equal(
        steps.reset_index(drop=True), metrics(final_only)[["train_loss", "grad_norm"]], check_exact=True
    )


def test_train_runs_trains_each_run_as_train_would(prepared_data_dir, tmp_path, capsys):
    """attnid train-runs: several spec files, one process, each run bit-identical (but for the clock) to
    its own attnid train; outputs declared before any run trains (a bad second --outs stops at once); a
    rerun resumes the finished runs from their checkpoints without training them again."""
    specs = []
    for seed in (3, 4):
        spec = tmp_path / f"seed{seed}.yaml"
        spec.write_text(
            f"case: adamw_gauge_fixed\nseed: {seed}\nn_layer: 1\nn_head: 2\nn_embd: 16\nblock_size: 32\n"
            f"batch_size: 8\neval_iters: 2\nmax_iters: 12\nlog_every: 4\nfull_val_every: 6\n"
        )
        specs.append(spec)
    outs = [tmp_path / "together" / f"seed{seed}" for seed in (3, 4)]
    command = ["train-runs", "--data", str(prepared_data_dir), "--configs", *map(str, specs)]
    assert main([*command, "--outs", *map(str, outs)]) == 0
    assert "run 2/2" in capsys.readouterr().err
    for spec, out in zip(specs, outs, strict=True):
        alone = tmp_path / "alone" / out.name
        assert (
            main(["train", "--config", str(spec), "--data", str(prepared_data_dir), "--out", str(alone)]) == 0
        )
        pd.testing.assert_frame_equal(
            without_timing(metrics(out)), without_timing(metrics(alone)), check_exact=True
        )
        assert run_json(out)["final_val_loss_full"] == run_json(alone)["final_val_loss_full"]
    before = [(out / "metrics.csv").read_text() for out in outs]
    assert main([*command, "--outs", *map(str, outs)]) == 0
    assert "holds a finished run" in capsys.readouterr().err
    assert [(out / "metrics.csv").read_text() for out in outs] == before
    # the workflow's per-arm jobs pass --restart-if-changed: a run whose settings changed starts over
    specs[0].write_text(specs[0].read_text() + "lr: 0.002\n")
    assert main([*command, "--outs", *map(str, outs)]) == 2  # without it, the changed run is refused
    assert main([*command, "--outs", *map(str, outs), "--restart-if-changed"]) == 0
    assert run_json(outs[0])["lr"] == 0.002 and (outs[1] / "metrics.csv").read_text() == before[1]
    assert main([*command, "--outs", str(outs[0])]) == 2
    assert "2 --configs and 1 --outs" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main([*command, "--outs", str(tmp_path / "fresh"), str(blocker)]) == 2
    assert not (tmp_path / "fresh" / "run.json").exists()  # refused before the first run trained


def test_config_file_and_flag_precedence(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "data: /some/data\ncase: sgd_wd\nlr: 0.05\nweight_decay: 0.01\nbias: true\nmax_iters: 300\n"
    )
    parser = build_parser("train")
    args = parser.parse_args(["train", "--config", str(config), "--lr", "0.2", "--out", str(tmp_path / "o")])
    cfg = config_from_args(args)
    assert (cfg.case, cfg.lr, cfg.weight_decay, cfg.bias, cfg.max_iters) == ("sgd_wd", 0.2, 0.01, True, 300)
    assert cfg.min_lr == pytest.approx(0.02) and cfg.warmup_iters == 30

    config.write_text("data: /some/data\nlearning_rate: 0.1\n")
    with pytest.raises(UserError, match="unknown keys.*learning_rate"):
        config_from_args(parser.parse_args(["train", "--config", str(config), "--out", "o"]))
    config.write_text("data: /some/data\nmax_iters: lots\n")
    with pytest.raises(UserError, match="max_iters"):
        config_from_args(parser.parse_args(["train", "--config", str(config), "--out", "o"]))


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--data", "d", "--out", "o", "--lr", "abc"], "--lr"),
        (
            ["--data", "d", "--out", "o", "--case", "adamm"],
            "sgd, sgd_wd, sgd_momentum, adamw, adamw_rebalance",
        ),
        (["--out", "o"], "missing --data"),
        (["--data", "d", "--out", "o", "--n-embd", "30", "--n-head", "4"], "multiple"),
        (["--data", "d", "--out", "o", "--rebalance-target", "zero"], "initial or balanced"),
        (["--data", "d", "--out", "o", "--rebalance-moments", "rotate"], "keep, first-moment or reset"),
        (["--data", "d", "--out", "o", "--rebalance-moments", "transport"], "transport was retired"),
        (["--data", "d", "--out", "o", "--reset-optimizer-state"], "--rebalance-moments reset"),
        (["--data", "d", "--out", "o", "--case", "adamw_gauge_fixed", "--rope"], "does not support --rope"),
        (["--data", "{tmp}/nowhere", "--out", "{tmp}/o"], "meta.json not found"),
    ],
)
def test_bad_flags_give_one_clear_line(tmp_path, capsys, flags, expected):
    flags = [f.format(tmp=tmp_path) for f in flags]
    try:
        status = main(["train", *flags])
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    assert status == 2
    stderr = capsys.readouterr().err.strip()
    assert len(stderr.splitlines()) == 1 and expected in stderr, stderr
    assert "Traceback" not in stderr


def test_every_case_is_documented_and_runs(prepared_data_dir, tmp_path):
    for case in CASES:
        out = tmp_path / case
        assert (
            train(
                prepared_data_dir,
                out,
                "--case",
                case,
                "--max-iters",
                "4",
                "--log-every",
                "2",
                "--eval-every",
                "4",
                "--rebalance-every",
                "2",
            )
            == 0
        ), case
        info = run_json(out)
        assert info["status"] == "completed" and info["config"]["case"] == case
        assert math.isfinite(info["final_val_loss"])


def _plain(value) -> bool:
    """Only what torch.load(weights_only=True) should ever have to rebuild: no numpy scalars, no classes."""
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (torch.Tensor, float, int, bool, str)


def test_checkpoints_load_with_weights_only(prepared_data_dir, tmp_path):
    """Mid-run and final checkpoints (plain and rebalancing cases) hold only plain types."""
    for case in ("sgd_momentum", "adamw_rebalance"):
        out = tmp_path / case
        flags = [
            "--case",
            case,
            "--max-iters",
            "10",
            "--log-every",
            "5",
            "--eval-every",
            "10",
            "--rebalance-every",
            "5",
        ]
        assert train(prepared_data_dir, out, *flags, "--stop-after", "5") == 128 + signal.SIGTERM
        mid = torch.load(out / "ckpt.pt", weights_only=True)
        assert mid["iter_num"] == 5 and mid["attnid"]["summary"] is None and len(mid["attnid"]["rows"]) == 2
        assert _plain(mid)
        assert train(prepared_data_dir, out, *flags) == 0
        final = torch.load(out / "ckpt.pt", weights_only=True)
        assert final["attnid"]["summary"]["status"] == "completed" and final["iter_num"] == 10
        assert _plain(final)


def test_corrupt_checkpoint_is_moved_aside_with_one_line(prepared_data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--case", "sgd", "--max-iters", "10", "--log-every", "5", "--eval-every", "10"]
    assert train(prepared_data_dir, out, *flags, "--stop-after", "5") == 128 + signal.SIGTERM
    truncated = (out / "ckpt.pt").read_bytes()[:5000]
    (out / "ckpt.pt").write_bytes(truncated)
    capsys.readouterr()
    assert train(prepared_data_dir, out, *flags) == 2
    stderr = capsys.readouterr().err.strip()
    assert len(stderr.splitlines()) == 1 and "ckpt.pt.corrupt" in stderr and "Traceback" not in stderr, stderr
    assert (out / "ckpt.pt.corrupt").read_bytes() == truncated and not (out / "ckpt.pt").exists()
    # the rerun starts over; a second bad file does not overwrite the first one moved aside
    assert train(prepared_data_dir, out, *flags) == 0 and run_json(out)["resumed_at"] == []
    (out / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert train(prepared_data_dir, out, *flags) == 2
    assert (out / "ckpt.pt.corrupt").read_bytes() == truncated
    assert (out / "ckpt.pt.corrupt1").read_bytes() == b"not a checkpoint"


def test_a_registered_case_trains_through_the_normal_code_path(prepared_data_dir, tmp_path, capsys):
    """Adding a case is one Case record: the flags, the help, training, run.json and the plot style follow."""
    from attnid.reports.figures import style
    from attnid.training import cases

    def nesterov(model, cfg, device_type):
        return torch.optim.SGD(model.optimizer_groups(0.0), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)

    cases.register(
        cases.Case(
            "sgd_nesterov",
            "SGD + Nesterov",
            "SGD with Nesterov momentum",
            0.02,
            nesterov,
            color="#56B4E9",
            linestyle=":",
            marker="P",
        )
    )
    try:
        with pytest.raises(SystemExit):
            main(["train", "--help"])
        assert "sgd_nesterov 0.02" in " ".join(capsys.readouterr().out.split())
        out = tmp_path / "nesterov"
        assert (
            train(
                prepared_data_dir,
                out,
                "--case",
                "sgd_nesterov",
                "--max-iters",
                "6",
                "--log-every",
                "3",
                "--eval-every",
                "6",
            )
            == 0
        )
        info = run_json(out)
        assert info["status"] == "completed" and info["case"] == "sgd_nesterov" and info["lr"] == 0.02
        assert math.isfinite(info["final_val_loss"])
        frame = metrics(out)
        assert (
            frame.step.tolist() == [0, 3, 6] and frame.tau.notna().all()
        )  # a non-rebalancing case: tau probed
        groups = torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
        assert all(group["nesterov"] and group["momentum"] == 0.9 for group in groups)
        assert style.case_style("sgd_nesterov")["color"] == "#56B4E9"
    finally:
        cases.unregister("sgd_nesterov")
    assert "sgd_nesterov" not in CASES
