"""The interventions' calibration (attnid.reports.calibration, `attnid calibration-table`, the plan's pending
specs): the best lr is the lowest mean final full-split val loss over the calibration seeds (a diverged lr
never, the smaller lr on a tie), and the spec file written for a run at an arm's best lr is the plan's run
with that lr, as `attnid train --config` reads it; the mistakes are one line each."""

from __future__ import annotations

import argparse
import copy
import json
import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_helpers import smoke_config
from synthetic_runs import write_run

from attnid.cli import main
from attnid.cli.train import add_train_arguments, config_from_args
from attnid.plan import plan, spec_texts
from attnid.plan.runs import read_pending_spec
from attnid.reports.calibration import best_lrs, calibration_table
from attnid.training.config import resolve_config

# arm -> (case, its config over the run's) and its final whole-split loss per (lr, seed); None: diverged
LOSSES = {
    "adamw": ("adamw", {}, {(5e-4, 9): 2.10, (5e-4, 10): 2.12, (2e-3, 9): 2.05, (2e-3, 10): 2.03}),
    "adamw_gauge_fixed": (
        "adamw_gauge_fixed",
        {},
        {
            (5e-4, 9): 2.04,
            (5e-4, 10): 2.06,
            (2e-3, 9): 2.06,
            (2e-3, 10): 2.04,
            (8e-3, 9): None,
            (8e-3, 10): 1.0,
        },
    ),
}


def calibration_run(root, arm: str, case: str, lr: float, seed: int, loss: float | None, **config):
    run_dir = write_run(
        root / arm / f"lr{lr:g}" / f"seed{seed}",
        case,
        seed,
        lr,
        status="diverged" if loss is None else "completed",
        dtype="float32",
    )
    info = json.loads((run_dir / "run.json").read_text())
    info["final_val_loss_full"] = loss
    info["config"].update(config)
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


@pytest.fixture()
def calibration_runs(tmp_path):
    return [
        str(calibration_run(tmp_path / "calibration", arm, case, lr, seed, loss, **config))
        for arm, (case, config, losses) in LOSSES.items()
        for (lr, seed), loss in losses.items()
    ]


def test_the_best_lr_is_the_lowest_mean_never_a_diverged_one_the_smaller_on_a_tie(calibration_runs):
    from attnid.training.rundir import load_run

    table = calibration_table([load_run(run_dir)[0] for run_dir in calibration_runs])
    assert table[["arm", "lr", "n_seeds", "n_diverged"]].values.tolist() == [
        ["adamw", 5e-4, 2, 0],
        ["adamw", 2e-3, 2, 0],
        ["adamw_gauge_fixed", 5e-4, 2, 0],
        ["adamw_gauge_fixed", 2e-3, 2, 0],
        ["adamw_gauge_fixed", 8e-3, 2, 1],
    ]
    means = table["mean"].tolist()
    assert means[:4] == pytest.approx([2.11, 2.04, 2.05, 2.05]) and math.isnan(means[4])
    assert table["sd"].iloc[0] == pytest.approx(0.02**0.5 / 10)  # the sample sd of 2.10 and 2.12
    # adamw: 2e-3; the gauge arm: 5e-4 and 2e-3 tie (the smaller wins), 8e-3 had a lower loss but diverged
    assert best_lrs(table) == {"adamw": 2e-3, "adamw_gauge_fixed": 5e-4}


def calibrated_config(tmp_path) -> dict:
    config = smoke_config()
    config["results_dir"] = str(tmp_path / "results")
    config["interventions"]["calibration"] = {
        "arms": ["adamw_gauge_fixed"],
        "lr_factors": [0.5, 2, 8],
        "seeds": [9, 10],
    }
    return config


def write_specs(planned) -> list[str]:
    """What the workflow's spec jobs write: every spec file of the plan, and the pending specs."""
    for path, text in spec_texts(planned).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return list(spec_texts(planned))


