"""The identification studies (attnid.plan.studies, attnid.reports.studies): the §4.10 matched embedding,
the point plan, the gathering and rank correlation on synthetic run directories, Figure 5, and the rules'
plan."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from figure_checks import invisible_legend_entries, overlapping_labels
from pipeline_helpers import REPO, copy_pipeline, run_snakemake, smoke_config, stderr_lines, train_jobs
from scipy import stats
from synthetic_runs import write_run, write_theory_tables
from system_packages import needs

from attnid.cli import main
from attnid.cli import reports as report_commands
from attnid.plan import plan
from attnid.plan import studies as study_plan
from attnid.reports import appendix, figures, studies
from attnid.reports.figures import fig5_identification_study
from attnid.reports.figures.inputs import Sources
from attnid.theory import counts

# ---------------------------------------------------------------------------- planning


@pytest.mark.parametrize("n_embd, reference", [(128, 4), (32, 2), (384, 6), (768, 12), (100, 1)])
def test_matched_single_head_embedding_is_the_even_integer_nearest_the_closed_form(n_embd, reference):
    exact = n_embd * math.sqrt(2 - 1 / reference)  # §4.10: 2 E0^2 = (4 - 2/H) E^2
    e0 = study_plan.matched_single_head_embd(n_embd, reference)
    assert e0 % 2 == 0 and abs(e0 - exact) <= 1
    assert abs(e0 - exact) == min(abs(even - exact) for even in range(0, 2 * n_embd + 4, 2))
    # the single head's identified count 2 E0^2 matches the H_ref-head layer's (4 - 2/H) E^2 up to the
    # rounding
    identified_multi = float(counts.multi_head_identified_share(reference)) * n_embd**2
    single = counts.single_head_params(e0) - counts.single_head_unidentified_params(e0)
    assert single == pytest.approx(identified_multi, rel=2.5 / exact)


def test_default_config_plans_the_issue_points():
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    points = study_plan.study_points(config)
    e0 = study_plan.matched_single_head_embd(
        config["model"]["n_embd"], config["heads"]["matched_reference_heads"]
    )
    heads = {point.name: point for point in points["heads"]}
    assert list(heads) == [f"h{h}" for h in (1, 2, 4, 8, 16)] + [f"h1_e{e0}"]
    shapes = {name: point.attention for name, point in heads.items()}
    assert all(shape.head_dim * shape.n_head == shape.n_embd for shape in shapes.values())
    matched = shapes[f"h1_e{e0}"]
    assert (matched.n_embd, matched.n_head, matched.head_dim) == (e0, 1, e0)
    n_head = config["model"]["n_head"]
    variants = {
        point.name: (point.attention.n_kv_head, point.attention.rope, point.attention.n_head)
        for point in points["variants"]
    }
    assert sorted(variants.values()) == sorted(
        [
            (n_head, False, n_head),
            (n_head // 2, False, n_head),
            (1, False, n_head),
            (n_head, True, n_head),
            (n_head // 2, True, n_head),
        ]
    )
    assert study_plan.check_study_config(config) == []
    for section in ("heads", "variants"):  # the same token budget for every point of a study
        assert "max_iters" in config[section] and "batch_size" not in config[section]


def copied_points(config: dict) -> dict[str, str]:
    """{"<study>/<point>": "<study>/<point>" it copies} of the plan's copied study runs, any seed."""
    out = f"{config['results_dir']}/studies/"
    return {
        run_dir.removeprefix(out).rsplit("/", 1)[0]: source.removeprefix(out).rsplit("/", 1)[0]
        for run_dir, source in plan(config).copied().items()
    }


