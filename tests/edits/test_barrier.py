"""``attnid barrier`` and ``attnid alignment-table`` (docs/design.md §18) on tiny nanoGPT checkpoints: a
planted orbit element has no barrier once every class is aligned and both ends are the same point; the table
recomputes its numbers from the per-pair reports; bad input is one line; the loss line is what the held-out
evaluation gives for the interpolated parameters."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from alignment_models import plant_orbit_element as _plant
from alignment_models import save_model as _save
from hypothesis import given, settings
from hypothesis import strategies as st

from attnid.cli import main
from attnid.edits.barrier import LineEvaluator, as_checkpoint, interpolate
from attnid.edits.checkpoints import load_checkpoint
from attnid.edits.heldout import evaluate, load_for_eval
from attnid.edits.whole_checkpoint import read_whole_checkpoint
from attnid.measure.line import barrier_height, chord_gap
from attnid.reports.alignment_table import (
    TABLE_GROUPS,
    alignment_claim_values,
    planted_claim_values,
    write_alignment_tables,
)
from attnid.reports.claims import PLANTED_CLAIMS, claims_table

POINTS = 5


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("barrier")
    a = _save(root / "a.pt", 0)
    _plant(a, root / "planted.pt", 11)
    other = _save(root / "other.pt", 1)
    out = {}
    for name, b, group in (("planted", root / "planted.pt", "adamw"), ("other", other, "sgd")):
        path = root / "alignment" / "cases" / group / f"seed0-seed{1 if name == 'other' else 2}.json"
        command = [
            "barrier",
            str(a),
            str(b),
            "--points",
            str(POINTS),
            "--sequences",
            "4",
            "--json",
            str(path),
        ]
        assert main(command) == 0
        out[name] = path
    out["root"], out["a"], out["other_ckpt"] = root, a, other
    return out


def test_a_planted_orbit_element_has_no_barrier_once_aligned(reports) -> None:
    report = json.loads(reports["planted"].read_text())
    levels = report["levels"]
    assert report["command"] == "barrier" and report["t"] == [i / (POINTS - 1) for i in range(POINTS)]
    assert levels["all"]["barrier"] <= 1e-4
    assert abs(levels["all"]["loss"][-1] - levels["all"]["loss"][0]) <= 1e-5  # the aligned ends: one point
    assert report["alignment"]["relative_distance_after"] <= 1e-6
    assert report["alignment"]["exact_max_abs_dlogp"] <= 1e-10
    # B and B aligned are one function: the line's far end has B's loss at every level
    assert report["endpoint_loss_change"] <= 1e-5
    functional = report["alignment"]["functional"]
    assert functional["kl_before"] <= 1e-6 and functional["kl_change"] <= 1e-6  # g.A is A's function


def test_the_barrier_is_the_largest_loss_above_the_chord(reports) -> None:
    report = json.loads(reports["other"].read_text())
    for level in report["levels"].values():
        losses = level["loss"]
        above = [loss - ((1 - t) * losses[0] + t * losses[-1]) for t, loss in zip(report["t"], losses)]
        assert level["barrier"] == pytest.approx(max(0.0, *above), abs=1e-12)
    functional = report["alignment"]["functional"]
    assert functional["kl_before"] > 1e-4  # two seeds: two functions
    assert functional["kl_change"] <= 1e-5 * functional["kl_before"] + 1e-9  # alignment keeps B's function


def test_the_line_is_the_held_out_loss_of_the_interpolated_parameters(reports) -> None:
    a, b = load_checkpoint(reports["a"]), load_checkpoint(reports["other_ckpt"])
    whole_a, whole_b = read_whole_checkpoint(a), read_whole_checkpoint(b)
    middle = interpolate(whole_a, whole_b, 0.5)
    for name, tensor in middle.params.items():
        assert torch.allclose(tensor, (whole_a.params[name] + whole_b.params[name]) / 2)
    assert any(".ln_" in name for name in middle.params)  # the norm gains are on the line too
    batch = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(0))
    evaluator = LineEvaluator(b, batch)
    # A's weights written into B's format are A: its tied head too, as A loads from its own file
    assert evaluator(whole_a)[0] == pytest.approx(evaluate(load_for_eval(a), batch)[0], abs=1e-6)
    for point in (middle, whole_a, middle):  # one model, its weights replaced: no state left behind
        loss, logits = evaluator(point)
        expected, expected_logits = evaluate(load_for_eval(as_checkpoint(b, point)), batch)
        assert loss == expected and torch.equal(logits, expected_logits)


def test_the_table_recomputes_every_number_from_the_reports(reports, tmp_path) -> None:
    rows = write_alignment_tables([reports["planted"], reports["other"]], tmp_path)
    written = pd.read_csv(tmp_path / "alignment.csv")
    line = pd.read_csv(tmp_path / "alignment_line.csv")
    assert len(written) == len(rows) and (tmp_path / "alignment.tex").read_text().count("tab:alignment") == 1
    for path in (reports["planted"], reports["other"]):
        report = json.loads(path.read_text())
        group, pair = path.parent.name, path.stem
        mine = written[(written["group"] == group) & (written["pair"] == pair)].set_index("class")
        before = report["alignment"]["distance_before"]
        assert mine.loc["none", "distance"] == pytest.approx(
            math.sqrt(sum(before[g] ** 2 for g in TABLE_GROUPS))
        )
        after = report["alignment"]["distance_after"]["total"]
        steps = [s["class"] for s in report["alignment"]["steps"]]
        assert mine.loc[steps, "share_removed"].sum() == pytest.approx(1 - after**2 / before["total"] ** 2)
        for level, row in (("none", "none"), ("discrete", "heads+mlp"), ("all", steps[-1])):
            losses = line[(line["group"] == group) & (line["pair"] == pair) & (line["level"] == level)]
            expected = max(0.0, *(losses["loss"] - ((1 - losses["t"]) * losses["loss"].iloc[0]
                                                     + losses["t"] * losses["loss"].iloc[-1])))  # fmt: skip
            assert mine.loc[row, "barrier"] == pytest.approx(expected, abs=1e-12)
        products = report["alignment"]["identified_products"]
        assert mine.loc[steps[-1], "product_distance"] == pytest.approx(
            math.hypot(products["qk"], products["ov"])
        )
    exact, _ = alignment_claim_values(written)["exact"]
    assert exact == max(json.loads(p.read_text())["alignment"]["exact_max_abs_dlogp"] for p in
                        (reports["planted"], reports["other"]))  # fmt: skip


def test_the_table_command_and_the_claim(reports, tmp_path, capsys) -> None:
    out = tmp_path / "tables"
    assert (
        main(
            [
                "alignment-table",
                "--json",
                str(reports["planted"]),
                str(reports["other"]),
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    assert "2 pairs" in capsys.readouterr().out
    assert main(["alignment-table", "--json", str(reports["a"]), "--out-dir", str(out)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("points", ["1", "0", "100000"])
def test_bad_points_are_one_line(reports, capsys, points) -> None:
    out = reports["root"] / "never.json"
    assert (
        main(
            ["barrier", str(reports["a"]), str(reports["other_ckpt"]), "--points", points, "--json", str(out)]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--points" in err and not out.exists()


def test_a_pair_of_other_shapes_is_one_line(reports, tmp_path, capsys) -> None:
    narrow = _save(tmp_path / "narrow.pt", 2, n_head=2, bias=False)
    assert main(["barrier", str(reports["a"]), str(narrow)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "differ" in err


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=12),
    st.floats(-5, 5, allow_nan=False),
    st.floats(-5, 5, allow_nan=False),
)
def test_a_barrier_is_unchanged_by_adding_a_line_to_the_loss(losses, offset, slope) -> None:
    ts = [i / (len(losses) - 1) for i in range(len(losses))]
    tilted = [loss + offset + slope * t for t, loss in zip(ts, losses)]
    assert barrier_height(ts, tilted) == pytest.approx(barrier_height(ts, losses), abs=1e-9)
    assert barrier_height(ts, losses) >= 0 and chord_gap(ts, losses)[0] == 0


def test_a_planted_element_of_every_class_gives_two_passing_checks(tmp_path, capsys) -> None:
    """The alignment stage's SmolLM2 step, on a tiny model: ``attnid plant`` (the stream's classes
    included), ``attnid barrier`` with its default classes (all), and the two claims read from its
    report; with the per-head classes alone the stream's are not moved back and the distance check fails."""
    a = _save(tmp_path / "a.pt", 0)
    assert main(["plant", str(a), "--out", str(tmp_path / "g.pt"), "--seed", "3"]) == 0
    reports = {}
    for name, extra in (("all", []), ("per_head", ["--classes", "heads,mlp,ov,qk"])):
        path = tmp_path / f"{name}.json"
        argv = [
            "barrier",
            str(a),
            str(tmp_path / "g.pt"),
            "--points",
            "3",
            "--sequences",
            "2",
            "--length",
            "8",
        ]
        assert main([*argv, *extra, "--json", str(path)]) == 0
        reports[name] = json.loads(path.read_text())
    capsys.readouterr()
    assert reports["all"]["levels"]["discrete"]["classes"] == ["stream", "heads", "mlp"]
    assert reports["all"]["levels"]["all"]["classes"][:2] == ["stream", "heads"]
    assert reports["per_head"]["levels"]["all"]["classes"] == ["heads", "mlp", "ov", "qk"]
    slopes = pd.DataFrame(columns=["optimizer", "quantity", "slope", "dtype"])
    claims = claims_table(pd.DataFrame(), slopes, planted=reports["all"])
    rows = claims[claims["claim"].isin([claim for _, claim, _ in PLANTED_CLAIMS])]
    assert list(rows["result"]) == ["pass", "pass"] and set(rows["kind"]) == {"check"}
    distance, _ = planted_claim_values(reports["all"])["distance"]
    assert distance == pytest.approx(reports["all"]["alignment"]["relative_distance_after"], rel=1e-9)
    assert planted_claim_values(reports["per_head"])["distance"][0] > 1e-3  # the stream left as planted
