"""QTensor: a tensor stored as integer codes plus per-block parameters, in any encodable lowbit format.

A QTensor holds

- ``codes``: one integer per element, shaped like the logical tensor (two's-complement when ``signed``,
  else unsigned bit patterns), ``bits`` wide, in the smallest torch integer dtype that holds them;
- ``params``: per-block parameters on the block grid (``scale``, ``zero_point``, ``exponent``, ``bias``),
  each in the dtype it is stored in (scales in the format's ``scale_dtype`` f32 / f16 / bf16);
- ``block``: the concrete block shape the parameters belong to (None when there are none);
- ``spec``: the format (name and every parameter) the values came from;
- ``dtype``: the dtype of the dequantized tensor, ``compute_dtype``: the float dtype the format computed in;
- ``zero_sign``: None, or a bool mask of zeros whose sign the codes cannot hold (two's-complement codes
  have no -0; ``encode(..., signed_zero=False)`` drops it);
- ``storage``: the packing used when it is saved ("auto", "native", "uint8", "uint32").

``dequantize()`` returns bit for bit what ``lowbit.quantize(x, spec)`` returned for the encoded ``x``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from lowbit.casting import narrow_directed, saturating_cast
from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import resolve
from lowbit.qtensor.codecs import codec_for
from lowbit.qtensor.packing import LAYOUTS, PackedCodes, code_dtype, pack_codes, unpack_codes

STORAGES = ("auto", *LAYOUTS)
FLOAT_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(eq=False)
class QTensor:
    """Integer codes + per-block parameters of one tensor in one format (see the module docstring)."""

    codes: torch.Tensor
    params: dict[str, torch.Tensor]
    spec: FormatSpec
    dtype: torch.dtype
    compute_dtype: torch.dtype
    block: tuple[int, ...] | None = None
    zero_sign: torch.Tensor | None = None
    storage: str = "auto"

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise FormatError(f"QTensor storage={self.storage!r} is invalid; legal: {', '.join(STORAGES)}")
        self.codes = self.codes.to(code_dtype(self.bits, self.signed))

    # ---- description --------------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def format(self) -> str:
        return self.spec.format_name

    @property
    def bits(self) -> int:
        return codec_for(self.spec).code_bits(self.spec)

    @property
    def signed(self) -> bool:
        return codec_for(self.spec).code_signed(self.spec)

    def numel(self) -> int:
        return self.codes.numel()

    @property
    def layout(self) -> str:
        """The packing ``storage`` resolves to: "auto" keeps 8-, 16- and 32-bit codes native, packs the
        others into bytes."""
        if self.storage != "auto":
            return self.storage
        return "native" if self.bits in (8, 16, 32) else "uint8"

    @property
    def nbytes(self) -> int:
        """Bytes of packed codes plus parameters (plus the zero-sign mask, if any)."""
        total = self.pack().nbytes + sum(p.numel() * p.element_size() for p in self.params.values())
        return total + (pack_codes(self.zero_sign.to(torch.int64), 1, signed=False).nbytes
                        if self.zero_sign is not None else 0)  # fmt: skip

    def bits_per_element(self) -> float:
        return 8.0 * self.nbytes / max(self.numel(), 1)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={tuple(v.shape)}:{dtype_name(v.dtype)}" for k, v in self.params.items())
        return (f"QTensor({self.spec.describe()}, shape={tuple(self.shape)}, bits={self.bits}, "
                f"block={self.block}, params=[{params}], dtype={dtype_name(self.dtype)})")  # fmt: skip

    # ---- values -------------------------------------------------------------------------------------
    def dequantize(self) -> torch.Tensor:
        """The fake-quantized tensor, bit for bit (dtype ``self.dtype``)."""
        if self.codes.numel() == 0:
            return torch.empty(self.shape, dtype=self.dtype, device=self.codes.device)
        values = self.decode_compute()
        if values.dtype == self.dtype:
            return values
        if self.spec.narrows_directed:  # the input is gone: against the mode (equal to quantize but where saturated)
            return narrow_directed(values, self.dtype, self.spec.rounding)
        return saturating_cast(values, self.dtype)

    def decode_compute(self) -> torch.Tensor:
        """The values in the compute dtype (before the cast to ``dtype``)."""
        values = codec_for(self.spec).decode(self.spec, self.codes, self.params, self.block, self.compute_dtype)
        if self.zero_sign is not None:
            values = torch.where(self.zero_sign, -values, values)
        return values

    def pack(self, layout: str | None = None) -> PackedCodes:
        return pack_codes(self.codes, self.bits, signed=self.signed, layout=layout or self.layout)

    # ---- plain tensors + JSON-able description (what export writes) ------------------------------------
    def to_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors by local key, header entry); ``from_state`` inverts it."""
        packed = self.pack()
        tensors = {"codes": packed.words.contiguous()}
        header: dict[str, Any] = {
            "type": "qtensor",
            "format": {"name": self.spec.format_name, "params": jsonable(self.spec.params())},
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "compute_dtype": dtype_name(self.compute_dtype),
            "codes": {"key": "codes", "bits": self.bits, "signed": self.signed, "packing": packed.layout,
                      "padding_bits": packed.padding_bits},  # fmt: skip
            "block": list(self.block) if self.block is not None else None,
            "params": {},
            "zero_sign": None,
        }
        for name, value in self.params.items():
            tensors[f"params.{name}"] = value.contiguous()
            header["params"][name] = {"key": f"params.{name}", "dtype": dtype_name(value.dtype),
                                      "shape": list(value.shape)}  # fmt: skip
        if self.zero_sign is not None:
            mask = pack_codes(self.zero_sign.to(torch.int64), 1, signed=False, layout="uint8")
            tensors["zero_sign"] = mask.words
            header["zero_sign"] = {"key": "zero_sign", "packing": "uint8"}
        return tensors, header

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], header: dict[str, Any]) -> QTensor:
        """Rebuild from ``to_state``'s output (raises FormatError / KeyError / TypeError on bad input)."""
        spec = resolve(header["format"]["name"], **header["format"]["params"])
        shape = tuple(int(d) for d in header["shape"])
        entry = header["codes"]
        bits, signed = int(entry["bits"]), bool(entry["signed"])
        codec = codec_for(spec)
        if (bits, signed) != (codec.code_bits(spec), codec.code_signed(spec)):
            raise FormatError(f"codes of {bits} bits (signed={signed}) do not match format {spec.describe()}")
        codes = unpack_codes(PackedCodes(tensors[entry["key"]], bits, signed, shape, entry["packing"]))
        params = {}
        for name, item in header["params"].items():
            value = tensors[item["key"]]
            if list(value.shape) != list(item["shape"]) or dtype_name(value.dtype) != item["dtype"]:
                raise FormatError(f"parameter {name!r}: stored {dtype_name(value.dtype)}{list(value.shape)} does "
                                  f"not match the header's {item['dtype']}{item['shape']}")  # fmt: skip
            params[name] = value
        zero_sign = None
        if header.get("zero_sign"):
            mask = PackedCodes(tensors[header["zero_sign"]["key"]], 1, False, shape, header["zero_sign"]["packing"])
            zero_sign = unpack_codes(mask).bool()
        block = tuple(int(b) for b in header["block"]) if header["block"] is not None else None
        result = cls(codes, params, spec, _float_dtype(header["dtype"]), _float_dtype(header["compute_dtype"]),
                     block, zero_sign, entry["packing"])  # fmt: skip
        if result.numel():
            result.decode_compute()  # parameters that do not fit the codes fail here, not at first use
        return result


def _float_dtype(name: str) -> torch.dtype:
    if name not in FLOAT_DTYPES:
        raise FormatError(f"dtype {name!r} is not a float dtype lowbit stores; legal: {', '.join(FLOAT_DTYPES)}")
    return FLOAT_DTYPES[name]


def jsonable(value: Any) -> Any:
    """Format parameters as JSON values: tuples become lists; floats stay exact (JSON keeps repr)."""
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        raise FormatError(f"parameter value {value!r} cannot be stored (not finite)")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise FormatError(f"parameter value {value!r} of type {type(value).__name__} cannot be stored")
