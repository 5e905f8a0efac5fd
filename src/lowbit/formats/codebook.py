"""Look-up-table formats: ``codebook`` (any table of values) and ``nf4`` (bitsandbytes' NormalFloat4).

``codebook``
    Value set: the given ``values`` (2 to 256 distinct finite numbers, stored sorted), one code per entry:
    ceil(log2(len(values))) bits. Each x goes to the nearest table value, decided exactly against the
    table as given (float64) and then rounded to x's dtype. Ties by ``rounding``: ``nearest_toward_zero``
    (default: the entry of smaller magnitude), ``nearest_away``, ``nearest_up``, ``nearest_down``; a tie at
    0 between -a and +a goes by x's sign bit under the first two (so a symmetric table is sign-symmetric).
    Values past either end (and +-inf) saturate to the end entries; NaN stays NaN.

    With ``block_size`` (an int or a list, lowbit's block geometry: an int runs along the last dimension,
    -1 is a whole dimension), the table is normalised (its largest magnitude is exactly 1 and it holds 0)
    and each block is scaled by its absmax, the largest finite |x| of the block (float32, as bitsandbytes
    stores it): t = x / absmax (in x's precision), y = table[nearest(t)] * absmax. An all-zero block keeps
    absmax 0 and stays zero. Bits: code bits + 32 per block.

``nf4``
    bitsandbytes' 4-bit NormalFloat (QLoRA): the codebook of 16 values below with absmax per block of
    ``block_size`` (default 64) consecutive elements of the last dimension; 4.5 bits per element at 64.
    The values are the normal quantiles Phi^-1 of 8 points evenly spaced from 0.9677083 to 0.5 (positive
    side, 0.5 excluded) and 7 from 0.9677083 to 0.5 (negative side), with 0, divided by the largest so that
    the ends are +-1; they are bitsandbytes' published table (float32), asymmetric: 7 negative values, 8
    positive. bitsandbytes quantizes with its own comparison tree and multiplies by 1 / absmax; here the
    nearest value of t = x / absmax is exact with ties toward zero (the two can differ by one code at inputs
    within float32 rounding of a midpoint).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec, check_block_size, check_bool, is_number
from lowbit.formats._nearest_table import nearest_index, thresholds
from lowbit.formats._registry import register
from lowbit.formats.blocking import apply_blockwise, block_shape, block_statistics, finite_abs_max, scaled_bits_per_element

NF4_VALUES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)  # fmt: skip
ABSMAX_BITS = 32
_TIES = {"nearest_toward_zero": "toward_zero", "nearest_away": "away", "nearest_up": "up", "nearest_down": "down"}
_COMPUTE_DTYPES = (torch.float32, torch.float64)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _TableFormat(FormatSpec):
    """Nearest entry of ``table()``, optionally scaled by each block's absmax (see the module docstring)."""

    roundings: ClassVar[tuple[str, ...]] = tuple(_TIES)

    rounding: str = "nearest_toward_zero"
    block_size: tuple[int, ...] | None = None
    skip_first_dim: bool = False

    def table(self) -> tuple[float, ...]:
        raise NotImplementedError

    def _check_blocks(self) -> None:
        """Check the block parameters and keep the table's thresholds per compute dtype (Python constants:
        nothing is computed from the table while quantizing, so compiled kernels trace plain comparisons)."""
        table, tie = self.table(), _TIES[self.rounding]
        object.__setattr__(self, "_thresholds", {dtype: thresholds(table, dtype, tie) for dtype in _COMPUTE_DTYPES})
        check_block_size(self)
        check_bool(self, "skip_first_dim")
        if self.block_size is not None and (max(abs(v) for v in table) != 1.0 or 0.0 not in table):
            raise FormatError(
                f"{self.format_name}: block_size={list(self.block_size)} scales blocks by their absmax, which needs a "
                "normalised table (largest magnitude exactly 1, and 0 in it); scale the values, or drop block_size"
            )

    # ---- description --------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return max(1, math.ceil(math.log2(len(self.table()))))

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        if self.block_size is None:
            return float(self.bits)
        if shape is None and all(b > 0 for b in self.block_size):
            return self.bits + ABSMAX_BITS / math.prod(self.block_size)
        return scaled_bits_per_element(self.bits, ABSMAX_BITS, shape, self.block_size, None, self.skip_first_dim)

    def value_set(self) -> torch.Tensor | None:
        return None if self.block_size is not None else torch.tensor(self.table(), dtype=torch.float64)

    # ---- quantization -------------------------------------------------------------------------------
    def indices(self, t: torch.Tensor) -> torch.Tensor:
        """The table index (int64) of each t's nearest entry (t float32 / float64; NaN: any index)."""
        return nearest_index(t, self._thresholds[t.dtype])

    def entries(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The table values at ``index``, rounded to ``dtype``."""
        return torch.tensor(self.table(), dtype=dtype, device=index.device).take(index)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.block_size is None:
            out = self.entries(self.indices(x), x.dtype)
        else:
            out = apply_blockwise(x, self._block(x), self._quantize_block)
        return torch.where(torch.isnan(x), x, out)

    def _block(self, x: torch.Tensor) -> tuple[int, ...]:
        return block_shape(x.shape, self.block_size, None, self.skip_first_dim)

    def _quantize_block(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        absmax = self._absmax(blocked, dims)
        t = blocked / torch.where(absmax > 0, absmax, torch.ones_like(absmax))
        return self.entries(self.indices(t), blocked.dtype) * absmax

    def _absmax(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        """Each block's largest finite |x|, rounded to float32 (what is stored) when x is float64."""
        return finite_abs_max(blocked, dims).to(torch.float32).to(blocked.dtype)

    def absmax(self, x: torch.Tensor) -> torch.Tensor:
        """The absmax of every block of ``x`` (one entry per block), float32 / float64."""
        work = x.detach() if x.dtype in _COMPUTE_DTYPES else x.detach().float()
        work = work.reshape(1) if work.dim() == 0 else work
        return block_statistics(work, self._block(work), self._absmax)


def _table_values(spec: FormatSpec, values: Any) -> tuple[float, ...]:
    legal = "must be a list of 2 to 256 distinct finite numbers (the table)"
    items = values.detach().flatten().tolist() if isinstance(values, torch.Tensor) else values
    if not isinstance(items, (list, tuple)) or not all(is_number(v) for v in items):
        raise FormatError(f"{spec.format_name}: values={values!r} is invalid; {legal}")
    table = tuple(sorted(float(v) for v in items))
    if not 2 <= len(table) <= 256 or not all(math.isfinite(v) for v in table) or len(set(table)) != len(table):
        raise FormatError(f"{spec.format_name}: values={values!r} is invalid; {legal}")
    return tuple(0.0 if v == 0 else v for v in table)  # -0.0 and 0.0 are one entry


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Codebook(_TableFormat):
    """Any table of ``values`` (sorted, 2 to 256 entries): the nearest entry, ties by ``rounding``;
    ``block_size`` scales a normalised table by each block's absmax (see the module docstring)."""

    format_name = "codebook"
    aliases = ("lut",)

    values: tuple[float, ...] = (-1.0, 0.0, 1.0)

    def validate(self) -> None:
        object.__setattr__(self, "values", _table_values(self, self.values))
        self._check_blocks()

    def table(self) -> tuple[float, ...]:
        return self.values


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class NF4(_TableFormat):
    """bitsandbytes' NormalFloat4: 16 normal-quantile values in [-1, 1] with absmax per ``block_size``
    (default 64) elements of the last dimension; 4 + 32 / 64 = 4.5 bits per element."""

    format_name = "nf4"

    block_size: tuple[int, ...] | None = 64

    def validate(self) -> None:
        self._check_blocks()
        if self.block_size is None:
            raise FormatError(f"{self.format_name}: block_size=None is invalid; nf4 scales every block by its absmax")

    def table(self) -> tuple[float, ...]:
        return NF4_VALUES
