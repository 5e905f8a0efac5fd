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
from typing import Any, ClassVar

from lowbit.errors import ConfigError, did_you_mean
from lowbit.flows.checks import granularity_params  # noqa: F401 (public here too)
from lowbit.flows.checks import choice as _choice
from lowbit.flows.checks import flag as _flag
from lowbit.flows.checks import positive_int as _positive_int
from lowbit.flows.recipe_base import (  # noqa: F401 (public here)
    RECIPE_CLASSES,
    RUN_TIME_FIELDS,
    Handler,
    Recipe,
    handler_for,
    handles,
    recipe,
)
from lowbit.flows.recipes_real import (  # noqa: F401 (public here)
    COMPUTE_DTYPES,
    GGUFQ4_0,
    GGUFQ4_1,
    GGUFQ4_K,
    GGUFQ5_0,
    GGUFQ6_K,
    GGUFQ8_0,
    GGUFWeightOnly,
    Int4WeightOnly,
    Int8Dynamic,
    Int8WeightOnly,
    W8A8Static,
)


@recipe
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


@recipe
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


@recipe
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


@recipe
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


RECIPES = RECIPE_CLASSES  # name -> class of every named recipe (each registered with @recipe where it is defined)
REAL_RECIPES = tuple(name for name, cls in RECIPES.items() if cls.builds_real_modules)  # the gguf_* names are also formats: as a recipe they mean the real GGMLLinear


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
