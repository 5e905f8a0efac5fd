"""``[passes.quantize_model]``: :func:`lowbit.quantize_model` from a TOML table, simulated and real alike.

::

    [passes.quantize_model]
    recipe = "int4_weight_only"   # a real recipe (flows.recipes.REAL_RECIPES) or a format name
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

import dataclasses
from typing import Any

from torch import nn

from lowbit._checks import check_positive_int
from lowbit.errors import ConfigError, did_you_mean
from lowbit.flows.recipes import RUN_TIME_FIELDS as RUN_TIME_KEYS  # objects, never in a file

PIPELINE_KEYS = ("recipe", "num_batches")
DEFAULT_BATCHES = 8


def _file_recipes() -> tuple[str, ...]:
    """The recipe names a file may give: the real recipes (their modules are saved and loaded by record)."""
    from lowbit.flows.recipes import REAL_RECIPES

    return REAL_RECIPES


def recipe_kind(recipe: Any) -> str:
    """"real" for a real recipe's name, "format" for a format name; ConfigError otherwise."""
    from lowbit.formats import list_formats

    if not isinstance(recipe, str) or not recipe:
        raise ConfigError(f"[passes.quantize_model] recipe must be a recipe or format name, got {recipe!r}")
    if recipe in _file_recipes():
        return "real"
    if recipe in list_formats():
        return "format"
    names = [*_file_recipes(), *list_formats()]
    raise ConfigError(f"[passes.quantize_model] unknown recipe {recipe!r}{did_you_mean(recipe, names)}; recipes: "
                      f"{', '.join(_file_recipes())}, or a format name (lowbit formats)")  # fmt: skip


def _fields(recipe: str) -> list[str]:
    """The fields of the recipe dataclass a table of this recipe builds."""
    from lowbit.flows.recipes import RECIPES, FormatRecipe

    cls = RECIPES[recipe] if recipe_kind(recipe) == "real" else FormatRecipe
    return [field.name for field in dataclasses.fields(cls)]


def _options(recipe: str) -> list[str]:
    """The keys a table of this recipe may hold: its fields less those a file cannot hold (calibration
    objects; a format recipe's format, which the recipe key names)."""
    return [name for name in _fields(recipe) if name not in RUN_TIME_KEYS and name != "format"]


def check_quantize_model(args: dict[str, Any]) -> None:
    """Every key of the table, before any pass runs; the values are checked by the typed recipe itself, the
    one validation that Python calls go through too."""
    where = "[passes.quantize_model]"
    if "recipe" not in args:
        raise ConfigError(f"{where} needs recipe = \"...\" ({', '.join(_file_recipes())}, or a format name)")
    recipe_kind(args["recipe"])  # an unknown recipe or format name is the first error
    _check_batches(args.get("num_batches"), where)
    valid = _options(args["recipe"])
    for key in args:
        if key in PIPELINE_KEYS:
            continue
        if key in RUN_TIME_KEYS:
            raise ConfigError(f"{where} {key} cannot be given in a file: the pass takes num_batches batches of the run's dataset")
        if key not in valid:
            from lowbit.flows.recipes import unknown_option

            raise ConfigError(f"{where} {unknown_option(args['recipe'], key, [*PIPELINE_KEYS, *valid])}")
    needs_data(args)  # builds the typed recipe: its own check of every value (roles included)


def _check_batches(value: Any, where: str) -> None:
    if value is not None:
        check_positive_int(where, "num_batches", value)


def needs_data(args: dict[str, Any]) -> bool:
    """Whether the pass gives the recipe calibration batches: the recipe runs them (GPTQ, w8a8_static, ...), or
    num_batches is given to a recipe that takes them. Builds the typed recipe (with a stand-in for the data
    where it takes some), so a bad value is the recipe's own one-line ConfigError."""
    recipe, options = recipe_call(args)
    takes_data = "calibration_data" in _fields(recipe)
    if takes_data and args.get("num_batches") is not None:
        _built(recipe, {**options, "calibration_data": ()})
        return True
    try:
        _built(recipe, options)
        return False
    except ConfigError as without_data:
        if takes_data:
            try:
                if _built(recipe, {**options, "calibration_data": ()}).needs_data():
                    return True
            except ConfigError:
                pass
        raise without_data from None


def _built(recipe: str, options: dict[str, Any]) -> Any:
    from lowbit.flows.recipes import make_recipe

    try:
        return make_recipe(recipe, **options)
    except ConfigError as error:
        raise ConfigError(f"[passes.quantize_model] {error}") from None


def recipe_call(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What :func:`lowbit.quantize_model` is given: (recipe or format name, options), data not included."""
    return args["recipe"], {k: v for k, v in args.items() if k not in PIPELINE_KEYS}


def saved_recipe(args: dict[str, Any]) -> dict[str, Any]:
    """The plain-data record of the pass, written beside a saved model (no data batches)."""
    return {key: value for key, value in args.items() if key not in RUN_TIME_KEYS}


def rebuild_structure(model: nn.Module, recipe: dict[str, Any]) -> nn.Module:
    """Apply the simulated part of a recorded recipe to a float model (no data needed): the quantized
    layers a saved file's tensors then load into. Real modules are rebuilt by ``lowbit.load`` itself."""
    if recipe_kind(recipe["recipe"]) != "format":
        return model
    from lowbit.flows import quantize_model

    name, options = recipe_call(recipe)
    if options.get("method") == "gptq":  # the layers GPTQ made are the format's layers: their weights load in
        options["method"] = "round"
    model, _ = quantize_model(model, name, **options)
    return model


__all__ = ["check_quantize_model", "needs_data", "rebuild_structure", "recipe_call", "recipe_kind",
           "saved_recipe"]  # fmt: skip
