"""Hadamard matrices of the sizes transformer widths take, and the transform they define.

A Hadamard matrix ``H`` of order ``n`` has entries +1 / -1 and ``H @ H.T == n * I``; ``H / sqrt(n)`` is then
orthonormal. Orders built here, all with exact integer entries:

- powers of two, by Sylvester's doubling ``[[H, H], [H, -H]]``;
- ``q + 1`` for a prime ``q`` with ``q % 4 == 3`` (Paley's first construction: 12, 20, 24, 44, 48, 60, ...);
- ``2 * (q + 1)`` for a prime ``q`` with ``q % 4 == 1`` (Paley's second construction: 12, 28, 36, 60, ...);
- products of those orders (the Kronecker product of two Hadamard matrices is one).

So 576 = 12 x 12 x 4, 384 = 12 x 32 and 1536 = 12 x 128 are built; 9 x 64 is not a route (9 is not a
Hadamard order: every order above 2 is a multiple of 4). :func:`hadamard_factors` says how a size splits,
:func:`hadamard_matrix` gives the integer matrix, :func:`orthonormal_hadamard` the float rotation (with optional
random signs, seeded), :func:`hadamard_transform` applies ``x @ H / sqrt(n)`` factor by factor at run time
(``sum(factors)`` multiply-adds per element instead of ``n``).
"""

from __future__ import annotations

import functools
import math

import torch

from lowbit.errors import ConfigError


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, math.isqrt(q) + 1))


def _paley_prime(order: int) -> tuple[str, int] | None:
    """Which Paley construction gives ``order`` from a prime, if one does: ("first" | "second", q)."""
    if _is_prime(order - 1) and (order - 1) % 4 == 3:
        return "first", order - 1
    if order % 2 == 0 and _is_prime(order // 2 - 1) and (order // 2 - 1) % 4 == 1:
        return "second", order // 2 - 1
    return None


@functools.lru_cache(maxsize=None)
def hadamard_factors(n: int) -> tuple[int, ...] | None:
    """The orders whose Kronecker product builds the Hadamard matrix of order ``n`` (Paley orders, smallest
    first, then one power of two), or None where this module has no construction for ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    if _is_power_of_two(n):
        return (n,)
    for order in range(12, n + 1, 4):
        if n % order or _is_power_of_two(order) or _paley_prime(order) is None:
            continue
        rest = hadamard_factors(n // order)
        if rest is not None:
            return (order, *(size for size in rest if size > 1))
    return None


def buildable_sizes(limit: int) -> list[int]:
    """Every size up to ``limit`` that :func:`hadamard_matrix` builds."""
    return [n for n in range(1, limit + 1) if hadamard_factors(n) is not None]


def _require_factors(n: int, where: str) -> tuple[int, ...]:
    factors = hadamard_factors(n)
    if factors is None:
        below = [size for size in buildable_sizes(n) if size % 4 == 0][-3:]
        above = next(size for size in range(n + 1, 4 * n + 8) if hadamard_factors(size) is not None)
        raise ConfigError(f"{where}: no Hadamard matrix of size {n} can be built here (sizes are a power of two "
                          "times Paley orders: q + 1 for a prime q = 3 mod 4, 2(q + 1) for a prime q = 1 mod 4, "
                          f"e.g. 12, 20, 28, 36, 44); nearest buildable sizes: {below + [above]}")  # fmt: skip
    return factors


def _legendre(a: int, q: int) -> int:
    a %= q
    if a == 0:
        return 0
    return 1 if pow(a, (q - 1) // 2, q) == 1 else -1


def _jacobsthal(q: int) -> torch.Tensor:
    residues = torch.tensor([_legendre(k, q) for k in range(q)], dtype=torch.int64)
    index = (torch.arange(q)[None, :] - torch.arange(q)[:, None]) % q
    return residues[index]


def _paley(order: int) -> torch.Tensor:
    kind, q = _paley_prime(order)
    jacobsthal = _jacobsthal(q)
    ones = torch.ones(q, dtype=torch.int64)
    if kind == "first":  # skew conference matrix S (q + 1), H = I + S
        skew = torch.zeros(q + 1, q + 1, dtype=torch.int64)
        skew[0, 1:], skew[1:, 0], skew[1:, 1:] = ones, -ones, jacobsthal
        return torch.eye(q + 1, dtype=torch.int64) + skew
    conference = torch.zeros(q + 1, q + 1, dtype=torch.int64)  # symmetric conference matrix C
    conference[0, 1:], conference[1:, 0], conference[1:, 1:] = ones, ones, jacobsthal
    on_entries = torch.tensor([[1, -1], [-1, -1]], dtype=torch.int64)
    on_diagonal = torch.tensor([[1, 1], [1, -1]], dtype=torch.int64)
    return torch.kron(conference, on_entries) + torch.kron(torch.eye(q + 1, dtype=torch.int64), on_diagonal)


def _sylvester(n: int) -> torch.Tensor:
    matrix = torch.ones(1, 1, dtype=torch.int64)
    while matrix.shape[0] < n:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix


@functools.lru_cache(maxsize=64)
def _factor_matrix(order: int) -> torch.Tensor:
    return _sylvester(order) if _is_power_of_two(order) else _paley(order)


def factor_matrices(n: int, where: str = "hadamard") -> list[torch.Tensor]:
    """The integer Hadamard matrices whose Kronecker product is :func:`hadamard_matrix` ``(n)``."""
    return [_factor_matrix(order).clone() for order in _require_factors(n, where)]


def hadamard_matrix(n: int, where: str = "hadamard") -> torch.Tensor:
    """The int64 Hadamard matrix of order ``n`` (``H @ H.T == n * I``); ConfigError naming ``where`` and the
    buildable sizes nearby where there is no construction for ``n``."""
    matrix = torch.ones(1, 1, dtype=torch.int64)
    for factor in factor_matrices(n, where):
        matrix = torch.kron(matrix, factor)
    return matrix


def orthonormal_hadamard(n: int, *, seed: int | None = None, dtype: torch.dtype = torch.float64,
                         where: str = "hadamard") -> torch.Tensor:  # fmt: skip
    """``diag(signs) @ H / sqrt(n)``: orthonormal; ``signs`` are +-1 drawn from ``seed`` (QuaRot's randomized
    Hadamard), all +1 when ``seed`` is None."""
    matrix = hadamard_matrix(n, where).to(torch.float64) / math.sqrt(n)
    if seed is not None:
        matrix = random_signs(n, seed)[:, None] * matrix
    return matrix.to(dtype)


def random_signs(n: int, seed: int) -> torch.Tensor:
    """``n`` float64 signs +-1 drawn from ``seed`` (the diagonal of :func:`orthonormal_hadamard`)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=generator).to(torch.float64) * 2 - 1


