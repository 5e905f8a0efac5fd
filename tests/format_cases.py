"""One representative case per format (and a few granularities): the table generic tests iterate over.

Each case: (case id, format name, parameters, traits). Traits:
- "sign_symmetric": q(-x) == -q(x) for every x (sign-magnitude value sets; no data-dependent asymmetry).
- "deterministic": no randomness (all cases here are; stochastic rounding has its own tests).
- "scalar": the result for an element depends on that element only (no data-derived scale).
- "asymmetric_minmax": scale and zero point re-derived from a quantized tensor may differ (the rounded
  zero point can leave the top code unused), so re-quantizing moves values by at most one step instead of
  leaving them bit-identical.
- "nan_left_out": a per-tensor statistic (a mean) leaves non-finite elements out (not counted as zero, so that
  the format stays idempotent: its output keeps the NaN), so a NaN or inf acts as if the element were absent.
- "scale_recomputed": a scale re-derived from the quantized block's maximum by a rule kept bit for bit from
  its owner (NVFP4's pts = amax / 2688, block FP8's amax / 448) may move a re-quantized value by a few float32
  ulps, instead of leaving it bit-identical.
Every registered format must appear here at least once (tests/formats/test_registry_cases.py checks it).
"""

from __future__ import annotations

CASES: list[tuple[str, str, dict, frozenset[str]]] = []


def _case(case_id: str, name: str, params: dict, *traits: str) -> None:
    CASES.append((case_id, name, params, frozenset(traits)))


# ---- issue 2: integer / affine / presets / binary / ternary -----------------------------------------------
_case("integer-8-4", "integer", {"width": 8, "frac_width": 4}, "scalar")
_case("fixed-6-2", "fixed", {"width": 6, "frac_width": 2}, "scalar")
_case("integer-unsigned", "integer", {"width": 4, "frac_width": 1, "signed": False}, "scalar")
_case("affine-given", "affine", {"bits": 8, "scale": 0.1, "zero_point": 3}, "scalar")
_case("affine-minmax", "affine", {"bits": 8}, "asymmetric_minmax")
_case("affine-sym-axis0", "affine", {"bits": 4, "symmetric": True, "axis": 0}, "sign_symmetric")
_case("affine-pow2-block", "affine", {"bits": 4, "block_size": [1, 32], "power_of_two": True}, "asymmetric_minmax")
for _name in ("q8s", "q4s", "q2s"):
    _case(_name, _name, {}, "sign_symmetric")
for _name in ("q8f", "q4f", "q2f"):
    _case(_name, _name, {})
_case("q4s-block-bf16", "q4s", {"block_size": [1, 32], "scale_dtype": "bf16"}, "sign_symmetric")
_case("binary-bipolar", "binary", {}, "scalar")
_case("binary-scaled", "binary", {"scaling_factor": True, "bipolar": True}, "nan_left_out")
_case("binary-residual", "binary_residual", {"levels": 2}, "scalar")
_case("ternary-twn-scaled", "ternary", {"scaling_factor": True}, "sign_symmetric", "nan_left_out")
_case("ternary-threshold", "ternary", {"threshold": 0.5}, "sign_symmetric", "scalar")

# ---- issue 3: minifloat / OCP elements / log / block / MX ---------------------------------------------------
_case("minifloat-ieee-e4m3", "minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": 7}, "sign_symmetric", "scalar")
_case("minifloat-denorm-e4m3", "minifloat_denorm", {"width": 8, "exponent_width": 4, "exponent_bias": 7}, "sign_symmetric", "scalar")
for _name in ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1"):
    _case(_name, _name, {}, "sign_symmetric", "scalar")
_case("e2m1-block32", "e2m1", {"block_size": [1, 32]}, "sign_symmetric")
_case("log-8-63", "log", {"width": 8, "exponent_bias": 63}, "sign_symmetric", "scalar")
_case("block-fp", "block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 16]}, "sign_symmetric")
_case("block-minifloat", "block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 16]}, "sign_symmetric")
_case("block-log", "block_log", {"width": 8, "exponent_bias_width": 4, "block_size": [1, 16]}, "sign_symmetric")
for _name in ("mxint8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"):
    _case(_name, _name, {}, "sign_symmetric")

# ---- issue 6: calibrated (given) scales of the scaled element and sign formats ------------------------------
_case("e4m3-given-scale", "e4m3", {"scale": 0.3}, "sign_symmetric", "scalar")
_case("ternary-given-alpha", "ternary", {"scaling_factor": True, "alpha": 0.75}, "sign_symmetric", "nan_left_out")

# ---- issue 45: the formats LLMs ship in -----------------------------------------------------------------
_case("nvfp4", "nvfp4", {}, "sign_symmetric", "scale_recomputed")
_case("nf4", "nf4", {})
_case("codebook-symmetric", "codebook", {"values": [-3.0, -1.0, -0.25, 0.25, 1.0, 3.0]}, "sign_symmetric", "scalar")
_case("codebook-scaled", "codebook", {"values": [-1.0, -0.5, 0.0, 0.25, 1.0], "block_size": [1, 32]})
_case("e4m3-tile-amax", "e4m3", {"block_size": [128, 128], "scale_rule": "amax"}, "sign_symmetric", "scale_recomputed")
# ---- issue 46: llama.cpp's block types ----------------------------------------------------------------------
for _name in ("gguf_q4_0", "gguf_q4_1", "gguf_q5_0", "gguf_q8_0"):
    _case(_name, _name, {})
for _name in ("gguf_q4_k", "gguf_q6_k"):  # the default least-squares search re-fits its own output
    _case(_name, _name, {}, "searched")
    _case(f"{_name}-min-max", _name, {"search": False})

CASE_IDS = [case[0] for case in CASES]
