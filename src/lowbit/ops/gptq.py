"""GPTQ: error-compensating rounding of int4 weights (Frantar et al. 2022, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers"), written from the paper's algorithm.

A Linear's output error for inputs x is ``(W - Q) x``; over calibration inputs its mean square is
``tr((W - Q) H (W - Q)^T) / 2`` with ``H = 2 / n * sum x x^T`` (the Hessian of that loss). GPTQ rounds the
weight one input column at a time and, after rounding column j, moves the rounding error onto the columns
not yet rounded, in the direction that the correlations in H say cancels it best (the optimal-brain-surgeon
update, expressed through the upper Cholesky factor U of H^-1):

    err = (w_j - q_j) / U[j, j];   W[:, j+1:] -= err * U[j, j+1:]

Updates are applied to a block of columns at once and to the rest of the matrix after each block (the
"lazy batch" form; same arithmetic, faster). Groups: the scale and zero point of a group of ``group_size``
columns are chosen, with :func:`lowbit.ops.int4.quantize_groups` (min-max plus the shrink search, weighted
by diag(H)), from the group's weights as they are when its first column comes up, so the error already
pushed into the group is part of its range. Codes, scales and zero points have exactly the layout
:class:`~lowbit.ops.int4.Int4WeightOnlyLinear` stores. ``act_order=True`` rounds columns by decreasing
diag(H); the groups then stay the contiguous groups of the stored layout, with their parameters chosen from
the weights before any update ("static groups").

On CPU weights under the "auto" / "native" backends each lazy batch runs in C (csrc/gptq.c, the weight
transposed so a tile of rows sits in the vector lanes): the same element arithmetic, the range search's error
sums in input order (torch.sum's order is its own), so a group whose trial ranges tie to float32 rounding may
keep another of them. ``float_zero=True`` fits the float zero-point domain (a float minimum per group).

:func:`lowbit.flows.gptq.blockwise_gptq` runs it over a model block by block (and
:func:`~lowbit.flows.gptq.sequential_gptq` layer by layer, with whole-model forwards): each layer's H comes
from inputs that already went through the earlier, quantized layers.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from lowbit import backend, native
from lowbit.errors import ConfigError, FormatError
from lowbit.native import gptq as native_gptq
from lowbit.ops.int4 import quantize_groups

MAX_DAMPING_TRIES = 8  # the dampening is multiplied by 10 per failed Cholesky factorisation
# Input rows per float32 Gram product (x^T x): each sum of at most this many products rounds to about 1e-6 of
# its terms' size (GPTQ's reference accumulates H in float32 throughout); the parts add in float64. float32
# products are 4-8x faster than float64 ones (a 1536-wide Hessian: 0.45 s of each SmolLM2 block in float64).
GRAM_ROWS = 1024
TRIANGULAR_BASE = 128  # below this size _lower_inverse solves against the identity


class GptqResult(NamedTuple):
    """uint8 codes [N, K] (0..15), scales [N, K / g] (scale dtype), uint8 zero points [N, K / g]."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor


