"""The point of a factor pair's GL(D) orbit nearest another pair (docs/design.md §17, ``ov_gl``/``qk_gl``).

For one key/value group, ``M`` in GL(D) minimising

    f(M) = ||A_1 - M B_1||^2 + ||A_2 - M^-T B_2||^2

(``B_1``: ``W_V | b_V``, or the group's query heads; ``B_2``: the ``W_O^{h T}``, or ``W_K | b_K``), from the
identity (the current point), by Newton's method. With ``N = M^-T``, ``R_1 = A_1 - M B_1``, ``U = N B_2``,
``R_2 = A_2 - U``: the gradient is ``-2 R_1 B_1^T + 2 N B_2 R_2^T N``, and ``f(M + X) = f + <G, X> +
<X, X P> + <X, L X K> - 2 c(X)`` to second order, with ``P = B_1 B_1^T``, ``K = N^T N``, ``L = U U^T`` (the
residuals' linearisation, Gauss-Newton's model) and ``c(X) = tr(R_2^T N X^T N X^T U)`` (the residual's own
curvature, zero at a planted element). Gauss-Newton's model alone is a generalized Sylvester equation,
``X P + L X K = C``, solved in closed form in ``O(D^3)`` (``W^T K W = I``, ``W^T P W = diag(lambda)``,
``L = V diag(omega) V^T``: ``X = V Y W^T``, ``Y_ij = (V^T C W)_ij / (omega_i + lambda_j)``); Newton's step
is found by conjugate gradients preconditioned by that solve, each iteration a Hessian product in
``O(D^2 n)``, never the ``D^2 x D^2`` Hessian. A backtracking line search keeps every step a decrease; it
stops when a step moves ``M`` by less than ``tolerance`` (relative), a stationary point to rounding, where a
second alignment starts and stays. L-BFGS (the RoPE commutant's solver, whose variables are few) needs
hundreds of iterations here: the pair's spectra make ``f`` badly conditioned in ``M``'s entries, which the
preconditioner undoes; Gauss-Newton alone converges slowly where the residual is large (two seeds).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

ARMIJO = 1e-4  # a step is kept when f falls by at least this share of the model's predicted decrease
SMALLEST_STEP = 2.0**-40  # the line search's shortest step: below it, no decrease is left to find
SLOW_RATE = 0.5  # a Gauss-Newton step longer than this share of the one before: Newton's from then on
CG_MAX_ITERATIONS = 50  # per Newton step
CG_TOLERANCE = 1e-8  # the Newton system solved to this share of its right-hand side


def objective(m: torch.Tensor, pair: tuple) -> float:
    """``f(M)``; ``inf`` where ``M`` is singular."""
    a1, b1, a2, b2 = pair
    try:
        n = torch.linalg.inv(m).T
    except torch.linalg.LinAlgError:
        return float("inf")
    return float((a1 - m @ b1).square().sum() + (a2 - n @ b2).square().sum())


def gradient(m: Tensor, pair: tuple) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``f``'s gradient at ``M``, ``-2 R_1 B_1^T + 2 W_2``; ``N = M^-T``, ``U = N B_2`` and
    ``W_2 = U R_2^T N`` (the Hessian product's)."""
    a1, b1, a2, b2 = pair
    n = torch.linalg.inv(m).T
    u = n @ b2
    w2 = u @ (a2 - u).T @ n
    return -2 * (a1 - m @ b1) @ b1.T + 2 * w2, n, u, w2


def sylvester_solver(p: torch.Tensor, k: torch.Tensor, lhs: torch.Tensor) -> Callable[[Tensor], Tensor]:
    """``C -> X`` with ``X P + L X K = C`` (``L``: ``lhs``; ``P``, ``K``, ``L`` symmetric positive
    definite), factored once: ``W^T K W = I``, ``W^T P W = diag(lambda)``, ``L = V diag(omega) V^T``."""
    chol = torch.linalg.cholesky(k)  # K = C C^T
    inv_chol = torch.linalg.solve_triangular(chol, torch.eye(k.shape[0], dtype=k.dtype), upper=False)
    lam, q = torch.linalg.eigh(inv_chol @ p @ inv_chol.T)
    w = inv_chol.T @ q
    omega, v = torch.linalg.eigh(lhs)
    denominator = omega[:, None] + lam[None, :]
    return lambda c: v @ ((v.T @ c @ w) / denominator) @ w.T


