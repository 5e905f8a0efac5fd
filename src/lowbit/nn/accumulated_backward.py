"""The backward GEMMs of an accumulated matmul, summed in the same accumulator (``accumulator_backward``).

For ``out = a @ b + bias`` (a: [..., M, K], b: [..., K, N]) the backward pass is three more reductions:
``grad_a = grad @ b^T`` (over N), ``grad_b = a^T @ grad`` (over M, and over the batch when ``b`` is shared
by the batch, as a Linear's or a convolution's weight is), and ``grad_bias`` (the sum of ``grad`` over every
dimension the bias was broadcast along). Each runs through :func:`~lowbit.nn.accumulate.accumulated_matmul`,
so the register, chunking, flushing, overflow and rounding of the forward pass apply to the gradients too.
Reduction orders: a shared operand's batch dimensions come before the row index ((batch, m) for a weight
gradient); a bias sums its broadcast dimensions in row-major order. What autograd does outside this op (the
scatter-add of a convolution's unfolded columns back into the input gradient) stays float.
"""

from __future__ import annotations

import math

import torch

from lowbit.errors import ConfigError
from lowbit.nn.accumulate import Accumulator, accumulated_matmul


def check_backward_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    """Backward accumulation handles operands of one batch shape, or one 2-D operand shared by the batch."""
    if a.dim() != 2 and b.dim() != 2 and a.shape[:-2] != b.shape[:-2]:
        raise ConfigError(f"accumulator_backward needs operands with one batch shape or a 2-D operand, got "
                          f"{tuple(a.shape)} @ {tuple(b.shape)}")  # fmt: skip


class AccumulatedMatmul(torch.autograd.Function):
    """``accumulated_matmul`` whose backward GEMMs (and bias sum) are accumulated the same way."""

    @staticmethod
    def forward(ctx, a, b, bias, accumulator: Accumulator, generator):  # noqa: D102
        ctx.save_for_backward(a, b)
        ctx.accumulator, ctx.generator = accumulator, generator
        ctx.bias_shape = None if bias is None else bias.shape
        return accumulated_matmul(a, b, accumulator, bias, generator)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        a, b = ctx.saved_tensors
        grad_a = grad_b = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_a = _left_gradient(grad, a, b, ctx.accumulator, ctx.generator).to(a.dtype)
        if ctx.needs_input_grad[1]:
            grad_b = _right_gradient(grad, a, b, ctx.accumulator, ctx.generator).to(b.dtype)
        if ctx.bias_shape is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_to(grad, ctx.bias_shape, ctx.accumulator, ctx.generator)
        return grad_a, grad_b, grad_bias, None, None


def _left_gradient(grad, a, b, accumulator, generator):
    right = b.transpose(-1, -2)  # [..., N, K]
    if a.dim() == grad.dim():
        return accumulated_matmul(grad, right, accumulator, None, generator)
    rows = a.shape[-2]  # a is 2-D and shared: sum over (batch, n)
    left = grad.movedim(-2, 0).reshape(rows, -1)
    right = right.expand(*grad.shape[:-2], *right.shape[-2:]).reshape(-1, right.shape[-1])
    return accumulated_matmul(left, right, accumulator, None, generator)


def _right_gradient(grad, a, b, accumulator, generator):
    left = a.transpose(-1, -2)  # [..., K, M]
    if b.dim() == grad.dim():
        return accumulated_matmul(left, grad, accumulator, None, generator)
    depth = b.shape[-2]  # b is 2-D and shared: sum over (batch, m)
    left = left.expand(*grad.shape[:-2], *left.shape[-2:]).movedim(-2, 0).reshape(depth, -1)
    return accumulated_matmul(left, grad.reshape(-1, grad.shape[-1]), accumulator, None, generator)


def sum_to(grad: torch.Tensor, shape: torch.Size, accumulator: Accumulator, generator=None) -> torch.Tensor:
    """``grad`` summed (in ``accumulator``) over the dimensions a tensor of ``shape`` was broadcast along."""
    padded = (1,) * (grad.dim() - len(shape)) + tuple(shape)
    reduced = [d for d in range(grad.dim()) if padded[d] == 1 and grad.shape[d] != 1]
    kept = [d for d in range(grad.dim()) if d not in reduced]
    size = math.prod(grad.shape[d] for d in reduced)
    table = grad.permute(*kept, *reduced).reshape(-1, size)
    ones = torch.ones(size, 1, dtype=grad.dtype, device=grad.device)
    return accumulated_matmul(table, ones, accumulator, None, generator).reshape(shape).to(grad.dtype)


__all__ = ["AccumulatedMatmul", "check_backward_shapes", "sum_to"]
