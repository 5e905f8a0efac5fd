"""``lowbit.export_compressed_tensors(model, directory)``: safetensors + ``config.json`` with a compressed-tensors
``quantization_config`` (the checkpoint format vLLM, SGLang and transformers load).

What goes where (docs/storage.md has the table):

- ``Int4WeightOnlyLinear`` (group g) -> ``pack-quantized``: weights int, 4 bits, asymmetric, strategy "group",
  group_size g. ``weight_packed`` int32 (codes q - 8 in [-8, 7], packed by compressed-tensors' own
  ``pack_to_int32``), ``weight_zero_point`` (zero_point - 8, packed along the rows), ``weight_scale`` float32
  (lowbit's bfloat16 / float16 scales widened: exact, and compressed-tensors dequantizes in the scale's dtype,
  where (q - z) * s is then exact too), ``weight_shape``. Where every q - zero_point lies in -8..7 (the
  ``symmetric=True`` int4 recipe: zero point 7, codes 0..14) the group is written symmetric instead:
  ``weight_packed`` holds q - zero_point and no zero point is written (the scheme transformers' loader
  takes; its loader cannot read asymmetric zero points, which compressed-tensors packs).
- ``Int8DynamicLinear`` (symmetric 8-bit per-token activations) -> ``int-quantized``: weights int, 8 bits,
  symmetric, strategy "channel" (``weight`` int8, ``weight_scale`` float32 [N, 1]); input_activations int, 8
  bits, symmetric, strategy "token", dynamic.
- Float Linear layers are listed in ``ignore``; every other tensor is written as it is. Any other quantized
  layer raises FormatError naming it (lowbit has no real fp8 Linear yet, so ``float-quantized`` is not written).

The folder is built beside ``directory`` and swapped in whole (``_io.atomic_directory``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn

from lowbit._io import atomic_directory, write_file
from lowbit.errors import FormatError

INT4_FORMAT, INT8_FORMAT = "pack-quantized", "int-quantized"


def _int4_scheme(group_size: int, targets: list[str], symmetric: bool) -> dict[str, Any]:
    weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group_size,
               "dynamic": False}  # fmt: skip
    return {"targets": targets, "weights": weights, "input_activations": None, "format": INT4_FORMAT}


def _int8_scheme(targets: list[str]) -> dict[str, Any]:
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    activations = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    return {"targets": targets, "weights": weights, "input_activations": activations, "format": INT8_FORMAT}


def _target(name: str) -> str:
    return "re:^" + name.replace(".", r"\.") + "$"


def _int4_tensors(module) -> tuple[bool, dict[str, torch.Tensor]]:
    """(symmetric, tensors): symmetric where every signed code fits (no zero point written: the format
    transformers and vLLM load directly), else asymmetric with packed zero points."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    tensors = {"weight_scale": module.weight_scale.float().cpu(),
               "weight_shape": torch.tensor([module.out_features, module.in_features])}  # fmt: skip
    signed = module.signed_codes()
    if signed is not None:
        return True, {"weight_packed": pack_to_int32(signed.cpu(), 4), **tensors}
    codes = (module.codes().to(torch.int16) - 8).to(torch.int8)
    zero_point = (module.weight_zero_point.to(torch.int16) - 8).to(torch.int8)
    return False, {"weight_packed": pack_to_int32(codes.cpu(), 4), **tensors,
                   "weight_zero_point": pack_to_int32(zero_point.cpu(), 4, packed_dim=0).contiguous()}  # fmt: skip


def _int8_tensors(module) -> dict[str, torch.Tensor]:
    return {"weight": module.weight_codes.cpu(), "weight_scale": module.weight_scale.float().reshape(-1, 1).cpu()}