def test_a_point_that_trains_what_an_earlier_point_trains_reuses_its_runs():
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    n_head = config["model"]["n_head"]
    # the variants' MHA is the heads sweep's point at the model's H: same shape, same study settings
    assert copied_points(config) == {"variants/mha": f"heads/h{n_head}"}
    assert len(plan(config).copied()) == len(config["variants"]["seeds"])
    # any difference in what `attnid train` would be told makes it a run of its own
    longer = yaml.safe_load((REPO / "config/config.yaml").read_text())
    longer["variants"]["max_iters"] += 1
    assert copied_points(longer) == {}
    without = yaml.safe_load((REPO / "config/config.yaml").read_text())
    without["heads"]["n_heads"] = [h for h in without["heads"]["n_heads"] if h != n_head]
    assert copied_points(without) == {}
    # two identical variants: the second reuses the first (config order)
    twice = yaml.safe_load((REPO / "config/config.yaml").read_text())
    twice["variants"]["points"]["gqa_full"] = {"n_kv_head": n_head}
    assert copied_points(twice)["variants/gqa_full"] == f"heads/h{n_head}"
    # a seed the earlier point does not train is trained, not copied from a run no job makes
    more = yaml.safe_load((REPO / "config/config.yaml").read_text())
    more["variants"]["seeds"] = [*more["heads"]["seeds"], 7]
    copies = plan(more).copied()
    assert f"{more['results_dir']}/studies/variants/mha/seed7" not in copies
    assert len(copies) == len(more["heads"]["seeds"])


def test_shapes_the_model_cannot_build_are_config_problems():
    config = smoke_config()
    config["heads"]["n_heads"] = [1, 3]
    config["variants"]["points"]["bad_gqa"] = {"n_kv_head": 3}
    problems = [f"{key}: {problem}" for key, problem in study_plan.check_study_config(config)]
    assert any(p.startswith("heads/h3: n_head 3 does not divide") for p in problems), problems
    assert any(p.startswith("variants/bad_gqa: n_kv_head=3 must divide") for p in problems), problems


# ---------------------------------------------------------------------------- synthetic study


def write_study_run(
    root,
    study,
    point,
    seed,
    arch: dict,
    val_loss: float,
    rho: float,
    n_params: int = 1000,
    status: str = "completed",
):
    """A synthetic run of a study point: synthetic_runs.write_run plus the architecture in run.json."""
    run_dir = write_run(
        root / study / point / f"seed{seed}",
        "adamw",
        seed,
        1e-3,
        rho_qk=rho,
        rho_ov=2 * rho,
        final_val_loss=val_loss,
        mu=0.1 * (seed + 1),
        status=status,
    )
    info = json.loads((run_dir / "run.json").read_text())
    info["config"].update({"n_layer": 2, "bias": False, **arch})
    info["n_params"] = n_params
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


HEADS = {"h1": 1, "h2": 2, "h4": 4, "h8": 8}
# val loss per point and seed: falls with H on seeds 0 and 1; seed 2 swaps h4 and h8
LOSSES = {"h1": (2.4, 2.5, 2.45), "h2": (2.3, 2.35, 2.3), "h4": (2.2, 2.25, 2.1), "h8": (2.1, 2.15, 2.15)}
VARIANTS = {
    "mha": {"n_head": 4},
    "gqa2": {"n_head": 4, "n_kv_head": 2},
    "mqa": {"n_head": 4, "n_kv_head": 1},
    "rope": {"n_head": 4, "rope": True},
}


@pytest.fixture()
def synthetic_study(tmp_path):
    root = tmp_path / "studies"
    for point, n_head in HEADS.items():
        for seed in range(3):
            write_study_run(
                root,
                "heads",
                point,
                seed,
                {"n_embd": 32, "n_head": n_head},
                LOSSES[point][seed],
                rho=0.1 / n_head,
                n_params=1000 + n_head,
            )
    for seed in range(3):
        write_study_run(
            root,
            "heads",
            "h1_e40",
            seed,
            {"n_embd": 40, "n_head": 1, "head_dim": 40},
            2.0 + seed / 10,
            rho=0.2,
        )
    for index, (point, arch) in enumerate(VARIANTS.items()):
        for seed in range(2):
            write_study_run(
                root,
                "variants",
                point,
                seed,
                {"n_embd": 32, **arch},
                2.0 - index / 10 + seed / 100,
                rho=0.01 * (index + 1),
                status="diverged" if (point, seed) == ("mqa", 1) else "completed",
            )
    return root


