"""The GL(D) orbit's nearest point (attnid.edits.gl_nearest, docs/design.md §17): the gradient is the
objective's, the Sylvester step solves its equation, a planted ``M`` is found to rounding, and on a pair
that is not one orbit the result is stationary and never worse than the start."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnid.edits.gl_nearest import (
    gl_nearest,
    gradient,
    half_hessian_times,
    newton_step,
    objective,
    sylvester_solver,
)


def _random(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


def _planted(d: int, n1: int, n2: int, seed: int) -> tuple[tuple, torch.Tensor]:
    """``A`` and ``B = (M^-1 A_1, M^T A_2)`` for a well-conditioned ``M``: ``B``'s nearest point is ``A``."""
    g = torch.Generator().manual_seed(seed)
    a1, a2 = _random(g, d, n1), _random(g, d, n2)
    u, _ = torch.linalg.qr(_random(g, d, d))
    v, _ = torch.linalg.qr(_random(g, d, d))
    m = u @ torch.diag(2 ** (torch.rand(d, generator=g, dtype=torch.float64) - 0.5)) @ v.T
    return (a1, torch.linalg.solve(m, a1), a2, m.T @ a2), m


def _objective_of(pair: tuple, d: int):
    """``f`` of ``M``'s entries, in autograd (the reference of the closed forms)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        m = x.reshape(d, d)
        return (pair[0] - m @ pair[1]).square().sum() + (
            pair[2] - torch.linalg.inv(m).T @ pair[3]
        ).square().sum()

    return f


def _random_point(d: int, n1: int, n2: int, spread: float, seed: int) -> tuple:
    """A random pair of sides, an ``M`` near the identity and the generator, for more draws."""
    g = torch.Generator().manual_seed(seed)
    pair = (_random(g, d, n1), _random(g, d, n1), _random(g, d, n2), _random(g, d, n2))
    return pair, torch.eye(d, dtype=torch.float64) + spread * _random(g, d, d), g


def _at(m: torch.Tensor, pair: tuple) -> tuple:
    """``P``, ``N``, ``U``, ``W_2`` of the Hessian product at ``M``."""
    _, n, u, w2 = gradient(m, pair)
    return pair[1] @ pair[1].T, n, u, w2


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_the_gradient_is_the_objectives(d, seed) -> None:
    pair, m, _ = _random_point(d, 7, 5, 0.2, seed)
    x = m.flatten().clone().requires_grad_()
    (expected,) = torch.autograd.grad(_objective_of(pair, d)(x), x)
    assert torch.allclose(gradient(m, pair)[0], expected.reshape(d, d), rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_the_hessian_product_is_half_the_objectives_hessian(d, seed) -> None:
    pair, m, g = _random_point(d, 6, 4, 0.3, seed)
    hessian = torch.autograd.functional.hessian(_objective_of(pair, d), m.flatten())
    x = _random(g, d, d)
    assert torch.allclose(
        half_hessian_times(x, *_at(m, pair)).flatten(), hessian @ x.flatten() / 2, atol=1e-8
    )


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_the_sylvester_step_solves_its_equation(d, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    eye = torch.eye(d, dtype=torch.float64)
    p, k, l_ = (x @ x.T + 0.1 * eye for x in (_random(g, d, d) for _ in range(3)))
    c = _random(g, d, d)
    x = sylvester_solver(p, k, l_)(c)
    assert torch.allclose(x @ p + l_ @ x @ k, c, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize(("d", "seed"), [(4, 0), (8, 1), (16, 2)])
def test_a_planted_element_is_found_to_rounding(d, seed) -> None:
    pair, m = _planted(d, 3 * d, 2 * d, seed)
    found, iterations = gl_nearest(pair, 1e-12, 500)
    assert iterations < 20  # Gauss-Newton's own: the residual is zero there
    assert objective(found, pair) <= 1e-20 * float(pair[0].square().sum() + pair[2].square().sum())
    assert torch.allclose(found, m, rtol=1e-9, atol=1e-9)
    moved = (pair[0], found @ pair[1], pair[2], torch.linalg.inv(found).T @ pair[3])
    again, _ = gl_nearest(moved, 1e-12, 500)
    assert torch.allclose(again, torch.eye(d, dtype=torch.float64), atol=1e-9)  # idempotent


@pytest.mark.parametrize(("d", "seed"), [(3, 0), (6, 1), (12, 2)])
def test_an_unrelated_pair_ends_stationary_and_never_worse(d, seed) -> None:
    """Two unrelated pairs (a large residual: Gauss-Newton alone converges slowly, Newton's step ends it):
    the gradient vanishes to rounding, the objective is below the start's, and a second solve from the
    result stays there."""
    g = torch.Generator().manual_seed(seed)
    pair = (_random(g, d, 3 * d), _random(g, d, 3 * d), _random(g, d, 2 * d), _random(g, d, 2 * d))
    eye = torch.eye(d, dtype=torch.float64)
    found, iterations = gl_nearest(pair, 1e-12, 500)
    assert iterations < 500
    assert objective(found, pair) < objective(eye, pair)
    scale = float(pair[0].square().sum() + pair[2].square().sum())
    assert float(gradient(found, pair)[0].norm()) <= 1e-9 * scale
    moved = (pair[0], found @ pair[1], pair[2], torch.linalg.inv(found).T @ pair[3])
    again, _ = gl_nearest(moved, 1e-12, 500)
    assert float((again - eye).norm()) <= 1e-8


def test_the_newton_step_is_a_descent_direction_where_the_hessian_is_indefinite() -> None:
    """Far from the minimum the residual's curvature can make the Hessian indefinite: conjugate gradients
    stop at the negative curvature (Steihaug), and the step still goes downhill; where the Hessian is
    positive definite, it is Newton's step."""
    g = torch.Generator().manual_seed(3)
    pair = (_random(g, 2, 2), _random(g, 2, 2), 10 * _random(g, 2, 2), 0.01 * _random(g, 2, 2))
    definite = []
    for scale in (0.05, 0.2, 1.0, 5.0):
        m = scale * torch.eye(2, dtype=torch.float64)
        grad = gradient(m, pair)[0]
        p, n, u, w2 = _at(m, pair)
        step = newton_step(-grad / 2, p, n, u, w2, sylvester_solver(p, n.T @ n, u @ u.T))
        assert float((grad * step).sum()) < 0
        hessian = torch.autograd.functional.hessian(_objective_of(pair, 2), m.flatten())
        if bool((torch.linalg.eigvalsh(hessian) > 0).all()):
            definite.append(True)
            assert torch.allclose(step.flatten(), -torch.linalg.solve(hessian, grad.flatten()), atol=1e-8)
        else:
            definite.append(False)
    assert any(definite) and not all(definite)
