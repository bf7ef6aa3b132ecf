"""Property tests of the log step's shared products (attnid.measure.products) and the from-products forms of
ρ and μ (attnid.theory.factor_pairs, attnid.theory.rope), against independent oracles, in float64.

Oracles: ρ's numerator from the pairs themselves (the projection, formed), the nuclear norm of the product
``Aᵀ B`` formed and handed to ``torch.linalg.matrix_norm``, Gram matrices computed directly.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnid.measure.products import CircuitPairs, CircuitStep
from attnid.theory import factor_pairs, rope
from attnid.theory.orbits import ORBITS

F64 = torch.float64
PROPERTY = settings(max_examples=40, deadline=None, database=None, derandomize=True)


@st.composite
def pairs_and_steps(draw, even: bool = False):
    """A batch of pairs (P, D, n_a), (P, D, n_b) at independent scales, a step of relative size 10^[-6, 0]."""
    seed = draw(st.integers(0, 2**31 - 1))
    batch, dim = draw(st.integers(1, 3)), draw(st.integers(1, 4)) * (2 if even else 1)
    n_a, n_b = dim + draw(st.integers(0, 5)), dim + draw(st.integers(0, 5))
    scale_a, scale_b = 10.0 ** draw(st.floats(-2, 2)), 10.0 ** draw(st.floats(-2, 2))
    step_scale = 10.0 ** draw(st.floats(-6, 0))
    gen = torch.Generator().manual_seed(seed)
    pair_a = scale_a * torch.randn(batch, dim, n_a, generator=gen, dtype=F64)
    pair_b = scale_b * torch.randn(batch, dim, n_b, generator=gen, dtype=F64)
    step_a = step_scale * scale_a * torch.randn(batch, dim, n_a, generator=gen, dtype=F64)
    step_b = step_scale * scale_b * torch.randn(batch, dim, n_b, generator=gen, dtype=F64)
    return pair_a, pair_b, step_a, step_b


def formed_projection_sq(orbit, pair_a, pair_b, step_a, step_b) -> torch.Tensor:
    proj_a, proj_b = orbit.tangent_projection(pair_a, pair_b, step_a, step_b)
    return proj_a.square().sum((-1, -2)) + proj_b.square().sum((-1, -2))


@PROPERTY
@given(pairs_and_steps(even=True), st.sampled_from(["gl", "rope"]))
def test_rho_from_shared_products_is_the_projection_norm(batch, kind):
    """ρ's numerator from (pre Grams, dA A0ᵀ, dB B0ᵀ), the pre Grams derived from the post ones as the
    metrics do, equals the squared norm of the formed projection (relative 1e-10 of the step's norm²)."""
    pair_a, pair_b, step_a, step_b = batch
    orbit = ORBITS[kind]
    step = CircuitStep(CircuitPairs(pair_a, pair_b), CircuitPairs(pair_a + step_a, pair_b + step_b))
    derived, _ = orbit.unidentified_sq_norm_from_products(*step.pre_grams, step.cross_a, step.cross_b)
    direct, _ = orbit.unidentified_sq_norm(pair_a, pair_b, step.step_a, step.step_b)
    expected = formed_projection_sq(orbit, pair_a, pair_b, step.step_a, step.step_b)
    scale = step.step_sq_norm()
    assert ((derived - expected).abs() <= 1e-10 * scale).all()
    assert ((direct - expected).abs() <= 1e-10 * scale).all()
    assert (
        (
            step.step_sq_norm() - (step.step_a.square().sum((-1, -2)) + step.step_b.square().sum((-1, -2)))
        ).abs()
        <= 1e-13 * scale
    ).all()


@PROPERTY
@given(pairs_and_steps())
def test_derived_pre_grams_are_the_grams_to_round_off(batch):
    pair_a, pair_b, step_a, step_b = batch
    step = CircuitStep(CircuitPairs(pair_a, pair_b), CircuitPairs(pair_a + step_a, pair_b + step_b))
    for derived, pair, post in zip(step.pre_grams, (pair_a, pair_b), (step.post.pair_a, step.post.pair_b)):
        direct = factor_pairs.gram(pair)
        bound = 1e-13 * (factor_pairs.trace(factor_pairs.gram(post)) + factor_pairs.trace(direct))
        assert ((derived - direct).abs().amax((-1, -2)) <= bound).all()


@PROPERTY
@given(pairs_and_steps(even=True))
def test_rope_rho_from_products_equals_rho_from_the_pairs(batch):
    pair_a, pair_b, step_a, step_b = batch
    from_pairs, singular_pairs = rope.rope_unidentified_sq_norm(pair_a, pair_b, step_a, step_b)
    from_products, singular_products = rope.rope_unidentified_sq_norm_from_products(
        factor_pairs.gram(pair_a),
        factor_pairs.gram(pair_b),
        step_a @ pair_a.transpose(-1, -2),
        step_b @ pair_b.transpose(-1, -2),
    )
    scale = step_a.square().sum((-1, -2)) + step_b.square().sum((-1, -2))
    assert ((from_products - from_pairs).abs() <= 1e-12 * scale).all()
    assert torch.equal(singular_pairs, singular_products)


def test_plane_blocks_are_the_2x2_diagonal_blocks_of_each_plane():
    matrix = torch.arange(2 * 36, dtype=F64).reshape(2, 6, 6)
    blocks = rope.plane_blocks(matrix)
    assert blocks.shape == (2, 3, 2, 2)
    for plane in range(3):
        rows = [plane, plane + 3]
        assert torch.equal(blocks[:, plane], matrix[:, rows][:, :, rows])


def nuclear_oracle(pair_a, pair_b) -> torch.Tensor:
    """2 ||Aᵀ B||_*, the product formed."""
    return 2 * torch.linalg.matrix_norm(pair_a.transpose(-1, -2) @ pair_b, ord="nuc")


@PROPERTY
@given(pairs_and_steps())
def test_excess_norm_from_gram_matrices_equals_the_formed_nuclear_norm(batch):
    """μ's minimum from Cholesky factors of the Grams (and from QRs where a pair is far from full row rank,
    here n < D included) equals the nuclear norm of the formed product, relative 1e-12."""
    pair_a, pair_b, _, _ = batch
    frobenius_sq, minimum = factor_pairs.excess_norm_terms(pair_a, pair_b)
    grams = factor_pairs.gram(pair_a), factor_pairs.gram(pair_b)
    given_grams = factor_pairs.excess_norm_terms(pair_a, pair_b, grams)
    expected = nuclear_oracle(pair_a, pair_b)
    assert ((minimum - expected).abs() <= 1e-12 * expected).all()
    assert torch.equal(given_grams[1], minimum)
    direct_frobenius = pair_a.square().sum((-1, -2)) + pair_b.square().sum((-1, -2))
    assert ((frobenius_sq - direct_frobenius).abs() <= 1e-14 * direct_frobenius).all()


def conditioned(batch: int, dim: int, width: int, condition: float, gen: torch.Generator) -> torch.Tensor:
    """Pairs ``(batch, dim, width)`` with singular values from 1 down to 1 / condition (0 beyond ``rank``)."""
    noise = torch.randn(batch, dim, width, generator=gen, dtype=F64)
    left, _, right = torch.linalg.svd(noise, full_matrices=False)
    values = torch.logspace(0, -torch.log10(torch.tensor(condition)).item(), dim, dtype=F64)
    return (left * values) @ right


def test_excess_norm_stays_exact_for_ill_conditioned_and_rank_deficient_pairs():
    gen = torch.Generator().manual_seed(5)
    for condition in (1e2, 1e4, 1e6, 1e9, 1e14):  # 1e9 and beyond: the Gram factorisation cannot be trusted
        pair_a, pair_b = conditioned(4, 8, 20, condition, gen), conditioned(4, 8, 24, 10.0, gen)
        _, minimum = factor_pairs.excess_norm_terms(pair_a, pair_b)
        expected = nuclear_oracle(pair_a, pair_b)
        assert ((minimum - expected).abs() <= 1e-12 * expected).all(), condition
    rank_two = torch.randn(3, 6, 2, generator=gen, dtype=F64), torch.randn(3, 2, 10, generator=gen, dtype=F64)
    rank_deficient = rank_two[0] @ rank_two[1]
    other = torch.randn(3, 6, 10, generator=gen, dtype=F64)
    _, minimum = factor_pairs.excess_norm_terms(rank_deficient, other)
    expected = nuclear_oracle(rank_deficient, other)
    assert ((minimum - expected).abs() <= 1e-12 * expected).all()
    zero = torch.zeros(2, 4, 6, dtype=F64)
    nonzero = torch.randn(2, 4, 6, generator=gen, dtype=F64)
    frobenius_sq, minimum = factor_pairs.excess_norm_terms(zero, nonzero)
    assert torch.equal(minimum, torch.zeros(2, dtype=F64)) and (frobenius_sq > 0).all()
    single = factor_pairs.excess_norm_terms(other[0], rank_deficient[0])  # no batch dimension
    expected = float(nuclear_oracle(other[0], rank_deficient[0]))
    assert single[1].shape == () and abs(float(single[1]) - expected) <= 1e-12 * expected


@PROPERTY
@given(pairs_and_steps(even=True))
def test_rope_excess_norm_from_grams_equals_it_from_the_pairs(batch):
    pair_a, pair_b, _, _ = batch
    frobenius_sq, minimum = rope.rope_excess_norm_terms(pair_a, pair_b)
    grams = factor_pairs.gram(pair_a), factor_pairs.gram(pair_b)
    from_grams = rope.rope_excess_norm_terms(pair_a, pair_b, grams)
    assert ((from_grams[0] - frobenius_sq).abs() <= 1e-13 * frobenius_sq).all()
    assert ((from_grams[1] - minimum).abs() <= 1e-12 * frobenius_sq).all()
