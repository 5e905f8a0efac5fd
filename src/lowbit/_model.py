"""Small model-handling helpers every floor shares: turn a data batch
into the model's arguments, run batches with hooks, skip patterns (regexes over qualified names).

This module sits on the lowest floor (torch and ``lowbit.errors`` only) so that graph passes, real kernels'
drivers, PTQ, the report and the pipeline all use the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError


def model_arguments(batch: Any) -> tuple[tuple, dict[str, Any]]:
    """A batch as the model's (args, kwargs).

    A mapping (a dict, a Hugging Face ``BatchEncoding``) is keyword arguments; a tuple / list is a data
    loader's (inputs, labels, ...) and gives its first item; anything else is the one positional input.
    """
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        if not batch:
            raise ConfigError("a batch is an empty tuple / list: nothing to give the model")
        return (batch[0],), {}
    return (batch,), {}


def model_input(batch: Any) -> Any:
    """The one object a loader batch stands for: x of (x, labels), or the whole mapping of a tokenized batch."""
    args, kwargs = model_arguments(batch)
    return args[0] if args else kwargs


def call_model(model: nn.Module, batch: Any) -> Any:
    """``model`` applied to ``batch`` by :func:`model_arguments`."""
    args, kwargs = model_arguments(batch)
    return model(*args, **kwargs)


PreHook = Callable[[nn.Module, tuple], Any]


@torch.no_grad()
def run_batches(model: nn.Module, batches: Iterable[Any], hooks: Mapping[nn.Module, PreHook] | None = None, *,
                num_batches: int | None = None, on_batch: Callable[[Any], None] | None = None) -> int:  # fmt: skip
    """Run ``batches`` through ``model`` in eval mode without gradients, with forward pre-hooks on given
    modules (removed afterwards, whatever happens); returns how many batches ran.

    ``num_batches`` stops early; ``on_batch(batch)`` is called before each batch runs (e.g. to set the row
    mask a hook reads). The model's training flag is restored.
    """
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1):
        raise ConfigError(f"num_batches={num_batches!r} must be a positive int (or None for all)")
    handles = [module.register_forward_pre_hook(hook) for module, hook in (hooks or {}).items()]
    was_training, seen = model.training, 0
    model.eval()
    try:
        for batch in batches:
            if num_batches is not None and seen >= num_batches:
                break
            if on_batch is not None:
                on_batch(batch)
            call_model(model, batch)
            seen += 1
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return seen


def skip_patterns(skip: Any) -> list[re.Pattern[str]]:
    """Regexes (fully matched against qualified module names) from a string or a list of strings."""
    if skip is None:
        return []
    if isinstance(skip, str):
        skip = [skip]
    if not isinstance(skip, (list, tuple)) or not all(isinstance(pattern, str) for pattern in skip):
        raise ConfigError(f"skip={skip!r} must be a regex or a list of regexes")
    try:
        return [re.compile(pattern) for pattern in skip]
    except re.error as error:
        raise ConfigError(f"skip={skip!r}: bad regex: {error}") from None


def root_module(model: Any, who: str = "quantize_") -> nn.Module:
    """The nn.Module to change: the model itself, or a QGraph's GraphModule (its ``.model``)."""
    if isinstance(model, nn.Module):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module):
        return inner
    raise ConfigError(f"{who} needs an nn.Module or a QGraph, got {type(model).__name__}")
