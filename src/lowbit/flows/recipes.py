"""Typed recipes: what :func:`lowbit.quantize_` does to a model, as small serialisable dataclasses.

A recipe is data only (no tensors except calibration batches, which are run-time inputs and never
serialised); its handler does the work. A handler is registered for its recipe classes with
:func:`handles` beside its code (``flows.real``, ``flows.simulated``, ``flows.kv_cache``, ``flows.rotation``),
and the door finds it with :func:`handler_for`: a new algorithm is a recipe class here, its handler, and
the door's import of the handler's module. ``to_dict()`` /
``recipe_from_dict()`` round-trip every serialisable field, so a recipe can be written into a TOML pass,
a saved model's header or a search study. Names: the registry key of each class (``Int8Dynamic.name ==
"int8_dynamic"``), and any format name (``"mxfp4_e2m1"``) means :class:`FormatRecipe` of that format.

``KVCache`` (``"kv_cache"``) quantizes the attention operands of Hugging Face decoders (keys and values, optionally
queries and attention probabilities): ``lowbit.flows.kv_cache`` is its handler.

Granularity has one vocabulary everywhere: ``"tensor"``, ``"channel"`` (per output channel of a weight),
``"token"`` (per row of an activation: its last dimension is one block) and ``"group"`` (blocks of
``group_size`` along the last dimension).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from lowbit._model import root_module
from lowbit.errors import ConfigError, did_you_mean
from lowbit.flows.checks import conv_option, granularity_params  # noqa: F401 (granularity_params: public here too)
from lowbit.flows.checks import choice as _choice
from lowbit.flows.checks import flag as _flag
from lowbit.flows.checks import positive_int as _positive_int
from lowbit.flows.checks import smoothquant_option as _smoothquant

RUN_TIME_FIELDS = ("calibration_data", "calibration")  # batches / states: given at run time, never saved


@dataclasses.dataclass
class Recipe:
    """Options every recipe has: ``skip`` (regexes fully matched against qualified module names)."""

    name: ClassVar[str] = ""
    builds_real_modules: ClassVar[bool] = False  # whether it swaps layers for real-quantized modules (lowbit.ops)
    skip: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.skip, str):
            self.skip = (self.skip,)
        if not isinstance(self.skip, (tuple, list)) or not all(isinstance(s, str) for s in self.skip):
            raise ConfigError(f"{self.name}: skip={self.skip!r} must be a list of regexes")
        self.skip = tuple(self.skip)
        self.check()

    def check(self) -> None:
        """Validate the fields (ConfigError naming the recipe and the field)."""

    def needs_data(self) -> bool:
        """Whether these options run calibration batches (``calibration_data``), which the recipe then requires."""
        return False

    def to_dict(self) -> dict[str, Any]:
        """The serialisable fields with the recipe's name under ``"recipe"``."""
        out: dict[str, Any] = {"recipe": self.name}
        for field in dataclasses.fields(self):
            if field.name in RUN_TIME_FIELDS:
                continue
            value = getattr(self, field.name)
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out


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


@dataclasses.dataclass
class Int8WeightOnly(Recipe):
    """Real int8 weights (per channel), float activations; ``compute_dtype`` None = the input's dtype."""

    name: ClassVar[str] = "int8_weight_only"
    builds_real_modules: ClassVar[bool] = True
    compute_dtype: str | None = None

    def check(self) -> None:
        _choice(self.name, "compute_dtype", self.compute_dtype, COMPUTE_DTYPES)


INT4_METHODS = ("round", "gptq", "hqq", "awq", "awq+gptq")


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


@dataclasses.dataclass
class GGUFQ4_0(GGUFWeightOnly):
    """llama.cpp Q4_0: d * (q - 8), one float16 d per 32 weights (4.5 bits per weight)."""

    name: ClassVar[str] = "gguf_q4_0"
    ggml_type: ClassVar[str] = "q4_0"


@dataclasses.dataclass
class GGUFQ4_1(GGUFWeightOnly):
    """llama.cpp Q4_1: d * q + m, float16 d and m per 32 weights (5 bits per weight)."""

    name: ClassVar[str] = "gguf_q4_1"
    ggml_type: ClassVar[str] = "q4_1"


