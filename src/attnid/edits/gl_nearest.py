"""The point of a factor pair's GL(D) orbit nearest another pair (docs/design.md §17, ``ov_gl``/``qk_gl``).

For one key/value group, ``M`` in GL(D) minimising

    f(M) = ||A_1 - M B_1||^2 + ||A_2 - M^-T B_2||^2

(``B_1``: ``W_V | b_V``, or the group's query heads; ``B_2``: the ``W_O^{h T}``, or ``W_K | b_K``), from the
identity (the current point), by Gauss-Newton. With ``N = M^-T``, ``R_1 = A_1 - M B_1``, ``U = N B_2``,
``R_2 = A_2 - U``: the gradient is ``-2 R_1 B_1^T + 2 N B_2 R_2^T N``, and the residuals' linearisation
(``dR_2 = N dM^T U``) makes the model's quadratic ``<dM, dM P + L dM K>`` with ``P = B_1 B_1^T``,
``K = N^T N``, ``L = U U^T``, all symmetric positive (semi)definite. Its minimiser solves the generalized
Sylvester equation ``dM P + L dM K = -gradient / 2``, in closed form in ``O(D^3)``: with ``W`` such that
``W^T K W = I``, ``W^T P W = diag(lambda)`` and ``L = V diag(omega) V^T``, ``dM = V Y W^T`` with
``Y_ij = (V^T C W)_ij / (omega_i + lambda_j)``. A backtracking line search keeps every step a decrease, so
the objective never rises; it stops when a step moves ``M`` by less than ``tolerance`` (relative), where a
second alignment, starting there, moves no further. L-BFGS (the RoPE commutant's solver, whose variables
are few) needs hundreds of iterations here: the pair's spectra make ``f`` badly conditioned in ``M``'s
entries, which the Sylvester step undoes.
"""

from __future__ import annotations

import math

import torch

ARMIJO = 1e-4  # a step is kept when f falls by at least this share of the model's predicted decrease
SMALLEST_STEP = 2.0**-40  # the line search's shortest step: below it, no decrease is left to find
SLOW_RATE = 0.5  # a Gauss-Newton step longer than this share of the one before: Newton's steps from then on
NEWTON_MAX_DIM = 64  # Newton's Hessian is D^2 x D^2: 128 MiB at D = 64


def objective(m: torch.Tensor, pair: tuple) -> float:
    """``f(M)``; ``inf`` where ``M`` is singular."""
    a1, b1, a2, b2 = pair
    try:
        n = torch.linalg.inv(m).T
    except torch.linalg.LinAlgError:
        return float("inf")
    return float((a1 - m @ b1).square().sum() + (a2 - n @ b2).square().sum())


def gradient(m: torch.Tensor, pair: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``f``'s gradient at ``M``, and the ``K``, ``L`` of the Gauss-Newton model there."""
    a1, b1, a2, b2 = pair
    n = torch.linalg.inv(m).T
    u = n @ b2
    grad = -2 * (a1 - m @ b1) @ b1.T + 2 * n @ b2 @ (a2 - u).T @ n
    return grad, n.T @ n, u @ u.T


def sylvester_step(p: torch.Tensor, k: torch.Tensor, lhs: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``X`` with ``X P + L X K = C`` (``L``: ``lhs``; ``P``, ``K``, ``L`` symmetric, ``K`` positive
    definite)."""
    chol = torch.linalg.cholesky(k)  # K = C C^T
    inv_chol = torch.linalg.solve_triangular(chol, torch.eye(k.shape[0], dtype=k.dtype), upper=False)
    lam, q = torch.linalg.eigh(inv_chol @ p @ inv_chol.T)
    w = inv_chol.T @ q  # W^T K W = I, W^T P W = diag(lam)
    omega, v = torch.linalg.eigh(lhs)
    y = (v.T @ c @ w) / (omega[:, None] + lam[None, :])
    return v @ y @ w.T


def newton_step(m: torch.Tensor, pair: tuple, grad: torch.Tensor, p: torch.Tensor) -> torch.Tensor | None:
    """Newton's step at ``M`` (the Gauss-Newton model plus the residual's own curvature), or None where
    that Hessian is not positive definite. ``f(M + X) = f + <G, X> + <X, X P> + <X, L X K> - 2 c(X)``,
    ``c(X) = tr(R_2^T N X^T N X^T U)``: in ``X``'s row-major entries ``I (x) P + L (x) K - 2 S``, ``S`` the
    symmetric part of ``C[(c, b), (e, d)] = (U R_2^T N)_{eb} N_{cd}``."""
    a1, b1, a2, b2 = pair
    d = m.shape[0]
    n = torch.linalg.inv(m).T
    u = n @ b2
    t = u @ (a2 - u).T @ n
    c = torch.einsum("eb,cd->cbed", t, n).reshape(d * d, d * d)
    eye = torch.eye(d, dtype=torch.float64)
    half_hessian = torch.kron(eye, p) + torch.kron(u @ u.T, n.T @ n) - (c + c.T)
    chol, info = torch.linalg.cholesky_ex(half_hessian)
    if int(info):
        return None
    return torch.cholesky_solve(-grad.reshape(-1, 1) / 2, chol).reshape(d, d)


def gl_nearest(pair: tuple, tolerance: float, max_iterations: int) -> tuple[torch.Tensor, int]:
    """``M`` (``D x D``) minimising ``f`` from the identity, and the iterations taken. ``pair``:
    ``(A_1, B_1, A_2, B_2)``, float64, ``(D, n_1)`` and ``(D, n_2)``. Gauss-Newton first (a planted
    element, whose residual is zero, is reached in a few steps, each ``O(D^3)``, each much shorter than the
    one before); once a step is longer than :data:`SLOW_RATE` of the one before, the residual's curvature
    counts (two seeds: a slow linear rate without it) and Newton's step is taken, where its Hessian is
    positive definite and ``D`` is at most :data:`NEWTON_MAX_DIM` (its ``D^2 x D^2`` Hessian)."""
    b1 = pair[1]
    d = b1.shape[0]
    m = torch.eye(d, dtype=torch.float64)
    p = b1 @ b1.T
    # a floor under the model's curvature: a head whose B_1 or B_2 has lost rank still gets a finite step
    ridge = 1e-12 * float(p.trace()) / d
    value, iterations, previous, newton = objective(m, pair), 0, math.inf, False
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (the count is reported)
        grad, k, lhs = gradient(m, pair)
        eye = torch.eye(d, dtype=torch.float64)
        step = newton_step(m, pair, grad, p) if newton else None
        if step is None:
            step = sylvester_step(p + ridge * eye, k, lhs + ridge * eye, -grad / 2)
        slope = float((grad * step).sum())  # < 0: the model is positive definite
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
        # Gauss-Newton's steps shrink fast where the residual is small (a planted element); where they
        # shrink slowly (two seeds), the residual's curvature counts: Newton's step from then on
        newton = newton or (d <= NEWTON_MAX_DIM and length > SLOW_RATE * previous)
        previous = length
    return m, iterations
