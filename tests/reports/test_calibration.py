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
