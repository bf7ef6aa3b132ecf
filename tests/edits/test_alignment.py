"""``attnid align`` and ``attnid compare`` (docs/design.md §17) on tiny nanoGPT checkpoints: a planted
orbit element of every class is recovered; the moves keep the function in float64; aligning twice moves
nothing; the continuous classes remove at least what the permutations leave; mismatched shapes are one line.
"""

from __future__ import annotations

import json

import pytest
import torch
from alignment_models import plant_orbit_element as _plant
from alignment_models import save_model as _save
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnid.cli import main
from attnid.edits.alignment import (
    ALIGN_CLASSES,
    DEFAULT_CLASSES,
    EXACT_DLOGP,
    PER_HEAD_CLASSES,
    align_whole,
    distances,
    norm_of,
    probe_tokens,
)
from attnid.edits.alignment_classes import best_scale
from attnid.edits.checkpoints import load_checkpoint
from attnid.edits.quant_moves import exact_log_probs
from attnid.edits.whole_checkpoint import read_whole_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("align")
    a = _save(root / "a.pt", 0)
    _plant(a, root / "planted.pt", 7)
    return {
        "root": root,
        "a": a,
        "planted": root / "planted.pt",
        "other": _save(root / "other.pt", 1),
        "narrow": _save(root / "narrow.pt", 2, n_head=2, bias=False),
    }


def _whole(path):
    return read_whole_checkpoint(load_checkpoint(path))


def test_planted_orbit_element_is_recovered(models, capsys) -> None:
    out, report_path = models["root"] / "aligned.pt", models["root"] / "report.json"
    assert (
        main(
            ["align", str(models["a"]), str(models["planted"]), "--out", str(out), "--json", str(report_path)]
        )
        == 0
    )
    a, planted, aligned = _whole(models["a"]), _whole(models["planted"]), _whole(out)
    assert distances(a, planted)["total"] / norm_of(a) > 0.1  # the plant moved it
    assert distances(a, aligned)["total"] / norm_of(a) <= 1e-6
    report = json.loads(report_path.read_text())
    assert report["command"] == "align"
    # no --classes: every class a tied nanoGPT model has (but the stream rotation), GL(D) too
    assert report["classes"] == [c for c in DEFAULT_CLASSES if c != "stream_rotation"]
    assert [s["class"] for s in report["steps"]] == report["classes"]
    assert report["relative_distance_after"] <= 1e-6
    assert report["share_removed"] == pytest.approx(1.0, abs=1e-9)
    assert report["identified_products"]["qk"] <= 1e-6 and report["identified_products"]["ov"] <= 1e-6
    assert report["exact_max_abs_dlogp"] <= EXACT_DLOGP
    assert report["realign_relative_move"] <= 1e-6
    assert "wrote" in capsys.readouterr().out


def test_alignment_is_exact_and_idempotent(models) -> None:
    a, b = _whole(models["a"]), _whole(models["other"])
    aligned, report = align_whole(a, b, PER_HEAD_CLASSES)
    tokens = probe_tokens(b, 3)
    change = float((exact_log_probs(aligned, tokens) - exact_log_probs(b, tokens)).abs().max())
    assert change <= EXACT_DLOGP
    assert report["steps"][-1]["distance"]["total"] < report["distance_before"]["total"]
    again, _ = align_whole(a, aligned, PER_HEAD_CLASSES)
    assert distances(aligned, again)["total"] / norm_of(aligned) <= 1e-6


def test_the_stream_classes_keep_the_function_and_align_idempotently(models) -> None:
    """Two seeds of a tied nanoGPT model: ``all`` is every class but the stream rotation (tied); the
    stream's classes keep the float64 function, the gain scales never move away, and a second alignment
    moves nothing."""
    a, b = _whole(models["a"]), _whole(models["other"])
    classes = ("stream", "heads", "mlp", "ov", "qk", "norm_gain")
    aligned, report = align_whole(a, b, classes)
    assert report["exact_max_abs_dlogp"] <= EXACT_DLOGP
    assert report["steps"][0]["units_moved"] > 0  # two seeds: their streams' coordinates differ in order
    by_class = {s["class"]: s["distance"]["total"] for s in report["steps"]}
    assert by_class["norm_gain"] <= by_class["qk"] + 1e-12
    again, _ = align_whole(a, aligned, classes)
    assert distances(aligned, again)["total"] / norm_of(aligned) <= 1e-6
    _, every = align_whole(a, b, ALIGN_CLASSES)
    assert "stream_rotation" not in every["classes"] and every["classes"][0] == "stream"


def test_attnid_plant_moves_exactly_and_align_all_brings_it_back(models, capsys) -> None:
    """``attnid plant``: g of every class (the stream's included), written as A is; ``attnid align --classes
    all`` recovers it; a planted file never goes over its input."""
    root = models["root"]
    planted, aligned = root / "plant-cli.pt", root / "plant-cli-aligned.pt"
    assert main(["plant", str(models["a"]), "--out", str(planted), "--seed", "11"]) == 0
    out = capsys.readouterr().out
    assert "stream, heads, mlp, ov, qk, norm_gain" in out and "wrote" in out  # tied: no stream rotation
    a, b = _whole(models["a"]), _whole(planted)
    assert distances(a, b)["total"] / norm_of(a) > 0.1
    tokens = probe_tokens(a, 2)
    assert (
        float((exact_log_probs(a, tokens) - exact_log_probs(b, tokens)).abs().max()) <= 1e-5
    )  # float64 file
    assert main(["align", str(models["a"]), str(planted), "--classes", "all", "--out", str(aligned)]) == 0
    assert distances(a, _whole(aligned))["total"] / norm_of(a) <= 1e-6
    before = models["a"].read_bytes()
    assert main(["plant", str(models["a"]), "--out", str(models["a"])]) == 2
    assert models["a"].read_bytes() == before and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_every_class_removes_at_least_what_permutations_leave(models) -> None:
    a, b = _whole(models["a"]), _whole(models["other"])
    _, permutations = align_whole(a, b, ("heads", "mlp"))
    _, every = align_whole(a, b)  # every class the architecture has
    assert every["classes"] == [c for c in DEFAULT_CLASSES if c != "stream_rotation"]
    assert every["distance_after"]["total"] <= permutations["distance_after"]["total"] + 1e-12
    totals = [every["distance_before"]["total"]] + [s["distance"]["total"] for s in every["steps"]]
    assert all(later <= earlier + 1e-12 for earlier, later in zip(totals, totals[1:]))


