"""A causal LM under a recipe: the registry's torch recipes (serve.recipes), which transform any
model of `nn.Linear` layers, applied to the fp32 model as an encoder arm's are (in place where
the recipe works in place: a caller that keeps the fp32 model passes a copy).

Runtime recipes (ONNX Runtime, CTranslate2, OpenVINO) and the accuracy-aware plan build encoder
artifacts and are refused, naming the recipes that build a causal LM. `auto` is accepted
here and resolved before building (serve.recipes.auto.causal.resolve): measured, then one of
these recipes.
"""

from __future__ import annotations

from rollout.settings import ModelSettings
from serve.recipes import AUTO, RECIPES, recipe, recipe_for
from serve.recipes.source import is_causal_lm, model_dir


def causal_recipes(device: str = "cpu") -> list[str]:
    """The registry's recipes that build a causal LM on `device`."""
    return [name for name, spec in RECIPES.items()
            if not (spec.runtime or spec.needs_plan) and device in spec.devices]


def check(name: str, device: str = "cpu"):
    """The recipe `name` as it builds a causal LM on `device` (None for `auto`, which is
    resolved to one before building): ValueError in one line for one that does not, naming
    those that do."""
    if name == AUTO:
        return None
    spec = recipe(name)
    if spec.runtime or spec.needs_plan:
        raise ValueError(f"{name} builds an encoder artifact or plan, not a causal LM: one of "
                         f"{', '.join(causal_recipes(device))}")
    spec.check_device(device)
    return spec


def build(fp32, name: str, device: str = "cpu"):
    """The model `name` makes of `fp32` (ValueError for a recipe that does not build a causal
    LM, naming those that do; `auto` must be resolved first)."""
    spec = check(name, device)
    if spec is None:
        raise ValueError("auto is resolved to a recipe before a causal LM is built "
                         "(serve.recipes.auto.causal.resolve)")
    return spec.build(fp32, device).eval()


def serves_causal_lm(settings: ModelSettings) -> bool:
    """Whether the arms generate: the baseline folder holds a causal LM. Then the optimized
    folder must hold one too and both arms' recipes must build one (ValueError in one line,
    before anything is deployed). A baseline folder this node does not have (a cluster whose
    models live on the workers) reads as an encoder's; its replicas then say what it is."""
    try:
        if not is_causal_lm(model_dir(settings, "baseline", generative=None)):
            return False
    except FileNotFoundError:
        return False
    model_dir(settings, "optimized", generative=True)
    for arm in ("baseline", "optimized"):
        check(recipe_for(arm, settings, "cpu"))
    return True

