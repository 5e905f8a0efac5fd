"""Accumulator simulation: the register a dot product sums into, in any format.

An :class:`Accumulator` says what the partial sums of a Linear / Conv / matmul are rounded to:

- a hardware float: ``fp32``, ``bf16``, ``fp16`` (round to nearest even, overflow to inf, as the units do);
- any lowbit format by name (``e5m2``, ``minifloat_ieee``, ``block_fp`` ... with its own parameters and
  rounding mode, stochastic included);
- ``integer``: a ``width``-bit two's-complement register holding multiples of ``2**-frac_width`` that either
  saturates or wraps (``overflow``) when a sum leaves its range.

``chunk`` is the K-split: the products of ``chunk`` consecutive k are summed exactly (the wide adder tree of
a tensor core), and each chunk's sum is then added to the accumulator and rounded, in the order k = 0, 1,
... (``chunk = 1``: every product is rounded into the accumulator on its own). A bias is added last, as one
more accumulation step; the result leaves in float32 holding the accumulator's value.

``flush`` makes it a two-level register, as fp8 tensor cores are used with a promotion to float32 every N_C
products: after every ``flush`` products (a multiple of ``chunk``) the narrow register's value is rounded to
float32 and added into a float32 register (IEEE addition, nearest even), and the narrow register restarts at
zero; the products left at the end are flushed the same way, and a bias is added in the float32 register.

Two paths compute the same definition:

- :func:`reference_matmul`: a slow scalar loop, product by product in the stated order (Python ints for
  integer registers, exact fractions for the in-chunk sums, float32 / float16 / bfloat16 scalar arithmetic
  for the hardware floats). For tests, small shapes only.
- :func:`accumulated_matmul`: the fast path. ``K/chunk`` steps, each a float64 matmul of one K-slice
  (the chunk sums s_j, ``[..., M, N]``) and one vectorised ``acc = Q(acc + s_j)``; cost: the FLOPs of one
  float64 GEMM split into ``K/chunk`` calls plus ``K/chunk`` elementwise passes over the output, memory of
  one output. Every product of operands with at most 26 significant bits
  is exact in float64; when every chunk sum is exact too (integer / fixed-point operands, or chunk = 1) the
  fast path equals the reference bit for bit. Otherwise each chunk sum s_j differs from the exact one by at
  most ``(chunk - 1) * 2**-53 * sum |products|`` of that chunk (float64 summation in any order) before it is
  rounded into the accumulator.
"""

from __future__ import annotations

import dataclasses
import fractions
from typing import Any

import torch

from lowbit.errors import ConfigError, LowbitError
from lowbit.formats import FormatSpec, get_format, resolve
from lowbit.formats.rounding import canonical_rounding, round_to_integer

# accumulator names that are a torch dtype: rounding is the dtype cast (nearest even, inf on overflow)
HARDWARE_FLOATS: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}  # fmt: skip
_CANONICAL = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
OVERFLOWS = ("saturate", "wrap")


