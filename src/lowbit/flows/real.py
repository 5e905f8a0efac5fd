"""Real-quantized recipes: Linear / Conv2d layers swapped for modules holding integer codes (``lowbit.ops``).

One mechanism serves the recipes and MASE pass_args alike: a recipe states its formats as a
:class:`~lowbit.nn.roles.RoleFormats` (:func:`recipe_formats`), the layer is wrapped in the simulated
``QuantLinear`` of those formats, and :func:`~lowbit.ops.from_fake.convert_quant_linear` builds the real module
whose weight codes are the simulated weight's own codes (one rounding rule). Options beyond a plain format
(int4's per-group range search, GPTQ) build the codes themselves and say so in the module's record.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch
from torch import nn

from lowbit._model import run_batches
from lowbit.errors import ConfigError
from lowbit.flows.recipes import (
    GGUFWeightOnly,
    Int4WeightOnly,
    Int8Dynamic,
    Int8WeightOnly,
    Recipe,
    W8A8Static,
    handles,
)
from lowbit.formats import resolve
from lowbit.graph.plan import Entry, Ready, Real, Transform, apply, build
from lowbit.graph.select import select_layers
from lowbit.nn.roles import RoleFormats


def recipe_formats(recipe: Recipe) -> RoleFormats:
    """The formats a real Linear recipe computes, as the simulated side spells them."""
    if isinstance(recipe, Int8Dynamic):
        block = {"block_size": (1, -1)} if recipe.act_granularity == "token" else {}
        data_in = resolve("affine", bits=recipe.act_bits, symmetric=recipe.act_symmetric, **block)
        return RoleFormats(data_in=data_in, weight=_int8_weight())
    if isinstance(recipe, Int8WeightOnly):
        return RoleFormats(weight=_int8_weight())
    if isinstance(recipe, Int4WeightOnly):
        if recipe.zero_point_domain == "float":
            raise ConfigError("int4_weight_only with zero_point_domain='float' has no simulated format twin (the "
                              "affine formats hold integer zero points)")  # fmt: skip
        sign = {"signed": True, "symmetric": True} if recipe.symmetric else {"signed": False}
        return RoleFormats(weight=resolve("affine", bits=4, block_size=(1, recipe.group_size),
                                          scale_dtype=recipe.scale_dtype, **sign))  # fmt: skip
    if isinstance(recipe, GGUFWeightOnly):
        return RoleFormats(weight=resolve(recipe.name))
    raise ConfigError(f"recipe {recipe.name!r} has no fixed formats (its activation scales are calibrated)")


def _int8_weight():
    return resolve("affine", bits=8, symmetric=True, axis=0)


def real_targets(root: nn.Module, recipe: Recipe, conv: bool | str) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """(name -> plain nn.Linear / nn.Conv2d to swap, name -> why a convolution stays float). ``conv``: the
    recipe's include_conv ("auto": only where an exact int8 convolution beats float32 on its device)."""
    from lowbit.ops.conv_modules import conv_problem
    from lowbit.ops.routes import int8_conv_problem

    ops = ("linear", "conv2d") if conv is not False else ("linear",)
    targets, kept = {}, {}
    for name, (module, _) in select_layers(root, ops, recipe.skip, exact=True).items():
        problem = None
        if isinstance(module, nn.Conv2d):
            problem = conv_problem(module) or (int8_conv_problem(module.weight.device) if conv == "auto" else None)
        if problem is None:
            targets[name] = module
        else:
            kept[name] = problem
    if not targets and not kept:
        raise ConfigError(f"the model has no nn.Linear{' or nn.Conv2d' if conv is not False else ''} layer to quantize "
                          "(after skip)")
    return targets, kept


def linear_from_formats(module: nn.Linear, formats: RoleFormats, **options: Any) -> nn.Module:
    """The real module computing ``formats`` on ``module`` (ConfigError when no kernel runs them)."""
    return build(module, Real(formats=formats, options=options))