@dataclasses.dataclass
class GGUFQ8_0(GGUFWeightOnly):
    """llama.cpp Q8_0: d * q with int8 q, one float16 d per 32 weights (8.5 bits per weight)."""

    name: ClassVar[str] = "gguf_q8_0"
    ggml_type: ClassVar[str] = "q8_0"


@dataclasses.dataclass
class GGUFQ5_0(GGUFWeightOnly):
    """llama.cpp Q5_0: d * (q - 16) with 5-bit q, one float16 d per 32 weights (5.5 bits per weight)."""

    name: ClassVar[str] = "gguf_q5_0"
    ggml_type: ClassVar[str] = "q5_0"


@dataclasses.dataclass
class GGUFQ4_K(GGUFWeightOnly):
    """llama.cpp Q4_K: super-blocks of 256, 6-bit scales and minima per 32 (4.5 bits per weight; lowbit's
    min-max rule, see ``lowbit.formats.ggml_k``). A layer whose inputs are not a multiple of 256 takes Q5_0,
    llama.cpp's own choice for such rows (``quantize_`` info ``gguf_fallback`` lists them)."""

    name: ClassVar[str] = "gguf_q4_k"
    ggml_type: ClassVar[str] = "q4_k"


@dataclasses.dataclass
class GGUFQ6_K(GGUFWeightOnly):
    """llama.cpp Q6_K: super-blocks of 256, int8 scales per 16, 6-bit codes (6.5625 bits per weight). A layer
    whose inputs are not a multiple of 256 takes Q8_0, as llama.cpp does (info ``gguf_fallback``)."""

    name: ClassVar[str] = "gguf_q6_k"
    ggml_type: ClassVar[str] = "q6_k"


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
class FormatRecipe(Recipe):
    """Simulated: one format for every role (inputs, weights, biases) of every Linear / Conv layer.

    ``format`` is a format name or a spec's plain dict (``{"name": "affine", "bits": 4, ...}``);
    ``params`` are its parameters when ``format`` is a name; ``roles`` which roles get it.

    ``method``: how the weights of Linear layers are rounded: "round" (each weight by the format, at run
    time) or "gptq" (``lowbit.ops.gptq_formats``: error-compensating rounding from ``calibration_data``,
    block by block; ``damping`` (a fraction of H's mean diagonal), ``block_size`` (GPTQ's lazy batch of
    columns), ``act_order``, ``static_groups`` (every block's scale from the weight before any update; always
    so with act_order)).
    """

    name: ClassVar[str] = "format"
    format: Any = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    roles: tuple[str, ...] = ("data_in", "weight", "bias")
    ops: tuple[str, ...] = ("linear", "conv1d", "conv2d")
    method: str = "round"
    damping: float = 0.1
    block_size: int = 128
    act_order: bool = False
    static_groups: bool = False
    calibration_data: Any = None

    def check(self) -> None:
        if not isinstance(self.format, (str, dict)) or not self.format:
            raise ConfigError(f"format recipe: format={self.format!r} must be a format name or a spec's dict")
        if not isinstance(self.params, dict):
            raise ConfigError(f"format recipe: params={self.params!r} must be a table of format parameters")
        self.roles, self.ops = tuple(self.roles), tuple(self.ops)
        for role in self.roles:
            _choice("format recipe", "roles", role, ("data_in", "weight", "bias", "data_out"))
        _choice("format recipe", "method", self.method, ("round", "gptq", "awq", "awq+gptq"))
        if isinstance(self.damping, bool) or not isinstance(self.damping, (int, float)) or not 0 < self.damping < 1e6:
            raise ConfigError(f"format recipe: damping={self.damping!r} must be a positive number")
        _positive_int("format recipe", "block_size", self.block_size)
        _flag("format recipe", "act_order", self.act_order)
        _flag("format recipe", "static_groups", self.static_groups)
        if self.needs_data() and self.calibration_data is None:
            reason = "to build each layer's Hessian" if self.method == "gptq" else "for AWQ's scale search"
            raise ConfigError(f"format recipe: method={self.method!r} needs calibration_data= (batches the model can "
                              f"run) {reason}")  # fmt: skip
        if self.method != "round" and "weight" not in self.roles:
            raise ConfigError(f"format recipe: method={self.method!r} rounds weights, but roles={list(self.roles)} "
                              "has no 'weight'")  # fmt: skip

    def needs_data(self) -> bool:
        return self.method != "round"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "params": dict(self.params)}


