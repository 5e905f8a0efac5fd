"""Observers: they watch tensors and produce ranges, scales and zero points; they never quantize.

Every observer has one granularity, chosen at construction and shared with the ``affine`` format's
geometry (``lowbit.formats.blocking.block_shape``): per tensor (default), per channel (``axis=``; ranges
shaped [channels]) or per ND block (``block_size=``, right-aligned with the shape, -1 = whole dimension;
ranges shaped [n0, n1, ...], one per block). The statistics are float32 (input is converted, as torch.ao
does); ``count`` is the number of finite values seen. Non-finite values (NaN, +-inf) are ignored and
tallied in ``nonfinite_count`` (``nonfinite="ignore"``, the rule of the affine format, whose scales come
from finite values only), or rejected with ConfigError before any state changes (``nonfinite="error"``).
A channel or block that has seen only non-finite values reports the range (0, 0). Empty tensors change
nothing; asking for a range before any finite value raises ConfigError. Every observer's state lives on
the device of the first batch it sees (later batches are moved there), so ranges come back on that
device (min / max state follows each new batch's device; sketches, histograms and sums move later
batches to theirs). On the meta device the min / max observers track shapes (non-finite values cannot be counted
there, so ``count`` counts every value); the percentile and search observers keep data-dependent buckets
and raise FormatError there.

Search observers (``MSEObserver``, ``HistogramObserver``) pick a range for a target code format: the one
given at construction, overridden by the keywords of ``min_max(bits=..., ...)``, or the one passed to
``scale_zero_point`` / ``affine_spec``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from lowbit.calibrate import builders
from lowbit.calibrate.builders import ScaleZeroPoint
from lowbit.calibrate.quantile import GroupedQuantileSketch
from lowbit.errors import ConfigError, FormatError
from lowbit.formats.blocking import block_shape


class MinMax(NamedTuple):
    min: torch.Tensor
    max: torch.Tensor


def _grouped(x: torch.Tensor, block: tuple[int, ...]) -> torch.Tensor:
    """x as [blocks, elements per block]; padding is NaN so that no statistic can see it."""
    pads = [(-dim) % size for dim, size in zip(x.shape, block, strict=True)]
    if any(pads):
        x = F.pad(x, [p for pad in reversed(pads) for p in (0, pad)], value=math.nan)
    blocked = x.reshape([v for dim, size in zip(x.shape, block, strict=True) for v in (dim // size, size)])
    order = list(range(0, 2 * x.dim(), 2)) + list(range(1, 2 * x.dim(), 2))
    return blocked.permute(order).reshape(-1, math.prod(block))


class Observer:
    """Base class: granularity, data checks, counts and the parameter / state API."""

    _needs_values = False  # True: the summary's layout depends on the values (no meta-device run)

    def __init__(self, *, axis: int | None = None, block_size=None, nonfinite: str = "ignore"):
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise ConfigError(f"axis={axis!r} is invalid; expected an int (a tensor dimension) or None")
        if block_size is not None:
            block_size = (block_size,) if isinstance(block_size, int) else tuple(block_size)
            if not block_size or any(isinstance(b, bool) or not isinstance(b, int) or (b < 1 and b != -1)
                                     for b in block_size):
                raise ConfigError(f"block_size={block_size!r} is invalid; expected ints >= 1 or -1 (whole dimension)")
        if nonfinite not in ("ignore", "error"):
            raise ConfigError(f"nonfinite={nonfinite!r} is invalid; expected 'ignore' or 'error'")
        self.axis, self.block_size, self.nonfinite = axis, block_size, nonfinite
        self.target = {"bits": 8, "signed": True, "symmetric": False, "power_of_two": False, "narrow_range": False}
        self.reset()

    def reset(self) -> None:
        """Forget every statistic (the granularity stays)."""
        self.count, self.nonfinite_count, self.stats_shape = 0, 0, None
        self.device = None  # of the last batch seen
        self._reset_statistics()

    # ---- observing ------------------------------------------------------------------------------------
    def update(self, x: torch.Tensor) -> None:
        """Record the statistics of ``x`` (a whole batch at once)."""
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"{type(self).__name__}.update expects a torch.Tensor, got {type(x).__name__}")
        if x.numel() == 0:
            return
        work = x.detach().to(torch.float32)
        work = work.reshape(1) if work.dim() == 0 else work
        meta = work.device.type == "meta"
        if meta and self._needs_values:
            raise FormatError(f"{type(self).__name__} cannot run on the meta device: its buckets depend on the "
                              "values; use min / max observers there, or the CPU or a GPU")  # fmt: skip
        nonfinite = 0 if meta else int((~torch.isfinite(work)).sum())  # meta holds no values to count
        self.device = work.device
        if nonfinite and self.nonfinite == "error":
            raise ConfigError(f"{type(self).__name__}: {nonfinite} non-finite values (NaN / inf) in the input")
        try:
            block = block_shape(work.shape, self.block_size, self.axis)
        except FormatError as error:
            raise ConfigError(f"{type(self).__name__}: {error}") from None
        shape = self._stats_shape(work.shape, block)
        if self.stats_shape is None:
            self.stats_shape = shape
            self._start(math.prod(shape), work.device)
        elif shape != self.stats_shape:
            raise ConfigError(
                f"{type(self).__name__}: input of shape {tuple(x.shape)} gives ranges of shape {shape}, but earlier "
                f"inputs gave {self.stats_shape}; a block_size of -1 covers a dimension whose size varies"
            )
        padded = any(dim % size for dim, size in zip(work.shape, block, strict=True))
        self._observe(_grouped(work, block), clean=nonfinite == 0 and not padded and not meta)
        self.count += work.numel() - nonfinite
        self.nonfinite_count += nonfinite

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Observe ``x`` and return it unchanged (usable as a forward hook body)."""
        self.update(x)
        return x

    def _stats_shape(self, shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
        if self.block_size is None and self.axis is None:
            return ()
        counts = tuple(-(-dim // size) for dim, size in zip(shape, block, strict=True))
        return (math.prod(counts),) if self.block_size is None else counts

    # ---- results -----------------------------------------------------------------------------------------
    def min_max(self, **target) -> MinMax:
        """(min, max) float32 tensors shaped like the granularity ([] / [channels] / [n0, n1, ...]).

        Search observers take target-format keywords (``bits``, ``signed``, ``symmetric``, ``power_of_two``,
        ``narrow_range``) that override the constructor's; the others ignore them.
        """
        unknown = sorted(set(target) - set(self.target))
        if unknown:
            known = ", ".join(self.target)
            raise ConfigError(f"{type(self).__name__}.min_max: unknown keyword {unknown[0]!r}; known: {known}")
        return self._range_for(**{**self.target, **target})

    def scale_zero_point(
        self, bits: int = 8, signed: bool = True, symmetric: bool = False, power_of_two: bool = False,
        narrow_range: bool = False,
    ) -> ScaleZeroPoint:  # fmt: skip
        """Scale and zero point from this observer's range via :func:`builders.scale_zero_point`."""
        target = {"bits": bits, "signed": signed, "symmetric": symmetric, "power_of_two": power_of_two,
                  "narrow_range": narrow_range}  # fmt: skip
        low, high = self._range_for(**target)
        return builders.scale_zero_point(low, high, **target)

    def affine_spec(self, bits: int = 8, signed: bool = True, symmetric: bool = False, power_of_two: bool = False,
                    narrow_range: bool = False, **format_parameters):  # fmt: skip
        """An ``affine`` FormatSpec with this observer's calibrated scale and zero point."""
        if self.block_size is not None:
            raise ConfigError("per-block ranges have no given-scale affine spec; use affine(block_size=...)")
        self.require_values("a spec's scales are Python numbers")
        parameters = self.scale_zero_point(bits, signed, symmetric, power_of_two, narrow_range)
        return builders.affine_spec(parameters, bits, signed, self.axis, narrow_range, **format_parameters)

    def require_values(self, why: str) -> None:
        """FormatError when the statistics came from meta tensors (shapes only): ``why`` needs values."""
        if self.device is not None and self.device.type == "meta":
            raise FormatError(f"{type(self).__name__} cannot run on the meta device: {why}")

    def _range_for(self, **target) -> MinMax:
        if self.count == 0:
            raise ConfigError(f"{type(self).__name__} has seen no data (no finite values); call update() first")
        low, high = self._range(**target)
        low, high = (torch.where(torch.isfinite(v), v, 0.0).to(torch.float32) for v in (low, high))
        return MinMax(low.reshape(self.stats_shape), high.reshape(self.stats_shape))

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Statistics as plain tensors (save with safetensors, or JSON via ``.tolist()``)."""
        state = {"count": torch.tensor(self.count), "nonfinite_count": torch.tensor(self.nonfinite_count)}
        if self.stats_shape is not None:
            state["stats_shape"] = torch.tensor(self.stats_shape, dtype=torch.int64)
            state.update(self._statistics())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()`` output (tensors, or numbers / lists as JSON gives them back)."""
        self.reset()
        self.count = int(torch.as_tensor(state["count"]))
        self.nonfinite_count = int(torch.as_tensor(state["nonfinite_count"]))
        if "stats_shape" in state:
            self.stats_shape = tuple(int(v) for v in torch.as_tensor(state["stats_shape"]).reshape(-1).tolist())
            self._start(math.prod(self.stats_shape))
            try:
                self._load_statistics(state)
            except KeyError as missing:
                raise ConfigError(f"{type(self).__name__}.load_state_dict: missing key {missing}") from None

    # ---- what subclasses provide -----------------------------------------------------------------------------
    def _reset_statistics(self) -> None: ...

    def _start(self, groups: int, device: torch.device | None = None) -> None:
        raise NotImplementedError

    def _observe(self, values: torch.Tensor, clean: bool) -> None:
        raise NotImplementedError

    def _range(self, **target) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _statistics(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _load_statistics(self, state: dict) -> None:
        raise NotImplementedError


def prefixed(state: dict, prefix: str) -> dict:
    """The entries of ``state`` whose keys start with ``prefix``, without it (a nested state)."""
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def _batch_min_max(values: torch.Tensor, clean: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group (min, max) over finite values (+inf / -inf for a group with none)."""
    if clean:
        return torch.aminmax(values, dim=1)
    finite = torch.isfinite(values)
    return torch.where(finite, values, math.inf).amin(1), torch.where(finite, values, -math.inf).amax(1)


class MinMaxObserver(Observer):
    """The running min and max of everything seen (torch.ao's MinMaxObserver / PerChannelMinMaxObserver)."""

    def _reset_statistics(self) -> None:
        self.low = self.high = None

    def _start(self, groups: int, device: torch.device | None = None) -> None:
        self.low = torch.full((groups,), math.inf, device=device)
        self.high = torch.full((groups,), -math.inf, device=device)

    def _observe(self, values: torch.Tensor, clean: bool) -> None:
        low, high = _batch_min_max(values, clean)
        self.low, self.high = self.low.to(low.device), self.high.to(high.device)  # state follows the data
        self.low, self.high = torch.minimum(self.low, low), torch.maximum(self.high, high)

    def _range(self, **target) -> tuple[torch.Tensor, torch.Tensor]:
        return self.low, self.high

    def _statistics(self) -> dict[str, torch.Tensor]:
        return {"min": self.low.clone(), "max": self.high.clone()}

    def _load_statistics(self, state: dict) -> None:
        self.low = torch.as_tensor(state["min"], dtype=torch.float32).reshape(-1).clone()
        self.high = torch.as_tensor(state["max"], dtype=torch.float32).reshape(-1).clone()


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Exponential moving averages of each batch's min and max: m <- m + c (batch_min - m), the first batch
    taken as it is (torch.ao's MovingAverage[PerChannel]MinMaxObserver). A group whose batch holds no finite
    value keeps its average."""

    def __init__(self, averaging_constant: float = 0.01, **granularity):
        if not 0.0 < averaging_constant <= 1.0:
            raise ConfigError(f"averaging_constant={averaging_constant!r} is invalid; expected a number in (0, 1]")
        self.averaging_constant = float(averaging_constant)
        super().__init__(**granularity)

    def _observe(self, values: torch.Tensor, clean: bool) -> None:
        low, high = _batch_min_max(values, clean)
        self.low, self.high = self.low.to(low.device), self.high.to(high.device)  # state follows the data
        self.low = self._average(self.low, low)
        self.high = self._average(self.high, high)

    def _average(self, average: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        moved = average + self.averaging_constant * (batch - average)
        moved = torch.where(torch.isfinite(average), moved, batch)  # first finite batch: taken as it is
        return torch.where(torch.isfinite(batch), moved, average)


class PercentileObserver(Observer):
    """The (100 - p)th and p-th percentiles of everything seen (numpy's linear definition), from a
    :class:`~lowbit.calibrate.quantile.GroupedQuantileSketch` per channel / block: each end is within
    ``relative_error`` times the neighbouring order statistics' magnitude of the exact percentile."""

    _needs_values = True

    def __init__(self, percentile: float = 99.99, relative_error: float = 0.01, **granularity):
        if not 50.0 < percentile <= 100.0:
            raise ConfigError(f"percentile={percentile!r} is invalid; expected a number in (50, 100]")
        self.percentile, self.relative_error = float(percentile), float(relative_error)
        GroupedQuantileSketch(self.relative_error)  # validates relative_error now
        super().__init__(**granularity)

    def _reset_statistics(self) -> None:
        self.sketch = None

    def _start(self, groups: int, device: torch.device | None = None) -> None:
        self.sketch = GroupedQuantileSketch(self.relative_error, groups, device)

    def _observe(self, values: torch.Tensor, clean: bool) -> None:
        self.sketch.update_groups(values)

    def _range(self, **target) -> tuple[torch.Tensor, torch.Tensor]:
        upper = self.percentile / 100.0
        return self.sketch.quantile_per_group(1.0 - upper), self.sketch.quantile_per_group(upper)

    def _statistics(self) -> dict[str, torch.Tensor]:
        return {f"sketch.{key}": value for key, value in self.sketch.state_dict().items()}

    def _load_statistics(self, state: dict) -> None:
        self.sketch.load_state_dict(prefixed(state, "sketch."))
