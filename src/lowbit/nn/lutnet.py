"""LUTNet (experimental): a binarised linear layer whose XNOR products become trainable K-input LUTs.

In a binarised network every connection (o, j) computes sign(w_oj) * x_j, an XNOR in hardware. A K-input
FPGA LUT can compute any boolean function of K bits at the same cost, so LUTNet gives each connection a LUT
fed by its own input x_j plus K-1 other inputs (chosen at random once, with a seed) and trains the LUT's
2^K entries.

The scheme implemented here, for input x [rows, in]:

1. Residual binarisation with lowbit's ``binary_residual`` format (``levels`` = L, magnitudes ``means``
   m_1..m_L): x_q = quantize(x) is a signed sum sum_l s_l m_l, s_l in {-1, +1}; the layer reads off each
   level's signs s_l (for a value with several sign patterns, the greedy one: + preferred at level 1, ...).
2. For each level l, connection (o, j) and LUT input bits b_i = [s_l[c_oji] > 0] (c_oj0 = j), the LUT index
   is sum_i b_i 2^(K-1-i) (the connection's own input is the most significant bit) and the connection
   outputs ``tables[o, j, index]``.
3. ``level_sums[l, o] = sum_j tables[o, j, index]``, ``y_o = scale_o * sum_l m_l level_sums[l, o] + bias_o``
   (the level sum is accumulated in order l = 1..L).

Initialised from a trained nn.Linear, ``tables[o, j, index] = sign(w_oj) * s`` where s = +-1 is the first
bit, and ``scale_o`` = mean |w_o| (lowbit's ``binary`` format with ``scaling_factor=True, axis=0``): the
layer then equals F.linear(x_q, binary(w), bias) up to float summation order. The tables and the bias are
trainable; gradients reach the input through the multilinear (Lagrange) extension of each LUT, and through
the binarisation by a straight-through estimator clipped to |x| <= 1. See docs/experimental.md.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from lowbit.errors import ConfigError
from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import resolve

MAX_K = 6  # 2^6 entries per connection: the LUT size of current FPGAs; larger tables multiply memory fast


def random_connections(in_features: int, out_features: int, k: int, seed: int = 0) -> torch.Tensor:
    """[out, in, k] input indices of each connection's LUT: position 0 is the connection's own input j,
    positions 1..k-1 are k-1 distinct other inputs drawn uniformly with ``seed`` (independent of global
    torch RNG state)."""
    _check_k(k, in_features)
    generator = torch.Generator().manual_seed(seed)
    own = torch.arange(in_features)
    connections = torch.empty((out_features, in_features, k), dtype=torch.int64)
    connections[:, :, 0] = own
    for neuron in range(out_features if k > 1 else 0):  # build time only; one row keeps the draw's memory at in x in
        # Draw distinct offsets 1..in-1 from j, so the extra inputs are distinct and never j itself.
        weights = torch.ones((in_features, max(1, in_features - 1)))
        offsets = torch.multinomial(weights, k - 1, replacement=False, generator=generator) + 1
        connections[neuron, :, 1:] = (own.unsqueeze(1) + offsets) % in_features
    return connections


def _check_k(k: int, in_features: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"LUTNet: k={k!r} is invalid; LUT inputs must be an integer in [1, {MAX_K}]")
    if k > in_features:
        raise ConfigError(
            f"LUTNet: k={k} needs k-1={k - 1} inputs besides each connection's own, but in_features={in_features}"
        )


def sign_patterns(spec: FormatSpec, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(grid, patterns): the format's values in ``dtype`` (ascending, distinct) and for each value the
    +-1 sign per level whose signed sum of ``means`` is nearest to it (ties: the first pattern in the order
    +...+, +...-, ..., i.e. the greedy residual sign)."""
    grid = spec.value_set().to(dtype).unique()
    candidates = list(itertools.product((1.0, -1.0), repeat=len(spec.means)))
    sums = [math.fsum(s * m for s, m in zip(pattern, spec.means, strict=True)) for pattern in candidates]
    chosen = [min(range(len(candidates)), key=lambda c: (abs(sums[c] - value), c)) for value in grid.tolist()]
    return grid, torch.tensor([candidates[c] for c in chosen], dtype=dtype)


