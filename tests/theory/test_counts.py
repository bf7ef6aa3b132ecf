"""Closed-form counts (claims T1-T6): exact values, property tests, the architectures file, the CLI."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import tomllib
from fractions import Fraction

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnid.cli import main
from attnid.cli.theory import load_architectures
from attnid.theory import architectures, counts, nullity

REQUIRED_ARCHITECTURES = {
    "nanoGPT shakespeare-char",
    "GPT-2 124M",
    "GPT-2 355M",
    "GPT-2 774M",
    "GPT-2 1.5B",
    "Llama-2 7B",
    "Llama-2 13B",
    "Llama-2 70B",
    "Llama-3 8B",
    "Llama-3 70B",
    "Mistral-7B",
}
REQUIRED_COLUMNS = {
    "architecture",
    "n_layer",
    "n_embd",
    "n_head",
    "n_kv_head",
    "head_dim",
    "rope",
    "bias",
    "attn_weights_per_layer",
    "unidentified_qk_per_layer",
    "unidentified_ov_per_layer",
    "unidentified_bias_per_layer",
    "identified_fraction",
    "unidentified_per_layer",
    "total_attn_params",
    "total_unidentified",
    "qk_if_mha_per_layer",
    "qk_with_gqa_only_per_layer",
}


def _exact_unidentified_share(shape: counts.LayerShape) -> Fraction:
    return Fraction(counts.unidentified_params_per_layer(shape), counts.attention_params_per_layer(shape))


@pytest.mark.parametrize("n_head", [1, 2, 3, 4, 8, 12, 16, 25, 64])
def test_t3_identified_share_is_one_minus_one_over_2h(n_head):
    shape = counts.layer_shape(n_embd=64 * n_head, n_head=n_head)
    assert counts.attention_weights_per_layer(shape) == 4 * shape.n_embd**2
    assert _exact_unidentified_share(shape) == Fraction(1, 2 * n_head)
    assert counts.identified_fraction(64 * n_head, n_head) == pytest.approx(1 - 1 / (2 * n_head), abs=1e-15)


def test_t3_eight_heads_is_fifteen_sixteenths_and_one_head_is_half():
    assert 1 - _exact_unidentified_share(counts.layer_shape(512, 8)) == Fraction(15, 16)
    assert 1 - _exact_unidentified_share(counts.layer_shape(512, 1)) == Fraction(1, 2)


def test_t5_llama2_70b_gqa_query_key_count():
    spec = load_architectures()["Llama-2 70B"]
    row = architectures.architecture_row("Llama-2 70B", spec)
    assert row["qk_with_gqa_only_per_layer"] == 131_072
    assert row["qk_if_mha_per_layer"] == 1_048_576
    # RoPE shrinks it further, to D per KV group (Prop. 4.8).
    assert row["unidentified_qk_per_layer"] == spec["n_kv_head"] * 128 == 1_024


def test_t4_bias_counts_for_nanogpt_layer_with_biases():
    shape = counts.layer_shape(12, 3, bias=True)
    assert counts.attention_params_per_layer(shape) == 624
    assert counts.unidentified_params_per_layer(shape) == 2 * 3 * 16 + 3 * 4 + 3 * 4 == 120
    # Without an output bias the value biases are identified (H C = E), with RoPE the key biases are.
    assert counts.unidentified_value_bias_params(counts.layer_shape(12, 3, bias=True, out_bias=False)) == 0
    assert counts.unidentified_key_bias_params(counts.layer_shape(12, 3, bias=True, rope=True)) == 0


def test_factor_pair_nullity_small_cases_by_hand():
    assert counts.factor_pair_nullity(3, 5, 5) == 9  # D^2 when D <= n
    assert counts.factor_pair_nullity(4, 4, 4) == 16
    assert counts.factor_pair_nullity(5, 3, 3) == 5 * 6 - 9  # products fill all 3 x 3 matrices


small = st.integers(min_value=1, max_value=6)


@st.composite
def shapes(draw, max_embd=512):
    n_kv_head = draw(st.integers(1, 8))
    n_head = n_kv_head * draw(st.integers(1, 4))
    n_embd = draw(st.integers(2, max_embd))
    rope = draw(st.booleans())
    head_dim = draw(st.integers(1, n_embd // 2) if rope else st.integers(1, n_embd)) * (2 if rope else 1)
    head_dim = min(head_dim, n_embd - n_embd % 2) if rope else head_dim
    value_dim = draw(st.integers(1, n_embd))
    bias, out_bias = draw(st.booleans()), draw(st.booleans())
    return counts.layer_shape(n_embd, n_head, n_kv_head, head_dim, value_dim, rope, bias, out_bias)


@given(shapes())
@settings(max_examples=200, deadline=None, derandomize=True)
def test_counts_properties_over_random_shapes(shape):
    params = counts.attention_params_per_layer(shape)
    unidentified = counts.unidentified_params_per_layer(shape)
    assert 0 < unidentified < params
    row = counts.layer_counts(shape)
    assert row["unidentified_per_layer"] == (
        row["unidentified_qk_per_layer"]
        + row["unidentified_ov_per_layer"]
        + row["unidentified_bias_per_layer"]
    )
    # GQA divides the plain-MHA query-key count by H/G; RoPE replaces D^2 by D.
    heads_per_group = shape.n_head // shape.n_kv_head
    assert row["qk_if_mha_per_layer"] == heads_per_group * row["qk_with_gqa_only_per_layer"]
    if shape.rope:
        assert row["unidentified_qk_per_layer"] * shape.head_dim == row["qk_with_gqa_only_per_layer"]
    else:
        assert (
            row["unidentified_qk_per_layer"]
            == row["qk_with_gqa_only_per_layer"]
            == shape.n_kv_head * shape.head_dim**2
        )
    assert row["unidentified_ov_per_layer"] == shape.n_kv_head * shape.value_dim**2
    assert 0 < row["identified_fraction"] < 1


@given(n_head=st.integers(1, 64), head_dim=st.integers(1, 128))
@settings(max_examples=100, deadline=None, derandomize=True)
def test_identified_fraction_mha_closed_form_over_random_shapes(n_head, head_dim):
    shape = counts.layer_shape(n_head * head_dim, n_head)
    assert 1 - _exact_unidentified_share(shape) == 1 - Fraction(1, 2 * n_head)


@st.composite
def tiny_cases(draw):
    n_kv_head = draw(st.integers(1, 2))
    n_head = n_kv_head * draw(st.integers(1, 2))
    n_embd = draw(st.integers(2, 7))
    rope = draw(st.sampled_from([None, "interleaved", "half"]))
    head_dim = 2 * draw(st.integers(1, n_embd // 2)) if rope else draw(st.integers(1, n_embd))
    value_dim = draw(st.integers(1, n_embd))
    bias, out_bias = draw(st.booleans()), draw(st.booleans())
    return nullity.nullity_case(
        "hypothesis",
        "random",
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=n_kv_head,
        head_dim=head_dim,
        value_dim=value_dim,
        rope=rope,
        bias=bias,
        out_bias=out_bias,
    )


@given(tiny_cases())
@settings(max_examples=12, deadline=None, derandomize=True)
def test_closed_form_equals_jacobian_nullity_on_random_small_shapes(case):
    row = nullity.measure_case(case)
    assert row["measured"] == row["theory"], row
    assert row["gap"] >= nullity.GAP_REQUIRED, row


def _multi_head_identified(n_embd: int, n_head: int) -> int:
    shape = counts.layer_shape(n_embd, n_head)
    return counts.attention_params_per_layer(shape) - counts.unidentified_params_per_layer(shape)


@pytest.mark.parametrize("n_head", [1, 2, 3, 4, 8, 12, 16, 25, 64])
def test_t6_single_head_readings_are_exact(n_head):
    """§4.10 with the paper's single head (3 E_0^2 parameters, E_0^2 unidentified), in exact fractions."""
    n_embd = 64 * n_head
    multi = Fraction(_multi_head_identified(n_embd, n_head), n_embd**2)  # 4 - 2/H, from the layer counts
    assert counts.multi_head_identified_share(n_head) == multi
    # The single head's identified share per E_0^2, from its own counts (E_0 = 5 is any width).
    single = Fraction(counts.single_head_params(5) - counts.single_head_unidentified_params(5), 5**2)
    assert single == 2 and Fraction(counts.single_head_params(5), 5**2) == 3
    equal_identified = counts.single_head_ratio_sq_equal_identified(n_head)
    assert single * equal_identified == multi
    # The paper's "roughly 60 %" reading: half of the 3 E_0^2 counted as identified.
    half_identified = counts.single_head_ratio_sq_half_identified(n_head)
    assert Fraction(counts.single_head_params(5), 2 * 5**2) * half_identified == multi
    row = counts.single_head_row(n_embd, n_head)
    assert row["identified_multi_head"] == _multi_head_identified(n_embd, n_head)
    assert row["params_multi_head"] == counts.attention_weights_per_layer(counts.layer_shape(n_embd, n_head))
    assert row["e0_ratio_equal_identified"] ** 2 == pytest.approx(float(equal_identified), rel=1e-14)
    assert row["e0_equal_identified"] == pytest.approx(n_embd * row["e0_ratio_equal_identified"], rel=1e-14)
    assert row["e0_ratio_half_identified"] ** 2 == pytest.approx(float(half_identified), rel=1e-14)
    assert row["e0_half_identified"] == pytest.approx(n_embd * row["e0_ratio_half_identified"], rel=1e-14)
    for reading, ratio_sq in (("equal_identified", equal_identified), ("half_identified", half_identified)):
        params_ratio = (
            Fraction(counts.single_head_params(1), 1)
            * ratio_sq
            / Fraction(counts.attention_weights_per_layer(counts.layer_shape(n_embd, n_head)), n_embd**2)
        )
        assert row[f"param_ratio_{reading}"] == pytest.approx(float(params_ratio), rel=1e-14)


