"""``quantize_model``: swap a model's Linear (and Conv2d) layers for real-quantized ones (integer codes + CPU
kernels).

Recipes (``recipe=``):

- ``"int8_dynamic"``: :class:`~lowbit.ops.Int8DynamicLinear` (int8 per-channel weights, per-token int8
  activations); options ``act_symmetric`` (default True), ``act_granularity`` ("token") and ``act_bits``
  (8; 7 makes one fbgemm call exact on CPUs without VNNI, one bit coarser everywhere).
- ``"int8_weight_only"``: :class:`~lowbit.ops.Int8WeightOnlyLinear`; option ``compute_dtype`` (None: the
  input's dtype; "bf16" computes a float32 model in bfloat16, faster on CPUs with bfloat16 hardware).
- ``"int4_weight_only"``: :class:`~lowbit.ops.Int4WeightOnlyLinear`; options ``compute_dtype`` (as above),
  ``group_size`` (32),
  ``scale_dtype`` ("bf16"), ``search`` (True: per-group range search), ``calibration_data`` (batches:
  the search then weighs each input channel by its mean square) and ``method``: "round" (default: each
  weight rounded to its nearest code) or "gptq" (error-compensating rounding, :mod:`lowbit.ops.gptq`;
  needs ``calibration_data``; layers are quantized one stage at a time in call order, each from inputs
  that went through the earlier quantized layers; options ``damping`` (0.1), ``block_size`` (128),
  ``act_order`` (False), ``mask_padding`` (True: rows where a dict batch's ``attention_mask`` is 0 stay
  out of the Hessians)).
- ``"w8a8_static"``: :class:`~lowbit.ops.W8A8StaticLinear`; ``calibration`` = a
  :class:`lowbit.ptq.CalibrationState` (from ``lowbit.ptq.calibrate(model, batches, ops=("linear", "conv2d"))``) or
  ``calibration_data`` = batches (calibrated here with min-max, uint8 asymmetric). The activation scale and
  zero point come from the same builder as ``lowbit.ptq.quantize_static``.
- a dict: MASE-style ``pass_args`` (``{"by": "type", "linear": {"config": {...}}}``). The fake-quant pass
  (``quantize_module_transform_pass``, or ``quantize_transform_pass`` for a QGraph) runs first, then every
  QuantLinear whose formats a kernel implements becomes a real module (see :func:`real_module_for`); the
  others stay fake-quantized and ``info["kept"]`` says why.

Every recipe takes ``skip`` (regexes fully matched against qualified module names, e.g. ``"pooler.*"``),
changes the model in place and returns ``(model, info)`` like the graph passes. ``"int8_dynamic"`` and
``"w8a8_static"`` also swap every plain ``nn.Conv2d`` for :class:`~lowbit.ops.Int8Conv2d` (dynamic or
calibrated per-tensor uint8 activations, int8 per-channel weights) unless ``include_conv=False``;
convolutions it cannot hold (padding modes other than zeros, ``padding="same"``) stay float, listed in
``info["kept"]`` with the reason. ``conv_channels_last=True`` lets them return the channels-last layout
they compute (no copy to NCHW: DigitsCNN 0.56-0.70x fp32 instead of 1.25-1.4x; a later ``.view()`` of
their output then fails where ``reshape`` / ``flatten`` work).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError, did_you_mean

RECIPES = ("int8_dynamic", "int8_weight_only", "int4_weight_only", "w8a8_static")
INT4_METHODS = ("round", "gptq")
CONV_RECIPES = ("int8_dynamic", "w8a8_static")  # these also swap nn.Conv2d for Int8Conv2d


def quantize_model(model: nn.Module, recipe: str | dict, **options) -> tuple[nn.Module, dict[str, Any]]:
    """Swap ``model``'s Linear (and Conv2d) layers for real-quantized modules by ``recipe``; see the module docstring."""
    if isinstance(recipe, dict):
        return _from_pass_args(model, recipe, **options)
    if recipe not in RECIPES:
        raise ConfigError(f"unknown recipe {recipe!r}{did_you_mean(str(recipe), RECIPES)}; recipes: {', '.join(RECIPES)}")
    root = _module_of(model)
    skip = _skip_patterns(options.pop("skip", ()))
    include_conv = options.pop("include_conv", True) if recipe in CONV_RECIPES else False
    if not isinstance(include_conv, bool):
        raise ConfigError(f"include_conv={include_conv!r} must be True or False")
    targets, kept = _targets(root, skip, include_conv)
    if not targets:
        raise ConfigError(f"the model has no nn.Linear{' or nn.Conv2d' if include_conv else ''} layer to quantize (after skip)")
    build = _BUILDERS[recipe]
    factory = build(root, targets, options)
    if options:
        raise ConfigError(f"recipe {recipe!r} got unknown option(s) {sorted(options)}")
    converted = {}
    for name, module in targets.items():
        new = factory(name, module)
        _replace(root, name, new)
        converted[name] = type(new).__name__
    info = {"recipe": recipe, "quantized": converted, "counts": dict(Counter(converted.values()))}
    return model, {**info, "kept": kept} if kept else info


