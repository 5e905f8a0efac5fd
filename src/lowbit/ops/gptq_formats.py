"""GPTQ for any weight format: the error-compensating column order of :mod:`lowbit.ops.gptq`, with each
column rounded by a format's own rounding instead of int4's.

A block format (MX blocks of 32 inputs, affine groups, block floating point, scaled OCP floats) shares
parameters (a scale, a shared exponent, a zero point) across the columns of a block. GPTQ rounds one column
at a time and moves its error onto the columns still to come, so a block's parameters must be fixed before
its first column is rounded; every column is then rounded with them, exactly as the format rounds an
element once it knows its block's parameters. Two choices of when:

- in order (``static_groups=False``, the default): from the block's weights as they are when its first
  column comes up, the error already pushed into the block included;
- static (``static_groups=True``, and always with ``act_order``): every block's parameters from the weight
  before any update.

:func:`column_rounder` finds, per format family, the function that gives a block's parameters and the one
that rounds values with given parameters (the formats' own functions, so the arithmetic is theirs bit for
bit); element formats (minifloat, fixed point, unscaled OCP floats, log) have no parameters and round each
column on its own. A format with no such split is refused with a ConfigError naming it. With an identity
Hessian no error moves, and :func:`gptq_round` returns exactly ``spec.quantize(weight)``.
"""

from __future__ import annotations

from collections.abc import Callable
import torch

from lowbit.errors import ConfigError
from lowbit.formats import FormatSpec
from lowbit.formats.blocking import apply_blockwise, block_shape
from lowbit.ops.gptq import _checked, _inverse_cholesky

Params = tuple[torch.Tensor, ...]  # per-element parameters, each [N, columns]
ELEMENT_FORMATS = ("integer", "fixed", "minifloat_ieee", "minifloat_denorm", "log")


class ColumnRounder:
    """How one format rounds the columns of one weight shape.

    ``width``: the columns that share parameters (the block's extent along the input dimension; None for
    element formats, which have none); ``fix(columns)``: the per-element parameters of ``columns`` [N, w]
    (whole blocks, the first starting at a block boundary); ``round(values, params)``: values [N, c]
    rounded with params (each [N, c]).
    """

    def __init__(self, width: int | None, fix: Callable[[torch.Tensor], Params],
                 round_with: Callable[[torch.Tensor, Params], torch.Tensor]) -> None:  # fmt: skip
        self.width, self.fix, self.round = width, fix, round_with


def column_rounder(spec: FormatSpec, shape: tuple[int, int], weight: torch.Tensor | None = None) -> ColumnRounder:
    """The :class:`ColumnRounder` of ``spec`` for a weight of ``shape`` [N, K]; ConfigError naming the format
    where it cannot round a column with fixed block parameters. ``weight``: the weight before any update, for
    formats with a parameter of the whole tensor (NVFP4's tensor scale, fixed from it before any column)."""
    if spec.is_stochastic:
        raise ConfigError(f"method='gptq' needs a deterministic rounding; {spec.describe()} rounds stochastically")
    family = _family(spec)
    if family is None:
        raise ConfigError(f"method='gptq' cannot round format {spec.format_name!r} ({spec.describe()}) one column at "
                          "a time with fixed block parameters; supported: MX (mx*), nvfp4, affine, block_fp, OCP "
                          "floats "
                          f"(e4m3, ...), {', '.join(ELEMENT_FORMATS)}")  # fmt: skip
    if family is _nvfp4_rounder:
        return family(spec, tuple(shape), weight)
    return family(spec, tuple(shape))


def _family(spec: FormatSpec):
    from lowbit.formats.affine import Affine
    from lowbit.formats.block_fp import BlockFP
    from lowbit.formats.mx import _MXFormat
    from lowbit.formats.ocp_float import _OcpFloat

    if spec.format_name in ELEMENT_FORMATS or (isinstance(spec, _OcpFloat) and not spec.is_scaled):
        return _element_rounder
    if spec.format_name == "nvfp4":
        return _nvfp4_rounder
    families = ((_MXFormat, _mx_rounder), (Affine, _affine_rounder), (BlockFP, _block_fp_rounder),
                (_OcpFloat, _ocp_rounder))  # fmt: skip
    return next((build for cls, build in families if isinstance(spec, cls)), None)


def _element_rounder(spec, shape) -> ColumnRounder:
    return ColumnRounder(None, lambda columns: (), lambda values, params: spec.quantize(values))


