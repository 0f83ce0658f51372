"""The recipe registry (serve.recipes): one place names every recipe, and the settings' `Recipe`
literal (rollout.settings) names the same ones and `auto`; each entry's build function exists,
and a recipe refuses a device it does not run on."""

from __future__ import annotations

import inspect
from typing import get_args

import pytest

from rollout.settings import Recipe as RecipeLiteral
from serve.recipes import AUTO, RECIPES, recipe


def test_the_settings_literal_and_the_registry_name_the_same_recipes():
    assert set(get_args(RecipeLiteral)) == {AUTO, *RECIPES}
    assert AUTO not in RECIPES  # a choice among recipes, not one


def test_every_entry_builds_with_the_signature_of_its_kind():
    for name, spec in RECIPES.items():
        parameters = list(inspect.signature(spec.build).parameters)
        if spec.runtime:
            assert parameters[:3] == ["variant", "recipe", "progress"], name
        elif spec.needs_plan:
            assert parameters == ["model", "device", "plan"], name
        else:
            assert parameters == ["model", "device"], name
        assert set(spec.devices) <= {"cpu", "cuda"} and spec.devices, name


def test_an_unknown_recipe_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown recipe 'int4'.*fp32.*ov-int8.* or auto"):
        recipe("int4")


def test_a_recipe_refuses_a_device_it_does_not_run_on():
    recipe("bf16").check_device("cpu")
    with pytest.raises(ValueError, match="int8-dynamic runs on CPU only"):
        recipe("int8-dynamic").check_device("cuda")
    with pytest.raises(ValueError, match="fp16-graphs runs on CUDA only"):
        recipe("fp16-graphs").check_device("cpu")


def test_the_eager_recipes_transform_a_model():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert recipe("bf16").build(model, "cpu")[0].weight.dtype == torch.bfloat16
    quantized = recipe("int8-dynamic").build(torch.nn.Sequential(torch.nn.Linear(4, 4)), "cpu")
    assert "quantized" in type(quantized[0]).__module__
    with pytest.raises(ValueError, match="needs a plan"):
        recipe("accuracy-aware").build(model, "cpu", None)
