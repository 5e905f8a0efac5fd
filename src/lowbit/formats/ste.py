"""The one straight-through estimator: forward quantizes, backward passes the gradient unchanged.

Formats never write a backward of their own; :func:`straight_through` wraps every quantizer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return fn(x)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return grad_output, None


def straight_through(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` in the forward pass; identity gradient in the backward pass."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _StraightThrough.apply(x, fn)
    return fn(x)
