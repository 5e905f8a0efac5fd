"""The native library's interface as Python sees it, in one table: every entry point's ctypes signature, the
numbered choices (enums) its arguments take, and the C structures a spec's constants are packed into.

csrc/ is the source of truth; this file mirrors it, and tests/native/test_interface.py reads the C definitions
(exported ``lb_*`` functions, ``enum`` constants, ``typedef struct``) and fails, naming the entry, when the two
drift apart. ``kernels.function(name)`` binds an entry point with the types listed here, so no caller spells a
signature of its own. To add an entry point: write it in csrc/, add its row to ``ENTRY_POINTS``, run that test.
"""

from __future__ import annotations

import ctypes

I64, INT, FLOAT, DOUBLE, POINTER = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_void_p
_RUNS = (I64, I64, I64)  # rows, row_length, block_length (blocking.contiguous_runs)

# name: (result type, argument types). Pointers of every kind pass as POINTER (an address).
ENTRY_POINTS: dict[str, tuple] = {
    # element-wise quantizers: x, out, n, ..., storage (STORAGE_CODES), threads
    "lb_fixed_f32": (None, (POINTER, POINTER, I64, POINTER, INT, INT)),
    "lb_float_grid_f32": (None, (POINTER, POINTER, I64, INT, INT, FLOAT, INT, INT, INT, INT)),
    "lb_log_f32": (None, (POINTER, POINTER, I64, INT, INT, FLOAT, INT, INT, INT, INT)),
    "lb_residual_f32": (None, (POINTER, POINTER, I64, INT, POINTER, POINTER, INT, INT)),
    "lb_narrow_f32": (None, (POINTER, POINTER, I64, INT, INT)),
    "lb_ocp_element_f32": (None, (POINTER, POINTER, I64, INT, INT, FLOAT, INT, INT, INT, INT, INT)),
    # grouped and block quantizers: 0 where they decline (nothing written)
    "lb_affine_f32": (INT, (POINTER, POINTER, INT, I64, I64, I64, POINTER, INT, INT)),
    "lb_ternary_f32": (INT, (POINTER, POINTER, I64, I64, I64, INT, FLOAT, INT, POINTER, INT, INT)),
    "lb_binary_f32": (INT, (POINTER, POINTER, I64, I64, I64, INT, INT, POINTER, INT, INT)),
    "lb_ocp_scaled_f32": (INT, (POINTER, POINTER, *_RUNS, POINTER, I64, INT, INT, FLOAT, INT, INT, INT, INT, INT)),
    "lb_ocp_columns_f32": (INT, (POINTER, POINTER, I64, I64, INT, INT, FLOAT, INT, INT, INT, INT, INT)),
    "lb_mx_f32": (INT, (POINTER, POINTER, *_RUNS, INT, INT, INT, FLOAT, INT, FLOAT, INT, INT, INT)),
    "lb_block_fp_f32": (INT, (POINTER, POINTER, *_RUNS, INT, INT, INT, DOUBLE, INT, INT, INT, INT)),
    "lb_block_minifloat_f32": (INT, (POINTER, POINTER, *_RUNS, INT, INT, INT, INT, INT, INT, INT, INT)),
    "lb_block_log_f32": (INT, (POINTER, POINTER, *_RUNS, INT, INT, INT, FLOAT, INT, INT, INT)),
    # int4 / GPTQ / HQQ fitting
    "lb_int4_fit_f32": (INT, (POINTER,) * 5 + (I64, I64, I64, INT, INT, INT, INT)),
    "lb_gptq_block_f32": (INT, (POINTER, POINTER, POINTER, I64) + (POINTER,) * 5 + (I64,) * 4 + (INT,) * 5),
    "lb_hqq_fit_f32": (INT, (POINTER,) * 4 + (I64, I64, I64, INT, INT, DOUBLE, DOUBLE, INT)),
    # integer matrix products and weight-only linear layers
    "lb_int8_pack": (None, (POINTER, POINTER, I64, I64)),
    "lb_int8_gemm_s32": (INT, (POINTER, INT, POINTER, POINTER, I64, I64, I64, INT)),
    "lb_int8_linear_f32": (INT, (POINTER, POINTER, POINTER, POINTER, POINTER, I64, I64, I64, INT)),
    "lb_int4_linear_f32": (INT, (POINTER,) * 6 + (I64, I64, I64, I64, INT)),
    "lb_weight_linear_f32": (INT, (POINTER,) * 7 + (I64, I64, I64, I64, INT, INT)),
    "lb_weight_rows_f32": (INT, (POINTER,) * 5 + (I64, I64, I64, INT, INT)),
    "lb_token_quantize_f32": (None, (POINTER, POINTER, I64, I64, POINTER, POINTER, FLOAT, FLOAT, FLOAT, FLOAT, INT,
                                     INT)),  # fmt: skip
    "lb_token_rescale_f32": (None, (POINTER, POINTER, I64, I64, POINTER, POINTER, POINTER, POINTER, POINTER, INT,
                                    INT)),  # fmt: skip
    # the library's own rules, their test overrides (0: the rule again) and counters
    "lb_set_threads_from": (None, (I64,)),
    "lb_set_stream_from": (None, (I64,)),
    "lb_set_window_from": (None, (I64,)),
    "lb_set_chunks": (None, (I64,)),
    "lb_set_prefetch": (None, (I64,)),
    "lb_chunks_run_count": (I64, ()),
    "lb_window_served_count": (I64, ()),
    "lb_window_wanted": (INT, (I64,)),
    "lb_stream_from": (I64, ()),
    "lb_streams": (INT, (I64, INT)),
    "lb_uses_openmp": (INT, ()),
    "lb_note_fork": (None, ()),
}