def _blockwise(block: tuple[int, ...], statistic) -> Callable[[torch.Tensor], Params]:
    """``fix`` from a per-block ``statistic(blocked, dims) -> tuple of keepdim tensors``, spread per element."""

    def fix(columns: torch.Tensor) -> Params:
        found: list[Params] = []

        def record(blocked, dims):
            found.append(statistic(blocked, dims))
            return blocked

        apply_blockwise(columns, block, record)
        return tuple(apply_blockwise(columns, block, lambda blocked, dims, i=i: found[0][i].expand_as(blocked)
                                     .to(blocked.dtype)) for i in range(len(found[0])))  # fmt: skip

    return fix


def _mx_rounder(spec, shape) -> ColumnRounder:
    from lowbit.formats._float_grid import round_to_float_grid

    block, element = spec._block(shape), spec.element
    dtype_max = torch.finfo(torch.float32).max

    def statistic(blocked, dims):
        exponent = spec._block_exponent(blocked, dims)
        min_exponent = exponent + element.min_exponent
        return min_exponent, spec._block_limit(exponent, min_exponent, blocked.dtype, dtype_max)

    def round_with(values, params):
        min_exponent, limit = params
        return round_to_float_grid(values, element.mantissa_bits, min_exponent.to(torch.int32), limit, spec.rounding)

    return ColumnRounder(block[1], _blockwise(block, statistic), round_with)


def _affine_rounder(spec, shape) -> ColumnRounder:
    block = block_shape(shape, spec.block_size, spec.axis, spec.skip_first_dim)
    width = shape[1] if spec.scale is not None else block[1]  # given scales: one fix of all columns

    def fix(columns):
        return tuple(spec.scale_and_zero_point(columns))

    def round_with(values, params):
        return spec._fake_quantize(values, params[0], params[1], None)

    return ColumnRounder(width, fix, round_with)


def _block_fp_rounder(spec, shape) -> ColumnRounder:
    from lowbit.formats._float_grid import exact_pow2
    from lowbit.formats.block_fp import dtype_max_exponent, shared_exponent
    from lowbit.formats.rounding import round_to_integer

    block = block_shape(shape, spec.block_size, spec.axis, spec.skip_first_dim)
    bits, top = spec.mantissa_bits, spec._top_code(torch.float32)
    max_exponent = min(spec.max_exponent, dtype_max_exponent(torch.float32))

    def statistic(blocked, dims):
        return (shared_exponent(blocked.double(), dims, bits, spec.rounding, spec.min_exponent, max_exponent),)

    def round_with(values, params):
        step = exact_pow2(params[0].to(torch.int64) - bits + 1, torch.float64)
        codes = round_to_integer(values.double() / step, spec.rounding)
        return codes.clamp_(-top, top).mul_(step).to(values.dtype)

    return ColumnRounder(block[1], _blockwise(block, statistic), round_with)


def _ocp_rounder(spec, shape) -> ColumnRounder:
    if spec.scale is not None:
        return ColumnRounder(shape[1], lambda columns: (spec.given_scale(columns).expand_as(columns),),
                             lambda values, params: spec._round_scaled(values, params[0], None))  # fmt: skip
    block = block_shape(shape, spec.block_size, spec.axis, spec.skip_first_dim)

    def round_with(values, params):
        out = spec._round_scaled(values, params[0], None)
        limit = torch.finfo(out.dtype).max  # as the format: finite data never rounds to inf
        return torch.where(torch.isinf(out) & torch.isfinite(values), out.clamp(-limit, limit), out)

    statistic = lambda blocked, dims: (spec._block_scale(blocked, dims),)  # noqa: E731
    return ColumnRounder(block[1], _blockwise(block, statistic), round_with)


def _nvfp4_rounder(spec, shape, weight: torch.Tensor | None) -> ColumnRounder:
    """NVFP4: the tensor scale (and the tiny tensors' shift) from the whole weight before any update, each
    block's E4M3 scale from its 16 columns when it comes up; the format's own steps (``NVFP4.decompose`` /
    ``combine``), so an identity Hessian gives ``spec.quantize(weight)`` bit for bit."""
    from lowbit.formats import nvfp4

    amax = torch.zeros(()) if weight is None else weight.to(torch.float32).abs().max()  # None: a shape check only
    shift = torch.where((amax > 0) & (amax < nvfp4.TINY_AMAX), -nvfp4.TINY_SHIFT, 0).to(torch.int32)
    pts = nvfp4.tensor_scale(torch.ldexp(amax, -shift))

    def fix(columns):
        s8 = nvfp4.block_scales(torch.ldexp(columns.to(torch.float32), -shift).unsqueeze(1), pts)  # [N, 1]
        return ((1.0 / pts) / s8).expand_as(columns), s8.expand_as(columns)

    def round_with(values, params):
        ratio, s8 = params
        scaled = (torch.ldexp(values.to(torch.float32), -shift) * ratio).clamp(-nvfp4.ELEMENT_MAX, nvfp4.ELEMENT_MAX)
        elements = nvfp4._E2M1.round(scaled, "nearest_even")
        y = torch.ldexp(elements * (pts * s8), shift)  # nvfp4.combine's arithmetic, one column at a time
        return y.clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max).to(values.dtype)

    return ColumnRounder(nvfp4.BLOCK_SIZE, fix, round_with)