ATTENTION_ROLES = ("query", "key", "value", "probabilities")  # lowbit.nn.attention's roles


@dataclasses.dataclass
class KVCache(Recipe):
    """Simulated: the keys (after the rotary embedding) and values every attention layer of a Hugging Face
    decoder stores and attends to, in ``format`` (a name with ``params``, or a spec's dict), in prefill and in
    each generation step; ``roles`` adds the queries and the attention probabilities (lowbit.nn.attention);
    ``key_per_channel`` blocks the keys along the tokens of each channel (KIVI) instead of along head_dim."""

    name: ClassVar[str] = "kv_cache"
    format: Any = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    roles: tuple[str, ...] = ("key", "value")
    key_per_channel: bool = False

    def check(self) -> None:
        if not isinstance(self.format, (str, dict)) or not self.format:
            raise ConfigError(f"{self.name}: format={self.format!r} must be a format name or a spec's dict")
        if not isinstance(self.params, dict):
            raise ConfigError(f"{self.name}: params={self.params!r} must be a table of format parameters")
        if isinstance(self.roles, str) or not isinstance(self.roles, (tuple, list)) or not self.roles:
            raise ConfigError(f"{self.name}: roles={self.roles!r} must be a non-empty list of "
                              f"{', '.join(ATTENTION_ROLES)}")  # fmt: skip
        self.roles = tuple(self.roles)
        for role in self.roles:
            _choice(self.name, "roles", role, ATTENTION_ROLES)
        _flag(self.name, "key_per_channel", self.key_per_channel)
        self.spec()  # the format and its parameters, checked now

    def spec(self):
        """The format spec every role in ``roles`` takes (ConfigError naming format / params if invalid)."""
        from lowbit.errors import FormatError
        from lowbit.formats import resolve

        try:
            if isinstance(self.format, dict):
                if self.params:
                    raise ConfigError(f"{self.name}: give params= or a spec dict as format=, not both")
                data = dict(self.format)
                return resolve(data.pop("name", None), **data)
            return resolve(self.format, **self.params)
        except FormatError as error:
            raise ConfigError(f"{self.name}: format={self.format!r} params={self.params!r}: {error}") from error

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "params": dict(self.params)}


@dataclasses.dataclass
class Rotate(Recipe):
    """QuaRot-style Hadamard rotation of a Llama-architecture decoder (``lowbit.flows.rotation``): norms folded,
    the residual stream rotated, values / o_proj rotated per head, optionally an online Hadamard before each
    down_proj; the float function is kept and every Linear stays an nn.Linear for the next recipe.
    ``online_rotate`` is MASE's ``rotate_llama`` spelling of ``online_down``."""

    name: ClassVar[str] = "rotate"
    online_down: bool = False
    rotate_heads: bool = True
    random_signs: bool = True
    seed: int = 0
    online_rotate: bool | None = None

    def check(self) -> None:
        _flag(self.name, "online_down", self.online_down)
        _flag(self.name, "rotate_heads", self.rotate_heads)
        _flag(self.name, "random_signs", self.random_signs)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"{self.name}: seed={self.seed!r} must be a non-negative int")
        if self.online_rotate is not None:
            _flag(self.name, "online_rotate", self.online_rotate)
        if self.skip:
            raise ConfigError(f"{self.name}: skip={list(self.skip)!r} is not supported (the residual rotation spans "
                              "every layer; skip layers in the quantization recipe that follows)")  # fmt: skip


@dataclasses.dataclass
class PassArgs(Recipe):
    """MASE-style ``pass_args`` (``{"by": "type", "linear": {"config": {...}}}``); ``real`` converts every
    quantized Linear whose formats a kernel runs into the real module (the others stay simulated)."""

    name: ClassVar[str] = "pass_args"
    pass_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    real: bool = True
    calibration_data: Any = None  # MASE's "gptq" table: the batches its Hessians come from

    def check(self) -> None:
        if not isinstance(self.pass_args, dict) or not self.pass_args:
            raise ConfigError("pass_args recipe: pass_args must be a non-empty table")
        _flag(self.name, "real", self.real)
        if "gptq" in self.pass_args and self.calibration_data is None:
            raise ConfigError("pass_args recipe: a \"gptq\" table needs calibration_data= (batches the model can run; "
                              "MASE's dataset / nsamples / seqlen are not read)")  # fmt: skip