def _layer(name: str, module: nn.Module) -> tuple[str | None, Any, dict[str, torch.Tensor]]:
    """(scheme key, group size, tensors) of one quantized layer; FormatError when none holds it."""
    from lowbit.ops import Int4WeightOnlyLinear, Int8DynamicLinear

    if isinstance(module, Int4WeightOnlyLinear) and module.float_zero:
        raise FormatError(f"export_compressed_tensors: layer {name!r} holds int4 with a float zero point "
                          "(zero_point_domain='float'); compressed-tensors' int schemes hold integer zero points: "
                          "quantize it with zero_point_domain='int'")  # fmt: skip
    if isinstance(module, Int4WeightOnlyLinear):
        symmetric, tensors = _int4_tensors(module)
        return "int4-symmetric" if symmetric else "int4", module.group_size, tensors
    if isinstance(module, Int8DynamicLinear) and module.act_symmetric and module.act_granularity == "token" \
            and module.act_bits == 8:  # fmt: skip
        return "int8", None, _int8_tensors(module)
    raise FormatError(f"export_compressed_tensors: layer {name!r} ({type(module).__name__}) has no compressed-tensors "
                      "scheme that holds it exactly; use int4_weight_only (pack-quantized) or int8_dynamic with "
                      "act_symmetric=True, act_granularity='token' (int-quantized)")  # fmt: skip


def _quantized_layers(model: nn.Module):
    from lowbit.nn.modules import QuantModule
    from lowbit.ops import REAL_MODULES

    kinds = (QuantModule, *REAL_MODULES.values())
    return {name: module for name, module in model.named_modules() if isinstance(module, kinds)}


def compressed_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the checkpoint's tensors, its quantization_config)."""
    layers = _quantized_layers(model)
    state, groups = {}, {}
    for name, module in layers.items():
        key, group_size, tensors = _layer(name, module)
        groups.setdefault((key, group_size), []).append(name)
        state.update({f"{name}.{tensor}": value for tensor, value in tensors.items()})
        if getattr(module, "bias", None) is not None:
            state[f"{name}.bias"] = module.bias.detach().cpu()
    for name, tensor in model.state_dict().items():
        if not any(name.startswith(f"{layer}.") for layer in layers):
            state.setdefault(name, tensor.detach().cpu())
    config_groups = {}
    for index, ((key, group_size), names) in enumerate(sorted(groups.items(), key=lambda item: str(item[0]))):
        targets = [_target(name) for name in names]
        config_groups[f"group_{index}"] = (_int8_scheme(targets) if key == "int8" else
                                           _int4_scheme(group_size, targets, key == "int4-symmetric"))  # fmt: skip
    formats = {group["format"] for group in config_groups.values()}
    ignore = [name for name, module in model.named_modules() if type(module) is nn.Linear]
    config = {"quant_method": "compressed-tensors", "format": formats.pop() if len(formats) == 1 else "mixed-precision",
              "quantization_status": "compressed", "config_groups": config_groups, "ignore": ignore}  # fmt: skip
    return state, config


def _output_quantized(model: nn.Module) -> bool:
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return output is not None and type(output) is not nn.Linear


def export_compressed_tensors(model: nn.Module, directory: str | os.PathLike) -> dict[str, Any]:
    """Write ``model`` as a compressed-tensors checkpoint folder (``model.safetensors`` + ``config.json``);
    returns the quantization_config written."""
    from safetensors.torch import save

    state, quantization = compressed_state(model)
    if not quantization["config_groups"]:
        raise FormatError("export_compressed_tensors: the model has no quantized layer to write")
    config = model.config.to_dict() if hasattr(getattr(model, "config", None), "to_dict") else {}
    if config.get("tie_word_embeddings") and _output_quantized(model):
        config["tie_word_embeddings"] = False  # the quantized lm_head no longer shares the float embedding
    config["quantization_config"] = quantization
    shared = {}
    for name, tensor in state.items():  # tied weights: safetensors wants one owner per storage
        shared[name] = tensor.contiguous().clone() if tensor.data_ptr() in {t.data_ptr() for t in shared.values()} else tensor.contiguous()
    with atomic_directory(directory) as building:
        write_file(building / "model.safetensors", save(shared, metadata={"format": "pt"}))
        write_file(building / "config.json", (json.dumps(config, indent=2, default=str) + "\n").encode())
    return quantization