# ---- one weight matrix -----------------------------------------------------------------------------------------
def gptq_round(weight: torch.Tensor, hessian: torch.Tensor, spec: FormatSpec, *, damping: float = 0.1,
               block_size: int = 128, act_order: bool = False,
               static_groups: bool = False) -> torch.Tensor:  # fmt: skip
    """``weight`` [N, K] rounded onto ``spec``'s grid (float32) so as to minimise the output error under
    ``hessian`` [K, K]; block parameters fixed in order or up front (``static_groups``; always with
    ``act_order``, which rounds columns by decreasing diag(H))."""
    weight, hessian = _checked(weight, hessian, None, damping, block_size)
    rounder = column_rounder(spec, tuple(weight.shape), weight)
    n, k = weight.shape
    weight, hessian = weight.clone(), hessian.clone()
    dead = torch.diagonal(hessian) == 0  # inputs that were always 0: their weights never matter
    hessian[dead, dead] = 1.0
    weight[:, dead] = 0.0
    device = weight.device
    order = (torch.argsort(torch.diagonal(hessian), descending=True, stable=True) if act_order
             else torch.arange(k, device=device))  # fmt: skip
    upper = _inverse_cholesky(hessian[order][:, order], damping).float()  # [K, K], in rounding order
    state = _Parameters(rounder, n, k)
    if static_groups or act_order:
        state.fix_all(weight)
    work, rounded = weight[:, order], torch.empty_like(weight)
    width = rounder.width or 1
    step = max(width, block_size // width * width)  # in order: lazy batches hold whole parameter blocks
    for start in range(0, k, step):
        end = min(k, start + step)
        block = work[:, start:end].clone()
        errors = _round_block(block, upper[start:end, start:end], order[start:end].tolist(), state, rounded)
        work[:, end:] -= errors @ upper[start:end, end:]  # the batch's error, pushed onto later columns at once
    return rounded


class _Parameters:
    """Per-element block parameters ([N, K] each, natural column order), fixed block by block or all at once."""

    def __init__(self, rounder: ColumnRounder, n: int, k: int) -> None:
        self.rounder, self.n, self.k = rounder, n, k
        self.tables: list[torch.Tensor] | None = None
        self.static = rounder.width is None

    def fix_all(self, weight: torch.Tensor) -> None:
        width = self.rounder.width
        if width is not None:
            for first in range(0, self.k, width):
                self.fix(weight[:, first:first + width], first)
        self.static = True

    def fix(self, columns: torch.Tensor, first: int) -> None:
        found = self.rounder.fix(columns)
        if self.tables is None:
            self.tables = [torch.empty(self.n, self.k, dtype=table.dtype, device=table.device) for table in found]
        for table, values in zip(self.tables, found):
            table[:, first:first + columns.shape[1]] = values

    def at(self, column: int) -> Params:
        return () if self.tables is None else tuple(table[:, column:column + 1] for table in self.tables)


def _round_block(block: torch.Tensor, upper: torch.Tensor, columns: list[int], state: _Parameters,
                 rounded: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Round ``block`` [N, B] (inputs ``columns``) column by column into ``rounded``, each column's error
    spread over the block's later columns; returns the scaled errors [N, B] for the rest of the matrix."""
    errors = torch.empty_like(block)
    width = state.rounder.width
    for j, column in enumerate(columns):
        if not state.static and column % width == 0:  # in-order rounding: a parameter block starts here
            state.fix(block[:, j:j + width], column)
        value = block[:, j:j + 1]
        quantized = state.rounder.round(value, state.at(column))
        rounded[:, column:column + 1] = quantized
        errors[:, j] = (value - quantized)[:, 0].div_(upper[j, j])
        block[:, j + 1:].addr_(errors[:, j], upper[j, j + 1:], alpha=-1)
    return errors


def settled(spec: FormatSpec, weight: torch.Tensor, rounded: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(``spec.quantize`` of the rounded weight in the weight's dtype, the count of elements it moved): what a
    simulated layer computes from the stored weight, which re-derives its block parameters from it."""
    stored = rounded.to(weight.dtype)
    again = spec.quantize(stored)
    return again, int((again != stored).sum())


__all__ = ["ColumnRounder", "ELEMENT_FORMATS", "column_rounder", "gptq_round", "settled"]
