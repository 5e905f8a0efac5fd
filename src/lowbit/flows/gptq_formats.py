"""GPTQ for the format recipe: ``quantize_(model, "mxfp4_e2m1", roles=["weight"], method="gptq",
calibration_data=batches)`` and the same for any format :func:`lowbit.ops.gptq_formats.column_rounder`
rounds a column of (MX, affine, block_fp, OCP floats, minifloat, fixed point, log).

The Linear layers of the plan are rounded in call order by the block-sequential drivers of
:mod:`lowbit.flows.gptq` (each layer's Hessian from inputs that went through the layers already quantized);
each becomes the simulated ``QuantLinear`` of its planned formats whose weight holds the GPTQ-rounded
values. The layer still quantizes that weight with its format at run time (weights are cached), so the
stored values are what the format gives back for them: for MX, block_fp, scaled OCP floats, symmetric
affine and element formats that is the GPTQ result itself, bit for bit (the block scale the format
re-derives from a rounded block puts the same values on its grid; mxfp8_e4m3, whose top binade is not
full, can rarely re-derive a smaller exponent); for asymmetric affine groups whose end codes GPTQ left
unused the re-derived grid differs. Where a value moves, the stored weight is the format's rounding of the
GPTQ result, what the layer computes anyway (``info["gptq"]["moved"]`` counts those elements). The other
layers of the plan (convolutions) are rounded by the format as with ``method="round"``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from lowbit.flows.blocks import call_without_cache
from lowbit.flows.gptq import blockwise_gptq, padding_mask
from lowbit.flows.recipes import FormatRecipe
from lowbit.graph.plan import Simulated, build
from lowbit.nn.roles import RoleFormats
from lowbit.ops.gptq_formats import column_rounder, gptq_round, settled


def gptq_format_layers(root: nn.Module, plan: dict[str, RoleFormats], recipe: FormatRecipe,
                       progress=None) -> dict[str, Any]:  # fmt: skip
    """Swap the Linear layers of ``plan`` that have a weight format for GPTQ-rounded QuantLinear; returns
    ``{"layers": names, "moved": elements the format moved on re-rounding, "seconds": wall time}``."""
    targets = {name: root.get_submodule(name) for name, formats in plan.items()
               if formats.weight is not None and type(root.get_submodule(name)) is nn.Linear}  # fmt: skip
    settings = {"damping": recipe.damping, "block_size": recipe.block_size, "act_order": recipe.act_order,
                "static_groups": recipe.static_groups}  # fmt: skip
    return gptq_layers(root, targets, plan, settings, recipe.calibration_data, progress)


def gptq_layers(root: nn.Module, targets: dict[str, nn.Linear], plan: dict[str, RoleFormats], settings: dict,
                batches: Any, progress=None) -> dict[str, Any]:  # fmt: skip
    """GPTQ-round the weight of each target (a Linear, or a QuantLinear already carrying its formats) with its
    planned weight format, in call order; each becomes the QuantLinear of ``plan[name]``."""
    for name, module in targets.items():  # refuse a format GPTQ cannot round before any work is done
        column_rounder(plan[name].weight, tuple(module.weight.shape))
    moved: dict[str, int] = {}

    def quantize_layer(name: str, module: nn.Module, hessian: torch.Tensor) -> nn.Module:
        spec = plan[name].weight
        rounded = gptq_round(module.weight, hessian, spec, **settings)
        stored, moved[name] = settled(spec, module.weight, rounded)
        new = build(module, Simulated(plan[name], "linear"), name)
        with torch.no_grad():
            new.weight.copy_(stored)
        return new

    start = time.perf_counter()
    if targets:
        blockwise_gptq(root, targets, batches, call_without_cache, quantize_layer, padding_mask,
                       progress or logging.getLogger("lowbit").info)  # fmt: skip
    return {"layers": list(targets), "moved": sum(moved.values()), "seconds": time.perf_counter() - start}


# ---- MASE's GPTQ pass options ----------------------------------------------------------------------------------
# MASE (chop.passes.module.transforms.gptq, run by its module quantize pass when pass_args has a "gptq" table):
# keys it reads, and what each means here. The weight format is each layer's own from pass_args (MASE's
# "format" / "weight_config" name the same MX format its later module replacement applies).
MASE_GPTQ_IGNORED = ("model_name", "device", "dataset", "nsamples", "seqlen", "cali_batch_size", "checkpoint_dir",
                     "hf_token", "max_layers", "format", "weight_config", "quantile_search",
                     "clip_search_y")  # fmt: skip
MASE_GPTQ_RENAMED = {"percdamp": "damping", "damp_percent": "damping", "blocksize": "block_size",
                     "desc_act": "act_order"}  # fmt: skip
GPTQ_OPTIONS = ("damping", "block_size", "act_order", "static_groups")
MASE_DAMPING = 0.01  # MASE's fixed percdamp


def mase_gptq_settings(table: Any) -> tuple[dict[str, Any], list[str]]:
    """(GPTQ settings, the MASE keys given that have no effect here) from pass_args' "gptq" table."""
    from lowbit.errors import ConfigError, did_you_mean
    from lowbit.flows.recipes import FormatRecipe

    if not isinstance(table, dict):
        raise ConfigError(f"pass_args gptq must be a table of GPTQ options, got {table!r}")
    settings: dict[str, Any] = {"damping": MASE_DAMPING}
    ignored = []
    for key, value in table.items():
        if key in MASE_GPTQ_IGNORED:
            ignored.append(key)
            continue
        option = MASE_GPTQ_RENAMED.get(key, key)
        if option not in GPTQ_OPTIONS:
            names = [*GPTQ_OPTIONS, *MASE_GPTQ_RENAMED, *MASE_GPTQ_IGNORED]
            raise ConfigError(f"pass_args gptq: unknown key {key!r}{did_you_mean(key, names)}; "
                              f"keys: {', '.join(names)}")  # fmt: skip
        settings[option] = value
    FormatRecipe(format="mxfp4_e2m1", **settings)  # the format recipe's own checks of every value
    return settings, ignored
