"""Quantized functional ops: the same math as :mod:`lowbit.nn.modules` for ops written as functions.

Each takes the float function's arguments plus a keyword ``config``: a :class:`RoleFormats` or its plain
dict form (what a quantized fx ``call_function`` node carries). Operand roles follow MASE: add / sub / mul
quantize both operands with ``data_in``; matmul / bmm quantize the first with ``data_in`` and the second
with ``weight``; linear / conv / norms quantize input, weight and bias. Non-tensor operands (``x + 1``)
pass through. These functions are fx leaves (see :mod:`lowbit.graph.qgraph`), so a quantized graph
re-traces to the same nodes.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from lowbit.nn import accumulated_ops
from lowbit.nn.roles import RoleFormats


def _formats(config: Any) -> RoleFormats:
    return RoleFormats.from_dict(config)


def _accumulator(f: RoleFormats):
    """The simulated accumulator of a GEMM op, or None (float sums)."""
    return None if f.bypass else f.accumulator


def _conv(f: RoleFormats, conv, simulated, x, weight, bias, args, kwargs):
    """A convolution on quantized operands, in float or (with an accumulator) simulated sums."""
    operands = f.apply("data_in", x), f.apply("weight", weight), f.apply("bias", bias)
    if _accumulator(f) is None:
        return f.apply("data_out", conv(*operands, *args, **kwargs))
    names = ("stride", "padding", "dilation", "groups")
    options = {**dict(zip(names, args, strict=False)), **kwargs}  # args: any leading ones of names
    return f.apply("data_out", simulated(*operands, f.accumulator, **options, stream=f.stream))


def _elementwise(python_op, torch_op, x, y, config, kwargs):
    """``x op y`` with both operands through data_in; the Python operator keeps int arithmetic (shape
    computations that share the op's name) working, the torch one takes keywords such as ``alpha``."""
    f = _formats(config)
    qx, qy = f.apply("data_in", x), f.apply("data_in", y)
    return f.apply("data_out", torch_op(qx, qy, **kwargs) if kwargs else python_op(qx, qy))


def quantized_add(x, y, *, config, **kwargs):
    return _elementwise(operator.add, torch.add, x, y, config, kwargs)


def quantized_sub(x, y, *, config, **kwargs):
    return _elementwise(operator.sub, torch.sub, x, y, config, kwargs)


def quantized_mul(x, y, *, config, **kwargs):
    return _elementwise(operator.mul, torch.mul, x, y, config, kwargs)


def quantized_matmul(x, y, *, config):
    f = _formats(config)
    qx, qy = f.apply("data_in", x), f.apply("weight", y)
    if _accumulator(f) is not None:
        return f.apply("data_out", accumulated_ops.matmul(qx, qy, f.accumulator, f.stream))
    return f.apply("data_out", torch.matmul(qx, qy))


def quantized_bmm(x, y, *, config):
    f = _formats(config)
    qx, qy = f.apply("data_in", x), f.apply("weight", y)
    if _accumulator(f) is not None:
        return f.apply("data_out", accumulated_ops.matmul(qx, qy, f.accumulator, f.stream))
    return f.apply("data_out", torch.bmm(qx, qy))


def quantized_linear(x, weight, bias=None, *, config):
    f = _formats(config)
    operands = f.apply("data_in", x), f.apply("weight", weight), f.apply("bias", bias)
    if _accumulator(f) is not None:
        return f.apply("data_out", accumulated_ops.linear(*operands, f.accumulator, f.stream))
    return f.apply("data_out", F.linear(*operands))


def quantized_conv1d(x, weight, bias=None, *args, config, **kwargs):
    return _conv(_formats(config), F.conv1d, accumulated_ops.conv1d, x, weight, bias, args, kwargs)


def quantized_conv2d(x, weight, bias=None, *args, config, **kwargs):
    return _conv(_formats(config), F.conv2d, accumulated_ops.conv2d, x, weight, bias, args, kwargs)


def quantized_relu(x, inplace: bool = False, *, config):
    # never in place: the caller's tensor must not change when the op is quantized
    f = _formats(config)
    return f.apply("data_out", F.relu(f.apply("data_in", x)))


def quantized_gelu(x, *args, config, **kwargs):
    f = _formats(config)
    return f.apply("data_out", F.gelu(f.apply("data_in", x), *args, **kwargs))


def quantized_softmax(x, *args, config, **kwargs):
    f = _formats(config)
    return f.apply("data_out", F.softmax(f.apply("data_in", x), *args, **kwargs))


def quantized_layer_norm(x, normalized_shape, weight=None, bias=None, *args, config, **kwargs):
    f = _formats(config)
    out = F.layer_norm(f.apply("data_in", x), normalized_shape, f.apply("weight", weight), f.apply("bias", bias),
                       *args, **kwargs)  # fmt: skip
    return f.apply("data_out", out)


def quantized_batch_norm(x, running_mean, running_var, weight=None, bias=None, *args, config, **kwargs):
    f = _formats(config)
    out = F.batch_norm(f.apply("data_in", x), running_mean, running_var, f.apply("weight", weight),
                       f.apply("bias", bias), *args, **kwargs)  # fmt: skip
    return f.apply("data_out", out)


def quantized_embedding(indices, weight, *args, config, **kwargs):
    f = _formats(config)
    return f.apply("data_out", F.embedding(indices, f.apply("weight", weight), *args, **kwargs))


# mase_op -> the quantized function replacing a call_function node of that op
FUNCTION_FOR_OP = {
    "add": quantized_add, "sub": quantized_sub, "mul": quantized_mul, "matmul": quantized_matmul,
    "bmm": quantized_bmm, "linear": quantized_linear, "conv1d": quantized_conv1d, "conv2d": quantized_conv2d,
    "relu": quantized_relu, "gelu": quantized_gelu, "softmax": quantized_softmax,
    "layer_norm": quantized_layer_norm, "batch_norm2d": quantized_batch_norm, "embedding": quantized_embedding,
}  # fmt: skip
QUANT_FUNCTIONS = tuple(FUNCTION_FOR_OP.values())
