"""The report's gradient pass: how far each layer's weight gradient moves when the model is quantized.

One backward pass of a loss through the float model and one through the quantized model, on the first
input batch (both in eval mode): the loss is the cross-entropy of the outputs against the labels when the
report has labels, else half the mean square of the outputs. Each quantized layer with a weight gets
``grad_weight_sqnr_db``: the SQNR (dB) of the quantized model's weight gradient against the float model's.
The quantized gradient is the one training would see: straight-through over the forward quantizers, with
the layer's gradient roles (``grad_data_out``, ``grad_weight``, ...) and accumulator applied. Layers
without a trainable float weight (function calls, real-quantized layers) get None.

Gradients come from ``torch.autograd.grad``, so no ``.grad`` of either model is written; weights frozen by
the caller (``requires_grad = False``) are unfrozen for the pass and frozen again afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from lowbit.report.collect import main_tensor, model_inputs
from lowbit.report.layers import Layer
from lowbit.report.metrics import sqnr_db


def gradient_sqnr(quantized: nn.Module, original: nn.Module, layers: list[Layer], batches: list[Any],
                  labels: list[Any] | None) -> dict[str, float | None]:  # fmt: skip
    """``{layer name: SQNR (dB) of its weight gradient, or None}`` (see the module docstring)."""
    pairs = _weight_pairs(layers, original)
    target = None if labels is None else labels[0]
    float_weights = [pair[0] for pair in pairs.values()]
    quantized_weights = [pair[1] for pair in pairs.values()]
    with _trainable(float_weights + quantized_weights), torch.enable_grad():
        float_grads = _gradients(original, batches[0], target, float_weights)
        quantized_grads = _gradients(quantized, batches[0], target, quantized_weights)
    result: dict[str, float | None] = {layer.name: None for layer in layers}
    for name, float_grad, quantized_grad in zip(pairs, float_grads, quantized_grads, strict=True):
        if float_grad is not None and quantized_grad is not None:
            result[name] = sqnr_db(float_grad, quantized_grad)
    return result


def _weight_pairs(layers: list[Layer], original: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{layer name: (float weight, quantized weight)} for the module layers with a float weight."""
    modules = dict(original.named_modules())
    nodes = {node.name: node for node in original.graph.nodes} if isinstance(original, fx.GraphModule) else {}
    pairs = {}
    for layer in layers:
        if layer.kind != "module":
            continue
        path = nodes[layer.name].target if layer.name in nodes else layer.name
        twin = modules.get(path) if isinstance(path, str) else None
        mine, theirs = getattr(layer.module, "weight", None), getattr(twin, "weight", None)
        if isinstance(mine, nn.Parameter) and isinstance(theirs, nn.Parameter) and mine.is_floating_point():
            pairs[layer.name] = (theirs, mine)
    return pairs


def _gradients(model: nn.Module, batch: Any, target: Any, weights: list[torch.Tensor]) -> tuple:
    args, kwargs = model_inputs(batch)
    output = main_tensor(model(*args, **kwargs)).float()
    if target is not None:
        loss = F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    else:
        loss = 0.5 * output.square().mean()
    return torch.autograd.grad(loss, weights, allow_unused=True)


@contextlib.contextmanager
def _trainable(weights: list[torch.Tensor]) -> Iterator[None]:
    frozen = [weight for weight in weights if not weight.requires_grad]
    try:
        for weight in frozen:
            weight.requires_grad_(True)
        yield
    finally:
        for weight in frozen:
            weight.requires_grad_(False)


__all__ = ["gradient_sqnr"]