def test_gathering_summarizes_every_point_over_its_seeds(synthetic_study, tmp_path):
    out = tmp_path / "tables"
    assert main(["studies", "--studies-dir", str(synthetic_study), "--out-dir", str(out)]) == 0
    heads = pd.read_csv(out / "heads.csv").set_index("point")
    assert set(heads.index) == {*HEADS, "h1_e40"}
    for point, n_head in HEADS.items():
        row = heads.loc[point]
        assert row.identified_fraction == pytest.approx(counts.identified_fraction(32, n_head))
        assert row.identified_fraction == pytest.approx(1 - 1 / (2 * n_head))  # T3 for D = E/H
        assert row.final_val_loss_mean == pytest.approx(np.mean(LOSSES[point]))
        assert row.final_val_loss_sd == pytest.approx(np.std(LOSSES[point], ddof=1))
        assert row.rho_qk_mean_mean == pytest.approx(0.1 / n_head) and row.rho_ov_mean_mean == pytest.approx(
            0.2 / n_head
        )
        shape = counts.layer_shape(32, n_head)
        assert (
            row.attn_params == 2 * counts.attention_params_per_layer(shape) and row.n_params == 1000 + n_head
        )
        assert row.n_seeds == 3 and row.tokens_per_s_mean == pytest.approx(1000.0)
    assert heads.loc["h1_e40", "identified_fraction"] == pytest.approx(0.5)
    assert heads.loc["h1_e40", "n_embd"] == 40 and heads.loc["h1_e40", "label"] == "H=1"
    assert heads.loc["h1", "mu_qk_final_mean"] == pytest.approx(0.2)  # mu 0.1, 0.2, 0.3 over the seeds

    variants = pd.read_csv(out / "variants.csv").set_index("point")
    for point, arch in VARIANTS.items():
        expected = counts.identified_fraction(32, 4, arch.get("n_kv_head"), rope=arch.get("rope", False))
        assert variants.loc[point, "identified_fraction"] == pytest.approx(expected)
    assert variants.loc["gqa2", "identified_fraction"] == pytest.approx(
        1 - 2 * 2 * 8**2 / (32 * (32 + 16 + 16 + 32))
    )
    assert variants.loc["mqa", "n_diverged"] == 1  # counted, not averaged
    assert variants.loc["mqa", "final_val_loss_mean"] == pytest.approx(2.0 - 2 / 10)
    assert variants.loc["rope", "label"] == "H=4, RoPE" and variants.loc["mqa", "label"] == "H=4, MQA"
    for name in ("heads.tex", "variants.tex"):
        tex = (out / name).read_text()
        assert r"\label{tab:study-" in tex and "$r_s$" in tex and r"\footnotesize" in tex
    assert "h1\\_e40" in (out / "heads.tex").read_text()


def brute_force_permutation_p(x, y) -> float:
    """Twice the smaller share of the n! orderings of y with r_s at most / at least the observed one."""
    observed = stats.spearmanr(x, y).statistic
    null = np.array([stats.spearmanr(x, order).statistic for order in itertools.permutations(y)])
    return min(1.0, 2 * min(np.mean(null <= observed + 1e-12), np.mean(null >= observed - 1e-12)))


def seed_draw_range(x, per_seed: dict) -> tuple[float, float]:
    """The smallest and largest r_s(x, point means) over every multiset of seeds drawn with replacement.
    With 3 seeds each multiset has probability >= 1/27 > 2.5 %, so the 95 % percentile bootstrap CI is
    this range."""
    points = list(per_seed)
    n_seeds = len(per_seed[points[0]])
    values = [
        stats.spearmanr(x, [np.mean([per_seed[p][s] for s in draw]) for p in points]).statistic
        for draw in itertools.combinations_with_replacement(range(n_seeds), n_seeds)
    ]
    return min(values), max(values)