class HessianAccumulator:
    """H = 2 / n * sum over input rows x of x x^T: float32 products of up to GRAM_ROWS rows, accumulated in float64
    ([K, K] memory).

    H lives on ``device`` (give the weight's: GPTQ works there), or on the first batch's device when none
    is given; later batches are moved to it.
    """

    def __init__(self, in_features: int, device: torch.device | str | None = None) -> None:
        self.in_features, self.rows = in_features, 0
        self.sum = None if device is None else self._zeros(device)

    def _zeros(self, device) -> torch.Tensor:
        return torch.zeros(self.in_features, self.in_features, dtype=torch.float64, device=device)

    def add(self, inputs: torch.Tensor) -> None:
        self.add_gram(*self.gram(inputs))

    def gram(self, inputs: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(sum of x x^T over the rows of ``inputs`` [..., K] in float64 on H's device, the row count): what
        :meth:`add` adds, computed once for layers fed the same tensor (attention's query / key / value)."""
        if self.sum is None:
            self.sum = self._zeros(inputs.device)
        rows = inputs.detach().reshape(-1, inputs.shape[-1]).to(self.sum.device, torch.float32)  # [M, K]
        if rows.shape[1] != self.sum.shape[0]:
            raise FormatError(f"inputs have {rows.shape[1]} features, the Hessian {self.sum.shape[0]}")
        parts = [_symmetric_gram(part) for part in rows.split(GRAM_ROWS)]  # float32 products, float64 sums
        gram = parts[0].double() if parts else torch.zeros_like(self.sum)
        for part in parts[1:]:
            gram += part
        return gram, rows.shape[0]  # [K, K]

    def add_gram(self, gram: torch.Tensor, rows: int) -> None:
        if self.sum is None:
            self.sum = self._zeros(gram.device)
        if tuple(gram.shape) != tuple(self.sum.shape):
            raise FormatError(f"a Gram matrix of shape {tuple(gram.shape)} for a Hessian {tuple(self.sum.shape)}")
        self.sum += gram.to(self.sum.device)
        self.rows += rows

    def hessian(self) -> torch.Tensor:
        if self.rows == 0 or self.sum is None:
            raise ConfigError("no calibration rows reached this layer: GPTQ needs its inputs")
        return self.sum * (2.0 / self.rows)


def _symmetric_gram(rows: torch.Tensor) -> torch.Tensor:
    """rows^T rows [K, K] for rows [M, K], exactly symmetric: from K = 1024 on, the two diagonal blocks and one
    off-diagonal block of the halves (three products where the whole takes four)."""
    k = rows.shape[1]
    if k < 1024:
        return rows.t() @ rows
    half = k // 2
    first, second = rows[:, :half], rows[:, half:]
    gram = torch.empty(k, k, dtype=rows.dtype, device=rows.device)
    gram[:half, :half] = first.t() @ first
    gram[half:, half:] = second.t() @ second
    gram[:half, half:] = first.t() @ second
    gram[half:, :half] = gram[:half, half:].t()
    return gram


# ---- one weight matrix -----------------------------------------------------------------------------------------
def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int = 32,
                  scale_dtype: torch.dtype = torch.bfloat16, *, damping: float = 0.1, block_size: int = 128,
                  act_order: bool = False, search: bool = True, float_zero: bool = False) -> GptqResult:  # fmt: skip
    """Int4 codes of ``weight`` [N, K] that minimise the output error under ``hessian`` [K, K]; with
    ``float_zero`` the groups take a float minimum (value q * scale + minimum; ``zero_point`` then holds the
    minima in ``scale_dtype``, codes round((w - minimum) * (1 / scale)))."""
    weight, hessian = _checked(weight, hessian, group_size, damping, block_size)
    n, k = weight.shape
    weight, hessian = weight.clone(), hessian.clone()
    dead = torch.diagonal(hessian) == 0  # inputs that were always 0: their weights never matter
    hessian[dead, dead] = 1.0
    weight[:, dead] = 0.0
    importance = torch.diagonal(hessian).float()
    device = weight.device  # every table below lives with the weight (and the Hessian, moved there)
    order = torch.argsort(importance, descending=True, stable=True) if act_order else torch.arange(k, device=device)
    ordered = hessian[order][:, order] if act_order else hessian
    upper = _inverse_cholesky(ordered, damping).float()  # [K, K], in rounding order
    grid = _Grid(group_size, scale_dtype, search, importance, n, k, float_zero)
    if act_order:  # static groups: every group's range from the weight before any update
        grid.choose_all(weight)
    step = max(group_size, block_size // group_size * group_size)  # blocks hold whole groups
    codes = _solve_native(weight, upper, order, grid, step, act_order) if _native_wanted(weight, scale_dtype) else None
    if codes is None:
        codes = _solve(weight, upper, order, grid, step, act_order)
    offset = grid.zero_point.to(scale_dtype if float_zero else torch.uint8)
    return GptqResult(codes.to(torch.uint8), grid.scale.to(scale_dtype), offset)


def _solve(weight: torch.Tensor, upper: torch.Tensor, order: torch.Tensor, grid: _Grid, step: int,
           static: bool) -> torch.Tensor:  # fmt: skip
    """The codes [N, K] (float), block after block of ``step`` columns in torch ops."""
    n, k = weight.shape
    work = weight[:, order]  # [N, K] in rounding order
    codes = torch.zeros(n, k, device=weight.device)
    for start in range(0, k, step):
        end = min(k, start + step)
        block = work[:, start:end].clone()
        errors = _round_block(block, upper[start:end, start:end], order[start:end].tolist(), grid, codes, static)
        work[:, end:] -= errors @ upper[start:end, end:]  # the block's error, pushed onto later columns at once
    return codes


def _native_wanted(weight: torch.Tensor, scale_dtype: torch.dtype) -> bool:
    """A CPU weight under the "auto" or "native" backend: the library is built now if it must be (once per
    machine; GPTQ itself takes far longer) and the column loop runs in C."""
    if weight.device.type != "cpu" or backend.get_backend() not in ("auto", "native"):
        return False
    if native.library() is None and not native.disabled():
        logging.getLogger("lowbit").info("GPTQ: loading lowbit's native kernels (built once per machine)")
    return native.ensure() is not None and native_gptq.fits_range(weight, scale_dtype)


def _solve_native(weight: torch.Tensor, upper: torch.Tensor, order: torch.Tensor, grid: _Grid, step: int,
                  static: bool) -> torch.Tensor | None:  # fmt: skip
    """:func:`_solve` with each block's column loop in C (csrc/gptq.c) over the transposed weight, rows in the
    vector lanes; the same element arithmetic, the range search's sums in input order. None: not taken."""
    n, k = weight.shape
    work, upper = weight[:, order].t().contiguous(), upper.contiguous()  # [K, N] in rounding order
    codes = torch.zeros(n, k, dtype=torch.uint8)
    scale, offset = grid.scale.t().contiguous(), grid.zero_point.t().contiguous()  # [K / g, N]
    for start in range(0, k, step):
        end = min(k, start + step)
        errors = native_gptq.gptq_block(work[start:end], upper, start, order[start:end], grid.importance, codes, scale,
                                        offset, grid.group_size, grid.scale_dtype, search=grid.search,
                                        float_zero=grid.float_zero, fixed=static)  # fmt: skip
        if errors is None:
            return None
        work[end:] -= upper[start:end, end:].t() @ errors  # [K - end, N]
    grid.scale, grid.zero_point = scale.t(), offset.t()
    return codes


class _Grid:
    """Per-group scales and zero points or minima (float32 tables [N, K / g]), chosen with int4's range logic."""

    def __init__(self, group_size: int, scale_dtype, search: bool, importance: torch.Tensor, n: int, k: int,
                 float_zero: bool = False) -> None:  # fmt: skip
        self.group_size, self.scale_dtype, self.search, self.importance = group_size, scale_dtype, search, importance
        self.float_zero = float_zero
        self.scale = torch.ones(n, k // group_size, device=importance.device)
        self.zero_point = torch.zeros(n, k // group_size, device=importance.device)

    def choose_all(self, weight: torch.Tensor) -> None:
        _, scale, zero_point = quantize_groups(weight, self.group_size, self.scale_dtype, self.search, self.importance,
                                               self.float_zero)  # fmt: skip
        self.scale, self.zero_point = scale.float(), zero_point.float()

    def choose(self, columns: torch.Tensor, first: int) -> None:
        """The group starting at input ``first`` from its current weights ``columns`` [N, g]."""
        group, size = first // self.group_size, self.group_size
        importance = self.importance[first:first + size]
        _, scale, zero_point = quantize_groups(columns, size, self.scale_dtype, self.search, importance, self.float_zero)
        self.scale[:, group], self.zero_point[:, group] = scale[:, 0].float(), zero_point[:, 0].float()

    def rounded(self, value: torch.Tensor, column: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(code, its value) of one column's weights ``value`` [N] on the column's group grid."""
        scale, offset = self.scale[:, column // self.group_size], self.zero_point[:, column // self.group_size]
        if self.float_zero:  # int4.py's float-domain rule
            code = torch.round((value - offset) * (1.0 / scale)).clamp_(0, 15)
            return code, code * scale + offset
        code = torch.round(value / scale).add_(offset).clamp_(0, 15)  # int4.py's rounding
        return code, (code - offset) * scale


def _round_block(block: torch.Tensor, upper: torch.Tensor, columns: list[int], grid: _Grid, codes: torch.Tensor,
                 static: bool) -> torch.Tensor:  # fmt: skip
    """Round ``block`` [N, B] (inputs ``columns``) column by column into ``codes``, each column's error
    spread over the block's later columns; returns the scaled errors [N, B] for the rest of the matrix."""
    errors = torch.empty_like(block)
    size = grid.group_size
    for j, column in enumerate(columns):
        if not static and column % size == 0:  # in-order rounding: a group starts here
            grid.choose(block[:, j:j + size], column)
        value = block[:, j]
        code, rounded = grid.rounded(value, column)
        codes[:, column] = code
        errors[:, j] = (value - rounded).div_(upper[j, j])
        block[:, j + 1:].addr_(errors[:, j], upper[j, j + 1:], alpha=-1)
    return errors


def _checked(weight: torch.Tensor, hessian: torch.Tensor, group_size: int | None, damping: float, block_size: int):
    """float32 weight [N, K] and float64 Hessian [K, K], or an error naming what is wrong."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise FormatError(f"GPTQ needs a 2-D weight [N, K], got {getattr(weight, 'shape', type(weight).__name__)}")
    n, k = weight.shape
    if group_size is not None:  # None: no int4 groups (lowbit.ops.gptq_formats rounds any format)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
            raise ConfigError(f"group_size={group_size!r} must be an even int >= 2")
        if k % group_size:
            raise FormatError(f"in_features={k} is not divisible by group_size={group_size}")
    if not (isinstance(damping, (int, float)) and 0 < damping < 1e6):
        raise ConfigError(f"damping={damping!r} must be a positive number (a fraction of the mean diagonal of H)")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"block_size={block_size!r} must be a positive int")
    if weight.device.type == "meta":
        raise FormatError("GPTQ cannot run on the meta device: it checks the weight's values, factorises the "
                          "Hessian and picks group ranges from the data; run it on the CPU or a GPU")  # fmt: skip
    weight = weight.detach().float()
    if not bool(torch.isfinite(weight).all()):
        raise FormatError("the weight has NaN or inf values; it cannot be quantized")
    if not isinstance(hessian, torch.Tensor) or tuple(hessian.shape) != (k, k):
        raise FormatError(f"the Hessian must be [{k}, {k}] for a weight with {k} inputs, "
                          f"got {tuple(getattr(hessian, 'shape', ()))}")  # fmt: skip
    hessian = hessian.detach().to(weight.device, torch.float64)  # H from anywhere: the work runs on the weight's device
    if not bool(torch.isfinite(hessian).all()):
        raise FormatError("the Hessian has NaN or inf values (NaN or inf in the calibration inputs?)")
    if bool((torch.diagonal(hessian) < 0).any()):
        raise FormatError("the Hessian has a negative diagonal entry: it is not a sum of x x^T")
    return weight, hessian


def _inverse_cholesky(hessian: torch.Tensor, damping: float) -> torch.Tensor:
    """Upper Cholesky factor U of (H + d I)^-1 (U^T U = (H + d I)^-1), d = damping * mean diag(H); d grows
    tenfold until H + d I factorises (a Hessian from few rows is only positive semi-definite).

    With P the order-reversing permutation and P (H + d I) P = L L^T, U = P L^-1 P: one factorisation and one
    triangular inverse instead of factorising, inverting and factorising again (the same U to float64
    rounding; 2.5x faster at K = 1536)."""
    mean_diagonal = float(torch.diagonal(hessian).mean())
    for attempt in range(MAX_DAMPING_TRIES):
        damped = hessian.flip(0, 1)  # P H P: a copy, whose diagonal takes the dampening
        torch.diagonal(damped).add_(damping * 10**attempt * mean_diagonal)
        lower, info = torch.linalg.cholesky_ex(damped)
        if int(info) == 0:
            return _lower_inverse(lower).flip(0, 1)
    raise FormatError(f"the Hessian is not positive definite even with dampening "
                      f"{damping * 10 ** (MAX_DAMPING_TRIES - 1)} x its mean diagonal")  # fmt: skip


def _lower_inverse(lower: torch.Tensor) -> torch.Tensor:
    """L^-1 of a lower-triangular L by halves ([[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]]): matrix
    products where a triangular solve against the identity does three times the arithmetic (40 against 64-78 ms
    at 1536, float64, 2 cores)."""
    size = lower.shape[0]
    if size <= TRIANGULAR_BASE:
        identity = torch.eye(size, dtype=lower.dtype, device=lower.device)
        return torch.linalg.solve_triangular(lower, identity, upper=False)
    half = size // 2
    first, second = _lower_inverse(lower[:half, :half]), _lower_inverse(lower[half:, half:])
    inverse = torch.zeros_like(lower)
    inverse[:half, :half], inverse[half:, half:] = first, second
    inverse[half:, :half] = -(second @ (lower[half:, :half] @ first))
    return inverse