def test_the_calibrated_spec_is_the_plan_s_run_at_the_best_lr(calibration_runs, tmp_path, capsys):
    """The plan gives pending specs (not specs) for the runs at the best lr; `attnid calibration-table`
    writes their spec files, which `attnid train --config` resolves to the plan's run with the chosen lr;
    run again, it replaces its own spec files."""
    config = calibrated_config(tmp_path)
    planned = plan(copy.deepcopy(config))
    written = write_specs(planned)
    calibrated = planned.calibrated()
    # adamw and the gauge arm at their best lr, each at the stage's seeds
    assert len(calibrated) == 2 * len(config["interventions"]["seeds"])
    pending = [planned.pending_spec_file(run_dir) for run_dir in calibrated]
    assert set(pending) <= set(written)
    assert not any((tmp_path / planned.spec_file(run_dir)).exists() for run_dir in calibrated)
    out = tmp_path / "tables"
    command = [
        "calibration-table",
        "--runs",
        *calibration_runs,
        "--out-dir",
        str(out),
        "--pending-specs",
        *pending,
    ]
    for _ in range(2):
        assert main(command) == 0
    assert "adamw_gauge_fixed lr 0.0005: mean 2.0500 over 2 seeds (best)" in capsys.readouterr().out
    assert pd.read_csv(out / "calibration.csv")["best"].sum() == 2
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    best = {"adamw": 2e-3, "adamw_gauge_fixed": 5e-4}
    for run_dir in calibrated:
        spec = planned.runs[run_dir]
        arm = spec.best_lr_of
        args = parser.parse_args(["--config", planned.spec_file(run_dir), "--data", "d", "--out", run_dir])
        expected = resolve_config({**spec.options(), "lr": best[arm], "data": "d", "out": run_dir})
        assert asdict(config_from_args(args)) == asdict(expected), run_dir
        assert expected.arm == f"{arm}_best_lr" and expected.max_iters == config["training"]["max_iters"]