def _targets(root: nn.Module, skip, include_conv: bool) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """(name -> plain nn.Linear / nn.Conv2d to swap, name -> why a convolution stays float)."""
    from lowbit.ops.conv_modules import conv_problem

    targets, kept = {}, {}
    for name, module in root.named_modules():
        if not name or any(pattern.fullmatch(name) for pattern in skip):
            continue
        if type(module) is nn.Linear:
            targets[name] = module
        elif include_conv and type(module) is nn.Conv2d:
            problem = conv_problem(module)
            if problem is None:
                targets[name] = module
            else:
                kept[name] = problem
    return targets, kept


# ---- recipes ---------------------------------------------------------------------------------------------------
def _int8_dynamic(root, targets, options):
    from lowbit.ops import Int8Conv2d, Int8DynamicLinear

    settings = {"act_symmetric": options.pop("act_symmetric", True),
                "act_granularity": options.pop("act_granularity", "token"), "act_bits": options.pop("act_bits", 8)}  # fmt: skip
    channels_last = options.pop("conv_channels_last", False)

    def factory(name, module):
        if isinstance(module, nn.Conv2d):
            return Int8Conv2d.from_float(module, activation="dynamic", channels_last=channels_last)
        return Int8DynamicLinear.from_float(module, **settings)

    return factory


def _int8_weight_only(root, targets, options):
    from lowbit.ops import Int8WeightOnlyLinear

    compute_dtype = options.pop("compute_dtype", None)
    return lambda name, module: Int8WeightOnlyLinear.from_float(module, compute_dtype=compute_dtype)


def _int4_weight_only(root, targets, options):
    from lowbit.ops import Int4WeightOnlyLinear
    from lowbit.ops.modules import check_compute_dtype

    group_size = options.pop("group_size", 32)
    scale_dtype = options.pop("scale_dtype", "bf16")
    search = options.pop("search", True)
    compute_dtype = check_compute_dtype("int4_weight_only", options.pop("compute_dtype", None))
    data = options.pop("calibration_data", None)
    for name, module in targets.items():
        if isinstance(group_size, int) and group_size > 0 and module.in_features % group_size:
            raise ConfigError(f"{name}: in_features={module.in_features} is not divisible by group_size={group_size}; "
                              f"skip it (skip=[{name!r}]) or pick another group_size")  # fmt: skip
    method = options.pop("method", "round")
    if method not in INT4_METHODS:
        raise ConfigError(f"method={method!r}{did_you_mean(str(method), INT4_METHODS)}; legal: {', '.join(INT4_METHODS)}")
    if method == "gptq":
        built = _gptq_modules(root, targets, data, group_size, scale_dtype, search, options)
        for module in built.values():
            module.compute_dtype = compute_dtype
        return lambda name, module: built[name]
    power = _input_power(root, targets, data) if data is not None else {}
    return lambda name, module: Int4WeightOnlyLinear.from_float(
        module, group_size=group_size, scale_dtype=scale_dtype, search=search, importance=power.get(name),
        compute_dtype=compute_dtype)


