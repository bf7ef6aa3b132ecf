"""Property tests of the factor-pair geometry (attnid.theory.factor_pairs), all in float64.

Tolerances are relative to the scale of the inputs (stated per test): the pairs are
drawn with random shapes and with A and B at independent scales 10^[-2, 2].
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import layout_of, model_pairs, pairs_from_tensors, write_pairs_back
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS

F64 = torch.float64
# derandomized and without an example database: the same examples on every run (CI is reproducible,
# nothing written into the repo); wider searches (300-400 examples) were run by hand when writing these
PROPERTY = settings(max_examples=40, deadline=None, database=None, derandomize=True)


@st.composite
def pair_batches(draw, max_d: int = 5):
    """A batch (H, D, n_a), (H, D, n_b) of random pairs with n >= D + 1, plus a generator for more draws."""
    seed = draw(st.integers(0, 2**31 - 1))
    heads, dim = draw(st.integers(1, 3)), draw(st.integers(1, max_d))
    n_a, n_b = dim + draw(st.integers(1, 4)), dim + draw(st.integers(1, 4))
    scale_a, scale_b = 10.0 ** draw(st.floats(-2, 2)), 10.0 ** draw(st.floats(-2, 2))
    gen = torch.Generator().manual_seed(seed)
    pair_a = scale_a * torch.randn(heads, dim, n_a, generator=gen, dtype=F64)
    pair_b = scale_b * torch.randn(heads, dim, n_b, generator=gen, dtype=F64)
    return pair_a, pair_b, gen


def inner(x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Per-pair Euclidean inner product of two steps, shape (H,)."""
    return (x[0] * y[0]).sum((-1, -2)) + (x[1] * y[1]).sum((-1, -2))


def norm(x) -> torch.Tensor:
    return inner(x, x).sqrt()


def random_step(pair_a, pair_b, gen):
    return (
        torch.randn(pair_a.shape, generator=gen, dtype=F64) * pair_a.abs().mean(),
        torch.randn(pair_b.shape, generator=gen, dtype=F64) * pair_b.abs().mean(),
    )


def brute_force_projection(pair_a, pair_b, step_a, step_b):
    """Independent oracle for one pair: project onto the span of (E_ij A, -E_ij^T B) by least squares."""
    dim = pair_a.shape[0]
    basis = []
    for i in range(dim):
        for j in range(dim):
            unit = torch.zeros(dim, dim, dtype=F64)
            unit[i, j] = 1
            ta, tb = factor_pairs.tangent_step(pair_a, pair_b, unit)
            basis.append(torch.cat([ta.flatten(), tb.flatten()]))
    tangent = torch.stack(basis, dim=1)  # (D*n_a + D*n_b, D^2), possibly rank-deficient
    target = torch.cat([step_a.flatten(), step_b.flatten()])
    coeffs = torch.linalg.lstsq(tangent, target, driver="gelsd").solution
    projected = tangent @ coeffs
    return projected[: step_a.numel()].reshape(step_a.shape), projected[step_a.numel() :].reshape(
        step_b.shape
    )


@PROPERTY
@given(pair_batches())
def test_projection_is_idempotent(batch):
    pair_a, pair_b, gen = batch
    step = random_step(pair_a, pair_b, gen)
    once = factor_pairs.tangent_projection(pair_a, pair_b, *step)
    twice = factor_pairs.tangent_projection(pair_a, pair_b, *once)
    difference = (twice[0] - once[0], twice[1] - once[1])
    # relative to the size of the step being projected
    assert torch.all(norm(difference) <= 1e-10 * norm(step))


@PROPERTY
@given(pair_batches())
def test_projection_is_orthogonal_to_every_tangent(batch):
    pair_a, pair_b, gen = batch
    step = random_step(pair_a, pair_b, gen)
    projected = factor_pairs.tangent_projection(pair_a, pair_b, *step)
    residual = (step[0] - projected[0], step[1] - projected[1])
    dim = pair_a.shape[-2]
    for _ in range(3):
        tangent = factor_pairs.tangent_step(pair_a, pair_b, torch.randn(dim, dim, generator=gen, dtype=F64))
        # Cauchy-Schwarz scale: |<r, t>| <= ||r|| ||t||, so compare with ||step|| ||t||
        assert torch.all(inner(residual, tangent).abs() <= 1e-10 * norm(step) * norm(tangent))


