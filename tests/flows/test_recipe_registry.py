"""Recipes and their handlers: a new algorithm is a recipe class, a handler registered with ``handles``, and
the door finds it (issue 42's "a recipe + a handler + tests")."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.flows import RECIPES, REAL_RECIPES, handler_for, handles
from lowbit.flows.recipes import Recipe, recipe
from lowbit.graph.plan import Simulated, apply
from lowbit.nn.roles import RoleFormats


def test_every_named_recipe_has_a_handler():
    from lowbit.flows import kv_cache, real, rotation, simulated  # noqa: F401

    for name, cls in RECIPES.items():
        assert callable(handler_for(cls.__new__(cls))), name
    assert set(REAL_RECIPES) == {name for name, cls in RECIPES.items() if cls.builds_real_modules}


@pytest.fixture
def clean_registry():
    """Whatever a test registers is gone after it (no other test sees its recipe names)."""
    from lowbit.flows import recipe_base

    classes, handlers = dict(recipe_base.RECIPE_CLASSES), dict(recipe_base._HANDLERS)
    yield
    recipe_base.RECIPE_CLASSES.clear()
    recipe_base.RECIPE_CLASSES.update(classes)
    recipe_base._HANDLERS.clear()
    recipe_base._HANDLERS.update(handlers)


def test_a_new_recipe_is_a_class_and_a_handler(clean_registry):
    @recipe
    @dataclasses.dataclass
    class HalfWidthLinears(Recipe):
        name: ClassVar[str] = "test_half_width"
        width: int = 4

    @handles(HalfWidthLinears)
    def handle(root: nn.Module, recipe: HalfWidthLinears) -> dict:
        spec = lowbit.formats.resolve("integer", width=recipe.width, frac_width=recipe.width // 2)
        plan = {name: Simulated(RoleFormats(weight=spec)) for name, module in root.named_modules()
                if type(module) is nn.Linear}  # fmt: skip
        return {"recipe": recipe.name, "quantized": list(apply(root, plan).placed)}

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    _, info = lowbit.quantize_model(model, "test_half_width", width=6)  # by name, as a TOML table names it
    assert info == {"recipe": "test_half_width", "quantized": ["0", "2"]}
    x = torch.randn(3, 8)
    weight = lowbit.quantize(model[0].weight.detach(), "integer", width=6, frac_width=3)
    assert torch.equal(model[0](x), nn.functional.linear(x, weight, model[0].bias))


def test_a_recipe_without_a_handler_and_a_second_handler_or_name_are_refused(clean_registry):
    @dataclasses.dataclass
    class Orphan(Recipe):
        name: ClassVar[str] = "test_orphan"

    with pytest.raises(ConfigError, match="no handler registered"):
        lowbit.quantize_(nn.Sequential(nn.Linear(2, 2)), Orphan())

    handles(Orphan)(lambda root, options: {})
    with pytest.raises(ConfigError, match="has a handler already"):
        handles(Orphan)(lambda root, options: {"other": True})

    @dataclasses.dataclass
    class Impostor(Recipe):
        name: ClassVar[str] = "int8_dynamic"

    with pytest.raises(ConfigError, match="taken by Int8Dynamic"):
        recipe(Impostor)


def test_option_checks_share_one_wording_across_recipes_search_and_the_report():
    from lowbit.errors import ReportError
    from lowbit.report.analysis import _flag
    from lowbit.search.config import parse_search

    seed = {"search_space": {"seed": {"default": {"choices": ["int8"]}}}}
    with pytest.raises(ConfigError, match=r"^config: setup.n_trials=0 must be a positive int$"):
        parse_search({**seed, "strategy": {"setup": {"n_trials": 0}}})
    with pytest.raises(ConfigError, match=r"^rotate: online_down='yes' must be true or false$"):
        lowbit.quantize_(nn.Sequential(nn.Linear(2, 2)), "rotate", online_down="yes")
    with pytest.raises(ReportError, match=r"gradients='yes' must be true or false$"):
        _flag("yes", "gradients")
