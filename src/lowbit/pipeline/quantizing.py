"""``[passes.quantize_model]``: :func:`lowbit.quantize_model` from a TOML table, simulated and real alike.

::

    [passes.quantize_model]
    recipe = "int4_weight_only"   # int8_dynamic, int8_weight_only, int4_weight_only, w8a8_static, or a format name
    method = "gptq"               # any option of the recipe, spelled as in Python
    num_batches = 4               # calibration batches taken from the run's dataset (train split)

Calibration data is what a file cannot hold: the pass gives the recipe ``num_batches`` batches of the run's
dataset when the recipe needs them (GPTQ, ``w8a8_static``) or when ``num_batches`` is given (the int4
search then weighs input channels by their mean square). A format name (``"mxfp4_e2m1"``) quantizes, in
simulation, the inputs, weights and biases of every Linear / Conv layer (``params``: the format's parameters,
``roles``: which roles). What the pass did is recorded (:func:`saved_recipe`) so that a saved model can be
rebuilt without the data.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from lowbit.errors import ConfigError, did_you_mean

REAL_RECIPES = ("int8_dynamic", "int8_weight_only", "int4_weight_only", "w8a8_static")
PIPELINE_KEYS = ("recipe", "num_batches")
RUN_TIME_KEYS = ("calibration_data", "calibration")  # objects, never in a file
FORMAT_ROLES = ("data_in", "weight", "bias", "data_out")
DEFAULT_BATCHES = 8

# Options of each real recipe and the type each must have (checked before any work).
_BOOL, _INT, _NUMBER, _TEXT, _LIST = "true or false", "an integer", "a number", "a string", "a list of strings"
_BOOL_OR_AUTO = 'true, false or "auto"'
RECIPE_OPTIONS: dict[str, dict[str, str]] = {
    "int8_dynamic": {"act_symmetric": _BOOL, "act_granularity": _TEXT, "act_bits": _INT, "include_conv": _BOOL_OR_AUTO,
                     "conv_channels_last": _BOOL, "skip": _LIST},
    "int8_weight_only": {"compute_dtype": _TEXT, "skip": _LIST},
    "int4_weight_only": {"group_size": _INT, "scale_dtype": _TEXT, "search": _BOOL, "compute_dtype": _TEXT,
                         "method": _TEXT, "damping": _NUMBER, "block_size": _INT, "act_order": _BOOL,
                         "mask_padding": _BOOL, "skip": _LIST},
    "w8a8_static": {"include_conv": _BOOL_OR_AUTO, "conv_channels_last": _BOOL, "skip": _LIST},
}  # fmt: skip
FORMAT_OPTIONS = {"params": "a table", "roles": _LIST, "method": _TEXT, "damping": _NUMBER, "block_size": _INT,
                  "act_order": _BOOL, "static_groups": _BOOL}  # fmt: skip


def recipe_kind(recipe: Any) -> str:
    """"real" for the four real recipes, "format" for a format name; ConfigError otherwise."""
    from lowbit.formats import list_formats

    if not isinstance(recipe, str) or not recipe:
        raise ConfigError(f"[passes.quantize_model] recipe must be a recipe or format name, got {recipe!r}")
    if recipe in REAL_RECIPES:
        return "real"
    if recipe in list_formats():
        return "format"
    names = [*REAL_RECIPES, *list_formats()]
    raise ConfigError(f"[passes.quantize_model] unknown recipe {recipe!r}{did_you_mean(recipe, names)}; recipes: "
                      f"{', '.join(REAL_RECIPES)}, or a format name (lowbit formats)")  # fmt: skip


def check_quantize_model(args: dict[str, Any]) -> None:
    """Every key and value type of the table, before any pass runs."""
    where = "[passes.quantize_model]"
    if "recipe" not in args:
        raise ConfigError(f"{where} needs recipe = \"...\" ({', '.join(REAL_RECIPES)}, or a format name)")
    kind = recipe_kind(args["recipe"])
    _check_batches(args.get("num_batches"), where)
    valid = RECIPE_OPTIONS[args["recipe"]] if kind == "real" else FORMAT_OPTIONS
    for key, value in args.items():
        if key in PIPELINE_KEYS:
            continue
        if key in RUN_TIME_KEYS:
            raise ConfigError(f"{where} {key} cannot be given in a file: the pass takes num_batches batches of the run's dataset")
        if key not in valid:
            names = [*PIPELINE_KEYS, *valid]
            raise ConfigError(f"{where} recipe {args['recipe']!r}: unknown key {key!r}{did_you_mean(key, names)}; "
                              f"valid keys: {', '.join(names)}")  # fmt: skip
        _check_type(where, key, value, valid[key])
    if kind == "format":
        _check_roles(args)
    if args.get("method", "round") not in ("round", "gptq"):
        raise ConfigError(f"{where} method = {args['method']!r}{did_you_mean(str(args['method']), ['round', 'gptq'])}; "
                          "legal: round, gptq")  # fmt: skip
    _check_with_typed_recipe(args)


def _check_with_typed_recipe(args: dict[str, Any]) -> None:
    """The typed recipe's own checks (legal values), with a stand-in for the calibration data."""
    try:
        from lowbit.flows.recipes import make_recipe
    except ImportError:  # an older lowbit: the recipe checks its options when it runs
        return
    recipe, options = recipe_call(args)
    if needs_data(args):
        options["calibration_data"] = ()
    try:
        make_recipe(recipe, **options)
    except ConfigError as error:
        raise ConfigError(f"[passes.quantize_model] {error}") from None


