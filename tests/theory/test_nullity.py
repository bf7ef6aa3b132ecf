"""Jacobian-nullity verification: the layer is faithful attention, every verify row passes,
and the measurement can tell the right closed form from plausible wrong ones."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attnid.cli import main
from attnid.theory import counts, nullity

NULLITY_COLUMNS = [
    "case",
    "kind",
    "n_embd",
    "n_head",
    "n_kv_head",
    "head_dim",
    "rope",
    "bias",
    "n_params",
    "theory",
    "measured",
    "gap",
    "passed",
]


def _random_params(case: nullity.NullityCase, seed: int = 0) -> dict[str, torch.Tensor]:
    shapes = nullity.parameter_shapes(case)
    generator = torch.Generator().manual_seed(seed)
    flat = torch.randn(sum(math.prod(s) for s in shapes.values()), generator=generator, dtype=torch.float64)
    return nullity.unflatten(flat / math.sqrt(case.attention.n_embd), shapes)


@pytest.mark.parametrize("n_head, bias", [(1, False), (3, True), (4, False)])
def test_attention_layer_matches_torch_causal_attention(n_head, bias):
    case = nullity.nullity_case("ref", "attention", n_embd=12, n_head=n_head, bias=bias)
    p, shape = _random_params(case), case.attention
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    ours = nullity.attention_layer(x, p, shape)
    e, d = 12, shape.head_dim
    # nanoGPT's CausalSelfAttention with c_attn = [W_Q; W_K; W_V], c_proj = W_O.
    qkv = torch.nn.functional.linear(
        x,
        torch.cat([p["w_q"], p["w_k"], p["w_v"]]),
        torch.cat([p["b_q"], p["b_k"], p["b_v"]]) if bias else None,
    )
    q, k, v = (t.view(2, 5, n_head, d).transpose(1, 2) for t in qkv.split(e, dim=2))
    y = (
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        .transpose(1, 2)
        .reshape(2, 5, e)
    )
    reference = torch.nn.functional.linear(y, p["w_o"], p["b_o"] if bias else None)
    torch.testing.assert_close(ours, reference)


def test_gqa_layer_equals_mha_with_repeated_keys_and_values():
    gqa = nullity.nullity_case("gqa", "gqa", n_embd=12, n_head=4, n_kv_head=2, head_dim=3)
    p = _random_params(gqa)
    mha = nullity.nullity_case("mha", "attention", n_embd=12, n_head=4, head_dim=3)
    repeated = dict(
        p,
        w_k=p["w_k"].view(2, 3, 12).repeat_interleave(2, dim=0).reshape(12, 12),
        w_v=p["w_v"].view(2, 3, 12).repeat_interleave(2, dim=0).reshape(12, 12),
    )
    x = torch.randn(3, 6, 12, dtype=torch.float64)
    torch.testing.assert_close(
        nullity.attention_layer(x, p, gqa.attention), nullity.attention_layer(x, repeated, mha.attention)
    )


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_scores_depend_only_on_relative_position(pairing):
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 7, 8)  # the same vector at every position
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 7, 8)
    rq, rk = nullity.rope_rotate(q, pairing, 10.0), nullity.rope_rotate(k, pairing, 10.0)
    scores = rq[0, 0] @ rk[0, 0].T  # (T, T)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    for offset in range(-6, 7):
        diagonal = torch.diagonal(scores, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 1)[0])


def test_half_split_is_interleaved_after_a_permutation():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    to_interleaved = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # half-split pairs (m, m+4) become (2m, 2m+1)
    torch.testing.assert_close(
        nullity.rope_rotate(x, "half", 10.0)[..., to_interleaved],
        nullity.rope_rotate(x[..., to_interleaved], "interleaved", 10.0),
    )


def test_rope_key_bias_is_identified_and_plain_key_bias_is_not():
    """T4 under RoPE: measured nullity sides with 'key bias identified', against the plain count."""
    case = nullity.nullity_case("rope+bias", "rope_bias", n_embd=8, n_head=2, rope="half", bias=True)
    row = nullity.measure_case(case)
    shape = case.attention
    key_bias_as_if_unidentified = row["theory"] + shape.n_kv_head * shape.head_dim
    assert row["measured"] == row["theory"] != key_bias_as_if_unidentified
    assert row["gap"] >= nullity.GAP_REQUIRED


def test_gqa_value_output_symmetry_is_per_group_not_per_head():
    case = nullity.nullity_case("gqa", "gqa", n_embd=8, n_head=4, n_kv_head=1, head_dim=2)
    row = nullity.measure_case(case)
    per_head_count = 4 * 2**2 + 1 * 2**2  # OV counted per head, QK per group
    assert row["measured"] == row["theory"] == 2 * 2**2 != per_head_count


def test_rank_gap_reported_and_too_few_rows_would_be_caught(monkeypatch):
    """With far too few input rows the rank cannot saturate: the check must then fail, not pass."""
    case = nullity.nullity_case("few rows", "attention", n_embd=8, n_head=2)
    monkeypatch.setattr(nullity, "ROW_FACTOR", 0.2)
    row = nullity.measure_case(case)
    assert row["measured"] > row["theory"] and not row["passed"]


@pytest.mark.slow
def test_verify_cli_every_case_passes(tmp_path, capsys):
    out = tmp_path / "theory" / "nullity.csv"
    assert main(["verify", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    table = pd.read_csv(out)
    assert list(table.columns[: len(NULLITY_COLUMNS)]) == NULLITY_COLUMNS or set(NULLITY_COLUMNS) <= set(
        table.columns
    )
    assert (
        table["passed"].all() and (table["theory"] == table["measured"]).all() and (table["gap"] >= 1e6).all()
    )
    assert err.count("\n") == len(table) + 1  # one progress line per case, one summary
    # Required cases.
    pairs = table[table.kind == "pair"]
    assert {"<", "="} <= {
        ("<" if d < e else "=" if d == e else ">") for d, e in zip(pairs.head_dim, pairs.n_embd)
    }
    plain = table[(table.kind == "attention") & ~table.bias & ~table.rope & (table.n_kv_head == table.n_head)]
    assert {1, 2, 3, 4} <= set(plain.n_head)
    for _, row in plain.iterrows():
        assert row.head_dim * row.n_head == row.n_embd
        assert 1 - row.measured / row.n_params == pytest.approx(1 - 1 / (2 * row.n_head), abs=1e-12)
    with_bias = table[(table.kind == "attention_bias") & (table.n_embd == 12)]
    assert {1, 2, 3, 4} <= set(with_bias.n_head)
    assert with_bias[(with_bias.n_head == 3) & with_bias.out_bias].measured.tolist() == [120]
    gqa = table[table.kind == "gqa"]
    assert {1, 2, 4} <= set(gqa.n_kv_head)
    assert set(table[table.rope].rope_pairing) == {"interleaved", "half"}
    assert {"rope", "rope_gqa", "rope_bias"} <= set(table.kind)


def test_verify_cli_fails_with_exit_1_when_a_case_fails(tmp_path, capsys, monkeypatch):
    wrong = nullity.nullity_case("deliberately wrong theory", "attention", n_embd=4, n_head=2)
    monkeypatch.setattr(nullity, "default_cases", lambda: [wrong])
    monkeypatch.setattr(nullity, "theory_nullity", lambda case: 1)
    out = tmp_path / "nullity.csv"
    assert main(["verify", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "FAIL" in err and "1 of 1 cases FAILED" in err
    assert pd.read_csv(out)["passed"].tolist() == [False]


def test_counts_and_verify_agree_on_the_formula():
    for case in nullity.default_cases():
        if case.kind not in ("pair", "single_head"):  # the single head is checked in test_counts.py
            assert (
                nullity.theory_nullity(case) == counts.layer_counts(case.attention)["unidentified_per_layer"]
            )


@pytest.mark.parametrize("bias", [False, True])
def test_project_nanogpt_attention_has_the_closed_form_nullity(bias):
    """The model we train (attnid.model.gpt) loses exactly the counted directions, not just our own layer."""
    from attnid.model.gpt import CausalSelfAttention, GPTConfig

    torch.manual_seed(0)
    layer = (
        CausalSelfAttention(GPTConfig(block_size=8, n_embd=12, n_head=3, bias=bias, dropout=0.0))
        .double()
        .eval()
    )
    names = [name for name, _ in layer.named_parameters()]
    shapes = [p.shape for _, p in layer.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for _, p in layer.named_parameters()]) * 3  # O(1) scores
    x = torch.randn(40, 6, 12, dtype=torch.float64)

    def outputs(theta):
        pieces = torch.split(theta, [math.prod(s) for s in shapes])
        params = {n: piece.reshape(s) for n, piece, s in zip(names, pieces, shapes)}
        return torch.func.functional_call(layer, params, (x,)).reshape(-1)

    singular = torch.linalg.svdvals(torch.func.jacrev(outputs)(flat))
    rank = int((singular > nullity.RANK_RTOL * singular[0]).sum())
    assert singular[rank - 1] / singular[rank] >= nullity.GAP_REQUIRED
    expected = counts.unidentified_params_per_layer(counts.layer_shape(12, 3, bias=bias))
    assert flat.numel() - rank == expected == (120 if bias else 96)