@handles(Int8Dynamic, Int8WeightOnly, Int4WeightOnly, W8A8Static, GGUFWeightOnly)
def quantize_real(root: nn.Module, recipe: Recipe) -> dict[str, Any]:
    """Swap ``root``'s layers (in place) by a real recipe; returns the info dict."""
    conv = getattr(recipe, "include_conv", False)
    targets, kept = real_targets(root, recipe, conv)
    smoothing = {}
    if getattr(recipe, "smoothquant", None) is not None and targets:
        from lowbit.flows.smoothing import smooth_quant

        batches = list(recipe.calibration_data)  # read twice (w8a8_static calibrates after the smoothing)
        recipe = dataclasses.replace(recipe, calibration_data=batches)
        fold = Transform(lambda model: smooth_quant(model, batches, float(recipe.smoothquant), targets))
        smoothing = apply(root, {"": fold}).transformed[""]
    factory = _factory(recipe)(root, targets, recipe) if targets else None
    smoothed = _smoothing_records(smoothing)
    plan = {name: _with_record(factory(name, module), smoothed.get(name)) for name, module in targets.items()}
    converted = apply(root, plan).placed
    if isinstance(recipe, Int4WeightOnly):
        _stamp_grid_spans(root, targets)
    info = {"recipe": recipe.name, "quantized": converted, "counts": dict(Counter(converted.values())), **smoothing,
            **getattr(factory, "info", {})}  # fmt: skip
    note = int8_speed_note(recipe, targets)
    info = {**info, "note": note} if note else info
    return {**info, "kept": kept} if kept else info


def _with_record(entry: Entry, record: dict[str, Any] | None) -> Entry:
    """``entry`` with ``record`` added to the record its module will carry."""
    if not record or not isinstance(entry, (Real, Ready)):
        return entry
    return dataclasses.replace(entry, record={**(entry.record or {}), **record})


def _stamp_grid_spans(root: nn.Module, targets: dict[str, nn.Module]) -> None:
    """Each int4 module's record gains its stored grid's span over its float weight's (:func:`grid_span`)."""
    from lowbit.ops import Int4WeightOnlyLinear

    for name, module in targets.items():
        placed = root.get_submodule(name)
        if isinstance(placed, Int4WeightOnlyLinear) and placed.algorithm is not None:
            placed.algorithm = {**placed.algorithm, **grid_span(placed, module.weight)}


