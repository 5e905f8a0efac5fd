"""LUTNet: initialised LUTs reproduce the binarised layer, the entries train, and bad configs fail clearly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit.errors import ConfigError, LowbitError
from lowbit.nn.lutnet import MAX_K, LUTNetLinear, random_connections


def trained_linear(in_features=8, out_features=3, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features)


def greedy_residual_signs(x: torch.Tensor, means: tuple[float, ...]) -> torch.Tensor:
    """[rows, L, in] residual signs computed greedily (r = x; s = sign(r), sign(0) = +1; r -= s m)."""
    residual = x.double()
    signs = []
    for magnitude in means:
        sign = torch.where(residual >= 0, 1.0, -1.0).double()
        signs.append(sign)
        residual = residual - sign * magnitude
    return torch.stack(signs, dim=1).to(x.dtype)


def binarised_linear(linear: nn.Linear, x: torch.Tensor, levels: int) -> torch.Tensor:
    """The reference: binary weights (+-mean|w| per row) times residual-binarised inputs, plus bias."""
    # The layer keeps the float32 scale of the float32 weight; the reference uses that same scale.
    weight = lowbit.quantize(linear.weight.detach(), "binary", scaling_factor=True, axis=0).to(x.dtype)
    return F.linear(lowbit.quantize(x, "binary_residual", levels=levels), weight, linear.bias.detach().to(x.dtype))


# ---- structure --------------------------------------------------------------------------------------------
def test_connections_own_input_first_then_distinct_others():
    connections = random_connections(in_features=7, out_features=5, k=4, seed=3)
    assert connections.shape == (5, 7, 4)
    assert torch.equal(connections[:, :, 0], torch.arange(7).expand(5, 7))
    for row in connections.reshape(-1, 4).tolist():
        assert len(set(row)) == 4 and all(0 <= i < 7 for i in row)


def test_connections_depend_only_on_the_seed():
    torch.manual_seed(123)  # global RNG state must not matter
    first = random_connections(16, 4, 3, seed=7)
    torch.manual_seed(456)
    assert torch.equal(first, random_connections(16, 4, 3, seed=7))
    assert not torch.equal(first, random_connections(16, 4, 3, seed=8))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_initial_tables_hold_the_xnor_of_the_first_input(k):
    linear = trained_linear()
    layer = LUTNetLinear.from_binary_linear(linear, k=k, levels=2, seed=1)
    assert layer.tables.shape == (3, 8, 2**k) and layer.tables.numel() == 3 * 8 * 2**k
    sign = torch.where(linear.weight >= 0, 1.0, -1.0).unsqueeze(-1)
    first_input = torch.where(torch.arange(2**k) >= 2 ** (k - 1), 1.0, -1.0)  # the most significant bit
    assert torch.equal(layer.tables.detach(), sign * first_input)
    binarised = lowbit.quantize(linear.weight.detach(), "binary", scaling_factor=True, axis=0)
    assert torch.equal(layer.scale, binarised.abs().amax(dim=1))  # the binary format's own scale
    # lowbit accumulates the mean in float64, torch.mean in float32: they may differ in the last bit.
    assert torch.allclose(layer.scale, linear.weight.detach().abs().mean(dim=1), rtol=1e-6, atol=0)


# ---- initial equivalence ----------------------------------------------------------------------------------
@pytest.mark.parametrize("levels", [1, 2])
def test_level_signs_are_the_greedy_residual_signs(levels):
    # With one or two levels every value has a single sign pattern: the greedy residual sign's.
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=2, levels=levels)
    x = torch.randn(64, 8) * 1.5
    assert torch.equal(layer.level_signs(x), greedy_residual_signs(x, layer.input_format.means))


def test_level_signs_rebuild_the_quantized_input():
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=2, levels=3)
    x = torch.randn(64, 8, dtype=torch.float64) * 1.5
    signs = layer.level_signs(x)
    rebuilt = sum(signs[:, level] * m for level, m in enumerate(layer.input_format.means))
    assert torch.allclose(rebuilt, lowbit.quantize(x, "binary_residual", levels=3), rtol=0, atol=1e-15)


def test_level_signs_are_a_function_of_the_quantized_value():
    # Three levels (1/2, 1/3, 1/6) write 0 as +1/2-1/3-1/6 or -1/2+1/3+1/6. Greedy residual signs on x would
    # pick by the sign of x; this layer picks from the quantized value alone: the first pattern, + before -.
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=2, levels=3)
    x = torch.tensor([[0.05, -0.05, 0.0, 0.2, -0.2, 0.9, -0.9, 5.0]])
    assert layer.level_signs(x)[0].T.tolist() == [
        [1, -1, -1], [1, -1, -1], [1, -1, -1], [1, -1, 1], [-1, 1, -1], [1, 1, 1], [-1, -1, -1], [1, 1, 1]
    ]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_initial_level_sums_are_the_exact_xnor_popcounts(k, levels):
    # While every entry is +-1 the level sums are integers, exact in float32: compare with equality.
    linear = trained_linear()
    layer = LUTNetLinear.from_binary_linear(linear, k=k, levels=levels, seed=5)
    x = torch.randn(40, 8)
    weight_sign = torch.where(linear.weight.detach() >= 0, 1.0, -1.0)
    assert torch.equal(layer.level_sums(x), layer.level_signs(x) @ weight_sign.T)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.float64, 1e-14)])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_initial_output_equals_the_binarised_linear_layer(dtype, tolerance, k, levels):
    # Not bit-exact: the LUT layer adds integer popcounts per level and scales once, F.linear adds
    # +-alpha * x_q products in its own order. Both round the same exact sum, so they differ by a few
    # ulps of the largest partial sum (|y| <= about in_features * alpha).
    linear = trained_linear(in_features=16, out_features=4)
    layer = LUTNetLinear.from_binary_linear(linear, k=k, levels=levels, seed=2)
    x = torch.randn(50, 16, dtype=dtype) * 2
    expected = binarised_linear(linear, x, levels)
    out = layer(x)
    assert out.dtype == dtype and out.shape == (50, 4)
    assert torch.allclose(out, expected, rtol=0, atol=tolerance * 16)


def test_batch_dimensions_are_kept():
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=2)
    x = torch.randn(2, 5, 8)
    assert torch.equal(layer(x), layer(x.reshape(10, 8)).reshape(2, 5, 3))


def test_output_follows_edited_table_entries():
    # Every entry 0.25 -> each level sums 8 * 0.25 = 2, so y = (2 m_1 + 2 m_2) * scale + bias (the levels'
    # means m = (2/3, 1/3)), in the layer's float32 order: the sums come from the tables, not from x.
    linear = trained_linear()
    layer = LUTNetLinear.from_binary_linear(linear, k=3, levels=2)
    with torch.no_grad():
        layer.tables.fill_(0.25)
    out = layer(torch.randn(6, 8))
    level = torch.full((6, 3), 2.0)
    means = layer.input_format.means
    assert means == pytest.approx((2 / 3, 1 / 3))
    expected = (level * means[0] + level * means[1]) * layer.scale.detach() + linear.bias.detach()
    assert torch.equal(out, expected)
    assert torch.allclose(out, 2 * layer.scale.detach() + linear.bias.detach(), rtol=1e-6, atol=0)


# ---- training ---------------------------------------------------------------------------------------------
def test_table_gradient_counts_the_visited_entries():
    # d sum(y) / d T[o, j, p] = scale_o * sum over rows and levels (with mean m_l) of [pattern p was read].
    # Each row and level reads exactly one entry per connection: the gradient over p sums to rows * scale_o.
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=3, levels=2)
    layer(torch.randn(20, 8)).sum().backward()
    per_connection = layer.tables.grad.sum(dim=-1)
    assert torch.allclose(per_connection, (20 * layer.scale).unsqueeze(1).expand(3, 8), rtol=1e-6, atol=0)
    assert torch.equal(layer.bias.grad, torch.full((3,), 20.0))


def test_initial_input_gradient_is_the_clipped_straight_through_one():
    # At initialisation the LUT's slope along its first input is sign(w) and 0 along the others, so the
    # input gradient is that of the binarised layer with a clipped straight-through estimator.
    linear = trained_linear()
    layer = LUTNetLinear.from_binary_linear(linear, k=4, levels=2)
    x = (torch.randn(10, 8) * 1.2).requires_grad_()
    out = layer(x)
    assert torch.equal(out, layer(x.detach()))  # the gradient path adds exactly zero
    out.sum().backward()
    weight = lowbit.quantize(linear.weight.detach(), "binary", scaling_factor=True, axis=0)
    expected = (x.detach().abs() <= 1) * weight.sum(dim=0)
    assert torch.allclose(x.grad, expected, rtol=1e-6, atol=1e-7)


def test_a_few_steps_fit_a_tiny_task():
    # Targets come from a teacher with random LUT contents; only the student's entries can fit them.
    torch.manual_seed(0)
    student = LUTNetLinear.from_binary_linear(trained_linear(in_features=6, out_features=2), k=2, levels=2)
    teacher = LUTNetLinear.from_binary_linear(trained_linear(in_features=6, out_features=2), k=2, levels=2)
    with torch.no_grad():
        teacher.tables.uniform_(-1, 1)
    x = torch.randn(64, 6)
    target = teacher(x).detach()
    optimizer = torch.optim.Adam(student.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = F.mse_loss(student(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert not torch.equal(student.tables.detach().abs(), torch.ones_like(student.tables))  # entries moved


# ---- errors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, -1, MAX_K + 1, 2.0])
def test_k_out_of_range(k):
    with pytest.raises(ConfigError, match=rf"k={k!r} is invalid; LUT inputs must be an integer in \[1, {MAX_K}\]"):
        LUTNetLinear.from_binary_linear(trained_linear(), k=k)


def test_k_larger_than_the_inputs():
    with pytest.raises(ConfigError, match="k=4 needs k-1=3 inputs besides each connection's own, but in_features=3"):
        LUTNetLinear.from_binary_linear(trained_linear(in_features=3), k=4)


def test_bad_shapes():
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=2)
    with pytest.raises(ConfigError, match=r"input shape \(4, 9\) does not end in in_features=8"):
        layer(torch.zeros(4, 9))
    spec = lowbit.get_format("binary_residual").create(levels=2)
    connections = random_connections(8, 3, 2)
    with pytest.raises(ConfigError, match=r"tables shape \(3, 8, 2\) must be \(3, 8, 4\)"):
        LUTNetLinear(connections, torch.zeros(3, 8, 2), torch.ones(3), None, spec)
    with pytest.raises(ConfigError, match=r"scale shape \(4,\) must be \(3,\)"):
        LUTNetLinear(connections, torch.zeros(3, 8, 4), torch.ones(4), None, spec)
    with pytest.raises(ConfigError, match=r"connections must be an integer tensor \[out, in, k\]"):
        LUTNetLinear(torch.zeros(3, 8), torch.zeros(3, 8, 4), torch.ones(3), None, spec)


def test_other_bad_inputs():
    with pytest.raises(ConfigError, match="expects an nn.Linear"):
        LUTNetLinear.from_binary_linear(nn.Conv1d(1, 1, 1), k=2)
    with pytest.raises(LowbitError, match="levels"):
        LUTNetLinear.from_binary_linear(trained_linear(), k=2, levels=9)
    spec = lowbit.get_format("binary").create()
    with pytest.raises(ConfigError, match="input_format must be binary_residual"):
        LUTNetLinear(random_connections(8, 3, 2), torch.zeros(3, 8, 4), torch.ones(3), None, spec)
    layer = LUTNetLinear.from_binary_linear(trained_linear(), k=2)
    with pytest.raises(ConfigError, match="NaN"):
        layer(torch.full((1, 8), float("nan")))