@PROPERTY
@given(pair_batches())
def test_unidentified_norm_shortcut_equals_the_projection_norm(batch):
    pair_a, pair_b, gen = batch
    step = random_step(pair_a, pair_b, gen)
    projected = factor_pairs.tangent_projection(pair_a, pair_b, *step)
    sq_norm, singular = factor_pairs.unidentified_sq_norm(pair_a, pair_b, *step)
    assert not bool(singular.any())
    # both relative to ||step||^2, the scale of the quantity
    assert torch.all((sq_norm - inner(projected, projected)).abs() <= 1e-10 * inner(step, step))


@PROPERTY
@given(pair_batches(max_d=3))
def test_projection_matches_least_squares_oracle(batch):
    pair_a, pair_b, gen = batch
    step = random_step(pair_a, pair_b, gen)
    projected = factor_pairs.tangent_projection(pair_a, pair_b, *step)
    for head in range(pair_a.shape[0]):
        expected = brute_force_projection(pair_a[head], pair_b[head], step[0][head], step[1][head])
        error = norm(
            (projected[0][head : head + 1] - expected[0], projected[1][head : head + 1] - expected[1])
        )
        assert float(error) <= 1e-9 * float(norm((step[0][head : head + 1], step[1][head : head + 1])))


def test_singular_pair_is_counted_and_still_projected_exactly():
    """A, B sharing a null row: A A^T + B B^T is singular; the pseudo-inverse solve is still the
    projection."""
    gen = torch.Generator().manual_seed(3)
    pair_a = torch.randn(1, 3, 5, generator=gen, dtype=F64)
    pair_b = torch.randn(1, 3, 4, generator=gen, dtype=F64)
    pair_a[:, 0], pair_b[:, 0] = 0, 0
    step = random_step(pair_a, pair_b, gen)
    generator, singular = factor_pairs.tangent_solve(pair_a, pair_b, *step)
    assert singular.tolist() == [True]
    projected = factor_pairs.tangent_step(pair_a, pair_b, generator)
    expected = brute_force_projection(pair_a[0], pair_b[0], step[0][0], step[1][0])
    assert float(norm((projected[0] - expected[0], projected[1] - expected[1]))) <= 1e-10 * float(norm(step))
    assert float(norm(projected)) > 0.1 * float(norm(step))  # not silently zeroed
    zero = torch.zeros(1, 3, 5, dtype=F64), torch.zeros(1, 3, 4, dtype=F64)
    assert float(norm(factor_pairs.tangent_projection(*zero, *step))) == 0.0


def rho(pair_a, pair_b, step_a, step_b) -> torch.Tensor:
    proj = factor_pairs.tangent_projection(pair_a, pair_b, step_a, step_b)
    return inner(proj, proj) / inner((step_a, step_b), (step_a, step_b))


@PROPERTY
@given(pair_batches())
def test_pure_tangent_step_has_rho_one(batch):
    pair_a, pair_b, gen = batch
    dim = pair_a.shape[-2]
    step = factor_pairs.tangent_step(pair_a, pair_b, torch.randn(dim, dim, generator=gen, dtype=F64))
    assert torch.all((rho(pair_a, pair_b, *step) - 1).abs() <= 1e-10)


@PROPERTY
@given(pair_batches(), st.sampled_from(["linear", "quadratic", "logsumexp"]))
def test_gradient_of_any_function_of_the_product_has_no_unidentified_part(batch, kind):
    """Lemma 5.1's premise: d f(A^T B) is orthogonal to the orbit, so rho ~ float64 round-off squared."""
    pair_a, pair_b, gen = batch
    pair_a, pair_b = pair_a.clone().requires_grad_(), pair_b.clone().requires_grad_()
    product = pair_a.transpose(-1, -2) @ pair_b  # (H, n_a, n_b)
    weights = torch.randn(product.shape, generator=gen, dtype=F64)
    if kind == "linear":
        value = (weights * product).sum()
    elif kind == "quadratic":
        value = (product @ weights.transpose(-1, -2) @ product).square().sum()
    else:
        # scaled so that softmax does not saturate (a saturated one has an exactly zero gradient)
        value = torch.logsumexp((weights * product / product.detach().abs().amax()).flatten(), 0)
    grad_a, grad_b = torch.autograd.grad(value, (pair_a, pair_b))
    ratio = rho(pair_a.detach(), pair_b.detach(), grad_a, grad_b)
    assert torch.all(ratio < 1e-20)