def _gptq_modules(root, targets, data, group_size, scale_dtype, search, options) -> dict[str, nn.Module]:
    """GPTQ-rounded Int4WeightOnlyLinear for every target, quantized in call order (lowbit.ops.gptq)."""
    from lowbit.ops import Int4WeightOnlyLinear
    from lowbit.ops.gptq import gptq_quantize, sequential_gptq
    from lowbit.ops.int4 import SCALE_DTYPES
    from lowbit.ptq import _model_inputs

    if data is None:
        raise ConfigError("method='gptq' needs calibration_data= (batches the model can run) to build each layer's Hessian")
    settings = {key: options.pop(key) for key in ("damping", "block_size", "act_order") if key in options}
    mask_padding = options.pop("mask_padding", True)
    if options:  # checked before the slow part
        raise ConfigError(f"recipe 'int4_weight_only' got unknown option(s) {sorted(options)}")
    if scale_dtype not in SCALE_DTYPES:
        raise ConfigError(f"scale_dtype={scale_dtype!r}; legal: {', '.join(SCALE_DTYPES)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ConfigError(f"group_size={group_size!r} must be an even int >= 2 (32 or 128 for the int4pack kernel)")
    if not isinstance(mask_padding, bool):
        raise ConfigError(f"mask_padding={mask_padding!r} must be True or False")

    def run_batch(model, batch):
        args, kwargs = _model_inputs(batch)
        model(*args, **kwargs)

    def quantize_layer(name, module, hessian):
        result = gptq_quantize(module.weight, hessian, group_size, SCALE_DTYPES[scale_dtype], search=search, **settings)
        return Int4WeightOnlyLinear.from_float(module, group_size=group_size, scale_dtype=scale_dtype,
                                               codes=result.codes, scale=result.scale, zero_point=result.zero_point)  # fmt: skip

    def row_mask(batch):  # Hugging Face batches: padding tokens stay out of the Hessians
        return batch.get("attention_mask") if isinstance(batch, dict) and mask_padding else None

    return sequential_gptq(root, targets, data, run_batch, quantize_layer, row_mask)


def _w8a8_static(root, targets, options):
    from lowbit.calibrate.builders import scale_zero_point
    from lowbit.ops import Int8Conv2d, W8A8StaticLinear
    from lowbit.ptq import calibrate

    state = options.pop("calibration", None)
    data = options.pop("calibration_data", None)
    channels_last = options.pop("conv_channels_last", False)
    if state is None and data is None:
        raise ConfigError("recipe 'w8a8_static' needs calibration= (lowbit.ptq.calibrate(...)) or calibration_data=")
    if state is None:
        convs = any(isinstance(module, nn.Conv2d) for module in targets.values())
        state = calibrate(root, data, ops=("linear", "conv2d") if convs else ("linear",))
    if state.bits != 8:
        raise ConfigError(f"w8a8_static needs an 8-bit calibration, got bits={state.bits}")
    missing = [name for name in targets if name not in state.ranges]
    if missing:
        raise ConfigError(f"the calibration has no range for {missing[:3]}{'...' if len(missing) > 3 else ''}"
                          + ("; calibrate with ops=('linear', 'conv2d') or pass include_conv=False"
                             if any(isinstance(targets[name], nn.Conv2d) for name in missing) else ""))  # fmt: skip

    def factory(name, module):
        low, high = torch.tensor(state.ranges[name]["min"]), torch.tensor(state.ranges[name]["max"])
        scale, zero_point = scale_zero_point(low, high, 8, signed=state.signed, symmetric=state.symmetric)
        if isinstance(module, nn.Conv2d):
            new = Int8Conv2d.from_float(module, activation="static", act_signed=state.signed, channels_last=channels_last)
        else:
            new = W8A8StaticLinear.from_float(module, act_signed=state.signed)
        return new.set_input_qparams(float(scale.flatten()[0]), int(zero_point.flatten()[0]))

    return factory


_BUILDERS = {"int8_dynamic": _int8_dynamic, "int8_weight_only": _int8_weight_only,
             "int4_weight_only": _int4_weight_only, "w8a8_static": _w8a8_static}  # fmt: skip


# ---- helpers ---------------------------------------------------------------------------------------------------
def _module_of(model) -> nn.Module:
    """The nn.Module to change: the model itself, or a QGraph's GraphModule."""
    inner = getattr(model, "model", None)
    if not isinstance(model, nn.Module) and isinstance(inner, nn.Module):
        return inner
    if not isinstance(model, nn.Module):
        raise ConfigError(f"quantize_model needs an nn.Module or a QGraph, got {type(model).__name__}")
    return model


def _skip_patterns(skip) -> list[re.Pattern[str]]:
    if isinstance(skip, str):
        skip = [skip]
    try:
        return [re.compile(pattern) for pattern in skip]
    except (TypeError, re.error) as error:
        raise ConfigError(f"skip={skip!r} must be a list of regexes: {error}") from None


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)


