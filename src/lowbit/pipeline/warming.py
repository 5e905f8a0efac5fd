"""``--warmup``: compile, before a command measures anything, the quantizer kernels its simulated layers will
use (:func:`lowbit.warmup`), so that the first test / report batch does not pay the compile time.

The formats and shapes come from the model itself: each quantized module's active roles, with the weight's
and bias's shapes and the input shape seen on one batch of the run's data (recorded by hooks while the model
runs that batch on the eager backend, which compiles nothing).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lowbit.pipeline.progress import note, waiting


def warm_up(model: nn.Module, batch: Any) -> int:
    """Compile the kernels ``model``'s quantized modules need for inputs like ``batch``; returns how many."""
    from lowbit.api import warmup

    jobs = _format_shapes(model, batch)
    if not jobs:
        note("warm-up: no simulated layer to compile kernels for")
        return 0
    ready = 0
    with waiting(f"warm-up: compiling quantizer kernels for {len(jobs)} format(s)"):
        for spec, shapes in jobs.values():
            ready += warmup(spec, shapes, inference=True, progress=lambda line: note(line.removeprefix("lowbit ")))
    return ready


def _format_shapes(model: nn.Module, batch: Any) -> dict[str, tuple[Any, list[tuple[int, ...]]]]:
    from lowbit.backend import get_backend, set_backend
    from lowbit.nn.modules import QuantModule
    from lowbit.pipeline.catalog import model_inputs

    modules = {name: module for name, module in model.named_modules() if isinstance(module, QuantModule)}
    input_shapes: dict[str, tuple[int, ...]] = {}
    hooks = [module.register_forward_pre_hook(_recorder(name, input_shapes)) for name, module in modules.items()]
    previous = get_backend()
    set_backend("eager")
    try:
        with torch.no_grad():
            inputs = model_inputs(batch)
            model(**inputs) if isinstance(inputs, dict) else model(inputs)
    finally:
        set_backend(previous)
        for hook in hooks:
            hook.remove()
    jobs: dict[str, tuple[Any, list[tuple[int, ...]]]] = {}
    for name, module in modules.items():
        for role, spec in module.formats.active().items():
            tensor_shape = input_shapes.get(name) if role == "data_in" else _shape(getattr(module, role, None))
            if tensor_shape is not None:
                shapes = jobs.setdefault(repr(spec), (spec, []))[1]
                if all(len(seen) != len(tensor_shape) for seen in shapes):  # one kernel per rank: shapes are dynamic
                    shapes.append(tensor_shape)
    return jobs


def _recorder(name: str, shapes: dict[str, tuple[int, ...]]):
    def hook(module, inputs):
        if inputs and isinstance(inputs[0], torch.Tensor):
            shapes.setdefault(name, tuple(inputs[0].shape))

    return hook


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


__all__ = ["warm_up"]