@dataclasses.dataclass(frozen=True)
class Accumulator:
    """What partial sums are rounded to (see the module docstring)."""

    name: str
    width: int | None = None  # integer registers
    frac_width: int = 0  # integer registers: the value of one step is 2**-frac_width
    overflow: str = "saturate"  # integer registers: saturate | wrap
    chunk: int = 1
    rounding: str = "nearest_even"  # integer registers
    spec: FormatSpec | None = None  # lowbit formats other than integer
    flush: int | None = None  # products between transfers of the register into a float32 one (None: never)
    backward: bool = False  # the backward GEMMs sum in this register too (lowbit.nn.accumulated_backward)

    def __post_init__(self) -> None:
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ConfigError(f"accumulator_chunk={self.chunk!r} is invalid; must be an integer >= 1")
        if self.flush is not None and (isinstance(self.flush, bool) or not isinstance(self.flush, int)
                                       or self.flush < 1 or self.flush % self.chunk):  # fmt: skip
            raise ConfigError(f"accumulator_flush={self.flush!r} is invalid; must be a positive multiple of "
                              f"accumulator_chunk ({self.chunk})")  # fmt: skip
        if not isinstance(self.backward, bool):
            raise ConfigError(f"accumulator_backward={self.backward!r} is invalid; must be true or false")
        if self.overflow not in OVERFLOWS:
            raise ConfigError(f"accumulator_overflow={self.overflow!r} is invalid; legal values: {', '.join(OVERFLOWS)}")
        if self.name == "integer":
            if isinstance(self.width, bool) or not isinstance(self.width, int) or not 2 <= self.width <= 52:
                raise ConfigError(f"accumulator_width={self.width!r} is invalid; an integer register needs 2..52 bits")
            if isinstance(self.frac_width, bool) or not isinstance(self.frac_width, int):
                raise ConfigError(f"accumulator_frac_width={self.frac_width!r} is invalid; must be an integer")
        elif self.name not in _CANONICAL.values() and self.spec is None:
            raise ConfigError(f"accumulator {self.name!r} needs a format spec")

    # ---- rounding ------------------------------------------------------------------------------------
    def round(self, value: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``value`` (float64) rounded into the accumulator; float64 out."""
        if self.name == "integer":
            step = 2.0**-self.frac_width
            units = round_to_integer(value / step, self.rounding, generator)
            return _overflow(units, self.width, self.overflow) * step
        if self.spec is None:
            return value.to(HARDWARE_FLOATS[self.name]).double()
        return self.spec.quantize(value, generator)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "chunk": self.chunk}
        if self.flush is not None:
            out["flush"] = self.flush
        if self.backward:
            out["backward"] = True
        if self.name == "integer":
            out.update(width=self.width, frac_width=self.frac_width, overflow=self.overflow, rounding=self.rounding)
        elif self.spec is not None:
            out.update({k: list(v) if isinstance(v, tuple) else v for k, v in self.spec.params().items()})
        return out

    def describe(self) -> str:
        if self.name == "integer":
            text = f"int{self.width}(frac_width={self.frac_width}, {self.overflow})"
        else:
            text = self.spec.describe() if self.spec is not None else self.name
        flush = "" if self.flush is None else f", flush={self.flush} into fp32"
        return f"{text}, chunk={self.chunk}{flush}" + (", backward too" if self.backward else "")


def build_accumulator(params: dict[str, Any]) -> Accumulator:
    """An Accumulator from ``{"name": ..., "width": ..., "overflow": ..., "chunk": ..., format params}``."""
    params = dict(params)
    name = str(params.pop("name", "fp32")).strip().lower()
    shared = {"chunk": _whole(params.pop("chunk", 1)), "flush": _whole(params.pop("flush", None)),
              "backward": params.pop("backward", False)}  # fmt: skip
    if name in HARDWARE_FLOATS:
        if params:
            raise ConfigError(f"accumulator {name!r} takes no parameters, got {sorted(params)}")
        return Accumulator(_CANONICAL[HARDWARE_FLOATS[name]], **shared)
    try:
        canonical = get_format(name).format_name
    except LowbitError as error:
        raise ConfigError(f"accumulator_name={name!r}: {error}; or one of fp32, bf16, fp16") from None
    if canonical == "integer":
        known = {"width", "frac_width", "overflow", "rounding", "signed"}
        unknown = set(params) - known
        if unknown:
            raise ConfigError(f"unknown accumulator key(s) {sorted(unknown)}; an integer accumulator takes "
                              f"accumulator_width / _frac_width / _overflow / _rounding / _chunk / _flush / _backward")  # fmt: skip
        if params.pop("signed", True) is not True:
            raise ConfigError("an integer accumulator is a signed register (accumulator_signed must be true)")
        params.setdefault("frac_width", 0)
        try:
            params["rounding"] = canonical_rounding(params.get("rounding", "nearest_even"))
        except LowbitError as error:
            raise ConfigError(f"accumulator_rounding: {error}") from None
        return Accumulator("integer", **shared, **params)
    if "overflow" in params:
        raise ConfigError(f"accumulator_overflow applies to integer accumulators, not {canonical!r}")
    try:
        spec = resolve(canonical, **params)
    except LowbitError as error:
        raise ConfigError(f"accumulator: {error}") from None
    return Accumulator(canonical, spec=spec, **shared)


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _overflow(units: torch.Tensor, width: int, overflow: str) -> torch.Tensor:
    low, span = -(2.0 ** (width - 1)), 2.0**width
    if overflow == "saturate":
        return units.clamp(low, -low - 1)
    return torch.remainder(units - low, span) + low


# ---- fast path ---------------------------------------------------------------------------------------
def accumulated_matmul(a: torch.Tensor, b: torch.Tensor, accumulator: Accumulator, bias: torch.Tensor | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
    """``a @ b`` (a: [..., M, K], b: [..., K, N], broadcast like torch.matmul) with every partial sum
    rounded into ``accumulator``; ``bias`` (broadcast against [..., M, N]) added last. Float32 out (float64 for float64 input)."""
    if a.dim() < 2 or b.dim() < 2:
        raise ConfigError("accumulated_matmul needs operands with at least 2 dimensions")
    out_dtype = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    a64, b64 = a.double(), b.double()
    acc, wide = None, None
    for start in range(0, a.shape[-1], accumulator.chunk):  # one chunk at a time: memory of one output
        stop = start + accumulator.chunk
        part = torch.matmul(a64[..., start:stop], b64[..., start:stop, :])  # [..., M, N]
        acc = accumulator.round(part if acc is None else acc + part, generator)
        if accumulator.flush is not None and (stop % accumulator.flush == 0 or stop >= a.shape[-1]):
            wide, acc = _add_float32(wide, acc), None
    if accumulator.flush is not None:  # float32 sums in float64 then rounded once: exact (53 >= 2 * 24 + 2)
        wide = torch.matmul(a64, b64) if wide is None else wide
        return (wide if bias is None else _add_float32(wide, bias.double())).to(out_dtype)
    if acc is None:  # K = 0
        acc = torch.matmul(a64, b64)
    if bias is not None:
        acc = accumulator.round(acc + bias.double(), generator)
    return acc.to(out_dtype)


def _add_float32(wide: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """IEEE float32 ``wide + float32(value)`` (float64 in and out)."""
    return ((0.0 if wide is None else wide) + value.float().double()).float().double()


# ---- slow reference ----------------------------------------------------------------------------------
def reference_matmul(a: torch.Tensor, b: torch.Tensor, accumulator: Accumulator,
                     bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The definition, one output at a time and one product at a time (2-D operands; slow)."""
    rows, size = a.shape
    cols = b.shape[1]
    out = torch.zeros(rows, cols, dtype=torch.float64)
    a_list, b_list = a.double().tolist(), b.double().tolist()
    bias_list = None if bias is None else bias.double().tolist()
    for i in range(rows):
        for j in range(cols):
            parts = []
            for start in range(0, size, accumulator.chunk):
                ks = range(start, min(start + accumulator.chunk, size))
                parts.append(sum((fractions.Fraction(a_list[i][k]) * fractions.Fraction(b_list[k][j]) for k in ks),
                                 fractions.Fraction(0)))  # fmt: skip
            bias_part = None if bias_list is None else fractions.Fraction(bias_list[j])
            out[i, j] = _two_level(parts, bias_part, accumulator)
    return out


def _two_level(parts: list[fractions.Fraction], bias: fractions.Fraction | None, accumulator: Accumulator) -> float:
    if accumulator.flush is None:
        return _sequential(parts if bias is None else [*parts, bias], accumulator)
    per_flush = accumulator.flush // accumulator.chunk
    wide = torch.zeros((), dtype=torch.float32)  # torch's own float32 addition is the oracle
    for start in range(0, len(parts), per_flush):
        wide = wide + torch.tensor(_sequential(parts[start:start + per_flush], accumulator), dtype=torch.float32)
    if bias is not None:
        wide = wide + torch.tensor(float(bias), dtype=torch.float32)
    return float(wide)


def _sequential(parts: list[fractions.Fraction], accumulator: Accumulator) -> float:
    if accumulator.name == "integer":
        return _integer_sequential(parts, accumulator)
    if accumulator.spec is None:
        dtype = HARDWARE_FLOATS[accumulator.name]
        acc = torch.zeros((), dtype=dtype)
        for part in parts:  # the part enters the register rounded, then the dtype's own addition rounds
            acc = acc + torch.tensor(float(part), dtype=torch.float64).to(dtype) if _fits(part, dtype) else \
                (acc.double() + float(part)).to(dtype)  # fmt: skip
        return float(acc)
    acc = 0.0
    for part in parts:
        exact = fractions.Fraction(acc) + part
        acc = float(accumulator.spec.quantize(torch.tensor(float(exact), dtype=torch.float64)))
    return acc


def _fits(part: fractions.Fraction, dtype: torch.dtype) -> bool:
    """Whether ``part`` is exactly a value of ``dtype`` (then the dtype's own addition is the oracle)."""
    value = float(part)
    return fractions.Fraction(value) == part and float(torch.tensor(value).to(dtype)) == value


def _integer_sequential(parts: list[fractions.Fraction], accumulator: Accumulator) -> float:
    scale = 2**accumulator.frac_width
    low, high = -(2 ** (accumulator.width - 1)), 2 ** (accumulator.width - 1) - 1
    acc = 0
    for part in parts:
        units = part * scale + acc
        if units.denominator != 1:
            units = int(round_to_integer(torch.tensor(float(units), dtype=torch.float64), accumulator.rounding, None))
        else:
            units = int(units)
        if accumulator.overflow == "saturate":
            acc = min(max(units, low), high)
        else:
            acc = (units - low) % (high - low + 1) + low
    return acc / scale
