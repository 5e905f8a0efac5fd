"""Streaming statistics of tensors, under MASE's names and output fields (the statistics profiler's stats).

Every stat is fed whole batches: ``stat.update(batch)`` where dim 0 of ``batch`` indexes samples (feed one
tensor, e.g. a weight, as ``w[None]``: one sample). Updates are vectorised over the batch and keep
running state whose size does not depend on how many samples were seen; ``record`` is the one exception
(it keeps every sample, O(samples) memory, by design). ``stat.compute()`` returns plain Python numbers
(or nested lists) ready for TOML; a value that cannot be computed yet is MASE's "NA".

Common options:

- ``dims``: what one result summarises. ``"all"`` (default): every element of every sample, one number.
  ``None`` (or "NA"): elementwise, one number per element of a sample, over the samples. A list of ints:
  those dims of a sample (negative counts from the end) together with the sample dim; the other dims are
  kept. ``count`` is the number of values behind each result.
- ``abs``: summarise ``|x|`` instead of ``x``.
- ``device``: accepted for MASE configs and ignored (state lives on the device of the data).

Stats (fields): ``range_min_max`` (min, max, range, count), ``range_quantile`` (quantile=0.975,
relative_error=0.01; min is the (1 - quantile) quantile, max the quantile one, range, count; from a
sketch), ``range_n_sigma`` (num_sigma=3, var_mode "online" | "precise": mean -+ num_sigma std),
``variance_online`` / ``variance_precise`` (mean, variance, count), ``abs_mean`` (abs_mean, count),
``record`` (data, count, size_in_bytes). Variances are population variances (divide by count, where
MASE's precise one divides by count - 1); count < 2 gives "NA" as in MASE.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lowbit.errors import ConfigError, FormatError, did_you_mean

NA = "NA"
_COMMON = {"dims": "all", "abs": False, "device": None}


# ---- helpers ----------------------------------------------------------------------------------------------
def _normalise_dims(stat: str, dims: Any) -> str | tuple[int, ...] | None:
    if dims is None or (isinstance(dims, str) and dims.strip().lower() in ("na", "none")):
        return None
    if dims == "all":
        return "all"
    if isinstance(dims, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return tuple(dims)
    raise ConfigError(f"{stat}: dims must be \"all\", None / \"NA\" (elementwise) or a list of ints, got {dims!r}")


def _plain(value: torch.Tensor) -> Any:
    """A Python float, or nested lists of floats, from a float tensor."""
    if value.device.type == "meta":
        raise FormatError("statistics cannot run on the meta device: compute() returns Python numbers; "
                          "update() works there, compute() needs the CPU or a GPU")  # fmt: skip
    return value.item() if value.ndim == 0 else value.tolist()


def _neumaier_add(total: torch.Tensor, compensation: torch.Tensor, value: torch.Tensor):
    """Compensated addition: keeps the low-order bits a plain running sum drops over many batches."""
    new = total + value
    bigger = total.abs() >= value.abs()
    compensation = compensation + torch.where(bigger, (total - new) + value, (value - new) + total)
    return new, compensation


class Stat:
    """Base class: option checking, the batch -> reduction-dims mapping, and the shape guard."""

    name = ""
    options: dict[str, Any] = {}

    def __init__(self, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in self.options:
                raise ConfigError(f"{self.name}: unknown option {key!r}{did_you_mean(key, self.options)}; "
                                  f"options: {', '.join(self.options)}")  # fmt: skip
        settings = {**self.options, **kwargs}
        self.dims = _normalise_dims(self.name, settings["dims"])
        if not isinstance(settings["abs"], bool):
            raise ConfigError(f"{self.name}: abs must be true or false, got {settings['abs']!r}")
        self.abs = settings["abs"]
        self.count = 0  # values behind each result
        self._kept_shape: tuple[int, ...] | None = None
        self.configure(settings)

    def configure(self, settings: dict[str, Any]) -> None:
        """Read the stat's own options (subclasses)."""

    def _prepare(self, batch: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """(the batch as float, the dims to reduce); counts the values each result now covers."""
        x = batch.detach()
        x = x.reshape(1) if x.ndim == 0 else x  # a 0-d value is one sample of one element
        x = x if x.is_floating_point() else x.to(torch.float64)  # integers: exact up to 2^53
        x = x.abs() if self.abs else x
        reduce = self._reduce_dims(x.ndim)
        kept = tuple(size for i, size in enumerate(x.shape) if i not in reduce)
        if self.dims != "all" and self._kept_shape not in (None, kept):
            raise ConfigError(f"{self.name}: sample shape changed ({list(self._kept_shape)} kept before, "
                              f"{list(kept)} now); profile with dims=\"all\" for varying shapes")  # fmt: skip
        self._kept_shape = kept
        self.count += math.prod(x.shape[i] for i in reduce)
        return x, reduce

    def _reduce_dims(self, ndim: int) -> tuple[int, ...]:
        if self.dims == "all":
            return tuple(range(ndim))
        if self.dims is None:
            return (0,)
        sample_ndim = ndim - 1
        dims = set()
        for d in self.dims:
            if not -sample_ndim <= d < sample_ndim:
                raise ConfigError(f"{self.name}: dims {list(self.dims)} out of range for samples of {sample_ndim} dims")
            dims.add(d % sample_ndim + 1)  # +1: skip the sample dim
        return (0, *sorted(dims))

    def update(self, batch: torch.Tensor) -> None:
        """Fold in one batch (dim 0 = samples). An empty batch changes nothing."""
        if not isinstance(batch, torch.Tensor):
            raise TypeError(f"{self.name}: update() takes a tensor, got {type(batch).__name__}")
        if batch.numel() > 0:
            self._update(batch)

    def _update(self, batch: torch.Tensor) -> None:
        raise NotImplementedError

    def compute(self) -> dict[str, Any]:
        raise NotImplementedError


# ---- stats --------------------------------------------------------------------------------------------------
class RangeMinMax(Stat):
    name, options = "range_min_max", dict(_COMMON)

    def configure(self, settings: dict[str, Any]) -> None:
        self.min = self.max = None

    def _update(self, batch: torch.Tensor) -> None:
        x, reduce = self._prepare(batch)
        low, high = x.amin(dim=reduce), x.amax(dim=reduce)
        self.min = low if self.min is None else torch.minimum(self.min, low)
        self.max = high if self.max is None else torch.maximum(self.max, high)

    def compute(self) -> dict[str, Any]:
        if self.min is None:
            return {"min": NA, "max": NA, "range": NA, "count": 0}
        # MASE reports no range from a single value
        spread = _plain(self.max.double() - self.min.double()) if self.count >= 2 else NA
        return {"min": _plain(self.min), "max": _plain(self.max), "range": spread, "count": self.count}


class VarianceOnline(Stat):
    """Chan et al.'s parallel update: each batch's (count, mean, M2) is merged into the running ones in
    float64, so one pass over the data, O(result size) memory, and no sum-of-squares cancellation."""

    name, options = "variance_online", dict(_COMMON)

    def configure(self, settings: dict[str, Any]) -> None:
        self.mean = self.m2 = None

    def _update(self, batch: torch.Tensor) -> None:
        before = self.count
        x, reduce = self._prepare(batch)
        x = x.double()
        n = self.count - before
        batch_mean = x.mean(dim=reduce, keepdim=True)
        batch_m2 = (x - batch_mean).square().sum(dim=reduce)
        batch_mean = batch_mean.reshape(batch_m2.shape)
        if self.mean is None:
            self.mean, self.m2 = batch_mean, batch_m2
            return
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * (n / self.count)
        self.m2 = self.m2 + batch_m2 + delta.square() * (before * n / self.count)

    def compute(self) -> dict[str, Any]:
        if self.count < 2:
            return {"mean": NA, "variance": NA, "count": self.count}
        return {"mean": _plain(self.mean), "variance": _plain(self.m2 / self.count), "count": self.count}


class VariancePrecise(Stat):
    """Exact up to float64 rounding, without storing the data (MASE keeps every sample).

    "Precise" here means: values are shifted by the first batch's mean (so the squares stay small when the
    data sit far from zero), summed per batch in float64, and the batch sums are added with Neumaier
    compensation; variance = (S2 - S1^2 / n) / n. The shift makes the textbook sum-of-squares
    cancellation harmless unless the mean drifts by many standard deviations after the first batch.
    """

    name, options = "variance_precise", dict(_COMMON)

    def configure(self, settings: dict[str, Any]) -> None:
        self.shift = None
        self.sums: list[torch.Tensor] = []  # [S1, c1, S2, c2]: shifted sums and their compensations

    def _update(self, batch: torch.Tensor) -> None:
        x, reduce = self._prepare(batch)
        x = x.double()
        if self.shift is None:
            self.shift = x.mean(dim=reduce, keepdim=True)
        d = x - self.shift
        s1, s2 = d.sum(dim=reduce), d.square().sum(dim=reduce)
        if not self.sums:
            self.sums = [s1, torch.zeros_like(s1), s2, torch.zeros_like(s2)]
            return
        self.sums[0], self.sums[1] = _neumaier_add(self.sums[0], self.sums[1], s1)
        self.sums[2], self.sums[3] = _neumaier_add(self.sums[2], self.sums[3], s2)

    def compute(self) -> dict[str, Any]:
        if self.count < 2:
            return {"mean": NA, "variance": NA, "count": self.count}
        s1, s2 = self.sums[0] + self.sums[1], self.sums[2] + self.sums[3]
        n = self.count
        mean = self.shift.reshape(s1.shape) + s1 / n
        variance = ((s2 - s1.square() / n) / n).clamp_min(0.0)
        return {"mean": _plain(mean), "variance": _plain(variance), "count": n}


class RangeNSigma(Stat):
    name, options = "range_n_sigma", {**_COMMON, "var_mode": "online", "num_sigma": 3}

    def configure(self, settings: dict[str, Any]) -> None:
        modes = {"online": VarianceOnline, "precise": VariancePrecise}
        if settings["var_mode"] not in modes:
            raise ConfigError(f"{self.name}: var_mode must be one of {', '.join(modes)}, got "
                              f"{settings['var_mode']!r}{did_you_mean(str(settings['var_mode']), modes)}")  # fmt: skip
        sigma = settings["num_sigma"]
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma > 0:
            raise ConfigError(f"{self.name}: num_sigma must be a positive number, got {sigma!r}")
        self.num_sigma = float(sigma)
        # abs is applied here, once; the inner variance sees the already-transformed values
        self.variance = modes[settings["var_mode"]](dims=settings["dims"])

    def _update(self, batch: torch.Tensor) -> None:
        x, _ = self._prepare(batch)
        self.variance.update(x)

    def compute(self) -> dict[str, Any]:
        moments = self.variance.compute()
        if moments["mean"] == NA:
            return {"min": NA, "max": NA, "range": NA, "count": self.count}
        mean = torch.as_tensor(moments["mean"], dtype=torch.float64)
        half = self.num_sigma * torch.as_tensor(moments["variance"], dtype=torch.float64).sqrt()
        return {"min": _plain(mean - half), "max": _plain(mean + half), "range": _plain(2 * half),
                "count": self.count}  # fmt: skip


class AbsMean(Stat):
    name, options = "abs_mean", dict(_COMMON)

    def configure(self, settings: dict[str, Any]) -> None:
        self.total = None

    def _update(self, batch: torch.Tensor) -> None:
        x, reduce = self._prepare(batch)
        part = x.double().abs().sum(dim=reduce)
        self.total = part if self.total is None else self.total + part

    def compute(self) -> dict[str, Any]:
        if self.total is None:
            return {"abs_mean": NA, "count": 0}
        return {"abs_mean": _plain(self.total / self.count), "count": self.count}


class RangeQuantile(Stat):
    """min = the (1 - q) quantile, max = the q quantile, from a bounded-memory quantile sketch.

    MASE stores every value and calls torch.quantile (capped at 16M elements). Here each result has a
    log-bucketed sketch (:class:`lowbit.calibrate.quantile.GroupedQuantileSketch`; all results of one stat
    update together, vectorised), whose memory depends on the range of magnitudes seen, not on how many
    values. Each reported quantile is within ``relative_error`` (default 0.01) times the larger of the two
    order statistics NumPy's linear quantile interpolates, plus 2^-126, of ``np.quantile(values, q)``.
    quantile must lie in [0.5, 1] so that min <= max (MASE computes the same two quantiles for q < 0.5 and
    then names them the wrong way round). With quantile 0.5, min = max = the median and range = 0.
    """

    name, options = "range_quantile", {**_COMMON, "quantile": 0.975, "relative_error": 0.01}

    def configure(self, settings: dict[str, Any]) -> None:
        q = settings["quantile"]
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.5 <= q <= 1:
            raise ConfigError(f"{self.name}: quantile must be a number in [0.5, 1], got {q!r}")
        error = settings["relative_error"]
        if isinstance(error, bool) or not isinstance(error, (int, float)) or not 1e-4 <= error <= 0.5:
            raise ConfigError(f"{self.name}: relative_error must be a number in [1e-4, 0.5], got {error!r}")
        self.quantile, self.relative_error = float(q), float(error)
        self.sketch = None

    def _update(self, batch: torch.Tensor) -> None:
        # lazy: the sketch module is only needed by this stat
        from lowbit.calibrate.quantile import GroupedQuantileSketch

        x, reduce = self._prepare(batch)
        kept = [i for i in range(x.ndim) if i not in reduce]
        columns = x.permute(*kept, *reduce).reshape(-1, math.prod(x.shape[i] for i in reduce))  # [results, values]
        if self.sketch is None:
            self.sketch = GroupedQuantileSketch(self.relative_error, groups=columns.shape[0], device=columns.device)
        self.sketch.update_groups(columns)

    def compute(self) -> dict[str, Any]:
        if self.sketch is None or int(self.sketch.count_per_group.min()) == 0:
            return {"min": NA, "max": NA, "range": NA, "count": self.count}
        shape = self._kept_shape or ()
        low = self.sketch.quantile_per_group(1 - self.quantile).reshape(shape)
        high = self.sketch.quantile_per_group(self.quantile).reshape(shape)
        return {"min": _plain(low), "max": _plain(high), "range": _plain(high - low), "count": self.count}


class Record(Stat):
    """Keeps every sample (O(samples) memory: the only stat that does). dims is accepted and ignored."""

    name, options = "record", {**_COMMON, "add_new_dim_before_concat": False}

    def configure(self, settings: dict[str, Any]) -> None:
        self.new_dim = bool(settings["add_new_dim_before_concat"])
        self.samples: list[torch.Tensor] = []

    def _update(self, batch: torch.Tensor) -> None:
        x = batch.detach()
        x = x.reshape(1) if x.ndim == 0 else x
        x = x.abs() if self.abs else x
        self.count += x.shape[0]
        # MASE concatenated one-sample slices; add_new_dim_before_concat gave each its own extra dim
        self.samples.append((x.unsqueeze(1) if self.new_dim else x).cpu().clone())

    def compute(self) -> dict[str, Any]:
        if not self.samples:
            return {"data": [], "count": 0, "size_in_bytes": 0}
        data = torch.cat(self.samples)
        return {"data": data.tolist(), "count": self.count, "size_in_bytes": data.numel() * data.element_size()}


STATS: dict[str, type[Stat]] = {cls.name: cls for cls in (RangeMinMax, RangeQuantile, RangeNSigma, VarianceOnline,
                                                            VariancePrecise, AbsMean, Record)}  # fmt: skip


def create_stat(name: str, **kwargs: Any) -> Stat:
    """A new stat by MASE name; ConfigError naming an unknown stat or option and the nearest valid one."""
    if name not in STATS:
        raise ConfigError(f"unknown statistic {name!r}{did_you_mean(str(name), STATS)}; statistics: {', '.join(STATS)}")
    return STATS[name](**kwargs)


__all__ = ["NA", "STATS", "AbsMean", "RangeMinMax", "RangeNSigma", "RangeQuantile", "Record", "Stat",
           "VarianceOnline", "VariancePrecise", "create_stat"]  # fmt: skip