def test_compare_writes_nothing(models, capsys) -> None:
    before = sorted(p.name for p in models["root"].iterdir())
    assert main(["compare", str(models["a"]), str(models["other"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["command"] == "compare" and set(report["distance_before"]) >= {"embedding", "mlp", "total"}
    assert sorted(p.name for p in models["root"].iterdir()) == before


def test_mismatched_shapes_are_one_line(models, capsys) -> None:
    out = models["root"] / "never.pt"
    assert main(["align", str(models["a"]), str(models["narrow"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "differ" in err
    assert not out.exists()


def test_unknown_class_is_refused(models, capsys) -> None:
    assert main(["compare", str(models["a"]), str(models["other"]), "--classes", "heads,nope"]) == 2
    assert "--classes" in capsys.readouterr().err


def test_gl_refinement_keeps_the_function_and_removes_more(models) -> None:
    a, b = _whole(models["a"]), _whole(models["other"])
    _, orthogonal = align_whole(a, b, PER_HEAD_CLASSES)
    refined, report = align_whole(a, b, ("heads", "mlp", "ov", "qk", "ov_gl", "qk_gl"))
    assert report["exact_max_abs_dlogp"] <= EXACT_DLOGP
    assert report["distance_after"]["total"] <= orthogonal["distance_after"]["total"] + 1e-12
    assert report["gl_tolerance"] is not None and report["steps"][-1]["gl_max_iterations"] >= 1


@pytest.mark.parametrize(
    "variant, note",
    [
        ({"rope": True}, "RoPE plane"),
        ({"n_kv_head": 2}, "key/value groups"),
        ({"rope": True, "n_kv_head": 1}, "1 key/value groups"),
    ],
    ids=["rope", "grouped-heads", "rope-mqa"],
)
def test_rope_and_grouped_heads_are_aligned_by_their_own_classes(tmp_path, capsys, variant, note) -> None:
    a = _save(tmp_path / "a.pt", 0, **variant)
    _plant(a, tmp_path / "planted.pt", 3)
    report_path = tmp_path / "report.json"
    argv = ["align", str(a), str(tmp_path / "planted.pt"), "--out", str(tmp_path / "out.pt")]
    assert main([*argv, "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["relative_distance_after"] <= 1e-6 and report["exact_max_abs_dlogp"] <= EXACT_DLOGP
    assert note in " ".join(report["notes"])
    assert distances(_whole(a), _whole(tmp_path / "out.pt"))["total"] / norm_of(_whole(a)) <= 1e-6


def test_a_move_that_changes_the_function_is_refused_naming_its_class(models, monkeypatch, capsys) -> None:
    def broken(whole, moves):  # W_V moved, W_O not: the function changes
        whole.params = {k: (v * 1.5 if k.endswith("attn.w_v") else v) for k, v in whole.params.items()}
        return whole

    monkeypatch.setattr("attnid.edits.alignment.move_value_output", broken)
    out = models["root"] / "refused.pt"
    assert main(["align", str(models["a"]), str(models["other"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "class ov" in err
    assert not out.exists()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-3, 3), min_size=4, max_size=4),
    st.lists(st.floats(-3, 3), min_size=4, max_size=4),
)
def test_a_gain_scale_is_the_best_on_a_fine_grid(gains, reader) -> None:
    """``norm_gain``'s closed form (the quartic's real roots and 1) is never beaten by any scale of a fine
    grid of both signs: per coordinate ``f(s) = ||g_A - g_B / s||^2 + ||W_A - s W_B||^2``. (With a zero
    gain, or zero reader columns, of B, ``f`` has only an infimum, at 0 or at infinity: ``align`` refuses
    a zero gain, and leaves such a coordinate at 1.)"""
    assume(abs(gains[1]) > 1e-3 and reader[2] ** 2 + reader[3] ** 2 > 1e-6)
    w_a = torch.tensor(reader[:2], dtype=torch.float64)[None, :].T  # two reader rows
    w_b = torch.tensor(reader[2:], dtype=torch.float64)[None, :].T
    g_a, g_b = torch.tensor([gains[0]], dtype=torch.float64), torch.tensor([gains[1]], dtype=torch.float64)
    alpha, beta = g_b.square(), g_a * g_b
    gamma, delta = w_b.square().sum(0), (w_a * w_b).sum(0)
    best = float(best_scale(alpha, beta, gamma, delta)[0])

    def f(s: torch.Tensor) -> torch.Tensor:  # (n,) scales -> (n,) values
        return (g_a - g_b / s).square() + (w_a - s[None, :] * w_b).square().sum(0)

    powers = 10 ** (torch.arange(-600, 601, dtype=torch.float64) / 200)
    grid = torch.cat([powers, -powers])
    value = float(f(torch.tensor([best], dtype=torch.float64))[0])
    assert value <= float(f(grid).min()) + 1e-9 * (1 + value)
    assert value <= float(f(torch.ones(1, dtype=torch.float64))[0]) + 1e-12