class Rotation:
    """``Q = diag(signs) H / sqrt(n)`` kept as its factors: :meth:`right` is ``x @ Q`` and :meth:`left_transposed`
    ``Q^T w``, each ``sum(factors)`` multiply-adds per element (float64) instead of ``n``."""

    def __init__(self, n: int, seed: int | None = None, where: str = "hadamard") -> None:
        self.size = n
        self.factors = [factor.to(torch.float64) for factor in factor_matrices(n, where)]
        self.signs = None if seed is None else random_signs(n, seed)

    def right(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        return hadamard_transform(x if self.signs is None else x * self.signs, self.factors)

    def left_transposed(self, w: torch.Tensor) -> torch.Tensor:
        return self.right(w.T).T

    def matrix(self) -> torch.Tensor:
        return self.right(torch.eye(self.size, dtype=torch.float64))


def hadamard_transform(x: torch.Tensor, factors: list[torch.Tensor]) -> torch.Tensor:
    """``x @ kron(*factors) / sqrt(n)`` along the last dimension, one factor at a time (factors in x's dtype)."""
    sizes = [factor.shape[0] for factor in factors]
    n = math.prod(sizes)
    if x.shape[-1] != n:
        raise ConfigError(f"hadamard_transform: last dimension {x.shape[-1]} is not the transform's size {n}")
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    for position, factor in enumerate(factors):
        before, after = math.prod(sizes[:position]), math.prod(sizes[position + 1:])
        y = torch.einsum("bimj,mk->bikj", y.reshape(-1, before, sizes[position], after), factor).reshape(-1, n)
    return (y / math.sqrt(n)).reshape(*lead, n)


class OnlineHadamard(torch.nn.Module):
    """``x @ H / sqrt(n)`` on the last dimension at run time (a Hadamard matrix of order ``n`` applied factor by
    factor); no parameters, and its factor buffers are not saved (they are rebuilt from ``n``)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.size = n
        for index, factor in enumerate(factor_matrices(n, "OnlineHadamard")):
            self.register_buffer(f"factor{index}", factor.to(torch.get_default_dtype()), persistent=False)

    def factors(self) -> list[torch.Tensor]:
        return [buffer for name, buffer in self.named_buffers() if name.startswith("factor")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hadamard_transform(x, [factor.to(x.dtype) for factor in self.factors()])

    def extra_repr(self) -> str:
        return f"{self.size}, factors={list(hadamard_factors(self.size))}"
