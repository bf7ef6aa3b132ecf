"""Rebalancing takes the nearest exact representative (docs/design.md §4): the identity on a pair that is
at its target already, idempotent, exact, and no farther than any other exact solution that can be
constructed independently. All in float64; tolerances are relative to the pairs' norm.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from variant_models import TINY, VARIANTS

from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import model_pairs, orbit_of
from attnid.model.moves import initial_conserved, prepared_target, rebalance_model
from attnid.theory import factor_pairs, rope
from attnid.theory.circuits import CIRCUITS
from attnid.theory.orbits import GENERAL_LINEAR, ORBITS, ROPE_COMMUTANT, Orbit

F64 = torch.float64
PROPERTY = settings(max_examples=40, deadline=None, database=None, derandomize=True)


@st.composite
def pairs_and_moves(draw, max_d: int = 5, log_scale: float = 1.0):
    """Random pairs ``(H, D, n_a)``, ``(H, D, n_b)`` (n >= D + 1, A and B at independent scales
    10^[-log_scale, log_scale]) and a random orbit element ``exp(spread X)`` per pair, spread in [0, 0.5]:
    the drift a rebalance undoes."""
    seed = draw(st.integers(0, 2**31 - 1))
    heads, dim = draw(st.integers(1, 3)), draw(st.integers(1, max_d))
    n_a, n_b = dim + draw(st.integers(1, 4)), dim + draw(st.integers(1, 4))
    scale_a, scale_b = (10.0 ** draw(st.floats(-log_scale, log_scale)) for _ in range(2))
    generator = torch.Generator().manual_seed(seed)
    pair_a = scale_a * torch.randn(heads, dim, n_a, generator=generator, dtype=F64)
    pair_b = scale_b * torch.randn(heads, dim, n_b, generator=generator, dtype=F64)
    element = GENERAL_LINEAR.random_element((heads,), dim, generator, spread=draw(st.floats(0, 0.5)))
    return pair_a, pair_b, element, generator


def relative_move(
    new: tuple[torch.Tensor, torch.Tensor], old: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """``(||A' - A||^2 + ||B' - B||^2)^{1/2} / (||A||^2 + ||B||^2)^{1/2}`` per pair."""
    moved = (new[0] - old[0]).square().sum((-1, -2)) + (new[1] - old[1]).square().sum((-1, -2))
    return (moved / (old[0].square().sum((-1, -2)) + old[1].square().sum((-1, -2)))).sqrt()


def svd_construction(pair_a, pair_b, target, signs, order):
    """An independent family of exact solutions (the construction of the project's first version, §4.1):
    ``A' = P diag(sqrt p) U^T``, ``B' = P diag(s / sqrt p) V^T`` with ``I* = P diag(b) P^T``, the
    product's ``s`` paired with ``b[order]`` and the eigenvectors' ``signs``. Every sign pattern and
    pairing is exact."""
    left, sing, right = factor_pairs.product_svd(pair_a, pair_b)
    eig, vec = torch.linalg.eigh(target)
    eig, vec = eig[..., order], vec[..., order] * signs.unsqueeze(-2)
    p = (eig + torch.sqrt(eig.square() + 4 * sing.square())) / 2
    return (vec * p.sqrt().unsqueeze(-2)) @ left.transpose(-1, -2), (
        vec * (sing / p.sqrt()).unsqueeze(-2)
    ) @ right.transpose(-1, -2)


def assert_exact(new_a, new_b, pair_a, pair_b, target):
    product = pair_a.transpose(-1, -2) @ pair_b
    product_error = torch.linalg.matrix_norm(new_a.transpose(-1, -2) @ new_b - product)
    assert torch.all(product_error <= 1e-12 * torch.linalg.matrix_norm(product))
    gram_scale = torch.linalg.matrix_norm(factor_pairs.gram(new_a) + factor_pairs.gram(new_b))
    assert torch.all(
        torch.linalg.matrix_norm(factor_pairs.imbalance(new_a, new_b) - target) <= 1e-11 * gram_scale
    )


# ------------------------------------------------------------------ GL_D pairs


@PROPERTY
@given(pairs_and_moves(), st.booleans())
def test_a_pair_at_its_target_is_left_where_it_is(case, balanced):
    """Rebalancing to the pair's own imbalance, or balancing a balanced pair, moves it by round-off only
    (the construction of §4.1 moved such pairs by about 1.4 of their norm)."""
    pair_a, pair_b, _, _ = case
    if balanced:
        pair_a, pair_b, _ = factor_pairs.rebalance_pairs(pair_a, pair_b)
        target = None
    else:
        target = factor_pairs.imbalance(pair_a, pair_b)
    new_a, new_b, done = factor_pairs.rebalance_pairs(pair_a, pair_b, target)
    assert bool(done.all())
    assert torch.all(relative_move((new_a, new_b), (pair_a, pair_b)) <= 1e-13)


@PROPERTY
@given(pairs_and_moves(), st.sampled_from(["balanced", "initial"]))
def test_rebalancing_twice_is_rebalancing_once_and_exact(case, target_kind):
    """After a drift (a random orbit move of a pair), rebalance to the pair's former imbalance or to balance:
    the result is exact, and rebalancing it again changes it by round-off only."""
    pair_a, pair_b, element, _ = case
    target = None if target_kind == "balanced" else factor_pairs.imbalance(pair_a, pair_b)
    drifted = Orbit.act(element, pair_a, pair_b)
    once_a, once_b, done = factor_pairs.rebalance_pairs(*drifted, target)
    assert bool(done.all())
    assert_exact(once_a, once_b, *drifted, torch.zeros_like(element) if target is None else target)
    twice_a, twice_b, _ = factor_pairs.rebalance_pairs(once_a, once_b, target)
    assert torch.all(relative_move((twice_a, twice_b), (once_a, once_b)) <= 1e-12)


@PROPERTY
@given(pairs_and_moves(max_d=4), st.sampled_from(["balanced", "initial"]))
def test_no_other_exact_solution_is_nearer(case, target_kind):
    """The result is at least as near to the drifted pair as: the pair before the drift (exact for the
    initial target), every sign pattern and pairing of the SVD construction, and the results of
    rebalancing random orbit moves of the drifted pair (each an exact solution too)."""
    pair_a, pair_b, element, generator = case
    dim = pair_a.shape[-2]
    target = (
        torch.zeros(dim, dim, dtype=F64)
        if target_kind == "balanced"
        else factor_pairs.imbalance(pair_a, pair_b)
    )
    drifted = Orbit.act(element, pair_a, pair_b)
    nearest_a, nearest_b, done = factor_pairs.rebalance_pairs(*drifted, target)
    assert bool(done.all())
    best = relative_move((nearest_a, nearest_b), drifted)
    slack = 1e-9
    if target_kind == "initial":
        assert torch.all(best <= relative_move((pair_a, pair_b), drifted) + slack)
    for _ in range(4):
        signs = torch.randint(0, 2, (dim,), generator=generator).to(F64) * 2 - 1
        order = torch.randperm(dim, generator=generator)
        other = svd_construction(*drifted, target.expand(pair_a.shape[0], dim, dim), signs, order)
        assert_exact(*other, *drifted, target)
        assert torch.all(best <= relative_move(other, drifted) + slack)
        start = Orbit.act(GENERAL_LINEAR.random_element((pair_a.shape[0],), dim, generator, 0.7), *drifted)
        elsewhere_a, elsewhere_b, elsewhere_done = factor_pairs.rebalance_pairs(*start, target)
        assert bool(elsewhere_done.all())
        assert torch.all(best <= relative_move((elsewhere_a, elsewhere_b), drifted) + slack)


@PROPERTY
@given(pairs_and_moves(log_scale=0.25))
def test_the_iteration_at_a_zero_target_finds_the_procrustes_point(case):
    """Two independent routes to the nearest balanced pair agree: the closed form of §4.2 (global) and the
    iteration of §4.3 started at the pair (local). The factors' scales differ by at most 10^0.5, which keeps
    the move within the range where the iteration converges inside its budget (§4.3)."""
    pair_a, pair_b, element, _ = case
    drifted = Orbit.act(element, pair_a, pair_b)
    closed_a, closed_b = factor_pairs.nearest_balanced(*drifted, factor_pairs.product_svd(*drifted))
    zero = torch.zeros_like(element)
    iterated, on_fiber, converged = factor_pairs.nearest_on_fiber(
        factor_pairs.gram(drifted[0]), factor_pairs.gram(drifted[1]), zero
    )
    assert bool(on_fiber.all()) and bool(converged.all())
    moved = Orbit.act(iterated, *drifted)
    assert torch.all(relative_move(moved, (closed_a, closed_b)) <= 1e-8)


def test_a_far_target_is_still_reached_exactly():
    """A target far from the pair's imbalance (a large move) is reached exactly, even where the nearest
    point takes the iteration's whole budget."""
    generator = torch.Generator().manual_seed(4)
    pair_a = 3 * torch.randn(4, 6, 10, generator=generator, dtype=F64)
    pair_b = 0.2 * torch.randn(4, 6, 9, generator=generator, dtype=F64)
    target = 50 * factor_pairs.imbalance(
        *Orbit.act(GENERAL_LINEAR.random_element((4,), 6, generator, 2.0), pair_a, pair_b)
    )
    new_a, new_b, done = factor_pairs.rebalance_pairs(pair_a, pair_b, target)
    assert bool(done.all())
    assert_exact(new_a, new_b, pair_a, pair_b, target)


# ------------------------------------------------------------------ the RoPE commutant


def plane_rotation(angle: float, batch: int, dim: int) -> torch.Tensor:
    """``cos I + sin J`` in every RoPE plane ``(p, p + D/2)``: an element of the commutant that changes no
    plane norm."""
    half, cos, sin = dim // 2, torch.tensor(angle, dtype=F64).cos(), torch.tensor(angle, dtype=F64).sin()
    element = torch.zeros(batch, dim, dim, dtype=F64)
    idx = torch.arange(half)
    element[:, idx, idx] = element[:, idx + half, idx + half] = cos
    element[:, idx, idx + half], element[:, idx + half, idx] = -sin, sin
    return element


def _rope_pairs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    pair_a = torch.randn(3, 6, 9, generator=generator, dtype=F64)
    pair_b = 2 * torch.randn(3, 6, 7, generator=generator, dtype=F64)
    return pair_a, pair_b, generator


@pytest.mark.parametrize("target_kind", ["balanced", "initial"])
def test_rope_rebalance_is_the_identity_at_its_target_idempotent_and_nearest(target_kind):
    """§8: on the RoPE commutant the exact solutions differ by a rotation per plane, and the plane scale that
    the rebalance applies (no rotation) is the nearest of them."""
    pair_a, pair_b, generator = _rope_pairs(0)
    if target_kind == "balanced":
        balanced = ROPE_COMMUTANT.rebalance(pair_a, pair_b)
        pair_a, pair_b, target = balanced.pair_a, balanced.pair_b, None
    else:
        target = ROPE_COMMUTANT.conserved_imbalance(pair_a, pair_b)
    at_target = ROPE_COMMUTANT.rebalance(pair_a, pair_b, target)
    assert torch.all(relative_move((at_target.pair_a, at_target.pair_b), (pair_a, pair_b)) <= 1e-14)

    drifted = Orbit.act(ROPE_COMMUTANT.random_element((3,), 6, generator, spread=0.8), pair_a, pair_b)
    once = ROPE_COMMUTANT.rebalance(*drifted, target)
    twice = ROPE_COMMUTANT.rebalance(once.pair_a, once.pair_b, target)
    assert torch.all(relative_move((twice.pair_a, twice.pair_b), (once.pair_a, once.pair_b)) <= 1e-14)
    best = relative_move((once.pair_a, once.pair_b), drifted)
    for angle in (0.3, 1.0, 3.0):  # the same exact point turned in every plane: same traces, farther away
        turned = plane_rotation(angle, batch=3, dim=6)
        other = Orbit.act(turned, once.pair_a, once.pair_b)
        torch.testing.assert_close(
            rope.rope_plane_traces(factor_pairs.imbalance(*other)),
            rope.rope_plane_traces(factor_pairs.imbalance(once.pair_a, once.pair_b)),
            rtol=0,
            atol=1e-12,
        )
        assert torch.all(best < relative_move(other, drifted))


# ------------------------------------------------------------------ whole models (GQA, RoPE, MHA)


def _model(fields: dict, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**(TINY | fields))).double().eval()


