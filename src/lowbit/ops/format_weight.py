"""FormatWeightLinear: a weight-only Linear holding its weight as the codes and block parameters of a lowbit
format that no integer kernel runs (NVFP4, NF4, any codebook), rebuilt exactly per call.

The weight is stored as :func:`lowbit.qtensor.encode` makes it: codes packed in ``weight_codes`` (uint8, a
little-endian bit stream: two 4-bit codes per byte), and each per-block parameter of the format as a buffer
``weight_<name>`` in the dtype the format stores it (NVFP4: E4M3 block scales as uint8 bits and the float32
tensor scale; NF4: a float32 absmax per block). ``dequantized_weight()`` decodes them with the format's own
codec: bit for bit the weight ``lowbit.quantize(weight, spec)`` gives, so this module computes exactly what
the simulated ``QuantLinear`` with that weight format computes (a -0.0 weight may come back as +0.0: the
same products). Path "dequantize": the float32 weight rebuilt per call, then a float32 matmul (or
"dequantize_bf16": bfloat16). Bytes per weight: NVFP4 0.5 + 1 / 16, NF4 with blocks of 64 0.5 + 4 / 64.

``lowbit.convert.to_real`` builds it from a simulated QuantLinear whose weight format is one of
``PACKED_WEIGHT_FORMATS`` and whose inputs stay float; ``lowbit.save`` / ``lowbit.load`` keep it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError, FormatError
from lowbit.formats._registry import resolve
from lowbit.ops.modules import WeightOnlyLinear, _check_linear, check_compute_dtype, register

PACKED_WEIGHT_FORMATS = ("nvfp4", "nf4", "codebook")


def _spec(format: Any):
    """The weight format from its config entry ({"name": ..., "params": {...}}) or a spec."""
    if isinstance(format, dict) and isinstance(format.get("name"), str):
        spec = resolve(format["name"], **dict(format.get("params") or {}))
    elif hasattr(format, "format_name"):
        spec = format
    else:
        raise ConfigError(f"FormatWeightLinear: format={format!r} must be a format spec or its "
                          "{'name': ..., 'params': {...}} entry")  # fmt: skip
    if spec.format_name not in PACKED_WEIGHT_FORMATS:
        raise ConfigError(f"FormatWeightLinear holds {', '.join(PACKED_WEIGHT_FORMATS)} weights, not "
                          f"{spec.format_name!r}")  # fmt: skip
    return spec


@register
class FormatWeightLinear(WeightOnlyLinear):
    """Weight-only Linear on a format's packed codes and block parameters (module docstring)."""

    paths = ("auto", "reference", "dequantize", "dequantize_bf16")
    packed_path = "packed"  # not a path: no kernel takes these codes

    def __init__(self, in_features: int, out_features: int, bias: bool = True, format: Any = None,
                 compute_dtype: str | None = None, *, encoded: Any = None) -> None:  # fmt: skip
        """``encoded``: the weight's QTensor (``from_float``); without it the buffers are zeros of the layout
        encoding a weight of this shape gives (``from_config``, before ``load_state_dict``)."""
        super().__init__(in_features, out_features, bias)
        self.spec = _spec(format)
        self.compute_dtype = check_compute_dtype(type(self).__name__, compute_dtype)
        empty = encoded is None
        if empty:
            encoded = self._encode(torch.zeros(out_features, in_features))
        self._layout = {"bits": encoded.bits, "signed": encoded.signed, "block": encoded.block,
                        "params": list(encoded.params)}  # fmt: skip
        values = {"codes": encoded.pack("uint8").words, **encoded.params}
        for name, value in values.items():
            self.register_buffer(f"weight_{name}", torch.zeros_like(value) if empty else value.contiguous())

    def _encode(self, weight: torch.Tensor):
        from lowbit.qtensor import encode

        return encode(weight, self.spec, signed_zero=False)

    def config(self) -> dict[str, Any]:
        from lowbit.qtensor.tensor import jsonable

        entry = {"name": self.spec.format_name, "params": jsonable(self.spec.params())}
        return {**super().config(), "format": entry}  # compute_dtype: WeightOnlyLinear's

    @classmethod
    def from_float(cls, module: nn.Linear, format: Any, compute_dtype: str | None = None) -> FormatWeightLinear:
        """``module``'s weight encoded in ``format`` (a spec or a format name with no parameters)."""
        _check_linear(module)
        spec = _spec({"name": format} if isinstance(format, str) else format)
        weight = module.weight.detach().float()
        if not bool(torch.isfinite(weight).all()):
            raise FormatError("the weight has NaN or inf values; it cannot be quantized")
        from lowbit.qtensor import encode

        encoded = encode(weight.cpu(), spec, signed_zero=False)  # once: the buffers are its tensors
        new = cls(module.in_features, module.out_features, module.bias is not None, spec, compute_dtype,
                  encoded=encoded)  # fmt: skip
        if module.bias is not None:
            new.bias.copy_(module.bias.detach())
        return new.to(module.weight.device)

    def qtensor(self):
        """The weight as a QTensor (codes unpacked from ``weight_codes``, parameters the buffers themselves)."""
        from lowbit.qtensor import QTensor
        from lowbit.qtensor.packing import PackedCodes, unpack_codes

        layout, shape = self._layout, (self.out_features, self.in_features)
        codes = unpack_codes(PackedCodes(self.weight_codes, layout["bits"], layout["signed"], shape, "uint8"))
        params = {name: getattr(self, f"weight_{name}") for name in layout["params"]}
        return QTensor(codes, params, self.spec, torch.float32, torch.float32, layout["block"])

    def dequantized_weight(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """float32 weight rows [start, end) (the whole weight is decoded: block parameters may span rows)."""
        weight = self.qtensor().dequantize()
        return weight if (start, end) in ((0, None), (0, self.out_features)) else weight[start:end]

    def dequantize_weight(self) -> torch.Tensor:
        """The whole weight [out, in] in float32."""
        return self.dequantized_weight()

    def packed_fits(self) -> bool:
        return False

    def run_packed(self, rows: torch.Tensor) -> torch.Tensor:
        raise ConfigError("FormatWeightLinear has no packed kernel")

    def run_native(self, rows: torch.Tensor) -> torch.Tensor | None:
        return None

    def run_path(self, path: str, rows: torch.Tensor) -> torch.Tensor:
        dtype = torch.bfloat16 if path == "dequantize_bf16" else torch.float32
        weight = self.dequantized_weight()  # decoded once per call, not once per row block
        if dtype == torch.float32:
            return torch.nn.functional.linear(rows, weight, self.bias)
        out = torch.nn.functional.linear(rows.to(dtype), weight.to(dtype)).float()
        return out if self.bias is None else out.add_(self.bias)


__all__ = ["PACKED_WEIGHT_FORMATS", "FormatWeightLinear"]