def test_rank_correlation_with_its_p_value_and_seed_bootstrap(synthetic_study, tmp_path):
    out = tmp_path / "tables"
    assert main(["studies", "--studies-dir", str(synthetic_study), "--out-dir", str(out)]) == 0
    table = pd.read_csv(out / "identification_correlation.csv")
    rows = table[table["quantity"] == "final_val_loss"].set_index(["study", "subset"])
    fractions = {p: 1 - 1 / (2 * h) for p, h in HEADS.items()} | {"h1_e40": 0.5}
    losses = LOSSES | {"h1_e40": (2.0, 2.1, 2.2)}
    x = [fractions[p] for p in losses]
    means = [np.mean(losses[p]) for p in losses]
    per_seed = [stats.spearmanr(x, [losses[p][s] for p in losses]).statistic for s in range(3)]
    row = rows.loc[("heads", "all points")]
    assert row.spearman_per_seed_mean == pytest.approx(np.mean(per_seed))
    assert (
        row.spearman_per_seed_sd == pytest.approx(np.std(per_seed, ddof=1)) and row.spearman_per_seed_sd > 0
    )
    assert row.spearman_of_means == pytest.approx(stats.spearmanr(x, means).statistic)
    assert row.n_seed_correlations == 3 and row.n_points == 5 and row.n_ci_seeds == 3
    assert row.p_value == pytest.approx(brute_force_permutation_p(x, means))  # 5! orderings, exact
    assert (row.ci_low, row.ci_high) == pytest.approx(seed_draw_range(x, losses))
    assert row.ci_low < row.ci_high

    sweep = rows.loc[("heads", "head sweep alone")]  # without the matched single head h1_e40
    sweep_x, sweep_means = [fractions[p] for p in HEADS], [np.mean(LOSSES[p]) for p in HEADS]
    assert sweep.n_points == len(HEADS)
    assert sweep.spearman_of_means == pytest.approx(-1.0)  # the means fall with H
    assert sweep.p_value == pytest.approx(2 / 24)
    assert sweep.p_value == pytest.approx(brute_force_permutation_p(sweep_x, sweep_means))
    assert (sweep.ci_low, sweep.ci_high) == pytest.approx(seed_draw_range(sweep_x, LOSSES))

    variants = rows.loc[("variants", "all points")]
    assert variants.n_seed_correlations == 2  # seed 1: three finished points (mqa diverged) still rank
    assert variants.n_ci_seeds == 1 and math.isnan(variants.ci_low)  # only seed 0 has every point: no CI
    assert set(table["study"]) == {"heads", "variants", "all"}
    # pooled, the variants' mha (the same 32-wide 4-head model, same steps) is heads' h4 and counts once
    pooled = rows.loc[("all", "all points")]
    assert pooled.n_points == len(HEADS) + 1 + len(VARIANTS) - 1
    # the confound splits of the pooled set: RoPE (one point) and the matched single head (one point) left out
    assert rows.loc[("all", "without RoPE")].n_points == pooled.n_points - 1
    assert rows.loc[("all", "without matched single head")].n_points == pooled.n_points - 1
    pooled_losses = {f"heads/{p}": np.mean(v) for p, v in losses.items()}
    pooled_losses |= {
        f"variants/{p}": 2.0 - i / 10 + (0.005 if p != "mqa" else 0.0)
        for i, p in enumerate(VARIANTS)
        if p != "mha"
    }
    pooled_x = {f"heads/{p}": f for p, f in fractions.items()}
    pooled_x |= {
        f"variants/{p}": counts.identified_fraction(32, 4, a.get("n_kv_head"), rope=a.get("rope", False))
        for p, a in VARIANTS.items()
        if p != "mha"
    }
    without_rope = [p for p in pooled_losses if p != "variants/rope"]
    expected = stats.spearmanr([pooled_x[p] for p in without_rope], [pooled_losses[p] for p in without_rope])
    assert rows.loc[("all", "without RoPE")].spearman_of_means == pytest.approx(expected.statistic)
    assert set(table["subset"]) == {
        "all points",
        "head sweep alone",
        "without RoPE",
        "without matched single head",
    }
    assert table["p_value"].between(0, 1, inclusive="right").all()

    tex = (out / "identification_correlation.tex").read_text()
    assert r"\label{tab:study-correlation}" in tex and "pooled, without RoPE" in tex
    assert "spread, not an uncertainty" in tex
    for study in ("heads", "variants"):  # the study tables point to it and label the seed sd as a spread
        text = (out / f"{study}.tex").read_text()
        assert r"Table~\ref{tab:study-correlation}" in text and "not an uncertainty" in text


