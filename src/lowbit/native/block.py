"""Entry points of the block kernels (csrc/block_ocp.c, block_scaled.c, block_log.c): OCP element casts, scaled OCP
elements, MX, block_fp, block_minifloat and block_log. Blocks are contiguous runs: ``rows`` rows of
``row_length`` floats cut into blocks of ``block_length`` (the last block of a row may be shorter), as
``blocking.contiguous_runs`` describes them. Each function returns a tensor of x's dtype, or None where no library is
loaded or the rounding mode has no code (stochastic): the caller then runs the eager path. Every kernel also
takes bfloat16 / float16 x, a tile at a time widened to float32 and the result narrowed (the float32 kernel's
result cast by ``casting.saturating_cast``); the block kernels do where blocks are at most a tile (2048
elements, csrc/stream.h) long, and answer None for longer ones."""

from __future__ import annotations

import torch

from lowbit.native.interface import OVERFLOW_KINDS, ROUNDING_CODES, SCALE_RULES
from lowbit.native.kernels import HALF_CODES, function, threads

# A chunk of this many elements shares one given scale entry (given scales need no per-block statistic): a
# tile of the kernels (csrc/stream.h), so that halves run too.
GIVEN_CHUNK = 2048


def _run(name: str, x: torch.Tensor, rounding: str, *arguments) -> torch.Tensor | None:
    """Calls the block kernel ``name`` (x and out first, then ``arguments``, the rounding mode, x's storage and the
    threads; it answers 0 where it declines) into a new tensor like x; None where it does not run."""
    entry = function(name)
    mode, half = ROUNDING_CODES.get(rounding), HALF_CODES.get(x.dtype)
    if entry is None or mode is None or half is None:
        return None
    out = torch.empty_like(x)
    return out if entry(x.data_ptr(), out.data_ptr(), *arguments, mode, half, threads()) else None


def ocp_element(x: torch.Tensor, mantissa_bits: int, min_exponent: int, max_value: float, overflow: str,
                saturate: bool, rounding: str) -> torch.Tensor | None:  # fmt: skip
    """ocp_float.round_element on every element (no scale)."""
    entry = function("lb_ocp_element_f32")
    mode, half = ROUNDING_CODES.get(rounding), HALF_CODES.get(x.dtype)
    if entry is None or mode is None or half is None:
        return None
    out = torch.empty_like(x)
    entry(x.data_ptr(), out.data_ptr(), x.numel(), mantissa_bits, min_exponent, max_value, OVERFLOW_KINDS[overflow],
          int(saturate), mode, half, threads())  # fmt: skip
    return out


def ocp_scaled(x: torch.Tensor, runs: tuple[int, int, int], scales: torch.Tensor | None, blocks_per_scale: int,
               mantissa_bits: int, min_exponent: int, max_value: float, overflow: str, saturate: bool,
               rounding: str) -> torch.Tensor | None:  # fmt: skip
    """s * element(x / s) per block: s derived from the block (f32 scales) when ``scales`` is None, else
    ``scales[block index // blocks_per_scale]`` (float32, contiguous)."""
    return _run("lb_ocp_scaled_f32", x, rounding, *runs,
                None if scales is None else scales.data_ptr(), blocks_per_scale, mantissa_bits, min_exponent,
                max_value, OVERFLOW_KINDS[overflow], int(saturate))  # fmt: skip


def ocp_columns(x: torch.Tensor, mantissa_bits: int, min_exponent: int, max_value: float, overflow: str,
                saturate: bool, rounding: str) -> torch.Tensor | None:  # fmt: skip
    """s * element(x / s) with one derived f32 scale per index of the last dimension (x contiguous, 2-D or more);
    None where the kernel declines (directed and stochastic modes) or no library is loaded."""
    columns = x.shape[-1]
    return _run("lb_ocp_columns_f32", x, rounding, x.numel() // columns,
                columns, mantissa_bits, min_exponent, max_value, OVERFLOW_KINDS[overflow], int(saturate))  # fmt: skip


def mx(x: torch.Tensor, runs: tuple[int, int, int], mantissa_bits: int, element_min_exponent: int, emax: int,
       element_max: float, scale_rule: str, dtype_max: float, rounding: str) -> torch.Tensor | None:  # fmt: skip
    """MX blocks: E8M0 exponent by ``scale_rule``, elements saturating at the block limit under dtype_max."""
    if mantissa_bits < 1:
        return None
    return _run("lb_mx_f32", x, rounding, *runs, mantissa_bits,
                element_min_exponent, emax, element_max, SCALE_RULES[scale_rule], dtype_max)  # fmt: skip


def block_fp(x: torch.Tensor, runs: tuple[int, int, int], mantissa_bits: int, min_exponent: int, max_exponent: int,
             top_code: float, in_float: bool, rounding: str) -> torch.Tensor | None:  # fmt: skip
    """block_fp blocks (in_float: the eager float32 path's arithmetic, else its float64 path's)."""
    return _run("lb_block_fp_f32", x, rounding, *runs, mantissa_bits,
                min_exponent, max_exponent, top_code, int(in_float))  # fmt: skip


def block_minifloat(x: torch.Tensor, runs: tuple[int, int, int], mantissa_bits: int, binades_below_top: int,
                    min_shared: int, max_shared: int, in_float: bool,
                    rounding: str) -> torch.Tensor | None:  # fmt: skip
    """block_minifloat blocks (in_float: the eager float32 path's arithmetic, else its float64 path's)."""
    return _run("lb_block_minifloat_f32", x, rounding, *runs, mantissa_bits,
                binades_below_top, min_shared, max_shared, int(in_float))  # fmt: skip


def block_log(x: torch.Tensor, runs: tuple[int, int, int], top_code: int, max_bias: int, log_domain: bool,
              below_sqrt2: float, rounding: str) -> torch.Tensor | None:  # fmt: skip
    """block_log blocks: bias from the block's finite |max|, elements by log.round_to_power_of_two."""
    return _run("lb_block_log_f32", x, rounding, *runs, top_code, max_bias,
                int(log_domain), below_sqrt2)
