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

The nearest modes are computed from ``floor(x)`` and the fractional part ``x - floor(x)``, which is exact
in binary floating point wherever the tie decision depends on it, so ties are detected exactly (unlike
``floor(x + 0.5)``, which misrounds 0.49999997).
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


def _round_half(floor: torch.Tensor, frac: torch.Tensor, x: torch.Tensor, mode: str) -> torch.Tensor:
    """Nearest rounding with the tie rule of ``mode``; ``frac = x - floor`` in [0, 1)."""
    above = frac > 0.5
    tie = frac == 0.5
    if mode == "nearest_up":
        up = above | tie
    elif mode == "nearest_down":
        up = above
    elif mode == "nearest_away":
        up = above | (tie & (x >= 0))
    else:  # nearest_toward_zero
        up = above | (tie & (x < 0))
    return floor + up.to(x.dtype)


def stochastic_round(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """floor(x) + 1 with probability frac(x): E[result] = x exactly (unbiased)."""
    floor = torch.floor(x)
    frac = x - floor
    noise = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return floor + (noise < frac).to(x.dtype)


def round_to_integer(
    x: torch.Tensor, mode: str = "nearest_even", generator: torch.Generator | None = None
) -> torch.Tensor:
    """Round every element of ``x`` to an integer-valued float by ``mode`` (canonical name).

    NaN stays NaN and +-inf stays +-inf in every mode.
    """
    if mode == "nearest_even":
        return torch.round(x)
    if mode == "toward_zero":
        return torch.trunc(x)
    if mode == "up":
        return torch.ceil(x)
    if mode == "down":
        return torch.floor(x)
    if mode == "away_from_zero":
        return torch.where(x >= 0, torch.ceil(x), torch.floor(x))
    if mode == "stochastic":
        return stochastic_round(x, generator)
    floor = torch.floor(x)
    return _round_half(floor, x - floor, x, mode)


def make_generator(seed: int | None, generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """The generator stochastic rounding draws from: the given one, a fresh one seeded by ``seed``, or None."""
    if generator is not None:
        if seed is not None:
            raise FormatError("give either seed= or generator=, not both")
        return generator
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FormatError(f"seed must be an int, got {seed!r}")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
