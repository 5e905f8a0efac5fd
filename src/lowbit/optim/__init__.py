"""Optimizers whose state lives in low-precision number formats (docs/training-arithmetic.md)."""

from lowbit.optim.low_precision import MOMENT_STATES, LowPrecisionOptimizer

__all__ = ["LowPrecisionOptimizer", "MOMENT_STATES"]