def test_calibration_mistakes_are_one_line_each(calibration_runs, tmp_path, capsys):
    config = calibrated_config(tmp_path)
    planned = plan(copy.deepcopy(config))
    write_specs(planned)
    pending = [planned.pending_spec_file(run_dir) for run_dir in planned.calibrated()]
    out = str(tmp_path / "tables")

    def error(*flags) -> str:
        assert main(["calibration-table", "--out-dir", out, *flags]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    gauge_runs = [run for run in calibration_runs if "/adamw_gauge_fixed/" in run]
    assert "arm adamw, which has no calibration runs among those given (adamw_gauge_fixed)" in error(
        "--runs", *gauge_runs, "--pending-specs", *pending
    )
    diverged = [run for run in gauge_runs if "lr0.008" in run]
    calibration_run(tmp_path / "calibration", "adamw_gauge_fixed", "adamw_gauge_fixed", 8e-3, 10, None)
    assert "arm adamw_gauge_fixed: a calibration run diverged at every lr of its grid" in error(
        "--runs", *diverged, "--pending-specs", pending[-1]
    )
    assert "is no pending spec of attnid.plan" in error(
        "--runs", *calibration_runs, "--pending-specs", planned.spec_file(planned.calibration_runs[0])
    )
    spec_file = tmp_path / planned.spec_file(planned.calibrated()[0])
    spec_file.write_text("notes: mine\n")
    assert "--force" in error("--runs", *calibration_runs, "--pending-specs", *pending)
    assert spec_file.read_text() == "notes: mine\n"
    assert "say which runs" in error("--pending-specs", *pending)
    read_pending_spec(pending[0])  # what the plan wrote reads back


# ---------------------------------------------------------------------------- two rounds

# round 1 (seeds 9, 10) and round 2 (seeds 11-13, at round 1's two best lrs) of one arm: round 1 ranks
# 2e-3 first, 5e-4 second, 8e-3 last; seed 9 alone picks 5e-4; round 2 reverses round 1's order
ROUND_ONE = {
    (5e-4, 9): 2.00,
    (5e-4, 10): 2.10,
    (2e-3, 9): 2.02,
    (2e-3, 10): 2.04,
    (8e-3, 9): 2.2,
    (8e-3, 10): 2.3,
}
ROUND_TWO = {
    (2e-3, 11): 2.06,
    (2e-3, 12): 2.07,
    (2e-3, 13): 2.05,
    (5e-4, 11): 2.01,
    (5e-4, 12): 2.0,
    (5e-4, 13): 2.02,
}


def _means(losses: dict, keep=lambda lr, seed: True) -> dict[float, float]:
    by_lr: dict[float, list[float]] = {}
    for (lr, seed), loss in losses.items():
        if keep(lr, seed):
            by_lr.setdefault(lr, []).append(loss)
    return {lr: sum(values) / len(values) for lr, values in by_lr.items()}


def test_round_two_refines_round_one_s_best_lrs_and_picks_the_lowest_mean_of_both(tmp_path, capsys):
    """calibration.csv keeps both rounds (round 2's means over all 5 seeds at its lrs), ``best`` on the
    final pick, ``round_best`` on each round's; calibration_picks.csv gives the final, round 1's and seed
    9's picks, each recomputed here from the losses."""
    root = tmp_path / "calibration"
    first = [
        str(calibration_run(root, "adamw_gauge_fixed", "adamw_gauge_fixed", lr, seed, loss))
        for (lr, seed), loss in ROUND_ONE.items()
    ]
    second = [
        str(calibration_run(root / "top", "adamw_gauge_fixed", "adamw_gauge_fixed", lr, seed, loss))
        for (lr, seed), loss in ROUND_TWO.items()
    ]
    out = tmp_path / "tables"
    assert main(["calibration-table", "--runs", *first, "--refine-runs", *second, "--out-dir", str(out)]) == 0
    table = pd.read_csv(out / "calibration.csv")
    one = _means(ROUND_ONE)
    both = _means({**ROUND_ONE, **ROUND_TWO}, lambda lr, seed: lr in {lr for lr, _ in ROUND_TWO})
    assert table[table["round"] == 1]["lr"].tolist() == sorted(one)
    assert table[table["round"] == 1]["mean"].tolist() == pytest.approx([one[lr] for lr in sorted(one)])
    round_two = table[table["round"] == 2]
    assert round_two["lr"].tolist() == sorted(both) and set(round_two["n_seeds"]) == {5}
    assert round_two["mean"].tolist() == pytest.approx([both[lr] for lr in sorted(both)])
    final, first_pick = min(both, key=both.get), min(one, key=one.get)
    assert final != first_pick  # the data make round 2 change the pick
    assert table.loc[table["best"], ["round", "lr"]].values.tolist() == [[2, final]]
    assert table.loc[table["round_best"] & (table["round"] == 1), "lr"].tolist() == [first_pick]
    assert best_lrs(table) == {"adamw_gauge_fixed": final}
    picks = pd.read_csv(out / "calibration_picks.csv").set_index("pick")["lr"].to_dict()
    alone = _means(ROUND_ONE, lambda lr, seed: seed == 9)
    assert picks == {"final": final, "round1": first_pick, "one_seed": min(alone, key=alone.get)}
    assert "(round 2)" in capsys.readouterr().out


def test_round_two_s_runs_take_round_one_s_lrs_by_rank(tmp_path):
    """The plan's round-2 runs are pending specs marked with a rank; `attnid calibration-table` on round 1
    writes each one's spec at the lr of its rank in round 1 (what `attnid train --config` reads)."""
    config = calibrated_config(tmp_path)
    config["interventions"]["calibration"]["refine"] = {"top": 2, "seeds": [11, 12, 13]}
    planned = plan(copy.deepcopy(config))
    write_specs(planned)
    refine = [d for d in planned.refine_runs if "/adamw_gauge_fixed/" in d]
    assert len(refine) == 2 * 3 and not set(refine) & set(planned.calibrated())
    root = tmp_path / "calibration"
    runs = [
        str(calibration_run(root, "adamw_gauge_fixed", "adamw_gauge_fixed", lr, seed, loss))
        for (lr, seed), loss in ROUND_ONE.items()
    ]
    pending = [planned.pending_spec_file(d) for d in refine]
    assert (
        main(
            [
                "calibration-table",
                "--runs",
                *runs,
                "--out-dir",
                str(tmp_path / "r1"),
                "--pending-specs",
                *pending,
            ]
        )
        == 0
    )
    one = _means(ROUND_ONE)
    ranked = sorted(one, key=lambda lr: (one[lr], lr))
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    for run_dir in refine:
        rank = planned.runs[run_dir].rank
        assert read_pending_spec(planned.pending_spec_file(run_dir)).rank == rank
        args = parser.parse_args(["--config", planned.spec_file(run_dir), "--data", "d", "--out", run_dir])
        assert config_from_args(args).lr == ranked[rank - 1] and f"/top{rank}/" in run_dir


@settings(max_examples=40, deadline=None)
@given(
    losses=st.lists(st.floats(1.0, 3.0, allow_nan=False), min_size=5 * 8, max_size=5 * 8),
)
def test_the_final_pick_is_the_lowest_mean_of_round_one_s_two_best_over_eight_seeds(losses):
    """Any losses on a 5-lr grid: round 2 at round 1's two best lrs (2 seeds) on 6 more seeds; the pick is
    the lower mean over the 8 (the smaller lr on a tie), as recomputed with pandas."""
    lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    value = dict(zip([(lr, seed) for lr in lrs for seed in range(8)], losses, strict=True))

    def info(lr, seed):
        return {
            "case": "adamw",
            "config": {},
            "lr": lr,
            "seed": seed,
            "final_val_loss_full": value[(lr, seed)],
        }

    first = [info(lr, seed) for lr in lrs for seed in (0, 1)]
    one = pd.DataFrame(first).groupby("lr")["final_val_loss_full"].mean()
    top = sorted(lrs, key=lambda lr: (one[lr], lr))[:2]
    second = [info(lr, seed) for lr in top for seed in range(2, 8)]
    table = calibration_table(first, second)
    both = pd.DataFrame([row for row in first + second if row["lr"] in top]).groupby("lr")[
        "final_val_loss_full"
    ]
    assert set(both.count()) == {8}
    means = both.mean()
    assert best_lrs(table) == {"adamw": min(top, key=lambda lr: (means[lr], lr))}