@torch.no_grad()
def _input_power(root: nn.Module, targets: dict[str, nn.Module], batches: Iterable[Any]) -> dict[str, torch.Tensor]:
    """Mean x^2 per input channel of every target module over the calibration batches."""
    from lowbit.ptq import _model_inputs

    sums: dict[str, list] = {name: [0.0, 0] for name in targets}

    def watch(name):
        def hook(module, inputs):
            rows = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            sums[name][0] = sums[name][0] + rows.square().sum(0)
            sums[name][1] += rows.shape[0]

        return hook

    hooks = [module.register_forward_pre_hook(watch(name)) for name, module in targets.items()]
    try:
        for batch in batches:
            args, kwargs = _model_inputs(batch)
            root(*args, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: total / max(count, 1) for name, (total, count) in sums.items() if count}


# ---- MASE-style configs ----------------------------------------------------------------------------------------
def _from_pass_args(model, pass_args: dict, **options) -> tuple[nn.Module, dict[str, Any]]:
    from lowbit.graph.module_swap import quantize_module_transform_pass
    from lowbit.graph.quantize import quantize_transform_pass
    from lowbit.nn.modules import QuantLinear

    if options:
        raise ConfigError(f"a pass_args recipe takes no options, got {sorted(options)}")
    if isinstance(model, nn.Module):
        model, pass_info = quantize_module_transform_pass(model, pass_args)
    else:
        model, pass_info = quantize_transform_pass(model, pass_args)
    root = _module_of(model)
    converted, kept = {}, {}
    for name, module in list(root.named_modules()):
        if not isinstance(module, QuantLinear):
            continue
        new, reason = real_module_for(module)
        if new is None:
            kept[name] = reason
        else:
            _replace(root, name, new)
            converted[name] = type(new).__name__
    info = {"recipe": "pass_args", "pass": pass_info, "quantized": converted, "kept": kept,
            "counts": dict(Counter(converted.values()))}  # fmt: skip
    return model, info


def real_module_for(module) -> tuple[nn.Module | None, str]:
    """The real-quantized module computing what a fake-quant ``QuantLinear`` computes, or (None, why not).

    Convertible: weight = affine 8-bit symmetric per output channel (axis 0), or affine 4-bit per group of
    the inputs (block_size [1, g]); data_in = none (weight-only), affine 8-bit per token
    (block_size [1, -1], dynamic) with an 8-bit weight, or affine 8-bit with a given per-tensor scale
    (static) with an 8-bit weight; no bias / data_out formats; round half to even; float32 scales.
    """
    from lowbit.ops.from_fake import convert_quant_linear

    return convert_quant_linear(module)
