"""The real recipes' dataclasses (their handler: :mod:`lowbit.flows.real`): int8 dynamic / weight-only,
int4 weight-only (round, HQQ, AWQ, GPTQ), llama.cpp's block types, static int8."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from lowbit.errors import ConfigError
from lowbit.flows.checks import conv_option
from lowbit.flows.checks import choice as _choice
from lowbit.flows.checks import flag as _flag
from lowbit.flows.checks import positive_int as _positive_int
from lowbit.flows.checks import smoothquant_option as _smoothquant
from lowbit.flows.recipe_base import Recipe, recipe


@recipe
@dataclasses.dataclass
class Int8Dynamic(Recipe):
    """Real int8: per-channel symmetric int8 weights, activations quantized per token (or tensor) at run time."""

    name: ClassVar[str] = "int8_dynamic"
    builds_real_modules: ClassVar[bool] = True
    act_symmetric: bool = True
    act_granularity: str = "token"
    act_bits: int = 8
    include_conv: bool | str = "auto"  # see conv_option
    conv_channels_last: bool = False
    smoothquant: float | None = None  # SmoothQuant's alpha (flows.smoothing), needs calibration_data
    calibration_data: Any = None

    def check(self) -> None:
        _flag(self.name, "act_symmetric", self.act_symmetric)
        _choice(self.name, "act_granularity", self.act_granularity, ("token", "tensor"))
        _choice(self.name, "act_bits", self.act_bits, (8, 7))
        conv_option(self.name, self.include_conv)
        _flag(self.name, "conv_channels_last", self.conv_channels_last)
        _smoothquant(self.name, self.smoothquant)
        if self.smoothquant is not None and self.calibration_data is None:
            raise ConfigError(f"{self.name}: smoothquant={self.smoothquant!r} needs calibration_data= (batches the "
                              "model can run) for the activations' per-channel maxima")  # fmt: skip

    def needs_data(self) -> bool:
        return self.smoothquant is not None


COMPUTE_DTYPES = (None, "bf16", "f32")


@recipe
@dataclasses.dataclass
class Int8WeightOnly(Recipe):
    """Real int8 weights (per channel), float activations; ``compute_dtype`` None = the input's dtype."""

    name: ClassVar[str] = "int8_weight_only"
    builds_real_modules: ClassVar[bool] = True
    compute_dtype: str | None = None

    def check(self) -> None:
        _choice(self.name, "compute_dtype", self.compute_dtype, COMPUTE_DTYPES)


INT4_METHODS = ("round", "gptq", "hqq", "awq", "awq+gptq")


