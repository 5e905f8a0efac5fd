"""Quantized copies of a float model by the peers and by lowbit, for the integer-kernel benchmarks.

``variants(model)`` returns ``{label: (quantized model, input dtype)}``; a peer that is missing or fails on
this machine is reported as ``{label: error text}`` instead, so a table says what could not run and why.
Every variant is a deep copy: the float model is never changed. The bfloat16 copy of the model (``BASELINE``)
is in every table, whatever ``only`` selects: it is the float baseline the quantized rows are set against.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import torch
from torch import nn

import lowbit

Builder = Callable[[nn.Module], nn.Module]


def _torch_ao_dynamic(model: nn.Module) -> nn.Module:
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def _torchao(config_name: str, bf16: bool = False, **arguments) -> Builder:
    def build(model: nn.Module) -> nn.Module:
        from torchao import quantization

        if config_name == "PrototypeInt4WeightOnlyConfig":
            from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig as config_class
        else:
            config_class = getattr(quantization, config_name)
        model = model.to(torch.bfloat16) if bf16 else model
        quantization.quantize_(model, config_class(**arguments))
        return model

    return build


def _quanto(bits: int) -> Builder:
    def build(model: nn.Module) -> nn.Module:
        from optimum import quanto

        quanto.quantize(model, weights=quanto.qint8 if bits == 8 else quanto.qint4)
        quanto.freeze(model)
        return model

    return build


def _lowbit(recipe: str, path: str | None = None, **options) -> Builder:
    """lowbit's recipe; with ``path`` every converted module is pinned to that kernel path."""

    def build(model: nn.Module) -> nn.Module:
        model = lowbit.quantize_model(model, recipe, **options)[0]
        for module in model.modules():
            if path is not None and path in getattr(module, "paths", ()):
                module.path = path
        return model

    return build


BASELINE = "bf16 model"  # the same model cast to bfloat16, inputs in bfloat16: kept by every ``only``

# label -> (builder, input dtype); lowbit rows last
PEERS: dict[str, tuple[Builder, torch.dtype]] = {
    BASELINE: (lambda model: model.to(torch.bfloat16), torch.bfloat16),
    "torch.ao quantize_dynamic int8": (_torch_ao_dynamic, torch.float32),
    "torchao Int8DynamicActivationInt8Weight": (_torchao("Int8DynamicActivationInt8WeightConfig"), torch.float32),
    "torchao Int8WeightOnly": (_torchao("Int8WeightOnlyConfig"), torch.float32),
    "torchao PrototypeInt4WeightOnly g32 (bf16 model)": (_torchao("PrototypeInt4WeightOnlyConfig", bf16=True, group_size=32), torch.bfloat16),
    "quanto qint8 weights": (_quanto(8), torch.float32),
    "quanto qint4 weights": (_quanto(4), torch.float32),
}
LOWBIT: dict[str, tuple[Builder, torch.dtype]] = {
    "lowbit int8_dynamic (per token)": (_lowbit("int8_dynamic"), torch.float32),
    "lowbit int8_dynamic (per token, fbgemm path)": (_lowbit("int8_dynamic", path="fbgemm"), torch.float32),
    "lowbit int8_dynamic (per token, centred)": (_lowbit("int8_dynamic", act_symmetric=False), torch.float32),
    "lowbit int8_dynamic (per tensor)": (_lowbit("int8_dynamic", act_symmetric=False, act_granularity="tensor"), torch.float32),
    "lowbit int8_dynamic (per token, act_bits 7)": (_lowbit("int8_dynamic", act_bits=7), torch.float32),
    "lowbit int8_dynamic (per token, onednn path)": (_lowbit("int8_dynamic", path="onednn"), torch.float32),
    "lowbit int8_dynamic (per token, fbgemm_pairs path)": (_lowbit("int8_dynamic", path="fbgemm_pairs"), torch.float32),
    "lowbit int8_dynamic (per token, float_codes path)": (_lowbit("int8_dynamic", path="float_codes"), torch.float32),
    "lowbit int8_dynamic (per token, native path)": (_lowbit("int8_dynamic", path="native"), torch.float32),
    "lowbit int8_weight_only": (_lowbit("int8_weight_only"), torch.float32),
    "lowbit int8_weight_only bf16 compute": (_lowbit("int8_weight_only", compute_dtype="bf16"), torch.float32),
    "lowbit int4_weight_only g32": (_lowbit("int4_weight_only", group_size=32), torch.float32),
}


def variants(model: nn.Module, only: list[str] | None = None) -> dict[str, tuple[nn.Module, torch.dtype] | str]:
    out: dict[str, tuple[nn.Module, torch.dtype] | str] = {}
    for label, (build, dtype) in {**PEERS, **LOWBIT}.items():
        if only and label != BASELINE and not any(word in label for word in only):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[label] = (build(copy.deepcopy(model)).eval(), dtype)
        except Exception as error:  # a peer that does not run here: say so in the table
            out[label] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return out


def linear_weight_bytes(model: nn.Module, float_names: set[str]) -> int:
    """Bytes ``torch.save`` writes for the modules that replaced the float model's Linear layers."""
    import io

    total = 0
    modules = dict(model.named_modules())
    for name in float_names:
        buffer = io.BytesIO()
        state = modules[name].state_dict() if name in modules else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(state, buffer)
        total += buffer.getbuffer().nbytes
    return total
