"""Hadamard matrices: exact integer H @ H.T == n I for every size built (Sylvester, both Paley constructions and
their Kronecker products), the sizes transformer widths need, a clear refusal elsewhere, and the factor-by-factor
run-time transform equal to the dense rotation."""

from __future__ import annotations

import math

import pytest
import torch

from lowbit.errors import ConfigError
from lowbit.ops.hadamard import (
    OnlineHadamard,
    Rotation,
    buildable_sizes,
    hadamard_factors,
    hadamard_matrix,
    hadamard_transform,
    orthonormal_hadamard,
)

CLAIMED = (1, 2, 4, 8, 12, 20, 24, 28, 36, 40, 44, 48, 60, 64, 68, 72, 76, 96, 128, 384, 576, 768, 1536, 2048)


@pytest.mark.parametrize("n", CLAIMED)
def test_exact_hadamard(n):
    matrix = hadamard_matrix(n)
    assert matrix.dtype == torch.int64 and matrix.shape == (n, n)
    assert bool((matrix.abs() == 1).all())
    assert torch.equal(gram(matrix), n * torch.eye(n, dtype=torch.int64))


def gram(matrix: torch.Tensor) -> torch.Tensor:
    """H @ H.T, exact: float64 holds every partial sum of +-1 products (integers below 2**53) exactly."""
    exact = matrix.double() @ matrix.double().T
    return exact.to(torch.int64)


def test_transformer_widths_factor():
    assert hadamard_factors(576) == (12, 12, 4)  # SmolLM2 hidden (9 x 64 is no route: 9 is no Hadamard order)
    assert hadamard_factors(384) == (12, 32)  # MiniLM hidden
    assert hadamard_factors(1536) == (12, 128)  # both models' intermediate size
    assert hadamard_factors(64) == (64,)
    assert hadamard_factors(36) == (36,)  # Paley's second construction (q = 17)


def test_buildable_sizes_up_to_100():
    assert buildable_sizes(100) == [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56, 60, 64, 68, 72, 76, 80,
                                    84, 88, 96]  # fmt: skip
    assert all(torch.equal(gram(hadamard_matrix(n)), n * torch.eye(n, dtype=torch.int64))
               for n in buildable_sizes(100))  # fmt: skip


@pytest.mark.parametrize("n", [3, 6, 9, 18, 52, 92, 100])
def test_unbuildable_sizes_refused(n):
    assert hadamard_factors(n) is None
    with pytest.raises(ConfigError, match=rf"rotate \(hidden\): no Hadamard matrix of size {n} .*nearest buildable"):
        hadamard_matrix(n, where="rotate (hidden)")


def test_orthonormal_and_seeded_signs():
    plain = orthonormal_hadamard(48)
    assert torch.allclose(plain @ plain.T, torch.eye(48, dtype=torch.float64), atol=1e-14)
    signed = orthonormal_hadamard(48, seed=3)
    assert torch.allclose(signed @ signed.T, torch.eye(48, dtype=torch.float64), atol=1e-14)
    assert torch.equal(signed, orthonormal_hadamard(48, seed=3))
    assert not torch.equal(signed, orthonormal_hadamard(48, seed=4))
    assert torch.equal(signed.abs(), plain.abs())


@pytest.mark.parametrize("n", [12, 96, 576, 1536])
def test_transform_equals_dense_rotation(n):
    x = torch.randn(3, 5, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    dense = x @ orthonormal_hadamard(n)
    module = OnlineHadamard(n).double()
    assert torch.allclose(module(x), dense, atol=1e-12)
    assert torch.allclose(hadamard_transform(x, [m.double() for m in module.factors()]), dense, atol=1e-12)
    assert module.state_dict() == {}  # rebuilt from n, never saved
    assert math.isclose(float(module(x).norm()), float(x.norm()), rel_tol=1e-12)


def test_transform_size_mismatch_refused():
    with pytest.raises(ConfigError, match="not the transform's size 12"):
        OnlineHadamard(12)(torch.zeros(2, 8))


@pytest.mark.parametrize("seed", [None, 5])
def test_factored_rotation_equals_dense(seed):
    rotation, dense = Rotation(96, seed=seed), orthonormal_hadamard(96, seed=seed)
    w = torch.randn(7, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(rotation.matrix(), dense, atol=1e-14)
    assert torch.allclose(rotation.right(w), w @ dense, atol=1e-12)
    assert torch.allclose(rotation.left_transposed(w.T), dense.T @ w.T, atol=1e-12)