@recipe
@dataclasses.dataclass
class Int4WeightOnly(Recipe):
    """Real int4 weights per group of ``group_size`` inputs; ``method`` "round", "gptq", "awq" or "awq+gptq"
    (AWQ's folded scales, then GPTQ's codes), all but "round" needing ``calibration_data``, or "hqq" (data-free
    half-quadratic fit of each group's scale and zero point, ``hqq_iterations`` steps). ``symmetric=True``:
    codes -7..7 around zero (scale = max |w| / 7 per group, stored as zero point 7), plain rounding (method
    "round"; the range search does not apply): the int4 that compressed-tensors writes symmetric and, at group
    32 with float16 scales, GGUF's Q4_0 holds. ``zero_point_domain="float"``: a float offset per group (value
    q * scale + minimum; torchao's and HQQ's default, ggml's Q4_1 at group 32 with float16 scales), methods
    "round", "gptq" and "hqq" (the paper's own form: min-max scale, float zero point fitted)."""

    name: ClassVar[str] = "int4_weight_only"
    builds_real_modules: ClassVar[bool] = True
    group_size: int = 32
    scale_dtype: str = "bf16"
    search: bool = True
    compute_dtype: str | None = None
    method: str = "round"
    damping: float = 0.1
    block_size: int = 128
    act_order: bool = False
    mask_padding: bool = True
    hqq_iterations: int = 20
    calibration_data: Any = None
    symmetric: bool = False
    zero_point_domain: str = "int"

    def check(self) -> None:
        _positive_int(self.name, "group_size", self.group_size, even=True)
        _flag(self.name, "symmetric", self.symmetric)
        _choice(self.name, "zero_point_domain", self.zero_point_domain, ("int", "float"))
        if self.zero_point_domain == "float" and (self.symmetric or self.method not in ("round", "gptq", "hqq")):
            raise ConfigError(f"{self.name}: zero_point_domain='float' takes method='round', 'gptq' or 'hqq' and "
                              "symmetric=False; AWQ fits integer zero points")  # fmt: skip
        if self.symmetric and self.method != "round":
            raise ConfigError(f"{self.name}: symmetric=True rounds each group plainly; method={self.method!r} "
                              "searches asymmetric grids (use method='round')")  # fmt: skip
        _choice(self.name, "scale_dtype", self.scale_dtype, ("bf16", "f16", "f32"))
        _flag(self.name, "search", self.search)
        _choice(self.name, "compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        _choice(self.name, "method", self.method, INT4_METHODS)
        if isinstance(self.damping, bool) or not isinstance(self.damping, (int, float)) or not 0 < self.damping < 1e6:
            raise ConfigError(f"{self.name}: damping={self.damping!r} must be a positive number")
        _positive_int(self.name, "block_size", self.block_size)
        _flag(self.name, "act_order", self.act_order)
        _flag(self.name, "mask_padding", self.mask_padding)
        _positive_int(self.name, "hqq_iterations", self.hqq_iterations)
        if self.needs_data() and self.calibration_data is None:
            reason = "to build each layer's Hessian" if self.method == "gptq" else "for the activation-aware scale search"
            raise ConfigError(f"{self.name}: method={self.method!r} needs calibration_data= (batches the model can "
                              f"run) {reason}")  # fmt: skip
        if self.method == "hqq" and self.calibration_data is not None:
            raise ConfigError(f"{self.name}: method='hqq' is data-free; drop calibration_data= (or num_batches)")

    def needs_data(self) -> bool:
        return self.method in ("gptq", "awq", "awq+gptq")


@recipe
@dataclasses.dataclass
class W8A8Static(Recipe):
    """Real int8 weights x int8 activations with calibrated per-tensor scales (``calibration`` from
    ``lowbit.ptq.calibrate`` or ``calibration_data`` batches, calibrated here with min-max)."""

    name: ClassVar[str] = "w8a8_static"
    builds_real_modules: ClassVar[bool] = True
    include_conv: bool | str = "auto"  # see conv_option
    conv_channels_last: bool = False
    calibration: Any = None
    calibration_data: Any = None
    smoothquant: float | None = None  # SmoothQuant's alpha (flows.smoothing), needs calibration_data

    def check(self) -> None:
        conv_option(self.name, self.include_conv)
        _flag(self.name, "conv_channels_last", self.conv_channels_last)
        if self.needs_data() and self.calibration_data is None:
            raise ConfigError(f"{self.name} needs calibration= (lowbit.ptq.calibrate(...)) or calibration_data=")
        _smoothquant(self.name, self.smoothquant)
        if self.smoothquant is not None and (self.calibration_data is None or self.calibration is not None):
            raise ConfigError(f"{self.name}: smoothquant={self.smoothquant!r} needs calibration_data= and no "
                              "calibration= (ranges taken before the smoothing would be stale)")  # fmt: skip

    def needs_data(self) -> bool:
        return self.calibration is None


@dataclasses.dataclass
class GGUFWeightOnly(Recipe):
    """Real weight-only llama.cpp block codes (``lowbit.formats.ggml``: ggml's reference rounding, blocks of 32
    inputs, float16 fields; ``lowbit.formats.ggml_k``: the K-quants' super-blocks of 256); the recipe name
    picks the type. ``compute_dtype`` None = the input's dtype."""

    name: ClassVar[str] = ""
    builds_real_modules: ClassVar[bool] = True
    ggml_type: ClassVar[str] = ""
    compute_dtype: str | None = None

    def check(self) -> None:
        _choice(self.name, "compute_dtype", self.compute_dtype, COMPUTE_DTYPES)


@recipe
@dataclasses.dataclass
class GGUFQ4_0(GGUFWeightOnly):
    """llama.cpp Q4_0: d * (q - 8), one float16 d per 32 weights (4.5 bits per weight)."""

    name: ClassVar[str] = "gguf_q4_0"
    ggml_type: ClassVar[str] = "q4_0"


@recipe
@dataclasses.dataclass
class GGUFQ4_1(GGUFWeightOnly):
    """llama.cpp Q4_1: d * q + m, float16 d and m per 32 weights (5 bits per weight)."""

    name: ClassVar[str] = "gguf_q4_1"
    ggml_type: ClassVar[str] = "q4_1"


@recipe
@dataclasses.dataclass
class GGUFQ8_0(GGUFWeightOnly):
    """llama.cpp Q8_0: d * q with int8 q, one float16 d per 32 weights (8.5 bits per weight)."""

    name: ClassVar[str] = "gguf_q8_0"
    ggml_type: ClassVar[str] = "q8_0"


@recipe
@dataclasses.dataclass
class GGUFQ5_0(GGUFWeightOnly):
    """llama.cpp Q5_0: d * (q - 16) with 5-bit q, one float16 d per 32 weights (5.5 bits per weight)."""

    name: ClassVar[str] = "gguf_q5_0"
    ggml_type: ClassVar[str] = "q5_0"


@recipe
@dataclasses.dataclass
class GGUFQ4_K(GGUFWeightOnly):
    """llama.cpp Q4_K: super-blocks of 256, 6-bit scales and minima per 32 (4.5 bits per weight; lowbit's
    min-max rule, see ``lowbit.formats.ggml_k``). A layer whose inputs are not a multiple of 256 takes Q5_0,
    llama.cpp's own choice for such rows (``quantize_`` info ``gguf_fallback`` lists them)."""

    name: ClassVar[str] = "gguf_q4_k"
    ggml_type: ClassVar[str] = "q4_k"


@recipe
@dataclasses.dataclass
class GGUFQ6_K(GGUFWeightOnly):
    """llama.cpp Q6_K: super-blocks of 256, int8 scales per 16, 6-bit codes (6.5625 bits per weight). A layer
    whose inputs are not a multiple of 256 takes Q8_0, as llama.cpp does (info ``gguf_fallback``)."""

    name: ClassVar[str] = "gguf_q6_k"
    ggml_type: ClassVar[str] = "q6_k"
