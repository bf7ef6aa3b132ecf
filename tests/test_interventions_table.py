"""attnid interventions-table (attnid.reports.interventions_table) on synthetic runs: every number of
interventions.csv recomputed here from the losses the runs were written with, a verdict of each kind, the
equal-wall-time metric between evaluations, the pairing errors, and the table in the appendix."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from synthetic_runs import write_run

from attnid.cli import main
from attnid.reports import appendix, interventions_table

SEEDS = range(5)
BASELINE_SECONDS_PER_STEP = 0.1  # evaluations at steps 0, 20, 40: wall 0, 2 and 4 s


def baseline_losses(seed: int) -> dict[int, float]:
    return {0: 4.2, 20: 2.6 + 0.01 * seed, 40: 2.3 + 0.02 * seed}


# Per arm: its val loss at each evaluation (step -> loss) for a seed, and its seconds per step. The names are
# not cases the registry knows: the table takes whatever case names the runs carry.
NOISE = (0.011, -0.013, 0.008, -0.009, 0.003)
ARMS = {
    "arm_lower": (lambda s: {k: v - 0.05 - 0.002 * s for k, v in baseline_losses(s).items()}, 0.1),
    "arm_higher": (lambda s: {k: v + 0.04 + 0.003 * s for k, v in baseline_losses(s).items()}, 0.1),
    # differences of both signs around 0; its best val loss is at step 20, not at the end
    "arm_same": (lambda s: {0: 4.2, 20: 2.25 + 0.02 * s, 40: 2.3 + 0.02 * s + NOISE[s]}, 0.1),
    # lower at the end but 1.5x slower: at the baseline's 4 s it has logged its step-20 evaluation (at 3 s;
    # the step-30 row at 4.5 s has no val loss, and would be too late anyway)
    "arm_slow": (lambda s: {0: 4.2, 20: 2.7 + 0.01 * s, 40: 2.27 + 0.02 * s}, 0.15),
}


def write_arm_run(
    root,
    case: str,
    seed: int,
    evals: dict[int, float],
    seconds_per_step: float,
    *,
    status: str = "completed",
    steps: int = 40,
):
    """A synthetic run (synthetic_runs.write_run) whose evaluations log exactly ``evals`` and whose wall clock
    runs at ``seconds_per_step``; the rows between evaluations (steps 10, 30) log no val loss."""
    run_dir = write_run(
        root / case / f"seed{seed}",
        case,
        seed,
        1e-3,
        steps=steps,
        log_every=10,
        status=status,
        dtype="float32",
    )
    metrics = pd.read_csv(run_dir / "metrics.csv")
    metrics["val_loss"] = metrics["step"].map(evals)
    metrics["wall_s"] = metrics["step"] * seconds_per_step
    if status == "diverged":
        metrics.loc[metrics.index[-1], "val_loss"] = np.nan
    metrics.to_csv(run_dir / "metrics.csv", index=False)
    info = json.loads((run_dir / "run.json").read_text())
    info["final_val_loss"] = None if status == "diverged" else evals[steps]
    info["wall_time_s"] = steps * seconds_per_step
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


@pytest.fixture()
def intervention_runs(tmp_path):
    root = tmp_path / "runs"
    for seed in [*SEEDS, 5]:  # the baseline's seed 5 has no arm run: it is simply not used
        write_arm_run(root, "adamw", seed, baseline_losses(seed), BASELINE_SECONDS_PER_STEP)
    for arm, (losses, seconds) in ARMS.items():
        for seed in SEEDS:
            write_arm_run(root, arm, seed, losses(seed), seconds)
    return root


def expected_differences(arm: str, metric: str) -> np.ndarray:
    """The per-seed differences arm - baseline, worked out from the losses the runs were written with."""
    losses, seconds = ARMS[arm]
    out = []
    for seed in SEEDS:
        mine, base = losses(seed), baseline_losses(seed)
        if metric == "final_val_loss":
            out.append(mine[40] - base[40])
        elif metric == "best_val_loss":
            out.append(min(mine.values()) - min(base.values()))
        else:  # the shorter run's last evaluation sets the time; each run's last evaluation by then
            wall = min(40 * seconds, 40 * BASELINE_SECONDS_PER_STEP)
            arm_step = max(step for step in mine if step * seconds <= wall)
            base_step = max(step for step in base if step * BASELINE_SECONDS_PER_STEP <= wall)
            out.append(mine[arm_step] - base[base_step])
    return np.array(out)


def enumerated_sign_flip_p(values: np.ndarray) -> float:
    observed = abs(values.sum())
    signs = itertools.product((1, -1), repeat=len(values))
    return float(np.mean([abs(np.dot(sign, values)) >= observed - 1e-12 for sign in signs]))


def test_every_number_of_the_table_is_recomputed(intervention_runs, tmp_path, capsys):
    out = tmp_path / "tables"
    assert main(["interventions-table", "--runs-dir", str(intervention_runs), "--out-dir", str(out)]) == 0
    table = pd.read_csv(out / "interventions.csv")
    assert list(table.columns) == [
        "arm",
        "baseline",
        "n_seeds",
        "metric",
        "delta_mean",
        "ci_low",
        "ci_high",
        "p_value",
        "verdict",
    ]
    assert set(table["arm"]) == set(ARMS) and set(table["baseline"]) == {"adamw"}
    assert len(table) == len(ARMS) * 3
    for row in table.itertuples():
        differences = expected_differences(row.arm, row.metric)
        ci = stats.bootstrap(
            (differences,), np.mean, n_resamples=9_999, method="percentile", random_state=0
        ).confidence_interval
        assert row.n_seeds == len(SEEDS)
        assert row.delta_mean == pytest.approx(differences.mean(), abs=1e-12)
        assert (row.ci_low, row.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-12)
        assert row.p_value == pytest.approx(enumerated_sign_flip_p(differences))
        expected = "better" if ci.high < 0 else "worse" if ci.low > 0 else "no detectable difference"
        assert row.verdict == expected, (row.arm, row.metric)
    verdicts = table.set_index(["arm", "metric"])["verdict"]
    assert verdicts[("arm_lower", "final_val_loss")] == "better"
    assert verdicts[("arm_higher", "final_val_loss")] == "worse"
    assert verdicts[("arm_same", "final_val_loss")] == "no detectable difference"
    assert verdicts[("arm_same", "best_val_loss")] == "better"  # its best is the step-20 evaluation
    # faster per step matters: lower at the end, worse at the baseline's wall time
    assert verdicts[("arm_slow", "final_val_loss")] == "better"
    assert verdicts[("arm_slow", "val_loss_at_equal_wall_time")] == "worse"
    # one sign on all five seeds: the smallest p five seeds can give
    p_values = table.set_index(["arm", "metric"])["p_value"]
    assert p_values[("arm_lower", "final_val_loss")] == pytest.approx(2 / 2**5)
    printed = capsys.readouterr().out
    assert "arm_higher - adamw, final_val_loss: mean +0.046" in printed and ": worse" in printed

    tex = (out / "interventions.tex").read_text()
    assert r"\label{tab:interventions}" in tex and r"\texttt{arm\_slow} against \texttt{adamw}" in tex
    assert tex.count("no detectable difference") >= 2  # the caption and arm_same's row
    assert r"\num{0.0625} at $n = 5$" in tex and "& 0.0625 & better" in tex


def test_equal_wall_time_reads_the_last_evaluation_by_then():
    evals = interventions_table.eval_rows(
        pd.DataFrame(
            {
                "step": [0, 10, 20, 30, 40],
                "wall_s": [0.0, 1.5, 3.0, 4.5, 6.0],
                "val_loss": [4.0, np.nan, 3.0, np.nan, 2.0],
            }
        )
    )
    assert evals["step"].tolist() == [0, 20, 40]  # the rows between evaluations log no val loss
    assert interventions_table.val_loss_reached_by(evals, 4.4) == 3.0
    assert interventions_table.val_loss_reached_by(evals, 6.0) == 2.0
    assert interventions_table.val_loss_reached_by(evals, 2.99) == 4.0
    assert math.isnan(interventions_table.val_loss_reached_by(evals, -1.0))
    shorter = interventions_table.eval_rows(
        pd.DataFrame({"step": [0, 20], "wall_s": [0.0, 4.0], "val_loss": [4.1, 2.9]})
    )
    assert interventions_table.equal_wall_time_losses(evals, shorter) == (3.0, 2.9)
    assert interventions_table.equal_wall_time_losses(shorter, evals) == (2.9, 3.0)


def test_a_seed_without_a_baseline_run_is_a_one_line_error(intervention_runs, tmp_path, capsys):
    write_arm_run(intervention_runs, "arm_lower", 7, baseline_losses(7), 0.1)
    command = ["interventions-table", "--runs-dir", str(intervention_runs), "--out-dir", str(tmp_path)]
    assert main(command) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        "attnid interventions-table: error: arm arm_lower: seed(s) 7 have no adamw run to pair "
        "with; pass the adamw runs of the same seeds (or leave those arm_lower runs out)"
    ]
    assert not (tmp_path / "interventions.csv").exists()


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("twice", "two runs of case arm_lower with seed 0"),
        ("longer", "arm arm_lower seed 0 trains 60 steps, adamw seed 0 40"),
        ("no baseline", "no adamw runs among the runs given"),
        ("only baseline", "only adamw runs given: nothing to compare"),
    ],
)
def test_other_selection_mistakes_are_one_line_errors(intervention_runs, tmp_path, capsys, mistake, message):
    runs = sorted(str(path.parent) for path in intervention_runs.rglob("run.json"))
    if mistake == "twice":
        runs.append(str(write_arm_run(tmp_path / "copy", "arm_lower", 0, baseline_losses(0), 0.1)))
    elif mistake == "longer":
        runs = [r for r in runs if not r.endswith("arm_lower/seed0")]
        runs.append(
            str(
                write_arm_run(
                    tmp_path / "long", "arm_lower", 0, baseline_losses(0) | {60: 2.2}, 0.1, steps=60
                )
            )
        )
    elif mistake == "no baseline":
        runs = [r for r in runs if "/adamw/" not in r]
    else:
        runs = [r for r in runs if "/adamw/" in r]
    assert main(["interventions-table", "--runs", *runs, "--out-dir", str(tmp_path / "out")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and message in errors[0], errors


def test_a_diverged_run_leaves_its_pair_out_and_says_so(intervention_runs, tmp_path, capsys):
    losses, seconds = ARMS["arm_lower"]
    write_arm_run(intervention_runs, "arm_lower", 2, losses(2), seconds, status="diverged")
    for seed in (0, 1, 2, 3):  # arm_higher: only seed 4 left, too few for a CI
        write_arm_run(
            intervention_runs, "arm_higher", seed, ARMS["arm_higher"][0](seed), 0.1, status="diverged"
        )
    out = tmp_path / "tables"
    assert main(["interventions-table", "--runs-dir", str(intervention_runs), "--out-dir", str(out)]) == 0
    table = pd.read_csv(out / "interventions.csv").set_index(["arm", "metric"])
    lower = table.loc[("arm_lower", "final_val_loss")]
    kept = np.delete(expected_differences("arm_lower", "final_val_loss"), 2)
    assert lower.n_seeds == 4 and lower.delta_mean == pytest.approx(kept.mean())
    assert lower.p_value == pytest.approx(2 / 2**4)
    higher = table.loc[("arm_higher", "best_val_loss")]
    assert higher.n_seeds == 1 and higher.verdict == interventions_table.TOO_FEW_SEEDS
    assert math.isnan(higher.ci_low) and math.isnan(higher.p_value)
    printed = capsys.readouterr().out
    assert "note: arm_lower vs adamw, final_val_loss: seed 2 left out (arm_lower diverged)" in printed
    assert printed.count("note: arm_higher vs adamw") == 4 * 3  # four seeds, three metrics


def test_the_appendix_includes_the_table_when_present_and_omits_it_on_request(intervention_runs, tmp_path):
    from test_studies import _theory

    tables = tmp_path / "tables"
    interventions_table.write_interventions_table(intervention_runs, tables)
    out = tmp_path / "paper" / "appendix.tex"
    text = appendix.render_appendix(*_theory(tmp_path), out, experiment_tables=tables)
    assert r"\section{Does identification buy anything?}" in text and r"\label{tab:interventions}" in text
    assert "Table~\\ref{tab:interventions} compares arms" in text
    assert "tab:study-correlation" not in text  # no study tables in this folder: no paragraph about them
    lean = appendix.render_appendix(
        *_theory(tmp_path), out, experiment_tables=tables, omit=("interventions",)
    )
    assert "tab:interventions" not in lean and "Does identification buy anything" not in lean


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("latexmk") is None, reason="needs TeX (latexmk)")
def test_the_table_fits_the_page(tmp_path, repo_root):
    """The widest rows the table gets (long arm names, differences in scientific notation) compile with no
    box more than 5 pt too wide."""
    from test_studies import _theory

    root = tmp_path / "runs"
    for seed in SEEDS:
        write_arm_run(root, "adamw", seed, baseline_losses(seed), 0.1)
        for arm, shift in (("adamw_gauge_fixed", -1.234e-4), ("adamw_rebalance_transport", 3.21e-3)):
            losses = {k: v + shift * (1 + seed) for k, v in baseline_losses(seed).items()}
            write_arm_run(root, arm, seed, losses, 0.1 + 0.01 * seed)
    tables, paper = tmp_path / "tables", tmp_path / "paper"
    interventions_table.write_interventions_table(root, tables)
    paper.mkdir()
    shutil.copy(repo_root / "paper" / "main.tex", paper / "main.tex")
    (paper / "appendix.tex").write_text(
        appendix.render_appendix(*_theory(tmp_path), paper / "appendix.tex", experiment_tables=tables)
    )
    appendix.compile_pdf(paper / "main.tex")
    log = (paper / "main.log").read_text(errors="replace")
    widths = [float(w) for w in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert not widths or max(widths) <= 5.0, re.findall(r"Overfull.*", log)
    assert "Float too large" not in log
