"""``attnid edits-table`` and the pipeline's checkpoint-edit stage (workflow/rules/edits.smk).

The gather runs on reports that the real ``attnid prune-biases`` and ``attnid balance`` wrote
for tiny runs of ``attnid train`` with biases; the plan and the smoke build check the rules.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess

import pandas as pd
import pytest
import yaml
from pipeline_helpers import (
    REPO,
    copy_pipeline,
    job_counts,
    run_snakemake,
    shared_smoke_run,
    smoke_config,
    stderr_lines,
    train_jobs,
)
from system_packages import needs

from attnid.cli import main
from attnid.theory import counts

TOLERANCE = 1e-5  # max |logit change| / max |logit|, float32 (as tests/cli/test_checkpoints.py)
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 16}
SEEDS = (0, 1)


def run(*argv) -> int:
    return main([str(a) for a in argv])


def redundant_bias_closed_form(n_layer: int, n_head: int, n_embd: int) -> tuple[int, int]:
    """Parameters prune-biases makes redundant and all attention parameters, from attnid.theory.counts
    (key biases and, with an output bias, the value biases: §4.7, claim T4)."""
    shape = counts.layer_shape(n_embd, n_head, bias=True)
    per_layer = counts.unidentified_key_bias_params(shape) + counts.unidentified_value_bias_params(shape)
    return n_layer * per_layer, n_layer * counts.attention_params_per_layer(shape)


@pytest.fixture(scope="module")
def edit_reports(prepared_data_dir, tmp_path_factory):
    """prune.json and balance.json of two tiny bias runs (seeds 0, 1), as the pipeline makes them."""
    root = tmp_path_factory.mktemp("edits")
    reports = []
    for seed in SEEDS:
        run_dir = root / "edits" / "adamw" / f"seed{seed}"
        assert (
            run(
                "train",
                "--data",
                prepared_data_dir,
                "--out",
                run_dir,
                "--case",
                "adamw",
                "--seed",
                seed,
                "--max-iters",
                "8",
                "--n-layer",
                TINY["n_layer"],
                "--n-head",
                TINY["n_head"],
                "--n-embd",
                TINY["n_embd"],
                "--block-size",
                "16",
                "--batch-size",
                "4",
                "--bias",
                "--eval-iters",
                "1",
                "--log-every",
                "4",
                "--eval-every",
                "8",
                "--progress-every",
                "1000",
            )
            == 0
        )
        for command, name, extra in (
            ("prune-biases", "prune", []),
            ("balance", "balance", ["--target", "balanced"]),
        ):
            assert (
                run(
                    command,
                    run_dir / "ckpt.pt",
                    "--out",
                    run_dir / f"{name}.pt",
                    "--data",
                    prepared_data_dir,
                    "--json",
                    run_dir / f"{name}.json",
                    *extra,
                )
                == 0
            )
            reports.append(run_dir / f"{name}.json")
    return reports


def test_gather_carries_the_reports_numbers(edit_reports, tmp_path, capsys):
    assert run("edits-table", "--json", *edit_reports, "--out-dir", tmp_path) == 0
    assert "wrote" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "prune.csv")
    raw = {(r["command"], r["input"]): r for r in (json.loads(p.read_text()) for p in edit_reports)}
    assert len(table) == len(raw) == 2 * len(SEEDS)
    assert list(table["edit"]) == ["prune-biases"] * len(SEEDS) + ["balance"] * len(SEEDS)
    assert list(table["seed"]) == [*SEEDS, *SEEDS] and set(table["case"]) == {"adamw"}
    for row in table.to_dict("records"):
        report = raw[(row["edit"], row["input"])]
        for key in ("loss_before", "loss_after", "loss_change", "max_rel_logit_change"):
            assert row[key] == pytest.approx(report[key], rel=1e-12, abs=1e-300)
        assert row["max_rel_logit_change"] <= TOLERANCE  # the edits keep the function
        assert report["tokens"].endswith("val.bin")  # measured on the validation split
    redundant, attention = redundant_bias_closed_form(**TINY)
    prune = table[table["edit"] == "prune-biases"]
    assert (prune["redundant_params"] == redundant).all() and (prune["attention_params"] == attention).all()
    assert prune["redundant_share"].tolist() == pytest.approx([redundant / attention] * len(SEEDS))
    balance = table[table["edit"] == "balance"]
    assert (balance["mu_qk_after"] < 1e-6).all() and (balance["mu_ov_after"] < 1e-6).all()
    assert (balance["attn_norm_after"] < balance["attn_norm_before"]).all()


def test_summary_is_mean_sd_and_max_over_seeds(edit_reports, tmp_path):
    assert run("edits-table", "--json", *edit_reports, "--out-dir", tmp_path) == 0
    summary = pd.read_csv(tmp_path / "prune_summary.csv").set_index("edit")
    reports = [json.loads(p.read_text()) for p in edit_reports]
    for edit in ("prune-biases", "balance"):
        mine = [r for r in reports if r["command"] == edit]
        row = summary.loc[edit]
        assert row["n_runs"] == len(SEEDS)
        assert row["loss_before_mean"] == pytest.approx(statistics.mean(r["loss_before"] for r in mine))
        assert row["loss_before_sd"] == pytest.approx(statistics.stdev(r["loss_before"] for r in mine))
        assert row["max_rel_logit_change"] == max(r["max_rel_logit_change"] for r in mine)
        assert row["max_abs_loss_change"] == max(abs(r["loss_change"]) for r in mine)
    balance = [r for r in reports if r["command"] == "balance"]
    for key in ("mu_qk_before", "mu_ov_before", "attn_norm_after"):
        assert summary.loc["balance", f"{key}_mean"] == pytest.approx(
            statistics.mean(r[key] for r in balance)
        )
    reduction = [1 - r["attn_norm_after"] / r["attn_norm_before"] for r in balance]
    assert summary.loc["balance", "attn_norm_reduction_mean"] == pytest.approx(statistics.mean(reduction))
    redundant, attention = redundant_bias_closed_form(**TINY)
    assert summary.loc["prune-biases", "redundant_params"] == redundant
    tex = (tmp_path / "prune.tex").read_text()
    assert r"\label{tab:prune}" in tex and f"{redundant:,} of {attention:,} attention parameters" in tex
    assert r"\scriptsize" not in tex and r"\tiny" not in tex and r"\resizebox" not in tex


def test_appendix_includes_the_prune_table_when_present(edit_reports, tmp_path, repo_root):
    tables = tmp_path / "tables"
    assert run("edits-table", "--json", *edit_reports, "--out-dir", tables) == 0
    theory = tmp_path / "theory"
    assert (
        run(
            "counts",
            "--out",
            theory / "counts.csv",
            "--single-head-out",
            theory / "single_head.csv",
        )
        == 0
    )
    (theory / "nullity.csv").write_text(
        "case,n_params,n_outputs,theory,measured,gap,passed\nx,4,4,1,1,1e15,True\n"
    )
    common = [
        "appendix",
        "--counts",
        theory / "counts.csv",
        "--nullity",
        theory / "nullity.csv",
        "--single-head",
        theory / "single_head.csv",
    ]
    assert run(*common, "--out", tmp_path / "with.tex", "--experiment-tables", tables) == 0
    tex = (tmp_path / "with.tex").read_text()
    assert r"\label{tab:prune}" in tex and r"Table~\ref{tab:prune}" in tex
    (tables / "prune.tex").unlink()
    assert run(*common, "--out", tmp_path / "without.tex", "--experiment-tables", tables) == 0
    assert "tab:prune" not in (tmp_path / "without.tex").read_text()


@needs("latexmk", "siunitx.sty")
def test_prune_table_fits_the_text_width(edit_reports, tmp_path, repo_root):
    """The widest cells (every number a mean +- sd in scientific notation) stay inside the page."""
    wide = []
    for path in edit_reports:
        report = json.loads(path.read_text())
        for key, value in report.items():
            if isinstance(value, float) and key not in ("redundant_share",):
                report[key] = -1.2345e-7 * (1 + 0.37 * len(wide)) if "change" in key else value * 1.1e-9
        wide.append(tmp_path / path.name.replace(".json", f"{len(wide)}.json"))
        wide[-1].write_text(json.dumps(report))
    assert run("edits-table", "--json", *wide, "--out-dir", tmp_path) == 0
    shutil.copy(repo_root / "paper" / "main.tex", tmp_path / "main.tex")
    shutil.copy(tmp_path / "prune.tex", tmp_path / "appendix.tex")
    proc = subprocess.run(
        ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "main.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = (tmp_path / "main.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull.*", log)


def test_bad_reports_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"command": "train"}))
    assert run("edits-table", "--json", tmp_path / "other.json", "--out-dir", tmp_path) == 2
    assert run("edits-table", "--json", tmp_path / "missing.json", "--out-dir", tmp_path) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "not a report of attnid prune-biases or attnid balance" in errors[0]
    assert "not found" in errors[1] and not (tmp_path / "prune.csv").exists()


def test_smoke_plan_has_the_edit_jobs(tmp_path):
    copy_pipeline(tmp_path)
    config = smoke_config()
    proc = run_snakemake(tmp_path, "-n", "-p")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = job_counts(proc.stdout)
    n_seeds = len(config["edits"]["seeds"])
    assert (
        jobs["train_edits"] == jobs["prune_biases"] == jobs["balance"] == n_seeds and jobs["edits_table"] == 1
    )
    out, case = config["results_dir"], config["edits"]["case"]
    lr = config["cases"][case]["lr"]
    trained = train_jobs(tmp_path, proc.stdout)
    for seed in config["edits"]["seeds"]:
        run_dir = f"{out}/edits/{case}/seed{seed}"
        job = trained[run_dir]
        assert (job["case"], job["bias"], job["lr"], job["seed"]) == (case, True, lr, seed), job
        for command, name in (("prune-biases", "pruned.pt"), ("balance --target balanced", "balanced.pt")):
            assert (
                f"attnid {command} {run_dir}/ckpt.pt --out {run_dir}/{name} --data data/tinyshakespeare "
                in proc.stdout
            )
    assert f"attnid edits-table --json {out}/edits/{case}/seed" in proc.stdout
    # the section's own step count overrides the case's, for these runs only
    proc = run_snakemake(tmp_path, "-n", "-p", config={"edits": {"max_iters": 7}})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = train_jobs(tmp_path, proc.stdout)
    assert all(trained[run_dir]["max_iters"] == 7 for run_dir in trained if "/edits/" in run_dir)
    assert not any(trained[run_dir]["max_iters"] == 7 for run_dir in trained if "/runs/" in run_dir)


def test_edits_section_is_optional_and_its_case_must_exist(tmp_path):
    copy_pipeline(tmp_path)
    config = smoke_config()
    del config["edits"]
    (tmp_path / "config/mine.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not {"train_edits", "prune_biases", "balance", "edits_table"} & set(job_counts(proc.stdout))
    del config["cases"]["adamw"]
    config["edits"] = {"case": "adamw", "seeds": [0]}
    config["sweep"].pop("adamw")
    (tmp_path / "config/mine.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("config error: edits/case"), (
        proc.stderr
    )


def test_default_config_trains_three_bias_seeds(tmp_path):
    copy_pipeline(tmp_path)
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert default["edits"]["case"] == "adamw" and default["edits"]["bias"] is True
    proc = run_snakemake(tmp_path, "-n", configfile=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert job_counts(proc.stdout)["train_edits"] == len(default["edits"]["seeds"]) == 3


@pytest.mark.slow
def test_smoke_build_makes_the_prune_table(tmp_path_factory, shakespeare_url):
    workdir = shared_smoke_run(tmp_path_factory, shakespeare_url)
    config = smoke_config()
    tables = workdir / config["results_dir"] / "tables"
    table = pd.read_csv(tables / "prune.csv")
    seeds = config["edits"]["seeds"]
    assert len(table) == 2 * len(seeds) and sorted(table["seed"]) == sorted(seeds * 2)
    assert (table["max_rel_logit_change"] < TOLERANCE).all(), table["max_rel_logit_change"]
    model = config["model"]
    redundant, attention = redundant_bias_closed_form(model["n_layer"], model["n_head"], model["n_embd"])
    prune = table[table["edit"] == "prune-biases"]
    assert len(prune) == len(seeds) and (prune["redundant_params"] == redundant).all()
    assert (prune["attention_params"] == attention).all()
    assert all(str(tokens).endswith("data/tinyshakespeare/val.bin") for tokens in table["tokens"])
    appendix = (workdir / config["results_dir"] / "paper/appendix.tex").read_text()
    assert r"\label{tab:prune}" in appendix
