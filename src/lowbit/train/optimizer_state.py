"""The ``[low_precision_optimizer]`` table of a training config: which formats the optimizer keeps its
weights, gradients, momentum and second moments in (``lowbit.optim.LowPrecisionOptimizer``).

    [low_precision_optimizer]
    weight = {name = "integer", width = 8, frac_width = 6}   # a format name, or a table with its parameters
    grad = "e5m2"
    momentum = {name = "block_fp", width = 8, exponent_width = 8}
    second_moment = "e5m2"                                     # Adam's exp_avg_sq (and RMSprop's square_avg, ...)
    stochastic = true                                          # every role rounds stochastically
    seed = 0                                                   # seeds those draws (default: the run's seed)

The config reader checks the keys; :func:`check_low_precision` builds the formats once before training, so
a bad format name or parameter is a ConfigError before any work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lowbit.optim import LowPrecisionOptimizer
from lowbit.optim.low_precision import as_format

FORMAT_ROLES = ("weight", "grad", "momentum", "second_moment")


def check_low_precision(section: Mapping[str, Any] | None) -> None:
    """Build every format of ``section`` (ConfigError naming the role if one is bad)."""
    if section is None:
        return
    for role in FORMAT_ROLES:
        as_format(section.get(role), role, bool(section.get("stochastic", False)))


def wrap_optimizer(optimizer: torch.optim.Optimizer, section: Mapping[str, Any] | None,
                   default_seed: int | None = None) -> torch.optim.Optimizer:  # fmt: skip
    """``optimizer`` kept in ``section``'s formats (unchanged when ``section`` is None)."""
    if section is None:
        return optimizer
    formats = {role: section.get(role) for role in FORMAT_ROLES}
    return LowPrecisionOptimizer(optimizer, **formats, stochastic=bool(section.get("stochastic", False)),
                                 seed=section.get("seed", default_seed))  # fmt: skip


__all__ = ["FORMAT_ROLES", "check_low_precision", "wrap_optimizer"]
