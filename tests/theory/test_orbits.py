"""Orbits of every architecture: pairs per key/value group, moves that keep the function,
the RoPE-restricted tangent, conserved imbalance and rebalance, and the orbit dimension
against counts.py's closed forms."""

from __future__ import annotations

import pytest
import torch
from variant_models import TINY, VARIANTS

from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import layer_pairs, layout_of, model_pairs, orbit_of, write_pairs_back
from attnid.model.moves import (
    initial_conserved,
    orbit_dimension,
    orbit_dimension_rows,
    prepared_target,
    rebalance_model,
)
from attnid.theory import counts, factor_pairs
from attnid.theory.circuits import CIRCUITS
from attnid.theory.orbits import GENERAL_LINEAR, ORBITS, ROPE_COMMUTANT, Orbit
from attnid.theory.rope import rope_plane_traces

ROPE_VARIANTS = [name for name, variant in VARIANTS.items() if variant.get("rope")]


def _model(variant: dict, bias: bool = True, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **variant}, bias=bias)).double().eval()
    with torch.no_grad():  # off the init: nonzero biases, unbalanced pairs
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _logits(model) -> torch.Tensor:
    idx = torch.randint(0, 23, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(idx, full_logits=True)[0]


def _relative_change(after: torch.Tensor, before: torch.Tensor) -> float:
    return ((after - before).abs().max() / before.abs().max()).item()


def _move(model, transform) -> None:
    """Apply ``transform(kind, A, B) -> (A', B')`` to every pair of both circuits."""
    for circuit in CIRCUITS:
        kind = orbit_of(model, circuit).name
        moved = [transform(kind, a, b) for a, b in model_pairs(model, circuit)]
        write_pairs_back(model, circuit, moved)


def test_mha_pairs_are_the_heads_rows_of_c_attn_and_columns_of_c_proj():
    """With G = H every pair is one head's (docs/design.md §2.1): A = [W_Q^h | b_Q^h],
    B = [W_K^h | b_K^h] (query-key) and A = [W_V^h | b_V^h], B = (W_O^h)^T (output-value): nanoGPT's
    c_attn rows, c_proj columns."""
    model = _model({})
    n_embd, n_head = model.config.n_embd, model.config.n_head
    d = n_embd // n_head
    for block, (query, key), (value, output) in zip(
        model.transformer.h, model_pairs(model, "qk"), model_pairs(model, "ov"), strict=True
    ):
        weight, out = block.attn.c_attn.weight.double(), block.attn.c_proj.weight.double()
        if block.attn.c_attn.bias is not None:  # the bias is one more column of A and B (§2.1)
            weight = torch.cat([weight, block.attn.c_attn.bias.double()[:, None]], dim=1)
        weight = weight.detach()
        for h in range(n_head):
            rows = slice(h * d, (h + 1) * d)
            assert torch.equal(query[h], weight[:n_embd][rows]) and torch.equal(
                key[h], weight[n_embd : 2 * n_embd][rows]
            )
            assert torch.equal(value[h], weight[2 * n_embd :][rows]) and torch.equal(
                output[h], out[:, rows].t().detach()
            )


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("bias", [True, False])
def test_pairs_shapes_products_and_write_back(name, bias):
    model = _model(VARIANTS[name], bias=bias)
    config = model.config
    h, g, d, e = config.n_head, config.kv_heads, config.per_head_dim, config.n_embd
    columns = e + (1 if bias else 0)
    query, key = layer_pairs(model, 1, "qk")
    value, output = layer_pairs(model, 1, "ov")
    assert query.shape == (g, d, (h // g) * columns) and key.shape == (g, d, columns)
    assert value.shape == (g, d, columns) and output.shape == (g, d, (h // g) * e)
    # group g's product holds the score matrix [x;1]^T W_Q^h^T W_K^g [y;1] of each of its query heads
    attn = model.transformer.h[1].attn
    w_q, w_k, _ = attn.c_attn.weight.detach().split([h * d, g * d, g * d])
    head = h - 1  # the last query head belongs to the last group
    product = query[-1].T @ key[-1]  # ((H/G) n, n)
    block = product[(h // g - 1) * columns : (h // g) * columns, :e]
    torch.testing.assert_close(block[:e], w_q[head * d : (head + 1) * d].T @ w_k[(g - 1) * d : g * d])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scaled = {c: [(2 * a, 3 * b) for a, b in model_pairs(model, c)] for c in CIRCUITS}
    for circuit in CIRCUITS:
        write_pairs_back(model, circuit, scaled[circuit])
        for (a, b), (ref_a, ref_b) in zip(model_pairs(model, circuit), scaled[circuit], strict=True):
            assert torch.equal(a, ref_a) and torch.equal(b, ref_b)
    for circuit in CIRCUITS:  # and back: an exact inverse
        write_pairs_back(model, circuit, [(a / 2, b / 3) for a, b in scaled[circuit]])
    for key_name, value_tensor in model.state_dict().items():
        torch.testing.assert_close(value_tensor, before[key_name], rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_random_element_of_the_architectures_group_keeps_logits(name):
    model = _model(VARIANTS[name])
    before = _logits(model)
    generator = torch.Generator().manual_seed(2)
    moved_norm = []

    def random_move(kind, a, b):
        element = ORBITS[kind].random_element(a.shape[:-2], a.shape[-2], generator)
        new_a, new_b = Orbit.act(element, a, b)
        moved_norm.append((new_a - a).norm().item())
        return new_a, new_b

    _move(model, random_move)
    assert min(moved_norm) > 1e-2  # the weights really moved
    assert _relative_change(_logits(model), before) < 1e-12


@pytest.mark.parametrize("name", ROPE_VARIANTS)
def test_full_gl_move_of_a_rope_query_key_pair_changes_logits(name):
    """The restriction is real: a generic GL_D move is not a symmetry of a RoPE layer."""
    model = _model(VARIANTS[name])
    before = _logits(model)
    generator = torch.Generator().manual_seed(3)
    pairs = model_pairs(model, "qk")
    element = ORBITS["gl"].random_element(pairs[0][0].shape[:-2], pairs[0][0].shape[-2], generator)
    pairs[0] = Orbit.act(element, *pairs[0])
    write_pairs_back(model, "qk", pairs)
    assert _relative_change(_logits(model), before) > 1e-3


@pytest.mark.parametrize("name", list(VARIANTS))
def test_rebalance_to_balance_and_back_keeps_logits_and_hits_the_target(name):
    model = _model(VARIANTS[name])
    before = _logits(model)
    initial = {
        c: [orbit_of(model, c).conserved_imbalance(a, b) for a, b in model_pairs(model, c)] for c in CIRCUITS
    }

    def balance(kind, a, b):
        moved = ORBITS[kind].rebalance(a, b)
        assert moved.done.all()
        return moved.pair_a, moved.pair_b

    _move(model, balance)
    assert _relative_change(_logits(model), before) < 1e-12
    for circuit in CIRCUITS:
        kind = orbit_of(model, circuit).name
        for (a, b), start in zip(model_pairs(model, circuit), initial[circuit], strict=True):
            scale = start.abs().max()
            assert ORBITS[kind].conserved_imbalance(a, b).abs().max() < 1e-10 * scale
            assert start.abs().max() > 1e-3  # it was not balanced before
            frobenius_sq, minimum = ORBITS[kind].excess_norm_terms(a, b)
            torch.testing.assert_close(frobenius_sq, minimum, rtol=1e-10, atol=0)  # mu = 0 when balanced
    for circuit in CIRCUITS:  # back to the initial conserved imbalance
        kind = orbit_of(model, circuit).name
        restored = []
        for (a, b), target in zip(model_pairs(model, circuit), initial[circuit], strict=True):
            moved = ORBITS[kind].rebalance(a, b, ORBITS[kind].rebalance_target(target))
            new_a, new_b = moved.pair_a, moved.pair_b
            assert moved.done.all()
            torch.testing.assert_close(
                ORBITS[kind].conserved_imbalance(new_a, new_b),
                target,
                rtol=0,
                atol=1e-10 * target.abs().max().item(),
            )
            restored.append((new_a, new_b))
        write_pairs_back(model, circuit, restored)
    assert _relative_change(_logits(model), before) < 1e-12


@pytest.mark.parametrize("name", ["mha", "rope+gqa G=2", "gqa D=12"])
def test_rebalance_model_restores_the_initial_conserved_imbalance(name):
    model = _model(VARIANTS[name])
    before = _logits(model)
    initial = {c: initial_conserved(model, c) for c in CIRCUITS}
    for circuit in CIRCUITS:
        assert rebalance_model(model, circuit).skipped == 0  # balance
        assert initial_conserved(model, circuit).abs().max() < 1e-10 * initial[circuit].abs().max()
    for circuit in CIRCUITS:
        target = prepared_target(orbit_of(model, circuit), initial[circuit], "initial")
        assert rebalance_model(model, circuit, target).skipped == 0  # and back
        torch.testing.assert_close(
            initial_conserved(model, circuit),
            initial[circuit],
            rtol=0,
            atol=1e-10 * initial[circuit].abs().max().item(),
        )
    assert _relative_change(_logits(model), before) < 1e-12


def _rope_pair(seed: int = 0, d: int = 6, n_a: int = 9, n_b: int = 7, batch: int = 3):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, d, n_a, generator=generator, dtype=torch.float64)
    b = torch.randn(batch, d, n_b, generator=generator, dtype=torch.float64) * 2
    da = torch.randn(batch, d, n_a, generator=generator, dtype=torch.float64)
    db = torch.randn(batch, d, n_b, generator=generator, dtype=torch.float64)
    return a, b, da, db


def _rope_tangent(a, b, generator):
    """(X A, -X^T B) for a random X in the RoPE algebra (blocks x I + y J per plane)."""
    d = a.shape[-2]
    coefficients = torch.randn(*a.shape[:-2], d, generator=generator, dtype=torch.float64)
    x, y = coefficients[..., : d // 2], coefficients[..., d // 2 :]
    generator_matrix = torch.diag_embed(torch.cat([x, x], -1))
    idx = torch.arange(d // 2)
    generator_matrix[..., idx, idx + d // 2] = -y
    generator_matrix[..., idx + d // 2, idx] = y
    return factor_pairs.tangent_step(a, b, generator_matrix)


def test_rope_projection_is_idempotent_orthogonal_and_its_norm_matches():
    a, b, da, db = _rope_pair()
    pa, pb = ORBITS["rope"].tangent_projection(a, b, da, db)
    qa, qb = ORBITS["rope"].tangent_projection(a, b, pa, pb)
    torch.testing.assert_close(qa, pa, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(qb, pb, rtol=1e-12, atol=1e-12)
    # the residual is orthogonal to every tangent vector of the restricted orbit
    generator = torch.Generator().manual_seed(9)
    for _ in range(3):
        ta, tb = _rope_tangent(a, b, generator)
        inner = ((da - pa) * ta).sum((-1, -2)) + ((db - pb) * tb).sum((-1, -2))
        scale = (da.norm() * ta.norm()).item()
        assert inner.abs().max() < 1e-12 * scale
        # and a tangent vector projects to itself
        sa, sb = ORBITS["rope"].tangent_projection(a, b, ta, tb)
        torch.testing.assert_close(sa, ta, rtol=1e-12, atol=1e-12)
    sq, singular = ORBITS["rope"].unidentified_sq_norm(a, b, da, db)
    torch.testing.assert_close(sq, pa.square().sum((-1, -2)) + pb.square().sum((-1, -2)), rtol=1e-12, atol=0)
    assert not singular.any()
    # the restricted share is part of the GL_D share (a subspace of its tangent)
    full_sq, _ = ORBITS["gl"].unidentified_sq_norm(a, b, da, db)
    assert (sq <= full_sq * (1 + 1e-12)).all() and (sq < 0.9 * full_sq).all()


def test_rope_tangent_directions_keep_the_product_and_commute_with_rotations():
    a, b, _, _ = _rope_pair(seed=1)
    ta, tb = _rope_tangent(a, b, torch.Generator().manual_seed(4))
    # first-order change of A^T B along a tangent vector is zero
    first_order = ta.transpose(-1, -2) @ b + a.transpose(-1, -2) @ tb
    assert first_order.abs().max() < 1e-12 * (a.norm() * b.norm()).item()
    element = ORBITS["rope"].random_element((2,), 6, torch.Generator().manual_seed(5))
    angles = torch.tensor([0.3, 1.1, 2.0], dtype=torch.float64)  # one RoPE rotation, planes (p, p + 3)
    rotation = torch.zeros(6, 6, dtype=torch.float64)
    idx = torch.arange(3)
    rotation[idx, idx] = rotation[idx + 3, idx + 3] = angles.cos()
    rotation[idx, idx + 3], rotation[idx + 3, idx] = -angles.sin(), angles.sin()
    torch.testing.assert_close(element @ rotation, rotation @ element, rtol=0, atol=1e-14)
    full = ORBITS["gl"].random_element((), 6, torch.Generator().manual_seed(5))
    assert (full @ rotation - rotation @ full).abs().max() > 1e-2


def test_rope_conserved_imbalance_is_the_plane_traces_and_gradient_flow_keeps_it():
    """Lemma 5.1 on the subgroup: a gradient of any f(A^T B) has no component along the
    RoPE tangent, so the plane traces of I are conserved to first order; the full I is not
    (for RoPE losses the gradient is orthogonal only to the restricted tangent)."""
    a, b, _, _ = _rope_pair(seed=2)
    imbalance = factor_pairs.imbalance(a, b)
    conserved = ORBITS["rope"].conserved_imbalance(a, b)
    traces = rope_plane_traces(imbalance)
    torch.testing.assert_close(rope_plane_traces(conserved), traces)
    torch.testing.assert_close(ORBITS["rope"].project_to_algebra(conserved), conserved)  # a projection
    # the residual I - proj(I) is orthogonal to the algebra
    residual = imbalance - conserved
    assert rope_plane_traces(residual).abs().max() < 1e-12 * imbalance.abs().max()
    assert torch.equal(ORBITS["gl"].conserved_imbalance(a, b), imbalance)
    # d/dt of the plane traces along a step orthogonal to the restricted tangent is zero
    _, _, da, db = _rope_pair(seed=3)
    pa, pb = ORBITS["rope"].tangent_projection(a, b, da, db)
    na, nb = da - pa, db - pb
    derivative = rope_plane_traces(
        na @ a.transpose(-1, -2)
        + a @ na.transpose(-1, -2)
        - nb @ b.transpose(-1, -2)
        - b @ nb.transpose(-1, -2)
    )
    assert derivative.abs().max() < 1e-12 * (a.norm() * da.norm()).item()


def test_rope_excess_norm_is_at_least_the_gl_excess():
    a, b, _, _ = _rope_pair(seed=4)
    frobenius_sq, rope_min = ORBITS["rope"].excess_norm_terms(a, b)
    gl_frobenius, gl_min = ORBITS["gl"].excess_norm_terms(a, b)
    torch.testing.assert_close(frobenius_sq, gl_frobenius)
    assert (rope_min >= gl_min * (1 - 1e-12)).all() and (rope_min <= frobenius_sq).all()


def test_degenerate_pairs_are_flagged_not_divided_by_zero():
    a, b, da, db = _rope_pair(seed=5)
    a[0, [1, 4]] = 0  # plane 1 of pair 0 has no query rows...
    b[0, [1, 4]] = 0  # ...nor key rows
    sq, singular = ORBITS["rope"].unidentified_sq_norm(a, b, da, db)
    assert singular.tolist() == [True, False, False] and torch.isfinite(sq).all()
    moved = ORBITS["rope"].rebalance(a, b)
    new_a, new_b, done = moved.pair_a, moved.pair_b, moved.done
    assert done.tolist() == [False, True, True]
    assert torch.equal(new_a[0], a[0]) and torch.equal(new_b[0], b[0])


DIMENSION_CASES = [
    dict(),  # MHA
    dict(n_kv_head=2),
    dict(n_kv_head=1),
    dict(rope=True),
    dict(rope=True, n_kv_head=2),
    dict(rope=True, n_kv_head=1),
    dict(head_dim=6),  # D != E/H
    dict(head_dim=12, n_kv_head=2),
    dict(rope=True, head_dim=6, n_kv_head=2),
    dict(n_head=1, head_dim=32),  # one full-width head
    dict(n_head=1, head_dim=16, rope=True),
]


@pytest.mark.parametrize("variant", DIMENSION_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_orbit_dimension_equals_the_closed_form(variant, bias):
    config = GPTConfig(**{**TINY, **variant}, bias=bias)
    model = _model(variant, bias=bias)
    shape = layout_of(config)
    expected = {"qk": counts.unidentified_qk_params(shape), "ov": counts.unidentified_ov_params(shape)}
    g, d = config.kv_heads, config.per_head_dim
    assert expected["ov"] == g * d * d
    assert expected["qk"] == g * (d if config.rope else d * d)
    for circuit in CIRCUITS:
        for layer in range(config.n_layer):
            assert orbit_dimension(model, layer, circuit) == expected[circuit]
            assert orbit_dimension(config, layer, circuit) == expected[circuit]


def test_orbit_dimension_rows_for_inspect():
    rows = orbit_dimension_rows(_model(dict(rope=True, n_kv_head=1)))
    assert [(r["layer"], r["circuit"], r["orbit"]) for r in rows] == [
        (0, "qk", "rope"),
        (0, "ov", "gl"),
        (1, "qk", "rope"),
        (1, "ov", "gl"),
    ]
    assert all(r["orbit_dimension"] == r["closed_form"] for r in rows)
    assert [r["closed_form"] for r in rows[:2]] == [8, 64]  # G D and G D^2 with G = 1, D = 8


def test_orbit_dimension_drops_at_degenerate_weights():
    """Computed from the weights, not copied from the formula: zero a head's key and query
    rows in one RoPE plane and the rank loses that plane's 2 directions."""
    model = _model(dict(rope=True, n_kv_head=2))
    d = model.config.per_head_dim
    with torch.no_grad():
        c_attn = model.transformer.h[0].attn.c_attn
        for row in (0, d // 2):  # plane 0 of group 0: query heads 0, 1 and key head 0
            for head in (0, 1):
                c_attn.weight[head * d + row] = 0
                c_attn.bias[head * d + row] = 0
            c_attn.weight[4 * d + row] = 0
            c_attn.bias[4 * d + row] = 0
    assert orbit_dimension(model, 0, "qk") == 2 * d - 2
    assert orbit_dimension(model, 1, "qk") == 2 * d


def test_orbit_of_each_circuit_and_bad_arguments():
    assert orbit_of(GPTConfig(**TINY, rope=True), "qk") is ROPE_COMMUTANT
    assert orbit_of(GPTConfig(**TINY, rope=True), "ov") is GENERAL_LINEAR
    assert orbit_of(GPTConfig(**TINY), "qk") is GENERAL_LINEAR
    assert {name: type(orbit).__name__ for name, orbit in ORBITS.items()} == {
        "gl": "GeneralLinearOrbit",
        "rope": "RopeCommutantOrbit",
    }
    with pytest.raises(ValueError, match="circuit"):
        orbit_of(GPTConfig(**TINY), "vo")
    with pytest.raises(ValueError, match="out of range"):
        orbit_dimension(GPTConfig(**TINY), 5, "qk")


@pytest.mark.parametrize("rope", [False, True])
def test_orbit_dimensions_add_up_to_the_jacobian_nullity(rope):
    """Against nullity.py's Jacobian of a bias-free GQA layer (E=8, H=2, G=1): the
    architecture's orbits account for every unidentified direction."""
    from attnid.theory import nullity

    case = nullity.nullity_case(
        "mqa", "rope_gqa" if rope else "gqa", n_embd=8, n_head=2, n_kv_head=1, rope="half" if rope else None
    )
    measured = nullity.measure_case(case)
    config = GPTConfig(
        block_size=8, vocab_size=5, n_layer=1, n_head=2, n_kv_head=1, n_embd=8, rope=rope, bias=False
    )
    assert measured["gap"] >= nullity.GAP_REQUIRED
    assert measured["measured"] == sum(orbit_dimension(config, 0, c) for c in CIRCUITS)