class LUTNetLinear(nn.Module):
    """K-input LUT replacement of a binarised linear layer (see the module doc for the exact scheme).

    Parameters: ``tables`` [out, in, 2^k], ``bias`` [out] or None. Buffers: ``connections`` [out, in, k]
    (long), ``scale`` [out]. Build it from a trained layer with :meth:`from_binary_linear`.
    """

    def __init__(
        self,
        connections: torch.Tensor,
        tables: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        input_format: FormatSpec,
    ) -> None:
        super().__init__()
        self.input_format = resolve(input_format)
        if self.input_format.format_name != "binary_residual":
            raise ConfigError(f"LUTNet: input_format must be binary_residual, got {self.input_format.describe()}")
        connections, tables, scale, bias = _check_shapes(connections, tables, scale, bias)
        self.out_features, self.in_features, self.k = connections.shape
        self.register_buffer("connections", connections)
        self.register_buffer("scale", scale)
        self.tables = nn.Parameter(tables)
        self.bias = None if bias is None else nn.Parameter(bias)
        self._patterns: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_binary_linear(
        cls,
        linear: nn.Linear,
        *,
        k: int,
        levels: int = 2,
        means: tuple[float, ...] | None = None,
        seed: int = 0,
    ) -> LUTNetLinear:
        """LUTs that reproduce ``linear`` with binarised weights and ``levels``-level residual inputs."""
        if not isinstance(linear, nn.Linear):
            raise ConfigError(f"LUTNet: from_binary_linear expects an nn.Linear, got {type(linear).__name__}")
        spec = resolve("binary_residual", levels=levels, means=means)
        weight = linear.weight.detach().float()
        connections = random_connections(linear.in_features, linear.out_features, k, seed)
        binarised = resolve("binary", scaling_factor=True, axis=0).quantize(weight)  # +-mean|w_o| per row
        scale = binarised.abs().amax(dim=1)
        weight_sign = torch.where(weight >= 0, 1.0, -1.0)  # the binary format's choice: w >= 0 -> +1
        # Entry = sign(w) * (first input bit as +-1): the XNOR of the binarised network.
        first_bit = (torch.arange(2**k) >> (k - 1)).float() * 2 - 1
        tables = weight_sign.unsqueeze(-1) * first_bit
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(connections, tables, scale, bias, spec)

    # ---- binarisation ---------------------------------------------------------------------------------
    def level_signs(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, L, in] signs +-1 of the residual binarisation of x [rows, in] (no gradient)."""
        dtype = x.dtype
        if dtype not in self._patterns:
            self._patterns[dtype] = sign_patterns(self.input_format, dtype)
        grid, patterns = (t.to(x.device) for t in self._patterns[dtype])
        quantized = self.input_format.quantize(x.detach())
        index = torch.searchsorted(grid, quantized)  # exact hit: quantized values are grid values
        return patterns[index].transpose(1, 2)

    def _signs_with_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """level_signs with the clipped straight-through gradient d s_l / d x = 1 for |x| <= 1."""
        signs = self.level_signs(x)
        if not (torch.is_grad_enabled() and x.requires_grad):
            return signs
        clipped = x.clamp(-1.0, 1.0)
        return signs + (clipped - clipped.detach()).unsqueeze(1)  # adds exactly 0 in the forward pass

    # ---- LUT evaluation -------------------------------------------------------------------------------
    def _lut_outputs(self, signs: torch.Tensor) -> torch.Tensor:
        """[rows, L, out, in] output of every connection's LUT for every level."""
        bits = (signs.detach() > 0).to(torch.int64)
        index = torch.zeros((*signs.shape[:2], self.out_features, self.in_features), dtype=torch.int64,
                            device=signs.device)  # fmt: skip
        for position in range(self.k):
            index = index | (bits[:, :, self.connections[:, :, position]] << (self.k - 1 - position))
        entries = 2**self.k
        base = torch.arange(self.out_features * self.in_features, device=signs.device).view(self.out_features, -1)
        flat_tables = self.tables.to(signs.dtype).reshape(-1)
        outputs = flat_tables[base * entries + index]  # differentiable w.r.t. the tables (scatter-add)
        if signs.requires_grad:
            outputs = outputs + self._input_gradient_path(signs, flat_tables, base * entries, index)
        return outputs

    def _input_gradient_path(self, signs, flat_tables, base, index) -> torch.Tensor:
        """Zero in value; its gradient w.r.t. each LUT input is the slope of the LUT's multilinear
        extension at a corner, (T[bit set] - T[bit clear]) / 2."""
        path = torch.zeros_like(index, dtype=signs.dtype)
        for position in range(self.k):
            bit = 1 << (self.k - 1 - position)
            slope = (flat_tables[base + (index | bit)] - flat_tables[base + (index & ~bit)]).detach() / 2
            moving = signs[:, :, self.connections[:, :, position]]
            path = path + (moving - moving.detach()) * slope
        return path

    def level_sums(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, L, out]: sum over inputs of the LUT outputs per level (integers while tables are +-1)."""
        return self._lut_outputs(self._signs_with_gradient(self._flat_input(x))).sum(dim=-1)

    def _flat_input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ConfigError(f"LUTNet: input must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ConfigError(f"LUTNet: input shape {tuple(x.shape)} does not end in in_features={self.in_features}")
        if torch.isnan(x).any():
            raise ConfigError("LUTNet: input contains NaN, which has no binarisation")
        return x.reshape(-1, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sums = self.level_sums(x)
        combined = sums[:, 0] * self.input_format.means[0]
        for level in range(1, sums.shape[1]):
            combined = combined + sums[:, level] * self.input_format.means[level]
        out = combined * self.scale.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, k={self.k}, "
                f"input_format={self.input_format.describe()}, bias={self.bias is not None}")  # fmt: skip


def _check_shapes(connections, tables, scale, bias):
    """Validate the layer's tensors against each other; ConfigError naming both shapes on a mismatch."""
    connections = torch.as_tensor(connections)
    if connections.dim() != 3 or connections.dtype.is_floating_point or connections.dtype == torch.bool:
        raise ConfigError(f"LUTNet: connections must be an integer tensor [out, in, k], got shape "
                          f"{tuple(connections.shape)} and dtype {connections.dtype}")  # fmt: skip
    out_features, in_features, k = connections.shape
    _check_k(k, in_features)
    if connections.numel() and (connections.min() < 0 or connections.max() >= in_features):
        raise ConfigError(f"LUTNet: connections must lie in [0, {in_features})")
    expected = {"tables": (out_features, in_features, 2**k), "scale": (out_features,), "bias": (out_features,)}
    given = {"tables": tables, "scale": scale, "bias": bias}
    for name, tensor in given.items():
        if tensor is not None and tuple(torch.as_tensor(tensor).shape) != expected[name]:
            raise ConfigError(f"LUTNet: {name} shape {tuple(torch.as_tensor(tensor).shape)} must be "
                              f"{expected[name]} for connections of shape {tuple(connections.shape)}")  # fmt: skip
    as_float = [None if t is None else torch.as_tensor(t).detach().float().clone() for t in (tables, scale, bias)]
    return connections.to(torch.int64), *as_float
