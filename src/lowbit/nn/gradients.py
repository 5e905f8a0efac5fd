"""Rounding the backward pass: an identity in the forward pass whose gradient is rounded to a format.

The gradient roles of a quantized op (see :mod:`lowbit.nn.roles`):

- ``grad_data_out``: the gradient arriving from the op's output, rounded before the op's backward uses it
  (it is the operand of both backward GEMMs of a Linear / Conv);
- ``grad_data_in``: the gradient the op sends to its input;
- ``grad_weight`` / ``grad_bias``: the gradients of the parameters, as the optimizer sees them.

This is a separate autograd function from the straight-through wrapper of the formats (which passes the
gradient unchanged): :func:`round_gradient` is placed on the input side of a forward quantizer (so it rounds
what the straight-through estimator passes back) and on the output side of the op (so it rounds what
arrives). Stochastic rounding draws from a :class:`GradientStream`: one generator per device, seeded, so a
seeded run is reproducible and successive backward passes draw fresh numbers.
"""

from __future__ import annotations

import torch

from lowbit.errors import ConfigError
from lowbit.formats import FormatSpec


class GradientStream:
    """Seeded generators (one per device) for stochastic rounding in the backward pass.

    ``seed=None`` draws from torch's global generator (``torch.manual_seed`` then makes a run reproducible).
    A deep copy (``copy.deepcopy`` of a model) starts again from the seed, so two copies draw alike.
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an int or None, got {seed!r}")
        self.seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None or device.type == "meta":
            return None
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device)
            self._generators[key].manual_seed(self.seed)
        return self._generators[key]

    def reset(self) -> None:
        """Start again from the seed."""
        self._generators.clear()

    def __deepcopy__(self, memo: dict) -> GradientStream:
        return GradientStream(self.seed)

    def __reduce__(self):
        return (GradientStream, (self.seed,))


class _RoundGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: FormatSpec, stream: GradientStream | None) -> torch.Tensor:
        ctx.spec, ctx.stream = spec, stream
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        generator = None
        if ctx.spec.is_stochastic and ctx.stream is not None:
            generator = ctx.stream.generator(grad.device)
        return ctx.spec.quantize(grad, generator), None, None


def round_gradient(x: torch.Tensor, spec: FormatSpec | None, stream: GradientStream | None = None) -> torch.Tensor:
    """``x`` unchanged; in the backward pass the gradient flowing through here is rounded to ``spec``."""
    if spec is None or not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return _RoundGradient.apply(x, spec, stream)