def random_symmetric(dim: int, heads: int, gen, scale: float) -> torch.Tensor:
    """An indefinite symmetric target: the imbalance of another random pair."""
    other_a = torch.randn(heads, dim, dim + 2, generator=gen, dtype=F64)
    other_b = torch.randn(heads, dim, dim + 1, generator=gen, dtype=F64)
    return scale * factor_pairs.imbalance(other_a, other_b)


@PROPERTY
@given(pair_batches(), st.sampled_from(["balanced", "initial"]), st.floats(-2, 2))
def test_rebalancing_keeps_the_product_and_hits_the_target(batch, target_kind, log_target_scale):
    pair_a, pair_b, gen = batch
    heads, dim = pair_a.shape[:2]
    if target_kind == "balanced":
        target = torch.zeros(heads, dim, dim, dtype=F64)
    else:
        # a target on the scale of the product's singular values (times 10^[-2, 2]): a target far
        # larger makes A' huge and B' tiny, and A'^T B' then carries eps * ||A'|| ||B'|| >> eps ||A^T B||
        product_scale = float(torch.linalg.matrix_norm(pair_a.transpose(-1, -2) @ pair_b, ord=2).max())
        target = random_symmetric(dim, heads, gen, 10.0**log_target_scale * product_scale / dim)
    new_a, new_b, done = factor_pairs.rebalance_pairs(pair_a, pair_b, target)
    assert bool(done.all())  # random pairs have well-conditioned products
    product = pair_a.transpose(-1, -2) @ pair_b
    new_product = new_a.transpose(-1, -2) @ new_b
    # product relative to its own size, and relative to the factors' sizes (what float64 guarantees)
    assert torch.all(
        torch.linalg.matrix_norm(new_product - product)
        <= 1e-13 * torch.linalg.matrix_norm(new_a) * torch.linalg.matrix_norm(new_b)
    )
    assert torch.all(
        torch.linalg.matrix_norm(new_product - product) <= 1e-12 * torch.linalg.matrix_norm(product)
    )
    # imbalance relative to the size of the two Gram matrices it is the difference of
    gram_scale = torch.linalg.matrix_norm(factor_pairs.gram(new_a)) + torch.linalg.matrix_norm(
        factor_pairs.gram(new_b)
    )
    assert torch.all(
        torch.linalg.matrix_norm(factor_pairs.imbalance(new_a, new_b) - target) <= 1e-10 * gram_scale
    )


@PROPERTY
@given(pair_batches(), st.floats(-8, 0))
def test_step_products_are_the_two_products_of_a_step(batch, log_step_scale):
    """The drift split's products (docs/design.md §7), one call of twice the width: ``dA A^T`` and
    ``dA dA^T``, each against the product computed on its own (to float64 round-off of the sums)."""
    pair_a, _, gen = batch
    step_a = 10.0**log_step_scale * torch.randn(pair_a.shape, generator=gen, dtype=F64)
    cross, step_gram = factor_pairs.step_products(step_a, pair_a)
    assert cross.shape == step_gram.shape == (*pair_a.shape[:-1], pair_a.shape[-2])
    # each entry is a sum of n products: its round-off is a few eps times the sum of their sizes
    tolerance = 8 * pair_a.shape[-1] * torch.finfo(F64).eps
    cross_scale = step_a.abs() @ pair_a.abs().transpose(-1, -2)
    gram_scale = step_a.abs() @ step_a.abs().transpose(-1, -2)
    assert ((cross - step_a @ pair_a.transpose(-1, -2)).abs() <= tolerance * cross_scale).all()
    assert ((step_gram - factor_pairs.gram(step_a)).abs() <= tolerance * gram_scale).all()


@PROPERTY
@given(pair_batches())
def test_excess_norm_is_nonnegative_and_zero_after_balancing(batch):
    pair_a, pair_b, _ = batch
    frob, twice_nuclear = factor_pairs.excess_norm_terms(pair_a, pair_b)
    nuclear = torch.linalg.matrix_norm(pair_a.transpose(-1, -2) @ pair_b, ord="nuc")
    assert torch.allclose(twice_nuclear, 2 * nuclear, rtol=1e-12, atol=0)
    assert torch.all(frob / twice_nuclear - 1 >= 0)
    heads, dim = pair_a.shape[:2]
    new_a, new_b, _ = factor_pairs.rebalance_pairs(pair_a, pair_b, torch.zeros(heads, dim, dim, dtype=F64))
    frob, twice_nuclear = factor_pairs.excess_norm_terms(new_a, new_b)
    assert torch.all((frob / twice_nuclear - 1).abs() <= 1e-12)


