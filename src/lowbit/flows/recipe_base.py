"""The recipe base class and the handler registry: what every recipe has, and how the door finds the
function that carries a recipe out (``handles`` registers it beside its code, ``handler_for`` finds it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from lowbit._model import root_module
from lowbit.errors import ConfigError

RUN_TIME_FIELDS = ("calibration_data", "calibration")  # batches / states: given at run time, never saved
RECIPE_CLASSES: dict[str, type[Recipe]] = {}  # name -> class, in the order of definition


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


def recipe(cls: type[Recipe]) -> type[Recipe]:
    """Register a recipe class under its ``name`` (what ``quantize_(model, "<name>")`` and TOML tables say)."""
    known = RECIPE_CLASSES.get(cls.name)
    if not cls.name or (known is not None and known is not cls):
        raise ConfigError(f"recipe class {cls.__name__}: name {cls.name!r} is empty or taken by {known.__name__}")
    RECIPE_CLASSES[cls.name] = cls
    return cls


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
