"""Simulated recipes: layers swapped for ``lowbit.nn`` quantized modules (fake quantization in any format),
and MASE pass_args, whose Linear layers become real modules wherever a kernel computes their formats.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from torch import nn

from lowbit._model import root_module
from lowbit.errors import ConfigError, LowbitError
from lowbit.flows.recipes import FormatRecipe, PassArgs, handles
from lowbit.formats import FormatSpec, resolve
from lowbit.graph.module_swap import quantize_module_transform_pass
from lowbit.graph.plan import MakeReal, Simulated, Transform, apply
from lowbit.graph.select import select_layers, swappable_modules
from lowbit.nn.modules import MODULE_FOR_OP, QuantLinear
from lowbit.nn.roles import RoleFormats


def swap_formats(root: nn.Module, plan: dict[str, RoleFormats]) -> dict[str, Any]:
    """Swap each named module of ``root`` for its quantized copy computing the planned formats."""
    ops = {name: op for name, _, op in swappable_modules(root)}
    missing = [name for name in plan if name not in ops]
    if missing:
        raise ConfigError(f"no quantized counterpart for module(s) {missing[:3]} (quantizable module types: "
                          f"{', '.join(cls.float_class.__name__ for cls in MODULE_FOR_OP.values())})")  # fmt: skip
    apply(root, {name: Simulated(formats, ops[name]) for name, formats in plan.items()})
    counts = Counter(ops[name] for name in plan)
    return {"quantized": list(plan), "counts": dict(counts)}


def format_spec(fmt: Any, params: dict[str, Any], where: str) -> FormatSpec:
    """A spec from a name (+ parameters), a spec, or a spec's plain dict ({"name": ..., params})."""
    try:
        if isinstance(fmt, dict):
            fmt = dict(fmt)
            return resolve(fmt.pop("name", None), **fmt, **params)
        return resolve(fmt, **params)
    except LowbitError as error:
        raise ConfigError(f"{where}: {error}") from None


@handles(FormatRecipe)
def quantize_format(root: nn.Module, recipe: FormatRecipe) -> dict[str, Any]:
    """Every role of ``recipe.roles`` of every layer of ``recipe.ops`` in one format (simulated)."""
    spec = format_spec(recipe.format, recipe.params, "format recipe")
    plan = {}
    for name, (module, op) in select_layers(root, recipe.ops, recipe.skip).items():
        roles = {role: spec for role in recipe.roles if role != "bias" or getattr(module, "bias", None) is not None}
        plan[name] = RoleFormats(**roles)
    if not plan:
        raise ConfigError(f"the model has no layer of the ops {list(recipe.ops)} to quantize (after skip)")
    awq = {}
    if recipe.method in ("awq", "awq+gptq"):
        recipe = dataclasses.replace(recipe, calibration_data=list(recipe.calibration_data))  # read twice
        awq = _format_awq(root, plan, spec, recipe)
    if recipe.method in ("gptq", "awq+gptq"):  # Linear weights GPTQ-rounded first; the other layers as with "round"
        from lowbit.flows.gptq_formats import gptq_format_layers

        gptq = gptq_format_layers(root, plan, recipe)
        rest = {name: formats for name, formats in plan.items() if name not in gptq["layers"]}
        info = swap_formats(root, rest) if rest else {"quantized": [], "counts": {}}
        counts = {**info["counts"], "linear": info["counts"].get("linear", 0) + len(gptq["layers"])}
        return {"recipe": spec.format_name, "quantized": list(plan), "counts": counts, "gptq": gptq, **awq}
    return {"recipe": spec.format_name, **swap_formats(root, plan), **awq}


def _format_awq(root: nn.Module, plan: dict[str, RoleFormats], spec: FormatSpec, recipe: FormatRecipe):
    """AWQ's scales for the plan's Linear layers, searched against ``spec``'s own rounding and folded into the
    ops before them (:mod:`lowbit.flows.awq`); the data is read again by GPTQ after it."""
    from lowbit.flows.awq import awq_scale

    targets = {name: root.get_submodule(name) for name in plan if type(root.get_submodule(name)) is nn.Linear}
    fold = Transform(lambda model: awq_scale(model, targets, recipe.calibration_data, spec.quantize))
    info, _ = apply(root, {"": fold}).transformed[""]
    return info


@handles(PassArgs, whole_model=True)
def quantize_pass_args(model: Any, recipe: PassArgs) -> dict[str, Any]:
    """MASE pass_args through the graph pass (a QGraph) or the module-swap pass (an nn.Module); with
    ``recipe.real`` every QuantLinear a kernel computes becomes the real module, the others stay simulated
    and ``info["kept"]`` says why."""
    from lowbit.graph.quantize import quantize_transform_pass

    pass_args = {key: value for key, value in recipe.pass_args.items() if key != "gptq"}
    if isinstance(model, nn.Module):
        _, pass_info = quantize_module_transform_pass(model, pass_args)
    else:
        _, pass_info = quantize_transform_pass(model, pass_args)
    info: dict[str, Any] = {"recipe": "pass_args", "pass": pass_info}
    if "gptq" in recipe.pass_args:  # MASE's GPTQ table: each Linear's weight GPTQ-rounded onto its own format
        info["gptq"] = _pass_args_gptq(root_module(model), recipe)
    if recipe.real:
        converted, kept = to_real(root_module(model), recipe.skip)
        info.update(quantized=converted, kept=kept, counts=dict(Counter(converted.values())))
    return info


def _pass_args_gptq(root: nn.Module, recipe: PassArgs) -> dict[str, Any]:
    from lowbit.flows.gptq_formats import gptq_layers, mase_gptq_settings

    settings, ignored = mase_gptq_settings(recipe.pass_args["gptq"])
    targets = {name: module for name, module in root.named_modules() if type(module) is QuantLinear
               and module.formats.weight is not None and not module.formats.bypass}  # fmt: skip
    plan = {name: module.formats for name, module in targets.items()}
    info = gptq_layers(root, targets, plan, settings, recipe.calibration_data)
    return {**info, "settings": settings, "ignored": ignored}


def to_real(root: nn.Module, skip: Any = ()) -> tuple[dict[str, str], dict[str, str]]:
    """Replace every simulated QuantLinear a kernel computes by its real module: (converted, kept with why)."""
    layers = [name for name, (module, _) in select_layers(root, ["linear"], skip).items()
              if isinstance(module, QuantLinear)]  # fmt: skip
    applied = apply(root, {name: MakeReal() for name in layers})
    return applied.placed, applied.kept