def test_one_study_alone_gets_its_own_confound_split(synthetic_study, tmp_path):
    heads = studies.write_study_tables(
        {"heads": sorted((synthetic_study / "heads").glob("*/seed*"))}, tmp_path / "heads_only"
    )["correlation"]
    assert set(zip(heads["study"], heads["subset"])) == {
        ("heads", "all points"),
        ("heads", "head sweep alone"),
    }
    variant_runs = sorted((synthetic_study / "variants").glob("*/seed*"))
    variants = studies.write_study_tables({"variants": variant_runs}, tmp_path / "variants")["correlation"]
    assert set(zip(variants["study"], variants["subset"])) == {
        ("variants", "all points"),
        ("variants", "without RoPE"),
    }
    assert (variants.loc[variants["subset"] == "without RoPE", "n_points"] == len(VARIANTS) - 1).all()


def test_no_runs_is_one_line(tmp_path, capsys):
    assert main(["studies", "--out-dir", str(tmp_path)]) == 2
    assert main(["studies", "--studies-dir", str(tmp_path / "none"), "--out-dir", str(tmp_path)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("attnid studies: error: ") for line in errors)


# ---------------------------------------------------------------------------- figure 5 and the appendix


@pytest.mark.slow  # matplotlib layout, a few seconds
def test_figure_5_is_drawn_and_included_in_the_appendix(synthetic_study, tmp_path):
    tables = tmp_path / "tables"
    studies.write_study_tables(
        {s: sorted((synthetic_study / s).glob("*/seed*")) for s in studies.STUDIES}, tables
    )
    paths = figures.make_figure("fig5", Sources(tables=tables), tmp_path / "figs")
    assert sorted(p.name for p in paths) == ["fig5.pdf", "fig5.png", "fig5.rst"]
    assert all(p.stat().st_size > 5_000 for p in paths if p.suffix != ".rst")
    fig = fig5_identification_study.draw_identification_study(
        pd.read_csv(tables / "heads.csv"), pd.read_csv(tables / "variants.csv")
    )
    fraction_axis = fig.axes[0]
    curve = fraction_axis.get_lines()[0]
    h = curve.get_xdata()
    np.testing.assert_allclose(curve.get_ydata(), 1 - 1 / (2 * h))  # the closed form T3
    assert not invisible_legend_entries(fig) and not overlapping_labels(fig)
    assert figures.registry()["fig5"].stage == "studies"
    caption = appendix.figure_caption("fig5", tmp_path / "figs")
    assert caption["title"].startswith("does identification buy anything")


def test_appendix_includes_the_study_tables_when_present(tmp_path, synthetic_study):
    tables = tmp_path / "tables"
    studies.write_study_tables(
        {s: sorted((synthetic_study / s).glob("*/seed*")) for s in studies.STUDIES}, tables
    )
    text = appendix.render_appendix(
        *write_theory_tables(tmp_path), tmp_path / "paper" / "appendix.tex", experiment_tables=tables
    )
    assert r"\section{Does identification buy anything?}" in text
    assert r"\label{tab:study-heads}" in text and r"\label{tab:study-variants}" in text


@pytest.mark.parametrize(
    "values, gap",
    [
        ([0.5], 0.1),
        ([0.90, 0.91, 0.95, 0.953, 0.957], 0.02),
        ([0.1, 0.5, 0.9], 0.05),
        ([0.3, 0.3, 0.3], 0.01),
    ],
)
def test_figure_5_labels_are_spread_at_least_a_gap_apart_and_stay_near_their_points(values, gap):
    positions = fig5_identification_study.spread_positions(values, gap)
    assert len(positions) == len(values)
    assert all(b - a >= gap - 1e-12 for a, b in zip(positions, positions[1:]))  # order kept, no overlap
    assert sum(positions) == pytest.approx(sum(values))  # centred on the points
    if all(b - a >= gap for a, b in zip(values, values[1:])):
        assert positions == pytest.approx(values)  # labels that do not collide stay where their points are


def test_a_build_without_the_studies_never_shows_their_leftovers(tmp_path, synthetic_study, monkeypatch):
    """Study tables, Figure 5 and prune.tex of an earlier build sit in the folders; --omit leaves them out."""
    tables = tmp_path / "tables"
    studies.write_study_tables(
        {s: sorted((synthetic_study / s).glob("*/seed*")) for s in studies.STUDIES}, tables
    )
    (tables / "prune.tex").write_text("\\begin{table}PRUNE-LEFTOVER\\end{table}\n")
    figs = tmp_path / "figs"
    figs.mkdir()
    for i in range(1, 6):
        (figs / f"fig{i}.pdf").write_bytes(b"%PDF-1.4 /MediaBox [0 0 400 300]")
        caption = figures.fill_caption(figures.registry()[f"fig{i}"].caption_template, {})
        (figs / f"fig{i}.rst").write_text(caption, encoding="utf-8")
    out = tmp_path / "paper" / "appendix.tex"
    full = appendix.render_appendix(
        *write_theory_tables(tmp_path), out, experiment_tables=tables, figures=figs
    )
    assert "fig5.pdf" in full and r"\label{tab:study-heads}" in full and "PRUNE-LEFTOVER" in full
    lean = appendix.render_appendix(
        *write_theory_tables(tmp_path), out, experiment_tables=tables, figures=figs, omit=("studies", "edits")
    )
    for leftover in (
        "fig5.pdf",
        "tab:study-heads",
        "tab:study-variants",
        "Does identification buy anything",
        "PRUNE-LEFTOVER",
    ):
        assert leftover not in lean, leftover
    assert "fig4.pdf" in lean
    # the figures command: no Figure 5 from the leftover study tables with --no-studies
    (tables / "sweep.csv").write_text("optimizer\n")
    drawn = []
    # where `attnid figures` looks it up (imported at the top of attnid.cli.reports)
    monkeypatch.setattr(report_commands, "make_figure", lambda name, *args: drawn.append(name) or [])
    theory = write_theory_tables(tmp_path)[0].parent
    assert (
        main(
            [
                "figures",
                "--tables",
                str(tables),
                "--runs",
                "r",
                "--theory-dir",
                str(theory),
                "--out-dir",
                str(figs),
                "--no-studies",
            ]
        )
        == 0
    )
    assert drawn == ["fig1", "fig2", "fig3", "fig4"]
    drawn.clear()
    assert (
        main(
            [
                "figures",
                "--tables",
                str(tables),
                "--runs",
                "r",
                "--theory-dir",
                str(theory),
                "--out-dir",
                str(figs),
            ]
        )
        == 0
    )
    assert drawn == ["fig1", "fig2", "fig3", "fig4", "fig5"]


# ---------------------------------------------------------------------------- the rules


def test_smoke_plan_lists_one_training_job_per_point_and_seed(tmp_path):
    copy_pipeline(tmp_path)
    proc = run_snakemake(tmp_path, "-n", "-p")
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = smoke_config()
    expected = {
        f"{config['results_dir']}/studies/{study}/{point.name}/seed{seed}"
        for study, points in study_plan.study_points(config).items()
        for point in points
        for seed in config[study]["seeds"]
    }
    jobs = train_jobs(tmp_path, proc.stdout)
    planned = {run_dir for run_dir in jobs if "/studies/" in run_dir}
    planned_runs = plan(smoke_config())
    copied = planned_runs.copied()
    # and the alignment stage's own second seed of a heads point (alignment/pairs_from)
    own = {run_dir for run_dir in planned_runs.alignment_runs if "/studies/" in run_dir}
    assert copied and own and planned == (expected | own) - set(copied)
    for run_dir, source in copied.items():  # copied from the run it repeats
        assert re.search(
            rf"cp {re.escape(source)}/metrics.csv {re.escape(run_dir)}/metrics.csv.tmp", proc.stdout
        )
    rope_mqa = jobs[f"{config['results_dir']}/studies/variants/rope_mqa/seed0"]
    assert rope_mqa["case"] == "adamw" and rope_mqa["n_kv_head"] == 1 and rope_mqa["rope"] is True
    assert rope_mqa["max_iters"] == config["variants"]["max_iters"]
    assert rope_mqa["lr"] == config["cases"]["adamw"]["lr"]
    e0 = study_plan.matched_single_head_embd(
        config["model"]["n_embd"], config["heads"]["matched_reference_heads"]
    )
    matched = jobs[f"{config['results_dir']}/studies/heads/h1_e{e0}/seed0"]
    assert (matched["n_head"], matched["n_embd"], matched["head_dim"]) == (1, e0, e0)
    assert "attnid studies --heads-runs" in proc.stdout and "fig5.pdf" in proc.stdout


def test_the_stages_beyond_the_paper_are_optional(tmp_path):
    copy_pipeline(tmp_path)
    # null turns a section off from the command line (a config file may simply leave it out)
    proc = run_snakemake(tmp_path, "-n", "-p", config={"heads": "null", "variants": "null", "edits": "null"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for absent in (
        "rule train_study",
        "rule study_tables",
        "rule train_edits",
        "rule edits_table",
        "fig5.p",
        "attnid studies",
    ):
        assert absent not in proc.stdout, absent
    assert "rule train_case" in proc.stdout and "fig4.pdf" in proc.stdout and "rule appendix" in proc.stdout
    # one study alone: its own table, no reuse (the repeated point's source is not planned), Figure 5
    proc = run_snakemake(tmp_path, "-n", "-p", config={"heads": "null"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "attnid studies --variants-runs" in proc.stdout and "--heads-runs" not in proc.stdout
    assert (
        "rule reuse_study_run" not in proc.stdout
        and "variants.csv" in proc.stdout
        and "heads.csv" not in proc.stdout
    )
    assert "fig5.pdf" in proc.stdout


def test_bad_study_shape_is_a_one_line_config_error(tmp_path):
    copy_pipeline(tmp_path)
    config = smoke_config()
    config["heads"]["n_heads"] = [1, 3]
    (tmp_path / "config/mine.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    assert proc.returncode != 0
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("config error: heads/h3: n_head 3 does not divide"), (
        proc.stderr
    )


@pytest.mark.slow
@needs("latexmk", "siunitx.sty")
def test_study_tables_fit_the_page(tmp_path):
    """The widest cells a study table gets (ρ in scientific notation, a long shape, millions of
    parameters) compile at 9 pt with no box more than 5 pt too wide."""
    arches = {
        "h16": {"n_embd": 128, "n_head": 16},
        "h1_e170": {"n_embd": 170, "n_head": 1, "head_dim": 170},
        "rope_gqa2": {"n_embd": 128, "n_head": 4, "n_kv_head": 2, "rope": True},
    }
    for point, arch in arches.items():
        for seed in range(3):
            write_study_run(
                tmp_path / "studies",
                "variants",
                point,
                seed,
                arch,
                2.0345 + 0.0123 * seed,
                rho=1.3e-9 * (seed + 1),
                n_params=12_345_678,
            )
    tables, paper = tmp_path / "tables", tmp_path / "paper"
    studies.write_study_tables({"variants": sorted((tmp_path / "studies/variants").glob("*/seed*"))}, tables)
    paper.mkdir()
    shutil.copy(REPO / "paper" / "main.tex", paper / "main.tex")
    text = appendix.render_appendix(
        *write_theory_tables(tmp_path), paper / "appendix.tex", experiment_tables=tables
    )
    (paper / "appendix.tex").write_text(text)
    appendix.compile_pdf(paper / "main.tex")
    log = (paper / "main.log").read_text(errors="replace")
    widths = [float(w) for w in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert not widths or max(widths) <= 5.0, re.findall(r"Overfull.*", log)
    assert r"\tiny" not in text and r"\scriptsize" not in text and r"\resizebox" not in text