# ---- numbered choices: each table's C constants are its prefix + the key in capitals ----------------------
ROUNDING_CODES = {
    "nearest_even": 0, "nearest_away": 1, "nearest_toward_zero": 2, "nearest_up": 3, "nearest_down": 4,
    "toward_zero": 5, "away_from_zero": 6, "up": 7, "down": 8,
}  # fmt: skip
STORAGE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}  # the kernels' `half` argument: x's and out's dtype
OVERFLOW_KINDS = {"saturate": 0, "inf": 1, "nan": 2}  # what an OCP element past max becomes
SCALE_RULES = {"floor": 0, "ceil": 1, "even": 2}  # MX's shared exponent
AFFINE_KINDS = {"asymmetric": 0, "symmetric": 1, "full_range": 2}
AFFINE_SCALE_DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
AFFINE_LAYOUTS = {"tensor": 0, "rows": 1, "channels": 2, "given": 3}
INT4_SCALE_TYPES = {"float32": 0, "bfloat16": 1, "float16": 2}  # the int4 fitters' scale storage
WEIGHT_KINDS = {"int8_channel": 0, "int4_zero": 1, "int4_min": 2, "int8_group": 3}

# table name: (the C file declaring the enum, the constants' prefix)
ENUM_SOURCES = {
    "ROUNDING_CODES": ("common.h", "LB_"),
    "STORAGE_CODES": ("common.h", "LB_STORE_"),
    "OVERFLOW_KINDS": ("block_ocp.c", "LB_OVERFLOW_"),
    "SCALE_RULES": ("block_scaled.c", "LB_SCALE_RULE_"),
    "AFFINE_KINDS": ("affine_params.h", "KIND_"),
    "AFFINE_SCALE_DTYPES": ("affine_params.h", "SCALE_"),
    "AFFINE_LAYOUTS": ("affine_params.h", "LAYOUT_"),
    "INT4_SCALE_TYPES": ("int4_groups.h", "SCALE_"),
    "WEIGHT_KINDS": ("linear.h", "LB_"),
}


# ---- structures: a spec's constants, packed once per spec (native/integer.py) ---------------------------------
class FixedSpec(ctypes.Structure):
    """csrc/fixed.c ``lb_fixed_spec``."""

    _fields_ = [("multiplier", ctypes.c_float), ("step", ctypes.c_float), ("q_min", ctypes.c_float),
                ("q_max", ctypes.c_float), ("keep_sign", ctypes.c_int32), ("mode", ctypes.c_int32)]  # fmt: skip


class AffineSpec(ctypes.Structure):
    """csrc/affine_params.h ``lb_affine_spec``."""

    _fields_ = [("q_min", ctypes.c_float), ("q_max", ctypes.c_float), ("clamp_low", ctypes.c_float),
                ("clamp_high", ctypes.c_float), ("kind", ctypes.c_int32), ("power_of_two", ctypes.c_int32),
                ("scale_dtype", ctypes.c_int32), ("shorten_bits", ctypes.c_int32), ("mode", ctypes.c_int32),
                ("unused", ctypes.c_int32), ("scales", ctypes.c_void_p), ("zero_points", ctypes.c_void_p),
                ("scale_count", ctypes.c_int64), ("zero_point_count", ctypes.c_int64)]  # fmt: skip


# structure class: (the C file defining it, its typedef name)
STRUCT_SOURCES = {FixedSpec: ("fixed.c", "lb_fixed_spec"), AffineSpec: ("affine_params.h", "lb_affine_spec")}
