"""The model-level floor: every way to quantize a model, behind one door.

``lowbit.quantize_(model, config, **options)`` quantizes ``model`` in place and returns it (torchao's
convention). ``config`` is a typed recipe (:mod:`lowbit.flows.recipes`), a recipe name (``"int8_dynamic"``,
``"int8_weight_only"``, ``"int4_weight_only"``, ``"w8a8_static"``, llama.cpp's ``"gguf_q4_0"`` /
``"gguf_q4_1"`` / ``"gguf_q8_0"``, ``"kv_cache"``: the attention operands of Hugging Face decoders,
``"rotate"``: a Hadamard rotation of a Llama decoder that keeps its float function), any
format name (``"mxfp4_e2m1"``: that format simulated for every role of every Linear / Conv), a ``{"recipe": ...}`` table, or MASE pass_args.
``lowbit.quantize_model`` is the same door returning ``(model, info)``.

Floors inside: ``recipes`` (data, and the handler registry) <- ``simulated`` / ``real`` / ``kv_cache`` /
``rotation`` (handlers, each registered with ``recipes.handles``; ``gptq``, ``awq``, ``smoothing``, ``ptq``
serve them) <- this door.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from lowbit._model import root_module
from lowbit.flows.recipes import (
    RECIPES,
    REAL_RECIPES,
    FormatRecipe,
    GGUFQ4_0,
    GGUFQ4_1,
    GGUFQ8_0,
    GGUFWeightOnly,
    Int4WeightOnly,
    Int8Dynamic,
    Int8WeightOnly,
    KVCache,
    PassArgs,
    Recipe,
    Rotate,
    W8A8Static,
    handler_for,
    handles,
    make_recipe,
    recipe_from_dict,
)

log = logging.getLogger("lowbit")


def quantize_model(model: Any, config: Any, **options: Any) -> tuple[Any, dict[str, Any]]:
    """Quantize ``model`` in place by ``config`` (see the module docstring); returns ``(model, info)``."""
    from lowbit.flows import kv_cache, real, rotation, simulated  # noqa: F401 (each registers its recipes' handlers)

    recipe = make_recipe(config, **options)
    return model, handler_for(recipe)(model)


def quantized_cache(model: Any) -> Any:
    """A transformers Cache storing the keys and values of a ``kv_cache``-quantized model as lowbit codes
    (``model.generate(..., cache=lowbit.flows.quantized_cache(model))``; ``.memory()``: its bytes)."""
    from lowbit.flows.kv_cache import quantized_cache as build

    return build(model)


def quantize_(model: Any, config: Any, **options: Any) -> Any:
    """Quantize ``model`` in place by ``config`` and return it (torchao's convention); what changed is in
    ``lowbit.quantize_model``'s info, or :func:`describe` of the model."""
    quantize_model(model, config, **options)
    return model


def describe(model: nn.Module) -> dict[str, str]:
    """Qualified name -> what each quantized layer computes (simulated formats or the real module's path)."""
    from lowbit.nn.attention import AttentionQuantizer
    from lowbit.nn.modules import QuantModule
    from lowbit.ops import REAL_MODULES

    real_classes = tuple(REAL_MODULES.values())
    out = {}
    for name, module in root_module(model, "describe").named_modules():
        if isinstance(module, QuantModule):
            out[name] = f"simulated {module.formats.describe()}"
        elif isinstance(module, real_classes):
            out[name] = f"real {type(module).__name__}"
        elif isinstance(module, AttentionQuantizer):
            out[name] = f"simulated attention {module.formats.describe()}"
    return out


__all__ = ["RECIPES", "REAL_RECIPES", "FormatRecipe", "GGUFQ4_0", "GGUFQ4_1", "GGUFQ8_0", "GGUFWeightOnly",
           "Int4WeightOnly", "Int8Dynamic", "Int8WeightOnly", "KVCache", "PassArgs", "Recipe", "Rotate", "W8A8Static",
           "describe", "handler_for", "handles", "make_recipe", "quantize_", "quantize_model", "quantized_cache", "recipe_from_dict"]  # fmt: skip