def half_hessian_times(x: Tensor, p: Tensor, n: Tensor, u: Tensor, w2: Tensor) -> Tensor:
    """Half ``f``'s Hessian at ``M`` applied to ``X``: ``X P + L X K - grad c(X)`` (``L = U U^T``, ``K =
    N^T N``), ``c(X) = tr(R_2^T N X^T N X^T U)`` the residual's own curvature, ``grad c(X) = N X^T W_2 +
    W_2 X^T N`` with ``W_2 = U R_2^T N``."""
    return x @ p + u @ (u.T @ x @ n.T) @ n - n @ x.T @ w2 - w2 @ x.T @ n


def newton_step(
    x_rhs: Tensor, p: Tensor, n: Tensor, u: Tensor, w2: Tensor, precondition: Callable[[Tensor], Tensor]
) -> Tensor:
    """Newton's step (half Hessian times it equals ``x_rhs``), by conjugate gradients preconditioned by the
    Gauss-Newton solve; stopped where the Hessian shows negative curvature (Steihaug), so the step is
    always a descent direction, the Gauss-Newton step at worst (the first iterate's direction)."""
    x = torch.zeros_like(x_rhs)
    r = x_rhs.clone()
    z = precondition(r)
    direction, rz = z, float((r * z).sum())
    size = float(x_rhs.norm())
    for _ in range(CG_MAX_ITERATIONS):
        product = half_hessian_times(direction, p, n, u, w2)
        curvature = float((direction * product).sum())
        if curvature <= 0:
            return x if bool(x.any()) else z
        alpha = rz / curvature
        x = x + alpha * direction
        r = r - alpha * product
        if float(r.norm()) <= CG_TOLERANCE * size:
            break
        z = precondition(r)
        rz, previous = float((r * z).sum()), rz
        direction = z + (rz / previous) * direction
    return x


def gl_nearest(pair: tuple, tolerance: float, max_iterations: int) -> tuple[Tensor, int]:
    """``M`` (``D x D``) minimising ``f`` from the identity, and the iterations taken. ``pair``:
    ``(A_1, B_1, A_2, B_2)``, float64, ``(D, n_1)`` and ``(D, n_2)``. Gauss-Newton's steps first (a planted
    element, whose residual is zero, is reached in a few); once a step is longer than :data:`SLOW_RATE` of
    the one before, Newton's, by conjugate gradients preconditioned by Gauss-Newton (two seeds, whose
    residual's curvature counts: tens of steps, not the hundreds Gauss-Newton or L-BFGS take). Each step
    then a backtracking line search."""
    b1 = pair[1]
    d = b1.shape[0]
    eye = torch.eye(d, dtype=torch.float64)
    m = eye.clone()
    p = b1 @ b1.T
    # a floor under the model's curvature: a head whose B_1 or B_2 has lost rank still gets a finite step
    ridge = 1e-12 * float(p.trace()) / d * eye
    p_floored = p + ridge
    value, iterations, previous, newton = objective(m, pair), 0, math.inf, False
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (the count is reported)
        grad, n, u, w2 = gradient(m, pair)
        gauss_newton = sylvester_solver(p_floored, n.T @ n, u @ u.T + ridge)
        if newton:
            step = newton_step(-grad / 2, p, n, u, w2, gauss_newton)
        else:
            step = gauss_newton(-grad / 2)
        slope = float((grad * step).sum())  # < 0: a descent direction
        t = 1.0
        while t >= SMALLEST_STEP:
            candidate = m + t * step
            new = objective(candidate, pair)
            if new <= value + ARMIJO * t * slope:
                break
            t /= 2
        else:
            break  # no decrease left at rounding: a stationary point
        m, value, length = candidate, new, t * float(step.norm())
        if length <= tolerance * float(m.norm()):
            break
        # Gauss-Newton's model is convex, so its steps head for the global minimum of a planted element
        # from far away and shrink fast where the residual is small; where they shrink slowly (two seeds),
        # the residual's curvature counts: Newton's steps from then on
        newton = newton or length > SLOW_RATE * previous
        previous = length
    return m, iterations
