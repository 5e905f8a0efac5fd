"""ND block geometry shared by every format with a shared scale (affine, block formats, MX, scaled fp8).

A *block size* is a tuple aligned to the trailing dimensions of the tensor: ``(1, 32)`` on a ``[64, 100]``
weight means blocks of one row by 32 columns. Rules (one helper, used everywhere):

- entries are right-aligned with the shape; missing leading entries mean 1 (one block per index);
- ``-1`` or an entry larger than the dimension means the whole dimension;
- a dimension that is not a multiple of its block is zero-padded; padding never changes a result
  (block statistics are max |x| or min / max including zero, which zeros cannot change), and is cropped;
- ``skip_first_dim`` keeps dimension 0 (the batch of an activation) out of every block.

Per-tensor scaling is the block size covering every dimension; per-channel (``axis``) is 1 along the
axis and the whole extent elsewhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from lowbit.errors import FormatError

BlockFn = Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]


def normalize_axis(axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise FormatError(f"axis={axis} is out of range for a tensor with {ndim} dimensions")
    return axis % max(ndim, 1)


def block_shape(
    shape: Sequence[int],
    block_size: Sequence[int] | None = None,
    axis: int | None = None,
    skip_first_dim: bool = False,
) -> tuple[int, ...]:
    """The concrete block (one entry per dimension) for a tensor of ``shape``.

    No block_size and no axis: per-tensor. ``axis`` without block_size: per-channel along ``axis``.
    ``axis`` with an int-like one-entry block_size: blocks of that size along ``axis`` (MX style).
    """
    ndim = len(shape)
    if ndim == 0:  # a 0-d tensor is one block of its one element (axis 0 / -1 still validated)
        if axis is not None:
            normalize_axis(axis, ndim)
        return ()
    if block_size is None:
        block = list(shape)
        if axis is not None:
            block[normalize_axis(axis, ndim)] = 1
    elif axis is not None and len(block_size) == 1:
        block = [1] * ndim
        block[normalize_axis(axis, ndim)] = block_size[0]
    else:
        tail = list(block_size)[-ndim:] if ndim else []
        block = [1] * (ndim - len(tail)) + tail
    block = [dim if (b == -1 or b > dim) else b for b, dim in zip(block, shape, strict=True)]
    if skip_first_dim and ndim > 0:
        block[0] = 1
    return tuple(max(b, 1) for b in block)


def apply_blockwise(x: torch.Tensor, block: Sequence[int], fn: BlockFn) -> torch.Tensor:
    """Run ``fn(blocked, reduce_dims)`` on a blocked view of ``x`` and undo the blocking.

    A reduction of ``blocked`` over ``reduce_dims`` with ``keepdim=True`` gives one statistic per block
    that broadcasts back over ``blocked``; ``fn`` must not rely on any other property of the layout.
    Blocks that span only the last dimension (per-row groups, MX) are presented as ``[rows, n, b]`` with
    ``reduce_dims = (2,)``: a simple layout whose compiled kernels generate quickly. Other blocks are
    presented as ``[n0, b0, n1, b1, ...]`` with ``reduce_dims = (1, 3, 5, ...)``.
    """
    if x.dim() == 0:
        return apply_blockwise(x.reshape(1), (1,), fn).reshape(())
    if all(b == 1 for b in block[:-1]) and block[-1] > 1:
        return _apply_along_last(x, block[-1], fn)
    return _apply_interleaved(x, block, fn)


def _apply_along_last(x: torch.Tensor, size: int, fn: BlockFn) -> torch.Tensor:
    length = x.shape[-1]
    pad = (-length) % size
    padded = F.pad(x, (0, pad)) if pad else x
    blocked = padded.reshape(-1, padded.shape[-1] // size, size)
    out = fn(blocked, (2,)).reshape(padded.shape)
    return out[..., :length] if pad else out


def _apply_interleaved(x: torch.Tensor, block: Sequence[int], fn: BlockFn) -> torch.Tensor:
    """apply_blockwise with the general ``[n0, b0, n1, b1, ...]`` layout (any block shape)."""
    if x.dim() == 0:
        return _apply_interleaved(x.reshape(1), (1,), fn).reshape(())
    shape = x.shape
    pads = [(-dim) % b for dim, b in zip(shape, block, strict=True)]
    if any(pads):
        pad_arg = [p for pad in reversed(pads) for p in (0, pad)]
        x = F.pad(x, pad_arg)
    blocked_shape = [v for dim, b in zip(x.shape, block, strict=True) for v in (dim // b, b)]
    blocked = x.reshape(blocked_shape)
    reduce_dims = tuple(range(1, 2 * x.dim(), 2))
    out = fn(blocked, reduce_dims).reshape(x.shape)
    if any(pads):
        out = out[tuple(slice(0, dim) for dim in shape)]
    return out


def contiguous_runs(shape: Sequence[int], block: Sequence[int]) -> tuple[int, int, int] | None:
    """(rows, row_length, block_length) when every block of ``block`` over ``shape`` is a contiguous run of
    a row-major tensor: ones, then one dimension cut into blocks, then whole dimensions; rows of row_length
    elements, each cut into blocks of block_length (its last block shorter where the cut dimension is not a
    multiple). None for other block shapes (ND blocks) and 0-d shapes."""
    if not shape:
        return None
    inner, cut = 1, len(shape) - 1
    while cut >= 0 and block[cut] == shape[cut]:
        inner *= shape[cut]
        cut -= 1
    if cut < 0:
        return 1, inner, inner
    if any(b != 1 for b in block[:cut]):
        return None
    rows = 1
    for dim in shape[:cut]:
        rows *= dim
    return rows, shape[cut] * inner, block[cut] * inner


def runs_of(shape: Sequence[int], block_size, axis: int | None = None,
            skip_first_dim: bool = False) -> tuple[int, int, int] | None:  # fmt: skip
    """``contiguous_runs`` of ``block_shape(shape, block_size, axis, skip_first_dim)``, remembered per
    parameters (the native kernels ask once per call; the axis must already be valid for the shape)."""
    try:
        return _cached_runs(tuple(shape), block_size, axis, skip_first_dim)
    except TypeError:  # an unhashable block_size
        return contiguous_runs(shape, block_shape(shape, block_size, axis, skip_first_dim))


def native_runs(spec, x) -> tuple[int, int, int] | None:
    """``runs_of`` for a block spec (``block_size``, ``axis``, ``skip_first_dim``) on x, or None where a native
    kernel does not apply: a 0-d tensor, an axis x does not have (the eager path names it), blocks that are
    not contiguous runs."""
    if x.dim() == 0 or (spec.axis is not None and not -x.dim() <= spec.axis < x.dim()):
        return None
    return runs_of(x.shape, spec.block_size, spec.axis, spec.skip_first_dim)


@functools.lru_cache(maxsize=512)
def _cached_runs(shape: tuple[int, ...], block_size, axis, skip_first_dim: bool) -> tuple[int, int, int] | None:
    return contiguous_runs(shape, block_shape(shape, block_size, axis, skip_first_dim))


def block_statistics(x: torch.Tensor, block: Sequence[int], statistic: BlockFn) -> torch.Tensor:
    """``statistic(blocked, reduce_dims)`` (one keepdim value per block) for every block of ``x``, shaped
    ``[n0, n1, ...]``: the blocks' own layout, one entry per block."""
    found: list[torch.Tensor] = []

    def record(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        found.append(statistic(blocked, dims))
        return blocked

    _apply_interleaved(x, block, record)
    return found[0].reshape(found[0].shape[0::2])  # [n0, 1, n1, 1, ...] -> [n0, n1, ...]


def finite_abs_max(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """max |x| per block over finite elements only (NaN / +-inf do not set a block's scale). Eagerly, when
    every block is finite: max(max, -min) from one pass (``finite_extremes``), the same value."""
    if can_branch_on_data(blocked):
        extremes = finite_extremes(blocked, dims)
        if extremes is not None:
            low, high = extremes
            return torch.maximum(high, low.neg()).abs_()  # abs_: an all -0.0 block gives +0.0, as |x| does
    return finite_or_zero(blocked.abs()).amax(dim=dims, keepdim=True)


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """x with NaN and +-inf replaced by 0. Eagerly one pass (``nan_to_num``; isfinite alone is three);
    compiled kernels keep the comparison, which Inductor vectorises. The same values either way."""
    if torch.compiler.is_compiling():
        return torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def finite_min_max(blocked: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) per block over finite elements, both widened to include zero."""
    finite = finite_or_zero(blocked)
    low = finite.amin(dim=dims, keepdim=True).clamp(max=0)
    high = finite.amax(dim=dims, keepdim=True).clamp(min=0)
    return low, high


def finite_extremes(blocked: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(min, max) per block in the input dtype, from two reductions of x itself (no |x| or finite-only copy;
    ``torch.aminmax`` over a short last dimension is several times slower than both); None when some block
    holds NaN or +-inf (both propagate through the reductions), or when the extremes' difference overflows:
    the caller then takes its general path. Eager only (the check reads the data)."""
    low, high = blocked.amin(dim=dims, keepdim=True), blocked.amax(dim=dims, keepdim=True)
    if not bool(torch.isfinite(high - low).all()):
        return None
    return low, high


def can_branch_on_data(x: torch.Tensor) -> bool:
    """Whether a fast path may branch on x's values: eagerly (not while compiling or exporting), not on meta."""
    compiler = torch.compiler
    return not compiler.is_compiling() and not compiler.is_exporting() and x.device.type != "meta"


def num_blocks(shape: Sequence[int], block: Sequence[int]) -> int:
    count = 1
    for dim, b in zip(shape, block, strict=True):
        count *= -(-dim // b)
    return count


def scaled_bits_per_element(element_bits: float, scale_bits: int, shape, block_size=None, axis=None,
                            skip_first_dim: bool = False) -> float:
    """Element bits plus ``scale_bits`` per block, spread over the tensor's elements (``shape`` None: the
    element bits alone, as for an empty tensor)."""
    if shape is None:
        return float(element_bits)
    numel = 1
    for dim in shape:
        numel *= dim
    if numel == 0:
        return float(element_bits)
    block = block_shape(shape, block_size, axis, skip_first_dim)
    return element_bits + scale_bits * num_blocks(shape, block) / numel


def given_per_axis(values: tuple[float, ...], x: torch.Tensor, axis: int | None, where: str) -> torch.Tensor:
    """Given per-tensor / per-channel parameters as a tensor (x's dtype and device) that broadcasts over x:
    one value for the whole tensor, or one per index of ``axis``. FormatError naming ``where`` (the format
    and parameter) when there are neither one nor x.shape[axis] of them."""
    given = torch.tensor(values, dtype=x.dtype, device=x.device)
    view = [1] * x.dim()  # a 0-d x keeps its 0-d shape
    if axis is not None:
        dim = normalize_axis(axis, x.dim())
        length = x.shape[dim] if x.dim() else 1
        if len(values) != 1 and len(values) != length:  # plain ints: torch.compile traces this as a guard
            raise FormatError(
                f"{where}: {len(values)} values do not match dimension {dim} of size {length} (axis={axis}, "
                f"tensor shape {tuple(x.shape)}); give one value, or one per index of that dimension"
            )
        if x.dim():
            view[dim] = -1
    return given.reshape(view)
