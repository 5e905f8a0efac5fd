"""The public quantize function."""

from __future__ import annotations

from typing import Any

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import resolve


def quantize(
    x: torch.Tensor,
    fmt: str | FormatSpec,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    **params: Any,
) -> torch.Tensor:
    """Fake-quantize ``x`` to the format ``fmt`` (a registered name or a spec object).

    ``params`` are the format's parameters (they override those of a spec object). Returns a tensor of the
    same shape and dtype holding representable values; the gradient is straight-through. ``seed`` or
    ``generator`` make stochastic rounding reproducible.

    >>> import torch, lowbit
    >>> lowbit.quantize(torch.tensor([0.30, -1.7]), "integer", width=4, frac_width=2)
    tensor([ 0.2500, -1.7500])
    """
    return resolve(fmt, **params)(x, seed=seed, generator=generator)