def _smoothing_records(smoothing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per smoothed layer: SmoothQuant's alpha and the range of the scales folded in front of it."""
    ranges = smoothing.get("smoothing_scale_ranges", {})
    return {layer: {"method": "smoothquant", "alpha": smoothing["smoothquant"], "scale_range": ranges[producer]}
            for producer, layers in smoothing.get("smoothed", {}).items() for layer in layers}  # fmt: skip


def int8_speed_note(recipe: Recipe, targets: dict[str, nn.Module]) -> str | None:
    """The one line saying that this machine has no exact int8 Linear route faster than float32 (None where
    it has one, and for the other recipes). The native library is built or loaded here if need be: whether
    its kernel is faster is measured, not assumed."""
    from lowbit import backend
    from lowbit.native import ensure
    from lowbit.ops import routes

    if not isinstance(recipe, (Int8Dynamic, W8A8Static)) or getattr(recipe, "act_bits", 8) != 8:
        return None
    for device in {module.weight.device for module in targets.values() if isinstance(module, nn.Linear)}:
        if routes.int8_linear_problem(device, native=False) is None:
            continue
        native = backend.get_backend() in ("auto", "native") and ensure() is not None
        problem = routes.int8_linear_problem(device, native=native)
        if problem is not None:
            return problem
    return None


def _int8_dynamic(root, targets, recipe: Int8Dynamic):
    formats = recipe_formats(recipe)

    def factory(name, module):
        if isinstance(module, nn.Conv2d):
            options = {"activation": "dynamic", "channels_last": recipe.conv_channels_last}
            return Real(module="Int8Conv2d", options=options)
        return Real(formats=formats)  # act_bits / granularity: in the data_in format

    return factory


def _int8_weight_only(root, targets, recipe: Int8WeightOnly):
    formats = recipe_formats(recipe)
    return lambda name, module: Real(formats=formats, options={"compute_dtype": recipe.compute_dtype})


def _int4_weight_only(root, targets, recipe: Int4WeightOnly):
    factory = _int4_factory(root, targets, recipe)
    awq_layers = {layer: {"awq_alpha": entry["alpha"], "awq_scale_range": entry["scale_range"]}
                  for entry in getattr(factory, "info", {}).get("awq", {}).values() for layer in entry["layers"]}

    def stamped(name: str, module: nn.Linear) -> Entry:
        return _with_record(factory(name, module), {**int4_algorithm(recipe), **awq_layers.get(name, {})})

    return _with_info(stamped, getattr(factory, "info", {}))


def int4_algorithm(recipe: Int4WeightOnly) -> dict[str, Any]:
    """What an int4 recipe's method is, with the options that shaped its result (for the module's record)."""
    entry: dict[str, Any] = {"method": recipe.method}
    if recipe.method == "round":
        weighted = " (weighted by the inputs)" if recipe.calibration_data is not None else ""
        entry["method"] = "min-max" if recipe.symmetric or not recipe.search else f"range search{weighted}"
    if "gptq" in recipe.method:
        entry.update(damping=recipe.damping, act_order=recipe.act_order, block_size=recipe.block_size)
    if recipe.method == "hqq":
        entry["iterations"] = recipe.hqq_iterations
    return entry


def grid_span(module: nn.Module, weight: torch.Tensor) -> dict[str, float]:
    """The stored grid's span (15 scale steps) over each group's own weight span (widened to hold 0 in the
    integer zero-point domain): its mean and minimum over the groups with a span, rounded; 1 is min-max, below
    1 the method clipped the group's ends."""
    groups = weight.detach().float().reshape(weight.shape[0], -1, module.group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    if not module.float_zero:
        low, high = low.clamp(max=0.0), high.clamp(min=0.0)
    span, grid = high - low, module.weight_scale.float().to(weight.device) * 15
    ratio = (grid / span)[span > 0]
    if ratio.numel() == 0:
        return {}
    return {"grid_span_mean": round(float(ratio.mean()), 4), "grid_span_min": round(float(ratio.min()), 4)}


def _int4_factory(root, targets, recipe: Int4WeightOnly):
    for name, module in targets.items():
        if module.in_features % recipe.group_size:
            raise ConfigError(f"{name}: in_features={module.in_features} is not divisible by group_size="
                              f"{recipe.group_size}; skip it (skip=[{name!r}]) or pick another group_size")  # fmt: skip
    awq_info, power = {}, None
    if recipe.method in ("awq", "awq+gptq"):
        from lowbit.flows.awq import awq_scale, int4_rounded
        from lowbit.ops.int4 import SCALE_DTYPES

        recipe = dataclasses.replace(recipe, calibration_data=list(recipe.calibration_data))  # read twice
        def rounded(weight):
            return int4_rounded(weight, recipe.group_size, SCALE_DTYPES[recipe.scale_dtype])

        fold = Transform(lambda model: awq_scale(model, targets, recipe.calibration_data, rounded))
        awq_info, power = apply(root, {"": fold}).transformed[""]
    if recipe.method in ("gptq", "awq+gptq"):
        from lowbit.flows.gptq import gptq_modules

        built = gptq_modules(root, targets, recipe)
        return _with_info(lambda name, module: Ready(built[name]), awq_info)
    if recipe.method == "hqq":
        return lambda name, module: _hqq_entry(module, recipe)
    if recipe.zero_point_domain == "float":
        power = input_power(root, targets, recipe.calibration_data) if recipe.calibration_data is not None else {}
        return lambda name, module: _int4_entry(recipe, search=recipe.search, importance=power.get(name),
                                                zero_point_domain="float")  # fmt: skip
    if not recipe.search or recipe.symmetric:  # a plain format: the simulated affine 4-bit weight's own codes
        formats = recipe_formats(recipe)
        return _with_info(lambda name, module: Real(formats=formats, options={"compute_dtype": recipe.compute_dtype}),
                          awq_info)  # fmt: skip
    if power is None:
        power = input_power(root, targets, recipe.calibration_data) if recipe.calibration_data is not None else {}
    return _with_info(lambda name, module: _int4_entry(recipe, search=True, importance=power.get(name)), awq_info)


def _int4_entry(recipe: Int4WeightOnly, **options: Any) -> Real:
    """The Int4WeightOnlyLinear entry of the recipe's group size, scale and compute dtypes, plus ``options``."""
    return Real(module="Int4WeightOnlyLinear", options={"group_size": recipe.group_size, "scale_dtype": recipe.scale_dtype,
                                                        "compute_dtype": recipe.compute_dtype, **options})  # fmt: skip


def _with_info(factory, info: dict[str, Any]):
    """``factory`` carrying what its preparation did (``info``, merged into quantize_'s info)."""
    factory.info = info
    return factory


def _hqq_entry(module: nn.Linear, recipe: Int4WeightOnly) -> Real:
    from lowbit.ops.hqq import hqq_float_quantize, hqq_quantize
    from lowbit.ops.int4 import SCALE_DTYPES

    fit = hqq_float_quantize if recipe.zero_point_domain == "float" else hqq_quantize
    result = fit(module.weight, recipe.group_size, SCALE_DTYPES[recipe.scale_dtype], recipe.hqq_iterations)
    return _int4_entry(recipe, codes=result.codes, scale=result.scale, zero_point=result.zero_point,
                       zero_point_domain=recipe.zero_point_domain)


# llama.cpp's type for a K-quant tensor whose rows are not whole super-blocks of 256 (its quantize tool's rule)
GGUF_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0"}


def _gguf_weight_only(root, targets, recipe: GGUFWeightOnly):
    from lowbit.ops.ggml import BLOCKS

    block = BLOCKS[recipe.ggml_type]
    fallback = {}
    for name, module in targets.items():
        if module.in_features % block and module.in_features % 32 == 0 and recipe.ggml_type in GGUF_FALLBACK:
            fallback[name] = GGUF_FALLBACK[recipe.ggml_type]
        elif module.in_features % block:
            raise ConfigError(f"{name}: in_features={module.in_features} is not a multiple of {block} "
                              f"({recipe.ggml_type.upper()}'s block); skip it (skip=[{name!r}])")  # fmt: skip
    formats = {recipe.ggml_type: recipe_formats(recipe)}  # the simulated gguf_* weight's own codes
    formats.update({kind: RoleFormats(weight=resolve(f"gguf_{kind}")) for kind in set(fallback.values())})
    return _with_info(lambda name, module: Real(formats=formats[fallback.get(name, recipe.ggml_type)],
                                                 options={"compute_dtype": recipe.compute_dtype}),
                      {"gguf_fallback": fallback} if fallback else {})  # fmt: skip


def _w8a8_static(root, targets, recipe: W8A8Static):
    from lowbit.calibrate.builders import scale_zero_point
    from lowbit.flows.ptq import calibrate

    state = recipe.calibration
    if state is None:
        convs = any(isinstance(module, nn.Conv2d) for module in targets.values())
        state = calibrate(root, recipe.calibration_data, ops=("linear", "conv2d") if convs else ("linear",))
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
        scale, zero_point = float(scale.flatten()[0]), int(zero_point.flatten()[0])
        if isinstance(module, nn.Conv2d):
            return Real(module="Int8Conv2d", options={"activation": "static", "act_signed": state.signed,
                                                      "channels_last": recipe.conv_channels_last,
                                                      "input_qparams": (scale, zero_point)})  # fmt: skip
        data_in = resolve("affine", bits=8, signed=state.signed, scale=scale, zero_point=zero_point)
        return Real(formats=RoleFormats(data_in=data_in, weight=_int8_weight()))

    return factory


_FACTORIES = {Int8Dynamic: _int8_dynamic, Int8WeightOnly: _int8_weight_only, Int4WeightOnly: _int4_weight_only,
              W8A8Static: _w8a8_static}  # fmt: skip


def _factory(recipe: Recipe):
    return _gguf_weight_only if isinstance(recipe, GGUFWeightOnly) else _FACTORIES[type(recipe)]


def input_power(root: nn.Module, targets: dict[str, nn.Module], batches) -> dict[str, torch.Tensor]:
    """Mean x^2 per input channel of every target module over the calibration batches."""
    sums: dict[str, list] = {name: [0.0, 0] for name in targets}

    def watch(name):
        def hook(module, inputs):
            rows = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            sums[name][0] = sums[name][0] + rows.square().sum(0)
            sums[name][1] += rows.shape[0]

        return hook

    run_batches(root, batches, {module: watch(name) for name, module in targets.items()})
    return {name: total / max(count, 1) for name, (total, count) in sums.items() if count}
