"""attnid tables on synthetic runs: exact summaries, mean ± sd, slopes, claims, diverged runs, LaTeX."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from synthetic_runs import write_run, write_study

from attnid.reports import claims as claims_module
from attnid.reports import latex, round_off, tables
from attnid.training import rundir


@pytest.fixture()
def study(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    out = tmp_path / "tables"
    return tables.write_tables(runs_dir, sweep_dir, out), out


def test_loglog_slope_of_beta_proportional_to_lr_squared_is_two():
    lr = np.array([1e-3, 1e-2, 3e-2, 1e-1])
    fit = tables.fit_loglog_slope(lr, 7.0 * lr**2)
    assert fit["slope"] == pytest.approx(2.0, abs=1e-12)
    assert fit["intercept"] == pytest.approx(math.log10(7.0), abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0) and fit["n_points"] == 4


def test_loglog_slope_ignores_missing_and_needs_two_points():
    assert tables.fit_loglog_slope([0.1, 1.0, 10.0], [0.01, np.nan, 1.0])["slope"] == pytest.approx(1.0)
    assert math.isnan(tables.fit_loglog_slope([0.1, 1.0], [0.01, np.nan])["slope"])


def test_per_run_summary_is_exact(study):
    frames, _ = study
    runs = frames["runs"]
    assert len(runs) == 12
    sgd0 = runs[(runs["case"] == "sgd") & (runs["seed"] == 0)].iloc[0]
    assert sgd0["rho_qk_mean"] == pytest.approx(1e-27) and sgd0["rho_qk_max"] == pytest.approx(1e-27)
    assert sgd0["dtype"] == "float64" and sgd0["closure_max"] == pytest.approx(1e-16)
    assert sgd0["drift1_ov_final"] == pytest.approx(2e-17) and sgd0["drift2_ov_final"] == pytest.approx(2e-3)
    assert sgd0["drift_ratio_qk_final"] == pytest.approx(1e-14) and sgd0[
        "drift_ratio_ov_final"
    ] == pytest.approx(1e-14)
    assert sgd0["beta_qk_final"] == pytest.approx(1e-3) and sgd0["beta_ov_final"] == pytest.approx(2e-3)
    assert sgd0["tau_max"] == pytest.approx(1e-7) and sgd0["tau_logits_max"] == pytest.approx(3e-7)
    assert sgd0["mu_qk_final"] == pytest.approx(0.1) and sgd0["final_val_loss"] == pytest.approx(1.0)
    rebalanced = runs[runs["case"] == "adamw_rebalance"].iloc[0]
    assert rebalanced["n_rebalances"] == 2 and rebalanced["beta_after_rebalance_max"] == pytest.approx(2e-9)
    # before the rebalances at steps 20 and 40: beta_ov at steps 10 and 30 = 2 * 0.2 * (10, 30) / 40
    assert rebalanced["beta_rebalance_ratio_max"] == pytest.approx(2e-9 / 0.1)


def test_cases_table_mean_and_sample_sd_over_seeds(study):
    cases = study[0]["cases"].set_index("case")
    assert cases.loc["sgd", "n_seeds"] == 3
    assert cases.loc["sgd", "final_val_loss_mean"] == pytest.approx(2.0)  # seeds: 1, 2, 3
    assert cases.loc["sgd", "final_val_loss_sd"] == pytest.approx(1.0)
    assert cases.loc["adamw", "rho_qk_mean_mean"] == pytest.approx(0.06)
    assert cases.loc["adamw", "rho_qk_mean_sd"] == pytest.approx(0.01)


def test_sweep_table_marks_diverged_points_and_fits_slopes(study):
    frames, _ = study
    sweep = frames["sweep"].set_index(["optimizer", "lr"])
    assert sweep.loc[("sgd", 1000.0), "status"] == "diverged"
    assert math.isnan(sweep.loc[("sgd", 1000.0), "final_val_loss"])
    assert (sweep.drop(index=("sgd", 1000.0))["status"] == "ok").all()
    slopes = frames["sweep_slopes"].set_index(["optimizer", "quantity"])
    assert slopes.loc[("sgd", "beta_qk_final"), "slope"] == pytest.approx(2.0, abs=1e-9)
    assert slopes.loc[("sgd", "beta_ov_final"), "slope"] == pytest.approx(2.0, abs=1e-9)
    assert slopes.loc[("sgd", "beta_qk_final"), "n_points"] == 3  # the diverged point is left out
    assert slopes.loc[("adamw", "beta_qk_final"), "slope"] == pytest.approx(1.0, abs=1e-9)


def test_claims_pass_on_a_study_that_shows_them(study):
    claims = study[0]["claims"].set_index("claim")
    assert (claims["result"] == "pass").all(), claims[["measured", "result"]]
    assert claims.loc["E1 sgd drift1/drift2 < 1e-9", "measured"] == pytest.approx(3e-14)
    assert claims.loc["E1 sgd rho max < 1e-20", "measured"] == pytest.approx(3e-27)
    assert claims.loc["E1 sgd sweep beta_qk slope in [1.8, 2.2]", "measured"] == pytest.approx(2.0)
    assert claims.loc["E1 sgd sweep beta_ov slope in [1.8, 2.2]", "measured"] == pytest.approx(2.0)
    assert claims.loc["E2 sgd_wd drift1 = prediction (rel. error < 1e-6)", "measured"] == pytest.approx(3e-12)
    assert claims.loc["E2 adamw drift1/drift2 > 10", "measured"] == pytest.approx(20.0)
    assert claims.loc["E2 rho_qk adamw mean > 1e-2", "measured"] == pytest.approx(0.05)
    assert claims.loc["drift split closes: closure < 1e-10", "measured"] == pytest.approx(1e-16)
    # each claim names the precision of the runs it read
    assert claims.loc["E1 sgd rho max < 1e-20", "dtype"] == "float64"
    assert claims.loc["E1 sgd sweep beta_ov slope in [1.8, 2.2]", "dtype"] == "float64"
    assert claims.loc["E2 adamw drift1/drift2 > 10", "dtype"] == "float32"
    assert claims.loc["drift split closes: closure < 1e-10", "dtype"] == "float32+float64"


def test_round_off_claims_on_float32_runs_are_not_applicable(tmp_path):
    """float32 cannot resolve E1's and E2's identities at their thresholds: neither pass nor fail."""
    runs_dir, sweep_dir = write_study(tmp_path, sgd_dtype="float32")
    claims = tables.write_tables(runs_dir, sweep_dir, tmp_path / "tables")["claims"].set_index("claim")
    float64_only = [
        "E1 sgd drift1/drift2 < 1e-9",
        "E1 sgd rho max < 1e-20",
        "E1 sgd sweep beta_qk slope in [1.8, 2.2]",
        "E1 sgd sweep beta_ov slope in [1.8, 2.2]",
        "E2 sgd_wd drift1 = prediction (rel. error < 1e-6)",
    ]
    not_applicable = claims.loc[float64_only, "result"] == claims_module.NOT_APPLICABLE
    assert not_applicable.all(), claims.loc[float64_only]
    assert (claims.loc[float64_only, "dtype"] == "float32").all()
    others = claims.drop(index=float64_only)
    assert (others["result"] == "pass").all(), others[["measured", "result"]]
    assert (
        pd.read_csv(tmp_path / "tables" / "claims.csv")
        .set_index("claim")
        .loc["E1 sgd rho max < 1e-20", "result"]
        == "not applicable (dtype)"
    )


def test_runs_from_before_the_dtype_field_read_as_their_devices_default():
    assert round_off.run_dtype({"device": "cpu"}) == "float32"
    assert round_off.run_dtype({"device": "cuda"}) == "bf16"
    assert round_off.run_dtype({"device": "cuda", "dtype": "bfloat16"}) == "bf16"
    assert round_off.run_dtype({"device": "cpu", "dtype": "float64"}) == "float64"
    assert claims_module.resolves("float64", claims_module.FLOAT64_ONLY) and not claims_module.resolves(
        "float32+float64", claims_module.FLOAT64_ONLY
    )
    assert not claims_module.resolves("", claims_module.FLOAT64_ONLY) and claims_module.resolves("bf16", None)


def test_claims_fail_or_go_missing_when_the_runs_do_not_show_them(tmp_path):
    runs = tmp_path / "runs"
    write_run(
        runs / "sgd" / "seed0", "sgd", 0, 0.5, rho_qk=1e-3, tau=1e-3, drift1=1e-4, drift2=1e-3, closure=1e-8
    )
    frames = tables.write_tables(runs, tmp_path / "no_sweep", tmp_path / "out")
    result = frames["claims"].set_index("claim")["result"]
    assert result["E1 sgd rho max < 1e-20"] == "fail"
    assert result["E1 sgd drift1/drift2 < 1e-9"] == "fail"
    assert result["drift split closes: closure < 1e-10"] == "fail"
    assert result["E3 tau max < 1e-5"] == "fail"
    assert result["E1 sgd sweep beta_qk slope in [1.8, 2.2]"] == "missing"
    assert result["E2 rho_qk adamw mean > 1e-2"] == "missing"
    assert result["E2 sgd_wd drift1 = prediction (rel. error < 1e-6)"] == "missing"


def test_diverged_main_run_is_listed_but_not_averaged(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "adamw" / "seed0", "adamw", 0, 1e-3, final_val_loss=2.0)
    write_run(runs / "adamw" / "seed1", "adamw", 1, 1e-3, status="diverged")
    frames = tables.write_tables(runs, None, tmp_path / "out")
    assert frames["runs"]["status"].tolist() == ["completed", "diverged"]
    case = frames["cases"].iloc[0]
    assert case["n_seeds"] == 2 and case["n_diverged"] == 1
    assert case["final_val_loss_mean"] == pytest.approx(2.0)


def test_every_file_is_written_and_latex_is_escaped(study):
    _, out = study
    for name in (
        "runs.csv",
        "runs.tex",
        "cases.csv",
        "cases.tex",
        "sweep.csv",
        "sweep.tex",
        "sweep_slopes.csv",
        "claims.csv",
    ):
        assert (out / name).stat().st_size > 0, name
    cases_tex = (out / "cases.tex").read_text()
    assert r"sgd\_wd" in cases_tex and " +- " in cases_tex and "\\begin{tabular}" in cases_tex
    assert cases_tex.count("\\\\") == 1 + 4  # header + one row per case
    sweep_tex = (out / "sweep.tex").read_text()
    assert "diverged" in sweep_tex and "slope" in sweep_tex
    assert pd.read_csv(out / "claims.csv")["result"].eq("pass").all()


def test_tex_number_formats():
    """siunitx typesets every number (true minus signs, a x 10^b); a mean and its spread share one box."""
    assert latex.tex_number(0.1234) == r"\num{0.123}"
    assert latex.tex_number(-1.5e-9) == r"\num{-1.50e-9}"
    assert latex.tex_number(float("nan")) == "--" and latex.tex_number(None) == "--"
    assert latex.table_number(0.0546) == "5.46e-2" and latex.table_number(None) == "{--}"
    assert latex.table_number(0.5, 3, 1e-3) == "0.5"
    assert latex.table_format([0.0546, 2.53e-30, 15.1, None, -3.2]) == "-2.2e-2"
    assert latex.table_format([1, 2, 36]) == "2"
    assert latex.tex_mean_sd(2.0, 1.0) == r"\mbox{\num{2.00 +- 1.00}}"
    assert latex.tex_mean_sd(4.13e-27, 5.0e-27) == r"\mbox{\num{4.13 +- 5.00 e-27}}"
    assert latex.tex_mean_sd(0.06, 2.2e-3) == r"\mbox{\num{0.0600 +- 0.0022}}"
    # a spread below the mean's last digit: both numbers in full, never "0.139 +- 0.000"
    assert latex.tex_mean_sd(0.139, 1.1e-5) == r"\mbox{\num{0.139} $\pm$ \num{1.1e-5}}"


def test_cli_without_runs_is_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnid",
            "tables",
            "--runs-dir",
            str(tmp_path / "none"),
            "--out-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no runs" in proc.stderr


def test_listed_runs_leave_out_leftovers_of_an_older_config(tmp_path):
    runs_dir, sweep_dir = write_study(tmp_path)
    every_run = rundir.find_run_dirs(runs_dir)
    listed = [str(d) for d in every_run[:-1]]  # the last one plays a run of an older config
    frames = tables.write_tables(None, sweep_dir, tmp_path / "tables", runs=listed)
    assert sorted(frames["runs"]["run_dir"]) == sorted(listed)
    with pytest.raises(tables.UserError, match="no run.json"):
        rundir.find_run_dirs(None, listed + [str(tmp_path / "never_ran")])


def test_each_verdict_of_the_family_is_a_finding_with_the_table_s_own_label(tmp_path):
    """``--verdicts interventions.csv``: a finding per comparison of the verdict rule's family, its outcome
    whatever label the table gives it (a label this code does not know included), the others left out;
    every row of claims.csv has its kind. A table without a column it reads is one line."""
    runs_dir, sweep_dir = write_study(tmp_path)
    comparisons = pd.DataFrame(
        {
            "comparison": ["fixing", "start", "frozen-adamw"],
            "arm": ["a", "b", "frozen"],
            "baseline": ["c", "d", "adamw"],
            "metric": ["final_val_loss_full"] * 3,
            "role": ["primary", "secondary", "descriptive"],
            "in_family": [True, True, False],
            "n_seeds": [10, 10, 10],
            "alpha": [0.05] * 3,
            "delta_mean": [0.004, -0.02, 0.3],
            "ci_low": [0.001, -0.03, 0.2],
            "ci_high": [0.008, -0.01, 0.4],
            "p_holm": [0.05, 0.002, float("nan")],
            "equivalence_margin": [0.01] * 3,
            "detectable_effect": [0.006, 0.01, 0.1],
            "verdict": ["worse, within the margin", "better", "not in family"],
        }
    )
    comparisons.to_csv(tmp_path / "interventions.csv", index=False)
    frames = tables.write_tables(
        runs_dir, sweep_dir, tmp_path / "tables", verdicts_csv=tmp_path / "interventions.csv"
    )
    claims = frames["claims"]
    verdicts = claims[claims["paper"] == "interventions (ours)"]
    assert verdicts["claim"].tolist() == [
        "interventions: fixing changes final_val_loss_full (primary)",
        "interventions: start changes final_val_loss_full (secondary)",
    ]
    assert verdicts["result"].tolist() == ["worse, within the margin", "better"]
    assert (verdicts["kind"] == "finding").all() and verdicts["measured"].tolist() == [0.004, -0.02]
    assert set(claims["kind"]) == {"paper", "finding", "check"}
    assert (claims.loc[claims["claim"].str.startswith("E"), "kind"] == "paper").all()
    comparisons.drop(columns="verdict").to_csv(tmp_path / "interventions.csv", index=False)
    with pytest.raises(tables.UserError, match=r"interventions.csv has no column\(s\) verdict"):
        tables.write_tables(runs_dir, sweep_dir, tmp_path / "t2", verdicts_csv=tmp_path / "interventions.csv")
