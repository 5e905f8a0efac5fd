"""The base class of every number format, and the parameter checks formats share.

A format is a frozen, keyword-only dataclass. ``__post_init__`` normalises MASE-style values ("NA" -> None,
0/1 -> bool, lists -> tuples) and validates every parameter, raising :class:`FormatError` that names the
parameter, its value and the legal range. ``_quantize`` is the pure tensor function; it sees float32 or
float64 input and never needs to think about autograd, empty tensors or dtypes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, ClassVar

import torch

from lowbit import backend
from lowbit.casting import narrow_toward, saturating_cast
from lowbit.errors import FormatError, LowbitError, did_you_mean
from lowbit.format_record import FormatRecord
from lowbit.formats.rounding import DIRECTED_MODES, ROUNDING_MODES, canonical_rounding, make_generator
from lowbit.formats.ste import straight_through

_NONE_STRINGS = {"na", "none", ""}
# Parameters that define the value set: ``describe`` shows them even at their default.
_ALWAYS_SHOWN = {"width", "frac_width", "bits", "exponent_width", "exponent_bias", "exponent_bias_width", "levels"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FormatSpec:
    """Parameters of one number format plus its quantize function."""

    format_name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    # Rounding modes this format accepts (a format whose grid is not a scaled integer grid may accept fewer).
    roundings: ClassVar[tuple[str, ...]] = ROUNDING_MODES
    # Formats with per-block reductions run slower when Inductor's dynamic-shape reduction kernels handle
    # half types (block_fp on bf16 4096^2: 460 ms fused vs about 200 ms, measured): their compiled kernel
    # works in float32 and the backend casts around it (see casting.saturating_cast).
    upcast_before_kernel: ClassVar[bool] = False
    # Whether ``_native`` also takes bfloat16 / float16 x and answers in x's dtype, as the float32 kernel's result
    # cast with ``casting.saturating_cast`` (csrc/stream.h widens and narrows a tile at a time, so no float32
    # tensor is made). Where it does not, or answers None for halves in some layout (blocks longer than a tile,
    # affine per channel), the backend widens x and narrows the float32 kernel's result.
    native_takes_halves: ClassVar[bool] = False
    # What the backend reads (lowbit.format_record): built from the class's hooks above and ``_native`` /
    # ``_quantize_in_dtype`` when the class is defined, unless the class sets one itself.
    format_record: ClassVar[FormatRecord]

    rounding: str = "nearest_even"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "format_record" not in cls.__dict__:
            cls.format_record = cls._record()

    @classmethod
    def _record(cls) -> FormatRecord:
        """This class's record: its eager function, its native binding (None where it keeps the base's, which
        has no kernel) and its kernel hints."""
        native = cls._native if cls._native is not FormatSpec._native else None
        return FormatRecord(eager=cls._quantize_in_dtype, native=native, native_takes_halves=cls.native_takes_halves,
                            upcast_before_kernel=cls.upcast_before_kernel)  # fmt: skip

    # ---- construction -------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        mode = canonical_rounding(self.rounding)
        if mode not in self.roundings:
            raise FormatError(
                f"{self.format_name}: rounding={self.rounding!r} is not supported; legal: {', '.join(self.roundings)}"
            )
        object.__setattr__(self, "rounding", mode)
        self.validate()

    def validate(self) -> None:
        """Check and normalise the format's own parameters (subclasses override)."""

    @classmethod
    def parameter_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def create(cls, **params: Any) -> FormatSpec:
        """Construct from keyword parameters, naming any unknown parameter and the nearest known one."""
        cls._check_names(params)
        return cls(**params)

    def replace(self, **params: Any) -> FormatSpec:
        self._check_names(params)
        return dataclasses.replace(self, **params)

    @classmethod
    def _check_names(cls, params: dict[str, Any]) -> None:
        known = cls.parameter_names()
        for name in params:
            if name not in known:
                raise FormatError(
                    f"{cls.format_name}: unknown parameter {name!r}{did_you_mean(name, known)}; "
                    f"parameters: {', '.join(known)}"
                )

    # ---- quantization -------------------------------------------------------------------------------
    def __call__(
        self, x: torch.Tensor, *, seed: int | None = None, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Fake-quantize ``x`` (same shape and dtype) with a straight-through gradient."""
        check_tensor(x)
        gen = None
        if seed is not None or generator is not None:
            gen = make_generator(seed, generator, x.device)  # validates seed / generator even if unused
            gen = gen if self.is_stochastic else None
        return straight_through(lambda t: self._quantize_checked(t, gen), x)

    def quantize(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Fake-quantize without autograd bookkeeping: float32/float64 math, result in ``x.dtype``."""
        check_tensor(x)
        return self._quantize_checked(x, generator)

    def _quantize_checked(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """``quantize`` of a checked tensor (the few microseconds of a 384 x 384 call count)."""
        if x.numel() == 0:
            return x.detach().clone()
        result = backend.run_native(self, x)
        if result is not None:
            return result
        if torch.is_grad_enabled():  # inside the straight-through function's forward it is already off
            with torch.no_grad():
                return backend.run_without_native(self, x.detach(), generator)
        return backend.run_without_native(self, x.detach() if x.requires_grad else x, generator)

    def _quantize_in_dtype(self, x: torch.Tensor, generator: torch.Generator | None,
                           out_dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
        """Up-cast half types to float32, quantize, and cast (saturating) to ``out_dtype`` (default x's
        dtype): the whole job in one function, so the compiled path fuses the casts into its pass."""
        out_dtype = x.dtype if out_dtype is None else out_dtype
        work = x if x.dtype in (torch.float32, torch.float64) else x.float()
        out = self._quantize_for(work, generator, out_dtype)
        if out.dtype == out_dtype:
            return out
        return self.narrowed(out, out_dtype, work)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        """The native kernel's result for x (float32, contiguous, on the CPU; deterministic rounding), as
        float32, bit for bit what ``_quantize_for(x, None, out_dtype)`` gives; None where this format has no
        native kernel for its parameters (subclasses override; see ``lowbit.native.kernels``)."""
        return None

    def _native_takes_halves(self) -> bool:
        """``native_takes_halves`` as this spec's record says it (the backend reads the record)."""
        return self.format_record.native_takes_halves

    def _quantize_for(self, x: torch.Tensor, generator: torch.Generator | None, out_dtype: torch.dtype) -> torch.Tensor:
        """``_quantize`` when the result will be cast to ``out_dtype``; formats whose grid depends on the
        output's range (MX scales) override this."""
        return self._quantize(x, generator)

    # ---- description --------------------------------------------------------------------------------
    @property
    def is_stochastic(self) -> bool:
        return self.rounding == "stochastic"

    @property
    def narrows_directed(self) -> bool:
        """Directed rounding: a float32 result is narrowed to a half / float8 input's dtype toward the input
        (``casting.narrow_toward``), so that it keeps its direction and a second pass leaves it."""
        return self.rounding in DIRECTED_MODES

    def narrowed(self, values: torch.Tensor, dtype: torch.dtype, inputs: torch.Tensor) -> torch.Tensor:
        """A float32 result of this format cast to ``dtype`` (narrower) by the format's rule (``inputs``: the
        values it was quantized from, as float32)."""
        return narrow_toward(values, inputs, dtype) if self.narrows_directed else saturating_cast(values, dtype)

    @property
    def bits(self) -> float:
        """Storage bits per element, not counting shared scales (see ``bits_per_element``)."""
        raise NotImplementedError

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Average storage bits per element including shared scales / zero points (default: ``bits``)."""
        return float(self.bits)

    def value_set(self) -> torch.Tensor | None:
        """All representable values, sorted ascending (float64), or None when they depend on the data."""
        return None

    def params(self) -> dict[str, Any]:
        """The parameters as a plain dict (what ``create`` takes back)."""
        return {name: getattr(self, name) for name in self.parameter_names()}

    def describe(self) -> str:
        """``name(param=value, ...)`` listing only the parameters that differ from their defaults."""
        defaults = self._default_params()
        shown = {k: v for k, v in self.params().items() if k in _ALWAYS_SHOWN or defaults.get(k, object()) != v}
        return f"{self.format_name}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def _default_params(cls) -> dict[str, Any]:
        """The parameters of a default-constructed spec ({} when the class has no valid defaults)."""
        try:
            return cls().params()
        except LowbitError:
            return {}


FormatSpec.format_record = FormatSpec._record()  # __init_subclass__ builds every subclass's own


# ---- shared parameter checks ----------------------------------------------------------------------------
def check_tensor(x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise FormatError(f"quantize expects a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise FormatError(
            f"quantize expects a dense (strided) tensor, got layout {x.layout}; convert it with .to_dense() first"
        )
    if not x.is_floating_point():
        raise FormatError(f"quantize expects a floating-point tensor, got dtype {x.dtype}")


def is_number(value: Any) -> bool:
    """A real number that is not a bool (True is an int to Python, never a number to a format)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _fail(spec: FormatSpec, name: str, value: Any, legal: str) -> FormatError:
    return FormatError(f"{spec.format_name}: {name}={value!r} is invalid; {legal}")


def set_field(spec: FormatSpec, name: str, value: Any) -> None:
    object.__setattr__(spec, name, value)


def check_int(spec: FormatSpec, name: str, low: int | None = None, high: int | None = None) -> int:
    """An int parameter in [low, high] (floats with integral value are accepted and converted)."""
    value = getattr(spec, name)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)  # numpy / other integral types
    elif isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        value = int(value)
    legal = f"must be an integer in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(spec, name, value, legal)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _fail(spec, name, value, legal)
    set_field(spec, name, value)
    return value


def check_bool(spec: FormatSpec, name: str) -> bool:
    """A bool parameter; TOML-style 0 / 1 ints are accepted."""
    value = getattr(spec, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        set_field(spec, name, bool(value))
        return bool(value)
    raise _fail(spec, name, value, "must be true or false (or 1 / 0)")


def check_optional(spec: FormatSpec, name: str) -> Any:
    """Turn MASE's "NA" / "None" strings into None."""
    value = getattr(spec, name)
    if isinstance(value, str) and value.strip().lower() in _NONE_STRINGS:
        set_field(spec, name, None)
        return None
    return value


def check_float(spec: FormatSpec, name: str, *, positive: bool = False, optional: bool = False) -> float | None:
    value = check_optional(spec, name) if optional else getattr(spec, name)
    if value is None and optional:
        return None
    legal = "must be a finite positive number" if positive else "must be a finite number"
    if not is_number(value) or not math.isfinite(value):
        raise _fail(spec, name, value, legal)
    if positive and value <= 0:
        raise _fail(spec, name, value, legal)
    set_field(spec, name, float(value))
    return float(value)


def check_choice(spec: FormatSpec, name: str, choices: dict[str, str] | tuple[str, ...]) -> str:
    """A string parameter from a fixed set (``choices`` may map aliases to canonical names)."""
    value = getattr(spec, name)
    mapping = choices if isinstance(choices, dict) else {c: c for c in choices}
    key = value.strip().lower() if isinstance(value, str) else None  # strings only (a list is no choice)
    if key not in mapping:
        hint = did_you_mean(str(value), mapping)
        raise _fail(spec, name, value, f"legal values: {', '.join(sorted(set(mapping.values())))}{hint}")
    set_field(spec, name, mapping[key])
    return mapping[key]


def check_block_size(spec: FormatSpec, name: str = "block_size") -> tuple[int, ...] | None:
    """None, an int, or a sequence of ints >= 1 or -1 (whole dimension); stored as a tuple."""
    value = check_optional(spec, name)
    if value is None:
        return None
    legal = "must be an int or a list of ints, each >= 1 or -1 (the whole dimension)"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        items = (value,)
    elif isinstance(value, (list, tuple, torch.Size)):  # not str / bytes (sequences of characters / bytes)
        items = value
    else:
        raise _fail(spec, name, value, legal)
    if not items or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) or (b < 1 and b != -1)
                        for b in items):  # fmt: skip
        raise _fail(spec, name, value, legal)
    block = tuple(int(b) for b in items)
    set_field(spec, name, block)
    return block


def check_axis(spec: FormatSpec, name: str = "axis") -> int | None:
    value = check_optional(spec, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(spec, name, value, "must be an int (a tensor dimension) or None")
    return value


SCALE_DTYPES: dict[str, str] = {
    "f32": "f32", "float32": "f32", "fp32": "f32", "float": "f32",
    "f16": "f16", "float16": "f16", "fp16": "f16", "half": "f16",
    "bf16": "bf16", "bfloat16": "bf16",
}  # fmt: skip


_SCALE_LIMITS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def check_given_scales(
    spec: FormatSpec, name: str, scale_dtype: str = "f32", largest: float | None = None
) -> tuple[float, ...] | None:
    """None, or given scales (a number, a list or a tensor) stored as a tuple of floats.

    Each must be finite and inside [smallest normal, largest finite] of ``scale_dtype``, the range a stored
    scale can take; more than one needs ``axis`` (one per index along it; the count is checked against the
    tensor when it is quantized). ``largest`` lowers the top of the range (a scale rounded up later).
    """
    value = check_optional(spec, name)
    if value is None:
        return None
    info = torch.finfo(_SCALE_LIMITS[scale_dtype])
    top = info.max if largest is None else min(largest, info.max)
    legal = (f"every value must be a finite number in [{info.tiny:.6g}, {top:.6g}] (the range of "
             f"{scale_dtype} scales); one per tensor, or one per index of axis")  # fmt: skip
    items = value.detach().flatten().tolist() if isinstance(value, torch.Tensor) else value
    items = list(items) if isinstance(items, (list, tuple)) else [items]
    if not items or not all(is_number(v) for v in items):
        raise _fail(spec, name, value, legal)
    scales = tuple(float(v) for v in items)
    if not all(math.isfinite(s) and info.tiny <= s <= top for s in scales):
        raise _fail(spec, name, value, legal)
    if len(scales) > 1 and getattr(spec, "axis", None) is None:
        raise _fail(spec, name, value, f"{len(scales)} values need axis= to say which dimension they follow")
    set_field(spec, name, scales)
    return scales