def _attention_move(model_before: list, model: GPT) -> float:
    """The relative move of the attention factors of both circuits, all pairs together."""
    moved = total = 0.0
    for circuit, pairs in zip(CIRCUITS, model_before, strict=True):
        for (a, b), (a0, b0) in zip(model_pairs(model, circuit), pairs, strict=True):
            moved += float((a - a0).square().sum() + (b - b0).square().sum())
            total += float(a0.square().sum() + b0.square().sum())
    return (moved / total) ** 0.5


@pytest.mark.parametrize("name", ["mha", "gqa G=2", "mqa G=1", "rope+gqa G=2", "gqa D=12"])
def test_a_fresh_model_rebalanced_to_its_own_imbalance_does_not_move(name):
    """The training-time rebalance (target I_0) of a model at step 0, and balancing a balanced model, move
    the attention factors by round-off; after a drift, a second rebalance repeats the first."""
    model = _model(VARIANTS[name])
    initial = {circuit: initial_conserved(model, circuit) for circuit in CIRCUITS}
    targets = {c: prepared_target(orbit_of(model, c), initial[c], "initial") for c in CIRCUITS}
    before = [model_pairs(model, circuit) for circuit in CIRCUITS]
    for circuit in CIRCUITS:
        assert rebalance_model(model, circuit, targets[circuit]).skipped == 0
    assert _attention_move(before, model) <= 1e-13

    for circuit in CIRCUITS:
        rebalance_model(model, circuit)  # balanced
    balanced = [model_pairs(model, circuit) for circuit in CIRCUITS]
    for circuit in CIRCUITS:
        rebalance_model(model, circuit)
    assert _attention_move(balanced, model) <= 1e-12

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a drift that is not an orbit move: a small step of every attention weight
        for block in model.transformer.h:
            for param in block.attn.parameters():
                param.add_(
                    0.05 * param.abs().mean() * torch.randn(param.shape, generator=generator, dtype=F64)
                )
    for circuit in CIRCUITS:
        rebalance_model(model, circuit, targets[circuit])
    once = [model_pairs(model, circuit) for circuit in CIRCUITS]
    for circuit in CIRCUITS:
        kind = orbit_of(model, circuit).name
        for (a, b), start in zip(once[CIRCUITS.index(circuit)], initial[circuit], strict=True):
            torch.testing.assert_close(
                ORBITS[kind].conserved_imbalance(a, b), start, rtol=0, atol=1e-10 * start.abs().max().item()
            )
        rebalance_model(model, circuit, targets[circuit])
    assert _attention_move(once, model) <= 1e-12
