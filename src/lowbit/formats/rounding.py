"""Rounding modes shared by every format.

``round_to_integer(x, mode, generator)`` rounds each element of ``x`` to an integer-valued float. Formats
scale their input so that the representable values sit on the integers, round with this function, then
scale back; so every format supports every mode that makes sense for it.

The ten modes (nGraph's nine plus stochastic):

===================== ============================================================ ===================
mode                  what a value halfway between two integers becomes          other values
===================== ============================================================ ===================
nearest_even          the even neighbour (IEEE 754 default; ``torch.round``)      nearest integer
nearest_away          the neighbour farther from zero                              nearest integer
nearest_toward_zero   the neighbour nearer to zero                                 nearest integer
nearest_up            the larger neighbour (toward +inf)                           nearest integer
nearest_down          the smaller neighbour (toward -inf)                          nearest integer
toward_zero           truncation                                                   truncation
away_from_zero        away from zero                                               away from zero
up                    ceiling                                                      ceiling
down                  floor                                                        floor
stochastic            up with probability equal to the fractional part (unbiased)  same
===================== ============================================================ ===================

The nearest modes start from ``torch.round(x)`` (ties to even) and detect ties as ``|x - round(x)| == 0.5``.
That difference is exact in binary floating point (the two operands are within a factor of two of each
other, or the rounded one is zero), so ties are found exactly. Two shortcuts that look equivalent are not:
``floor(x + 0.5)`` turns 0.49999997 into 1, and ``x - floor(x)`` rounds to exactly 0.5 for x = -0.49999997
(float32), which would send that value to -1. A zero result keeps the sign of its input in every mode
(-0.3 -> -0.0), so rounding is exactly sign-symmetric where the mode is.
"""

from __future__ import annotations

import torch

from lowbit.errors import FormatError, did_you_mean

ROUNDING_MODES: tuple[str, ...] = (
    "nearest_even",
    "nearest_away",
    "nearest_toward_zero",
    "nearest_up",
    "nearest_down",
    "toward_zero",
    "away_from_zero",
    "up",
    "down",
    "stochastic",
)

# nGraph's names (and a few common spellings) for the same modes.
ROUNDING_ALIASES: dict[str, str] = {
    "round_nearest_toward_even": "nearest_even",
    "nearest": "nearest_even",
    "round_nearest_toward_infinity": "nearest_away",
    "round_nearest_toward_zero": "nearest_toward_zero",
    "round_nearest_upward": "nearest_up",
    "round_nearest_downward": "nearest_down",
    "round_toward_zero": "toward_zero",
    "round_toward_infinity": "away_from_zero",
    "round_up": "up",
    "round_down": "down",
    "floor": "down",
    "ceil": "up",
    "trunc": "toward_zero",
}


def canonical_rounding(mode: str) -> str:
    """The canonical name of a rounding mode; FormatError naming the legal modes if unknown."""
    if not isinstance(mode, str):
        raise FormatError(f"rounding must be a string, got {mode!r}; legal: {', '.join(ROUNDING_MODES)}")
    key = mode.strip().lower()
    key = ROUNDING_ALIASES.get(key, key)
    if key not in ROUNDING_MODES:
        hint = did_you_mean(key, ROUNDING_MODES)
        raise FormatError(f"rounding={mode!r} is not a rounding mode{hint}; legal: {', '.join(ROUNDING_MODES)}")
    return key


# Which neighbour a nearest mode picks on a tie, as the sign of the half step added to the tie.
_TIE_STEP = {
    "nearest_up": lambda x: torch.ones_like(x),
    "nearest_down": lambda x: -torch.ones_like(x),
    "nearest_away": torch.sign,
    "nearest_toward_zero": lambda x: -torch.sign(x),
}


def _round_half(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Nearest rounding with the tie rule of ``mode`` (one of the keys of ``_TIE_STEP``)."""
    nearest = torch.round(x)
    tie = (x - nearest).abs() == 0.5  # exact: see the module docstring
    resolved = x + 0.5 * _TIE_STEP[mode](x)  # a tie k + 0.5 plus or minus 0.5: an integer, exact
    return torch.copysign(torch.where(tie, resolved, nearest), x)


def stochastic_round(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """floor(x) + 1 with probability frac(x), else floor(x): E[result] = x (unbiased).

    The uniform noise has the resolution of x's dtype (2^-24 in float32), which bounds the bias by one
    noise step; integers, NaN and +-inf come back unchanged.
    """
    floor = torch.floor(x)
    frac = x - floor
    noise = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return torch.copysign(floor + (noise < frac).to(x.dtype), x)


def _away_from_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, torch.ceil(x), torch.floor(x))


# mode -> rounding function of (x, generator); only stochastic uses the generator.
_ROUNDERS = {
    "nearest_even": lambda x, generator: torch.round(x),
    "toward_zero": lambda x, generator: torch.trunc(x),
    "away_from_zero": lambda x, generator: _away_from_zero(x),
    "up": lambda x, generator: torch.ceil(x),
    "down": lambda x, generator: torch.floor(x),
    "stochastic": stochastic_round,
    **{mode: (lambda x, generator, mode=mode: _round_half(x, mode)) for mode in _TIE_STEP},
}


def round_to_integer(
    x: torch.Tensor, mode: str = "nearest_even", generator: torch.Generator | None = None
) -> torch.Tensor:
    """Round every element of ``x`` to an integer-valued float by ``mode`` (canonical name).

    NaN stays NaN and +-inf stays +-inf in every mode.
    """
    return _ROUNDERS[mode](x, generator)


def make_generator(seed: int | None, generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """The generator stochastic rounding draws from: the given one, a fresh one seeded by ``seed`` on
    ``device`` (the input's: torch draws only from a generator on the tensor's own device), or None.

    On the meta device there is nothing to draw: a seed gives None (torch cannot make a meta generator) and
    the draws keep only their shape, so stochastic formats run there like the others.
    """
    device = torch.device(device)
    if generator is not None:
        if seed is not None:
            raise FormatError("give either seed= or generator=, not both")
        if device.type != "meta" and generator.device.type != device.type:
            raise FormatError(
                f"generator is on {generator.device} but the tensor is on {device}; stochastic rounding draws "
                f"from a generator on the tensor's device (torch.Generator(device={str(device)!r}))"
            )
        return generator
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FormatError(f"seed must be an int, got {seed!r}")
    if device.type == "meta":
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


# Directed modes: where the result must not exceed x (True; else it must not fall below x).
DIRECTED_MODES = {
    "down": lambda x: torch.ones_like(x, dtype=torch.bool),
    "up": lambda x: torch.zeros_like(x, dtype=torch.bool),
    "toward_zero": lambda x: x >= 0,
    "away_from_zero": lambda x: x < 0,
}


def correct_directed(x: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, mode: str) -> torch.Tensor:
    """Directed rounding against the actual grid values steps * scale.

    x * (1 / scale) is off by an ulp or so when scale is not a power of two, which can put a value that
    lies exactly on the grid (or within an ulp of it) just across an integer: "down" would then move a
    representable value one step down. One step of correction suffices for codes of up to 16 bits.
    """
    not_above = DIRECTED_MODES[mode](x)
    steps = steps - (not_above & (steps * scale > x)).to(x.dtype)
    steps = steps + (not_above & ((steps + 1) * scale <= x)).to(x.dtype)
    steps = steps + (~not_above & (steps * scale < x)).to(x.dtype)
    return steps - (~not_above & ((steps - 1) * scale >= x)).to(x.dtype)
