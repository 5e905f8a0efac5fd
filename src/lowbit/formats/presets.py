"""Burn-style integer presets: q8s q4s q2s (symmetric) and q8f q4f q2f (full range).

All six are symmetric (zero point 0) with min-max scales at any granularity (per tensor by default,
``axis=`` per channel, ``block_size=`` ND blocks) and a ``scale_dtype`` of f32 / f16 / bf16.

- ``qNs``: codes [-(2^(N-1) - 1), 2^(N-1) - 1] (the most negative code unused), scale = max|x| / q_max,
  so +-max|x| are represented exactly.
- ``qNf``: codes [-2^(N-1), 2^(N-1) - 1], every code used: scale = max(-min / 2^(N-1), max / (2^(N-1) - 1))
  over the range widened to include zero, so the side with the larger magnitude lands exactly on its end
  code (the negative side may use the extra code). Burn's "full range" scale 2 max|x| / (2^N - 1) puts
  +-max|x| on half codes and is not idempotent; this rule uses the same codes and is.

Every derived scale is rounded down to 24 - N significant bits (see ``scaling.shorten_scale``), so the
codes times the scale are exact and quantizing a quantized tensor gives it back unchanged.

The floating-point presets (e5m2, e4m3, e2m1) live with the minifloats.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from lowbit.errors import FormatError
from lowbit.formats._registry import register
from lowbit.formats.affine import Affine


@dataclasses.dataclass(frozen=True, kw_only=True)
class _IntegerPreset(Affine):
    """An Affine with fixed bits / symmetry / code range; the granularity and scale precision stay free.

    The fixed parameters default to None ("not given") rather than to Affine's defaults, so that any
    explicit value other than the preset's own, including Affine's default (q4s with bits=8), is an error
    instead of being silently replaced.
    """

    preset_bits: ClassVar[int] = 8
    preset_narrow: ClassVar[bool] = True

    bits: int | None = None
    signed: bool | None = None
    symmetric: bool | None = None
    narrow_range: bool | None = None

    def __post_init__(self) -> None:
        fixed = {"bits": self.preset_bits, "signed": True, "symmetric": True, "narrow_range": self.preset_narrow}
        for name, value in fixed.items():
            given = getattr(self, name)
            if given is not None and not _same_fixed_value(given, value):
                raise FormatError(
                    f"{self.format_name}: {name}={given!r} is invalid; the preset fixes {name}={value!r} "
                    f"(use format 'affine' to choose it)"
                )
            object.__setattr__(self, name, value)
        super().__post_init__()


def _same_fixed_value(given: object, fixed: bool | int) -> bool:
    """Whether a given fixed parameter means the preset's value: a bool (or 0 / 1) for a flag, an integer
    (an integral float too) for ``bits``; nothing else (a string, a tensor, a list) is taken as equal."""
    if isinstance(fixed, bool):
        return type(given) in (bool, int) and given in (0, 1) and bool(given) == fixed
    return type(given) in (int, float) and given == fixed


def _preset(name: str, bits: int, narrow: bool) -> type[Affine]:
    doc = f"Burn's {name.upper()}: {bits}-bit symmetric codes, {'symmetric (narrow)' if narrow else 'full'} range."
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(
        type(name.upper(), (_IntegerPreset,), {"format_name": name, "preset_bits": bits, "preset_narrow": narrow,
                                               "full_range_scale": not narrow,
                                               "__doc__": doc, "__module__": __name__})
    )
    return register(cls)


Q8S = _preset("q8s", 8, True)
Q4S = _preset("q4s", 4, True)
Q2S = _preset("q2s", 2, True)
Q8F = _preset("q8f", 8, False)
Q4F = _preset("q4f", 4, False)
Q2F = _preset("q2f", 2, False)
