"""Orthogonal matrices for the rotation moves (docs/design.md §16): Hadamard matrices, Haar-random
rotations, and the residual-stream rotation ``R1`` of an architecture (which must fix ``1_E`` under
LayerNorm).

A Hadamard matrix of order ``n`` (entries ``±1``, ``H H^T = n I``) exists only for ``n`` = 1, 2 or a
multiple of 4. Built here: Sylvester's ``2^k``, Paley's first construction (order ``q + 1``, ``q ≡ 3 mod 4``
prime) and second (order ``2(q + 1)``, ``q ≡ 1 mod 4`` prime), and their Kronecker products: 576 =
36 · 16 (Paley II of 17 times Sylvester 16) for SmolLM2, 12 = Paley I of 11, ... (QuaRot ships a table of
such matrices; these are built). Each is normalised so that its first column is all ones, so the
scaled matrix ``H / sqrt(n)`` maps ``e_1`` to ``1_n / sqrt(n)``.
"""

from __future__ import annotations

import math

import torch

SEARCH_LIMIT = 1 << 16  # Hadamard orders tried up to this


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % p for p in range(2, math.isqrt(q) + 1))


def _jacobsthal(q: int) -> torch.Tensor:
    """``Q[i, j] = chi(j - i)``, the quadratic character of ``GF(q)`` (``q`` prime)."""
    squares = {(x * x) % q for x in range(1, q)}
    chi = torch.tensor([0] + [1 if x in squares else -1 for x in range(1, q)], dtype=torch.float64)
    index = (torch.arange(q)[None, :] - torch.arange(q)[:, None]) % q
    return chi[index]


def _paley(order: int) -> torch.Tensor | None:
    """A Hadamard matrix of ``order`` from a Paley construction over a prime field, or None."""
    q = order - 1
    if q % 4 == 3 and _is_prime(q):  # Paley I
        jac = _jacobsthal(q)
        core = torch.zeros(order, order, dtype=torch.float64)
        core[0, 1:] = 1
        core[1:, 0] = -1
        core[1:, 1:] = jac
        return core + torch.eye(order, dtype=torch.float64)
    q = order // 2 - 1
    if order % 2 == 0 and q % 4 == 1 and _is_prime(q):  # Paley II
        jac = _jacobsthal(q)
        conference = torch.zeros(q + 1, q + 1, dtype=torch.float64)
        conference[0, 1:] = 1
        conference[1:, 0] = 1
        conference[1:, 1:] = jac
        plus = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
        minus = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
        return torch.kron(conference, plus) + torch.kron(torch.eye(q + 1, dtype=torch.float64), minus)
    return None


def hadamard(n: int) -> torch.Tensor | None:
    """An ``n x n`` Hadamard matrix scaled to be orthogonal (``H / sqrt(n)``), first column ``1 / sqrt(n)``;
    None when none of the constructions above gives one of order ``n``."""
    if n < 1 or n > SEARCH_LIMIT:
        return None
    power = (n & -n).bit_length() - 1  # the largest 2^k dividing n
    for k in range(power, -1, -1):
        rest = n >> k
        base = torch.ones(1, 1, dtype=torch.float64) if rest == 1 else _paley(rest)
        if base is None:
            continue
        matrix = base
        for _ in range(k):
            matrix = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), matrix)
        matrix = matrix * torch.sign(matrix[:, :1])  # first column all ones
        return matrix / math.sqrt(n)
    return None


def haar_orthogonal(n: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-random orthogonal ``n x n`` matrix (QR of a Gaussian with the signs of ``R``'s diagonal)."""
    gaussian = torch.randn(n, n, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return q * torch.sign(torch.diagonal(r))[None, :]


def random_signs(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=generator).to(torch.float64) * 2 - 1


def mean_fixing_basis(n: int) -> torch.Tensor:
    """An orthogonal matrix whose first column is ``1_n / sqrt(n)`` (a Householder reflection)."""
    ones = torch.ones(n, dtype=torch.float64) / math.sqrt(n)
    target = torch.zeros(n, dtype=torch.float64)
    target[0] = 1.0
    v = target - ones
    if float(v.norm()) < 1e-12:
        return torch.eye(n, dtype=torch.float64)
    v = v / v.norm()
    return torch.eye(n, dtype=torch.float64) - 2 * torch.outer(v, v)


def stream_rotation(n: int, kind: str, seed: int, fix_mean: bool) -> torch.Tensor:
    """``R1``, the residual-stream rotation of one seed: ``kind`` ``hadamard`` (the randomized Hadamard
    transform ``H diag(s)`` of QuaRot, random signs ``s``) or ``random`` (Haar). With ``fix_mean``
    (LayerNorm) it must fix ``1_n``: ``B diag(1, U) B^T`` with ``B``'s first column ``1_n / sqrt(n)``, ``U`` a
    rotation of the other ``n - 1`` dimensions (``hadamard``: ``B = H`` and ``U`` random signs, so
    ``R1 = H diag(1, s) H^T``). Raises ValueError when no Hadamard matrix of order ``n`` is built here."""
    generator = torch.Generator().manual_seed(seed)
    if kind == "random":
        if not fix_mean:
            return haar_orthogonal(n, generator)
        basis = mean_fixing_basis(n)
        inner = torch.zeros(n, n, dtype=torch.float64)
        inner[0, 0] = 1.0
        inner[1:, 1:] = haar_orthogonal(n - 1, generator)
        return basis @ inner @ basis.T
    matrix = hadamard(n)
    if matrix is None:
        raise ValueError(f"no Hadamard matrix of order {n} is built here (Sylvester x Paley)")
    signs = random_signs(n, generator)
    if not fix_mean:
        return matrix * signs[None, :]
    signs[0] = 1.0
    return (matrix * signs[None, :]) @ matrix.T