RECIPES: dict[str, type[Recipe]] = {cls.name: cls for cls in (Int8Dynamic, Int8WeightOnly, Int4WeightOnly, W8A8Static,
                                                                GGUFQ4_0, GGUFQ4_1, GGUFQ5_0, GGUFQ8_0, GGUFQ4_K,
                                                                GGUFQ6_K, FormatRecipe, KVCache, PassArgs, Rotate)}  # fmt: skip
REAL_RECIPES = tuple(name for name, cls in RECIPES.items() if cls.builds_real_modules)  # the gguf_* names are also formats: as a recipe they mean the real GGMLLinear


Handler = Callable[[Any, Recipe], dict[str, Any]]
_HANDLERS: dict[type[Recipe], tuple[Handler, bool]] = {}


def handles(*recipe_classes: type[Recipe], whole_model: bool = False) -> Callable[[Handler], Handler]:
    """Register the decorated ``function(model, recipe) -> info`` as the handler of ``recipe_classes`` (and of
    their subclasses). It gets the nn.Module to change (a QGraph's GraphModule), or with ``whole_model`` the
    object the user passed."""

    def register(function: Handler) -> Handler:
        for cls in recipe_classes:
            if cls in _HANDLERS and _HANDLERS[cls][0] is not function:
                raise ConfigError(f"recipe {cls.__name__} has a handler already ({_HANDLERS[cls][0].__qualname__})")
            _HANDLERS[cls] = (function, whole_model)
        return function

    return register


def handler_for(recipe: Recipe) -> Callable[[Any], dict[str, Any]]:
    """``run(model) -> info``: the registered handler of ``recipe``'s class (the nearest registered base)."""
    for cls in type(recipe).__mro__:
        if cls in _HANDLERS:
            function, whole_model = _HANDLERS[cls]
            return lambda model: function(model if whole_model else root_module(model), recipe)
    raise ConfigError(f"recipe {type(recipe).__name__} ({recipe.name!r}) has no handler registered (lowbit.flows."
                      "recipes.handles); import the module that registers it before quantizing")  # fmt: skip


def make_recipe(config: Any, **options: Any) -> Recipe:
    """A typed recipe from what :func:`lowbit.quantize_` accepts: a Recipe (options must be empty), a recipe
    name, a format name (every role of every Linear / Conv), a ``{"recipe": ...}`` dict, or MASE pass_args."""
    if isinstance(config, Recipe):
        if options:
            return dataclasses.replace(config, **_known(type(config), options))
        return config
    if isinstance(config, dict):
        if "recipe" in config:
            data = dict(config)
            return make_recipe(data.pop("recipe"), **data, **options)
        if "by" in config or "default" in config:
            return PassArgs(pass_args=config, **_known(PassArgs, options))
        return FormatRecipe(format=config, **_known(FormatRecipe, options))
    if not isinstance(config, str):
        raise ConfigError(f"quantize_: config must be a recipe, a recipe or format name, or pass_args, "
                          f"got {type(config).__name__}")  # fmt: skip
    if config in RECIPES:
        return RECIPES[config](**_known(RECIPES[config], options))
    from lowbit.formats import list_formats

    if config in list_formats():
        return FormatRecipe(format=config, **_known(FormatRecipe, options, config))
    names = [*REAL_RECIPES, KVCache.name, *list_formats()]
    raise ConfigError(f"unknown recipe or format {config!r}{did_you_mean(config, names)}; recipes: "
                      f"{', '.join((*REAL_RECIPES, KVCache.name))}, or any format name "
                      "(lowbit.list_formats())")  # fmt: skip


def _known(cls: type[Recipe], options: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    fields = [field.name for field in dataclasses.fields(cls)]
    unknown = [key for key in options if key not in fields]
    if unknown:
        raise ConfigError(unknown_option(name or cls.name, unknown[0], fields))
    return options


def unknown_option(recipe: str, key: str, valid: list[str]) -> str:
    """The one wording of a recipe option nobody knows, from Python and from a TOML table alike."""
    return f"recipe {recipe!r}: unknown option {key!r}{did_you_mean(key, valid)}; options: {', '.join(valid)}"


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    """The recipe :meth:`Recipe.to_dict` wrote."""
    if not isinstance(data, dict) or "recipe" not in data:
        raise ConfigError(f"a recipe table needs a 'recipe' key, got {data!r}")
    return make_recipe(dict(data))
