"""E1 and E2 as exact identities on tiny ``attnid train`` runs (docs/design.md §7): the drift split
logged per step, in float64 where the identities are resolved, and resumed bit for bit."""

from __future__ import annotations

import json
import signal

import pandas as pd
import pytest
import tiny_runs

CIRCUITS = ("qk", "ov")


def train(data_dir, out, *flags) -> int:
    return tiny_runs.train(data_dir, out, "--eval-every", "1000", *flags)


def metrics(out) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv")


def stepped(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame.step > 0]


def test_float64_sgd_has_no_first_order_drift_and_no_step_along_the_orbit(
    prepared_data_dir, tmp_path, capsys
):
    """E1: the gradient is orthogonal to the orbit, so SGD's L_t = 0 and ρ = 0 up to float64 round-off."""
    out = tmp_path / "sgd"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "sgd",
            "--lr",
            "0.3",
            "--max-iters",
            "40",
            "--log-every",
            "5",
            "--dtype",
            "float64",
        )
        == 0
    )
    assert "cpu (float64)" in capsys.readouterr().err
    info = json.loads((out / "run.json").read_text())
    assert info["dtype"] == "float64" and info["config"]["dtype"] == "float64"
    frame = metrics(out)
    last = frame.iloc[-1]
    for circuit in CIRCUITS:
        assert last[f"drift2_{circuit}"] > 1e-9  # the whole drift is second order...
        assert (
            last[f"drift1_{circuit}"] / last[f"drift2_{circuit}"] < 1e-9
        )  # ...the first-order part is round-off
        assert stepped(frame)[f"rho_{circuit}"].max() < 1e-20
        assert frame[f"closure_{circuit}"].max() < 1e-10
        assert last[f"beta_{circuit}"] == pytest.approx(last[f"drift2_{circuit}"], rel=1e-6)
    assert not any(
        column.startswith("drift1_pred") for column in frame.columns
    )  # no coupled decay, no prediction
    assert {"drift1_qk_l0", "drift2_ov_l1"} <= set(frame.columns)


def test_sgd_with_coupled_decay_drifts_exactly_as_predicted(prepared_data_dir, tmp_path):
    """E2: SGD + L2 decay λ has L_t = -2 lr_t λ I_t; its first-order drift equals the prediction."""
    out = tmp_path / "sgd_wd"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "sgd_wd",
            "--lr",
            "0.3",
            "--weight-decay",
            "0.05",
            "--max-iters",
            "40",
            "--log-every",
            "10",
            "--dtype",
            "float64",
        )
        == 0
    )
    rows = stepped(metrics(out))
    for circuit in CIRCUITS:
        assert (rows[f"drift1_{circuit}"] > 1e-4).all()
        assert rows[f"drift1_{circuit}"].to_numpy() == pytest.approx(
            rows[f"drift1_pred_{circuit}"].to_numpy(), rel=1e-6
        )
        assert rows[f"drift1_pred_relerr_{circuit}"].max() < 1e-6


def test_adamw_moves_along_the_orbit_at_first_order_and_the_split_closes_in_float32(
    prepared_data_dir, tmp_path
):
    """E2: AdamW's first-order drift dominates; the split closes to float64 round-off even in float32
    training."""
    out = tmp_path / "adamw"
    assert (
        train(
            prepared_data_dir,
            out,
            "--case",
            "adamw",
            "--lr",
            "1e-3",
            "--max-iters",
            "40",
            "--log-every",
            "10",
        )
        == 0
    )
    assert json.loads((out / "run.json").read_text())["dtype"] == "float32"  # auto on the CPU
    frame = metrics(out)
    last = frame.iloc[-1]
    for circuit in CIRCUITS:
        assert last[f"drift1_{circuit}"] / last[f"drift2_{circuit}"] > 10
        assert frame[f"closure_{circuit}"].max() < 1e-10


def test_rebalancing_restarts_the_split_from_the_rebalanced_imbalance(prepared_data_dir, tmp_path):
    """The orbit move is not part of any step: the reference moves with it and the split still closes."""
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
            "30",
            "--log-every",
            "5",
            "--rebalance-every",
            "10",
        )
        == 0
    )
    frame = metrics(out)
    assert frame[frame.rebalanced == 1].step.tolist() == [10, 20, 30]
    for circuit in CIRCUITS:
        assert frame[f"closure_{circuit}"].max() < 1e-10
        # five steps after a rebalance the drift is five steps' worth, less than the ten before it
        assert (
            frame.set_index("step").loc[[15, 25], f"drift1_{circuit}"].to_numpy()
            < frame.set_index("step").loc[[10, 20], f"drift1_{circuit}"].to_numpy()
        ).all()


def test_float64_resume_with_the_drift_split_is_exact(prepared_data_dir, tmp_path, capsys):
    flags = [
        "--case",
        "sgd_wd",
        "--max-iters",
        "20",
        "--log-every",
        "5",
        "--ckpt-every",
        "10",
        "--seed",
        "3",
        "--dtype",
        "float64",
    ]
    assert train(prepared_data_dir, tmp_path / "straight", *flags) == 0
    stopped = tmp_path / "stopped"
    assert train(prepared_data_dir, stopped, *flags, "--stop-after", "7") == 128 + signal.SIGTERM
    capsys.readouterr()
    other = [f if f != "float64" else "float32" for f in flags]
    assert train(prepared_data_dir, stopped, *other) == 2  # another precision cannot resume it
    assert "dtype" in capsys.readouterr().err
    assert train(prepared_data_dir, stopped, *flags) == 0
    timing = ["tokens_per_s", "wall_s"]
    pd.testing.assert_frame_equal(
        metrics(stopped).drop(columns=timing),
        metrics(tmp_path / "straight").drop(columns=timing),
        check_exact=True,
    )
    assert "drift1_pred_ov" in metrics(stopped).columns


def test_auto_resumes_the_precision_it_stands_for(prepared_data_dir, tmp_path):
    flags = ["--case", "sgd", "--max-iters", "10", "--log-every", "5"]
    out = tmp_path / "run"
    assert (
        train(prepared_data_dir, out, *flags, "--dtype", "float32", "--stop-after", "5")
        == 128 + signal.SIGTERM
    )
    assert train(prepared_data_dir, out, *flags) == 0  # --dtype auto is float32 on the CPU
    assert json.loads((out / "run.json").read_text())["resumed_at"] == [5]


@pytest.mark.parametrize(
    "dtype, expected", [("bf16", "needs a CUDA GPU"), ("half", "unknown --dtype 'half'")]
)
def test_bad_dtype_is_one_line(prepared_data_dir, tmp_path, capsys, dtype, expected):
    assert (
        train(prepared_data_dir, tmp_path / "run", "--case", "sgd", "--max-iters", "2", "--dtype", dtype) == 2
    )
    stderr = capsys.readouterr().err.strip()
    assert len(stderr.splitlines()) == 1 and expected in stderr and "Traceback" not in stderr, stderr