def test_t6_single_head_matching_at_twelve_heads():
    # Equal identified counts: E_0/E = sqrt(23/12) = 1.384, parameters 3 E_0^2 / 4 E^2 = 23/16.
    row = counts.single_head_row(768, 12)
    assert round(row["e0_ratio_equal_identified"], 3) == 1.384
    assert row["param_ratio_equal_identified"] == float(Fraction(3, 4) * (2 - Fraction(1, 12)))
    assert round(row["param_ratio_equal_identified"], 2) == 1.44
    # The reading behind the paper's "roughly 60 % larger": 1.5 E_0^2 = (4 - 2/12) E^2.
    assert round(row["e0_ratio_half_identified"], 3) == 1.599
    assert row["e0_ratio_half_identified"] == pytest.approx(math.sqrt((4 - 2 / 12) / 1.5), rel=1e-14)
    # E=1600, H=25: sqrt(2 - 1/25) = 7/5, so E_0 = 2240 is whole and its counts are integers.
    assert counts.single_head_match_equal_identified(1600, 25) == pytest.approx(2240, rel=1e-15)
    e0 = 2240
    single_identified = counts.single_head_params(e0) - counts.single_head_unidentified_params(e0)
    assert single_identified == _multi_head_identified(1600, 25)
    # No single head of the same embedding matches a multi-head layer (T6); one head is its own match.
    for n_head in (2, 4, 12, 64):
        assert counts.single_head_match_equal_identified(768, n_head) > 768 * 1.2
    assert counts.single_head_match_equal_identified(768, 1) == pytest.approx(768)
    # The stated matching stays below sqrt(2) E for every H: it can never give 60 %.
    assert all(counts.single_head_ratio_sq_equal_identified(h) < 2 for h in range(1, 1000))


