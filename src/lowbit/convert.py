"""``lowbit.quantize_model``: the door of :mod:`lowbit.flows` returning ``(model, info)``; kept as the
documented alias of :func:`lowbit.quantize_` for code written against it. Recipes and options:
:mod:`lowbit.flows.recipes` and docs/real-execution.md."""

from lowbit.flows import REAL_RECIPES as RECIPES
from lowbit.flows import quantize_model
from lowbit.flows.simulated import to_real

__all__ = ["RECIPES", "quantize_model", "to_real"]