def _check_batches(value: Any, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{where} num_batches must be a positive integer, got {value!r}")


def _check_type(where: str, key: str, value: Any, kind: str) -> None:
    ok = {
        _BOOL: lambda v: isinstance(v, bool),
        _BOOL_OR_AUTO: lambda v: isinstance(v, bool) or v == "auto",
        _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
        _NUMBER: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        _TEXT: lambda v: isinstance(v, str) or v is None,
        _LIST: lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, str) for i in v)),
        "a table": lambda v: isinstance(v, dict),
    }[kind]
    if not ok(value):
        raise ConfigError(f"{where} {key} must be {kind}, got {value!r}")


def needs_data(args: dict[str, Any]) -> bool:
    """Whether the recipe runs calibration batches (GPTQ, w8a8_static, or num_batches given)."""
    recipe = args["recipe"]
    if recipe == "w8a8_static" or args.get("method") == "gptq":  # int4_weight_only or a format name
        return True
    return recipe == "int4_weight_only" and args.get("num_batches") is not None


def recipe_call(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What :func:`lowbit.quantize_model` is given: (recipe or format name, options), data not included."""
    return args["recipe"], {k: v for k, v in args.items() if k not in PIPELINE_KEYS}


def _check_roles(args: dict[str, Any]) -> None:
    roles = args.get("roles", ["data_in", "weight", "bias"])
    roles = [roles] if isinstance(roles, str) else roles
    for role in roles:
        if role not in FORMAT_ROLES:
            raise ConfigError(f"[passes.quantize_model] roles: {role!r}{did_you_mean(role, FORMAT_ROLES)}; "
                              f"roles: {', '.join(FORMAT_ROLES)}")  # fmt: skip
    if not {"data_in", "weight"} <= set(roles):
        raise ConfigError("[passes.quantize_model] roles must include data_in and weight (a Linear needs both)")


def saved_recipe(args: dict[str, Any]) -> dict[str, Any]:
    """The plain-data record of the pass, written beside a saved model (no data batches)."""
    return {key: value for key, value in args.items() if key not in RUN_TIME_KEYS}


def rebuild_structure(model: nn.Module, recipe: dict[str, Any]) -> nn.Module:
    """Apply the simulated part of a recorded recipe to a float model (no data needed): the quantized
    layers a saved file's tensors then load into. Real modules are rebuilt by ``lowbit.load`` itself."""
    if recipe_kind(recipe["recipe"]) != "format":
        return model
    import lowbit

    name, options = recipe_call(recipe)
    if options.get("method") == "gptq":  # the layers GPTQ made are the format's layers: their weights load in
        options["method"] = "round"
    model, _ = lowbit.quantize_model(model, name, **options)
    return model


__all__ = ["REAL_RECIPES", "check_quantize_model", "needs_data", "rebuild_structure", "recipe_call", "recipe_kind",
           "saved_recipe"]  # fmt: skip
