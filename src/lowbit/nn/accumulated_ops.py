"""Linear, convolution and matmul whose dot products sum into a simulated accumulator.

Each function takes operands that are already quantized (the caller applies the forward roles) and
returns the op's result with every partial sum rounded by :func:`lowbit.nn.accumulate.accumulated_matmul`.
The gradient is straight-through over the accumulation: the backward pass is that of the float op on the
same operands (the gradient roles of :mod:`lowbit.nn.gradients` round it), so training sees the forward
value of the accumulator and the usual gradients.

Convolutions become a matmul over ``F.unfold`` columns; the reduction order of a convolution's K is
(input channel, kernel row, kernel column), the order of the unfolded columns. Grouped convolutions and
non-zero padding modes are not simulated (ConfigError).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowbit.errors import ConfigError
from lowbit.nn.accumulate import Accumulator, accumulated_matmul


def _straight_through(float_out: torch.Tensor, simulated: torch.Tensor) -> torch.Tensor:
    """``simulated``'s values with ``float_out``'s gradient."""
    simulated = simulated.to(float_out.dtype)
    if not float_out.requires_grad:
        return simulated
    return float_out + (simulated - float_out).detach()


def _generator(stream, device: torch.device) -> torch.Generator | None:
    return None if stream is None else stream.generator(device)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, accumulator: Accumulator,
           stream=None) -> torch.Tensor:  # fmt: skip
    """``F.linear(x, weight, bias)`` accumulated in ``accumulator`` (K = in_features, in index order)."""
    float_out = F.linear(x, weight, bias)
    with torch.no_grad():
        rows = x.detach().reshape(-1, x.shape[-1])  # [M, K]
        out = accumulated_matmul(rows, weight.detach().t(), accumulator, _detached(bias), _generator(stream, x.device))
    return _straight_through(float_out, out.reshape(float_out.shape))


def matmul(x: torch.Tensor, y: torch.Tensor, accumulator: Accumulator, stream=None) -> torch.Tensor:
    """``torch.matmul(x, y)`` accumulated in ``accumulator`` (vectors are treated as torch.matmul does)."""
    float_out = torch.matmul(x, y)
    with torch.no_grad():
        a = x.detach().unsqueeze(0) if x.dim() == 1 else x.detach()
        b = y.detach().unsqueeze(-1) if y.dim() == 1 else y.detach()
        out = accumulated_matmul(a, b, accumulator, None, _generator(stream, x.device))
    return _straight_through(float_out, out.reshape(float_out.shape))


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, accumulator: Accumulator,
           stride=1, padding=0, dilation=1, groups: int = 1, stream=None) -> torch.Tensor:  # fmt: skip
    """``F.conv2d`` accumulated in ``accumulator`` (K = in_channels * kernel height * kernel width)."""
    if groups != 1:
        raise ConfigError(f"accumulator simulation supports groups=1 convolutions only, got groups={groups}")
    if isinstance(padding, str):
        raise ConfigError(f"accumulator simulation needs numeric padding, got padding={padding!r}")
    float_out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    with torch.no_grad():
        batched = x.detach() if x.dim() == 4 else x.detach().unsqueeze(0)
        columns = F.unfold(batched, weight.shape[-2:], dilation=dilation, padding=padding, stride=stride)  # [B, K, L]
        kernel = weight.detach().reshape(weight.shape[0], -1)  # [O, K]
        column_bias = None if bias is None else bias.detach().reshape(-1, 1)  # [O, 1]
        out = accumulated_matmul(kernel, columns, accumulator, column_bias, _generator(stream, x.device))  # [B, O, L]
    return _straight_through(float_out, out.reshape(float_out.shape))


def conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, accumulator: Accumulator,
           stride=1, padding=0, dilation=1, groups: int = 1, stream=None) -> torch.Tensor:  # fmt: skip
    """``F.conv1d`` accumulated in ``accumulator``, as a height-1 conv2d."""
    pair = lambda value: (1, value[0] if isinstance(value, (tuple, list)) else value)  # noqa: E731
    if isinstance(padding, str):
        raise ConfigError(f"accumulator simulation needs numeric padding, got padding={padding!r}")
    out = conv2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, accumulator, pair(stride), (0, pair(padding)[1]),
                 pair(dilation), groups, stream)  # fmt: skip
    return out.squeeze(-2)


def _detached(value: torch.Tensor | None) -> torch.Tensor | None:
    return None if value is None else value.detach()