def test_rank_deficient_product_is_skipped():
    gen = torch.Generator().manual_seed(5)
    pair_a = torch.randn(2, 3, 6, generator=gen, dtype=F64)
    pair_b = torch.randn(2, 3, 6, generator=gen, dtype=F64)
    pair_b[1, 2] = 1e-9 * pair_b[1, 1]  # second head's product has s_min / s_max ~ 1e-9
    new_a, new_b, done = factor_pairs.rebalance_pairs(pair_a, pair_b, torch.zeros(2, 3, 3, dtype=F64))
    assert done.tolist() == [True, False]
    assert torch.equal(new_a[1], pair_a[1]) and torch.equal(new_b[1], pair_b[1])
    assert not torch.equal(new_a[0], pair_a[0])
    assert factor_pairs.rebalance_pair(pair_a[1], pair_b[1], torch.zeros(3, 3, dtype=F64)) is None
    assert factor_pairs.rebalance_pair(pair_a[0], pair_b[0], torch.zeros(3, 3, dtype=F64)) is not None


# ------------------------------------------------------------------ pairs in a real model


def tiny_gpt(bias: bool, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=8, vocab_size=13, n_layer=2, n_head=3, n_embd=12, bias=bias)).double()
    with torch.no_grad():  # nanoGPT zero-inits biases: make them nonzero so they matter in the tests
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    return model.eval()


def test_pairs_reproduce_the_attention_products():
    """[x;1]^T A^T B [y;1] is head h's q.k, and B^T A [x;1] is its output-projected value."""
    model = tiny_gpt(bias=True)
    attn = model.transformer.h[1].attn
    x, y = torch.randn(12, dtype=F64), torch.randn(12, dtype=F64)
    with torch.no_grad():
        q, _, v = attn.c_attn(x).split(12)  # query and value of token x: (E,) each
        k = attn.c_attn(y).split(12)[1]  # key of token y
        projected_values = [attn.c_proj.weight[:, 4 * h : 4 * h + 4] @ v[4 * h : 4 * h + 4] for h in range(3)]
    tensors, layout = (attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight), layout_of(model)
    query, key = pairs_from_tensors(*tensors, layout, "qk")
    value, output = pairs_from_tensors(*tensors, layout, "ov")
    x1, y1 = torch.cat([x, torch.ones(1, dtype=F64)]), torch.cat([y, torch.ones(1, dtype=F64)])
    for head in range(3):
        rows = slice(4 * head, 4 * head + 4)
        assert torch.allclose(x1 @ query[head].T @ key[head] @ y1, q[rows] @ k[rows], rtol=1e-12, atol=1e-14)
        assert torch.allclose(
            output[head].T @ value[head] @ x1, projected_values[head], rtol=1e-12, atol=1e-14
        )


def test_write_back_is_the_inverse_of_extraction_and_the_orbit_is_a_symmetry():
    for bias in (True, False):
        model = tiny_gpt(bias=bias)
        idx = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(1))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            logits_before, _ = model(idx, idx)
        gen = torch.Generator().manual_seed(2)
        for circuit in CIRCUITS:
            per_layer = model_pairs(model, circuit)
            write_pairs_back(model, circuit, per_layer)
            assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        for circuit in CIRCUITS:
            moved = []
            for pair_a, pair_b in model_pairs(model, circuit):
                group = torch.eye(4, dtype=F64) + 0.3 * torch.randn(3, 4, 4, generator=gen, dtype=F64)
                moved.append((group @ pair_a, torch.linalg.inv(group).transpose(-1, -2) @ pair_b))
            write_pairs_back(model, circuit, moved)
        changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
        assert sorted(changed) == sorted(
            k for k in before if ".attn.c_attn." in k or k.endswith("attn.c_proj.weight")
        )
        with torch.no_grad():
            logits_after, _ = model(idx, idx)
        assert torch.allclose(
            logits_after, logits_before, rtol=0, atol=1e-12 * float(logits_before.abs().max())
        )
