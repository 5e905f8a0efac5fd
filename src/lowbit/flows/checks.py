"""The checks recipe fields go through (``check()`` methods): ``flag`` / ``choice`` / ``positive_int`` are
:mod:`lowbit._checks`' one wording under the names the recipes call; the recipe-only ones; the granularity
vocabulary."""

from __future__ import annotations

from typing import Any

from lowbit._checks import check_choice as choice
from lowbit._checks import check_flag as flag
from lowbit._checks import check_positive_int as positive_int
from lowbit.errors import ConfigError

GRANULARITIES = ("tensor", "channel", "token", "group")


def granularity_params(granularity: str, group_size: int | None = None, where: str = "granularity") -> dict[str, Any]:
    """The format parameters (``axis`` / ``block_size``, the formats' and observers' own spelling) of a
    granularity word for a 2-D [rows, last dimension] tensor."""
    choice(where, "granularity", granularity, GRANULARITIES)
    if granularity == "group":
        positive_int(where, "group_size", group_size)
        return {"block_size": (1, group_size)}
    if group_size is not None:
        raise ConfigError(f"{where}: group_size={group_size!r} needs granularity='group'")
    return {"tensor": {}, "channel": {"axis": 0}, "token": {"block_size": (1, -1)}}[granularity]


def conv_option(recipe: str, value: Any) -> None:
    """``include_conv``: "auto" (the default) swaps each nn.Conv2d for Int8Conv2d where an exact int8
    convolution faster than float32 runs on its device and keeps it in float, with the reason in
    ``info["kept"]``, elsewhere; True swaps every one (the exact reference path where nothing faster runs);
    False none."""
    if value != "auto" and not isinstance(value, bool):
        raise ConfigError(f"{recipe}: include_conv={value!r} must be true, false or \"auto\"")


def smoothquant_option(recipe: str, value: Any) -> None:
    """``smoothquant``: None (off) or SmoothQuant's migration strength alpha in (0, 1]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{recipe}: smoothquant={value!r} must be a number in (0, 1] (SmoothQuant's alpha) "
                          "or None (off)")  # fmt: skip


__all__ = ["GRANULARITIES", "choice", "conv_option", "flag", "granularity_params", "positive_int", "smoothquant_option"]
