"""Linear, convolution and matmul whose dot products sum into a simulated accumulator.

Each function takes operands that are already quantized (the caller applies the forward roles) and
returns the op's result with every partial sum rounded by :func:`lowbit.nn.accumulate.accumulated_matmul`.
By default the gradient is straight-through over the accumulation: the backward pass is that of the float op
on the same operands (the gradient roles of :mod:`lowbit.nn.gradients` round it), so training sees the
forward value of the accumulator and the usual gradients. With ``accumulator.backward`` the backward GEMMs
sum in the accumulator too (:mod:`lowbit.nn.accumulated_backward`).

Convolutions become a matmul over ``F.unfold`` columns; the reduction order of a convolution's K is
(input channel, kernel row, kernel column), the order of the unfolded columns. Grouped convolutions and
non-zero padding modes are not simulated (ConfigError).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowbit.errors import ConfigError
from lowbit.nn.accumulate import Accumulator, accumulated_matmul
from lowbit.nn.accumulated_backward import AccumulatedMatmul, check_backward_shapes


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
    if accumulator.backward:
        rows = x.reshape(-1, x.shape[-1])
        out = _accumulated(rows, weight.t(), bias, accumulator, stream)
        return out.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)
    float_out = F.linear(x, weight, bias)
    with torch.no_grad():
        rows = x.detach().reshape(-1, x.shape[-1])  # [M, K]
        out = accumulated_matmul(rows, weight.detach().t(), accumulator, _detached(bias), _generator(stream, x.device))
    return _straight_through(float_out, out.reshape(float_out.shape))


def matmul(x: torch.Tensor, y: torch.Tensor, accumulator: Accumulator, stream=None) -> torch.Tensor:
    """``torch.matmul(x, y)`` accumulated in ``accumulator`` (vectors are treated as torch.matmul does)."""
    float_out = torch.matmul(x, y)
    a = x.unsqueeze(0) if x.dim() == 1 else x
    b = y.unsqueeze(-1) if y.dim() == 1 else y
    if accumulator.backward:
        return _accumulated(a, b, None, accumulator, stream).reshape(float_out.shape).to(float_out.dtype)
    with torch.no_grad():
        out = accumulated_matmul(a.detach(), b.detach(), accumulator, None, _generator(stream, x.device))
    return _straight_through(float_out, out.reshape(float_out.shape))


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, accumulator: Accumulator,
           stride=1, padding=0, dilation=1, groups: int = 1, stream=None) -> torch.Tensor:  # fmt: skip
    """``F.conv2d`` accumulated in ``accumulator`` (K = in_channels * kernel height * kernel width)."""
    if groups != 1:
        raise ConfigError(f"accumulator simulation supports groups=1 convolutions only, got groups={groups}")
    if isinstance(padding, str):
        raise ConfigError(f"accumulator simulation needs numeric padding, got padding={padding!r}")
    float_out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    if accumulator.backward:  # autograd carries the column gradient back through unfold (a float scatter-add)
        out = _accumulated(*_conv_operands(x, weight, bias, stride, padding, dilation), accumulator, stream)
        return out.reshape(float_out.shape).to(float_out.dtype)
    with torch.no_grad():
        kernel, columns, column_bias = _conv_operands(x.detach(), weight.detach(), _detached(bias), stride, padding,
                                                      dilation)  # fmt: skip
        out = accumulated_matmul(kernel, columns, accumulator, column_bias, _generator(stream, x.device))  # [B, O, L]
    return _straight_through(float_out, out.reshape(float_out.shape))


def _conv_operands(x, weight, bias, stride, padding, dilation):
    """A convolution as ``kernel [O, K] @ columns [B, K, L] + bias [O, 1]``."""
    batched = x if x.dim() == 4 else x.unsqueeze(0)
    columns = F.unfold(batched, weight.shape[-2:], dilation=dilation, padding=padding, stride=stride)
    return weight.reshape(weight.shape[0], -1), columns, None if bias is None else bias.reshape(-1, 1)


def _accumulated(a, b, bias, accumulator: Accumulator, stream) -> torch.Tensor:
    check_backward_shapes(a, b)
    return AccumulatedMatmul.apply(a, b, bias, accumulator, _generator(stream, a.device))


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