def test_t6_single_head_unidentified_count_is_the_jacobian_nullity():
    case = next(c for c in nullity.default_cases() if c.kind == "single_head")
    row = nullity.measure_case(case)
    assert row["n_params"] == counts.single_head_params(case.attention.n_embd)
    assert (
        row["measured"]
        == row["theory"]
        == counts.single_head_unidentified_params(case.attention.n_embd)
        == case.attention.n_embd**2
    )
    assert row["gap"] >= nullity.GAP_REQUIRED


def test_architectures_file_has_required_models_with_sources():
    published = load_architectures()
    assert REQUIRED_ARCHITECTURES <= set(published)
    assert len(published) >= 12
    assert any(
        s.get("rope") and s.get("bias") and s.get("n_kv_head", s["n_head"]) < s["n_head"]
        for s in published.values()
    ), "need one with biases + RoPE + GQA"
    for name, spec in published.items():
        assert len(spec["source"]) > 10, name


def test_counts_cli_writes_csv(tmp_path):
    out, single = tmp_path / "t" / "counts.csv", tmp_path / "t" / "single_head.csv"
    assert (
        main(
            [
                "counts",
                "--out",
                str(out),
                "--single-head-out",
                str(single),
            ]
        )
        == 0
    )
    frame = pd.read_csv(out)
    assert REQUIRED_COLUMNS <= set(frame.columns)
    assert set(out.read_text().split("\n")[1].split(",")) & {"True", "False"}
    gpt2 = frame.set_index("architecture").loc["GPT-2 124M"]
    assert gpt2["total_attn_params"] == 12 * (4 * 768**2 + 4 * 768)
    assert gpt2["total_unidentified"] == 12 * gpt2["unidentified_per_layer"]
    assert math.isclose(
        gpt2["identified_fraction"], 1 - gpt2["unidentified_per_layer"] / gpt2["attn_params_per_layer"]
    )
    assert {
        "e0_equal_identified",
        "param_ratio_equal_identified",
        "e0_half_identified",
        "param_ratio_half_identified",
    } <= set(pd.read_csv(single).columns)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("architectures: {}\n", "non-empty"),
        ("architectures:\n  x: {n_layer: 1, n_embd: 10, n_head: 3, source: s}\n", "multiple of n_head"),
        (
            "architectures:\n  x: {n_layer: 1, n_embd: 8, n_head: 2, rope: maybe, source: s}\n",
            "true or false",
        ),
        ("architectures:\n  x: {n_layer: 1, n_embd: 8, n_head: 2, heads: 3, source: s}\n", "unknown field"),
        ("architectures: [\n", "not valid YAML"),
    ],
)
def test_counts_cli_bad_config_is_one_line_error(tmp_path, capsys, text, fragment):
    config = tmp_path / "arch.yaml"
    config.write_text(text)
    assert main(["counts", "--architectures", str(config), "--out", str(tmp_path / "c.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err
    assert not (tmp_path / "c.csv").exists()


def test_counts_cli_missing_file(tmp_path, capsys):
    assert (
        main(["counts", "--architectures", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "c.csv")])
        == 2
    )
    assert "not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The architectures file is package data; --csv and --json (issue 27 item 8)


def test_architectures_file_is_package_data_and_has_one_copy(repo_root):
    """The published shapes ship inside the package (pyproject's package-data), and nowhere else in the
    checkout: the workflow reads the package's file."""
    assert architectures.PACKAGED_ARCHITECTURES.is_file()
    assert architectures.PACKAGED_ARCHITECTURES.parent == repo_root / "src" / "attnid" / "theory"
    patterns = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = repo_root / "src" / "attnid"
    assert architectures.PACKAGED_ARCHITECTURES in {
        path for glob in patterns["attnid"] for path in package.glob(glob)
    }
    copies = [
        p for p in repo_root.rglob("architectures.yaml") if ".git" not in p.parts and "results" not in p.parts
    ]
    assert copies == [architectures.PACKAGED_ARCHITECTURES]
    assert "PACKAGED_ARCHITECTURES" in (repo_root / "workflow" / "rules" / "theory.smk").read_text()


def _attnid(args: list[str], cwd, repo_root) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo_root / "src")}
    return subprocess.run(
        [sys.executable, "-m", "attnid", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_counts_runs_outside_the_repository(tmp_path, repo_root):
    """From a directory that is not a checkout, ``attnid counts`` finds the published shapes, prints them
    (as text, CSV or JSON) and writes nothing there."""
    text = _attnid(["counts"], tmp_path, repo_root)
    assert text.returncode == 0, text.stderr
    assert "GPT-2 124M" in text.stdout and "unidentified" in text.stdout
    as_csv = _attnid(["counts", "--csv"], tmp_path, repo_root)
    assert as_csv.returncode == 0, as_csv.stderr
    from io import StringIO

    frame = pd.read_csv(StringIO(as_csv.stdout)).set_index("architecture")
    assert REQUIRED_ARCHITECTURES <= set(frame.index)
    assert frame.loc["GPT-2 124M", "total_attn_params"] == 12 * (4 * 768**2 + 4 * 768)
    assert list(tmp_path.iterdir()) == []


def test_counts_csv_and_json_agree_with_the_table(tmp_path, capsys):
    expected = architectures.counts_table(load_architectures()).set_index("architecture")
    assert main(["counts", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["architectures"]
    assert set(printed) == set(expected.index)
    for name, row in printed.items():
        assert row["total_unidentified"] == expected.loc[name, "total_unidentified"]
        assert row["identified_fraction"] == expected.loc[name, "identified_fraction"]  # every digit
        assert row["rope"] is bool(expected.loc[name, "rope"])
    # to files: CSV and JSON at once, and the JSON file may be rewritten by the next run
    out_csv, out_json = tmp_path / "c.csv", tmp_path / "c.json"
    for _ in range(2):
        assert main(["counts", "--csv", str(out_csv), "--json", str(out_json)]) == 0
    assert "attention params" in capsys.readouterr().out  # standard output free: the text table
    assert json.loads(out_json.read_text())["architectures"] == printed
    frame = pd.read_csv(out_csv).set_index("architecture")
    assert (frame["total_unidentified"] == expected["total_unidentified"]).all()


def test_counts_json_of_a_hugging_face_config_has_its_whole_model(tmp_path, capsys):
    config = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "n_positions": 1024,
        "vocab_size": 50257,
        "layer_norm_epsilon": 1e-5,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["counts", "--hf-config", str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["architectures"].values()
    spec = load_architectures()["GPT-2 124M"]
    assert (
        row["whole_unidentified"] == architectures.whole_model_row("GPT-2 124M", spec)["whole_unidentified"]
    )


def test_counts_refuses_both_tables_on_standard_output(capsys):
    assert main(["counts", "--csv", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "standard output" in err


def test_counts_json_file_is_held_to_the_output_rule(tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}\n')
    assert main(["counts", "--json", str(notes)]) == 2
    assert "--force" in capsys.readouterr().err and notes.read_text() == '{"mine": 1}\n'


def test_theory_reads_no_files():
    """theory/ is pure functions (docs/design.md): no module of it opens, reads or lists a file."""
    theory_dir = os.path.join(os.path.dirname(counts.__file__))
    forbidden = {"open", "read_text", "read_bytes", "iterdir", "glob", "rglob", "exists", "is_file", "is_dir"}
    for name in sorted(os.listdir(theory_dir)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(theory_dir, name), encoding="utf-8").read())
        for node in ast.walk(tree):
            called = node.func if isinstance(node, ast.Call) else None
            attribute = getattr(called, "attr", None) or getattr(called, "id", None)
            assert attribute not in forbidden, f"theory/{name}:{node.lineno} calls {attribute}"
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"json", "yaml", "attnid.common.files", "attnid.common.hf_config_file"}, name
