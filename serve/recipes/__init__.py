"""The recipes wing, and its registry: every optimization recipe by name, what builds it and
where it runs. Importing this package is cheap (no torch, no runtime): each recipe's module is
imported when that recipe is built.

A recipe makes the model an arm runs from its fp32 source model. Two kinds:

- **torch** recipes transform the loaded fp32 model (`build(model, device, plan)`):
  serve.recipes.eager (`fp32`, `int8-dynamic`, `int8-dynamic-per-channel`, `int8-torchao`,
  `fp16`, `bf16`, `compiled`), serve.recipes.fp16_graphs (`fp16-graphs`: fp16, small batches
  replayed as CUDA graphs), serve.recipes.accuracy_aware (`accuracy-aware`: a per-layer plan
  keeps the sensitive layers in high precision, the rest int8);
- **runtime** recipes build an artifact from the model folder, cached on disk
  (serve.recipes.artifact), and serve it with an inference runtime (`build(variant, recipe,
  say) -> (model, decision)`): serve.recipes.onnx (`onnx-fp32`, `onnx-int8`: ONNX Runtime),
  serve.recipes.ct2_int8 (`ct2-int8`: CTranslate2), serve.recipes.ov_int8 (`ov-int8`: OpenVINO,
  quantized by NNCF).

`auto` is not a recipe but a choice among them, by measurement on this host (serve.recipes.auto).
The settings' `Recipe` literal (rollout.settings) names the same recipes and `auto`; a test ties
the two. Where the variant that runs a recipe lives: serve.recipes.variants; its model folder,
labels, tokenizer and versions: serve.recipes.source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from rollout.settings import ModelSettings

AUTO = "auto"


@dataclass(frozen=True)
class Recipe:
    """One recipe: its name, where it runs, its kind, and where its build function lives
    (`module:function`, imported when it is built)."""

    name: str
    builder: str
    devices: tuple[str, ...] = ("cpu", "cuda")
    runtime: bool = False  # an artifact served by an inference runtime, not a torch model
    needs_plan: bool = False  # built from a per-layer plan (accuracy-aware)
    # few distinct input shapes wanted (compilation, CUDA graphs); runtimes want them too
    fixed_shapes: bool = False

    @property
    def build(self) -> Callable[..., Any]:
        module, function = self.builder.split(":")
        return getattr(import_module(module), function)

    def exact_shapes(self, device: str) -> bool:
        """Whether its inputs are padded to a chunk's longest row only (serve.common.batching):
        eager torch on the CPU takes any shape at no cost; a runtime prepares kernels per
        shape, compilation and CUDA graphs want few shapes."""
        return device == "cpu" and not self.runtime and not self.fixed_shapes

    def check_device(self, device: str) -> None:
        """ValueError unless this recipe runs on `device`."""
        if device not in self.devices:
            raise ValueError(f"{self.name} runs on {' or '.join(self.devices).upper()} only")


def _eager(function: str) -> str:
    return f"serve.recipes.eager:{function}"


RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in (
    Recipe("fp32", _eager("fp32")),
    Recipe("int8-dynamic", _eager("int8_dynamic"), devices=("cpu",)),
    Recipe("int8-dynamic-per-channel", _eager("int8_dynamic_per_channel"), devices=("cpu",)),
    Recipe("int8-torchao", _eager("int8_torchao")),
    Recipe("fp16", _eager("fp16")),
    Recipe("bf16", _eager("bf16")),
    Recipe("compiled", _eager("compiled"), fixed_shapes=True),
    Recipe("accuracy-aware", "serve.recipes.accuracy_aware:build", devices=("cpu",),
           needs_plan=True),
    Recipe("fp16-graphs", "serve.recipes.fp16_graphs:build", devices=("cuda",),
           fixed_shapes=True),
    Recipe("onnx-fp32", "serve.recipes.onnx.build:build_recipe", devices=("cpu",), runtime=True),
    Recipe("onnx-int8", "serve.recipes.onnx.build:build_recipe", devices=("cpu",), runtime=True),
    Recipe("ct2-int8", "serve.recipes.ct2_int8:build_recipe", devices=("cpu",), runtime=True),
    Recipe("ov-int8", "serve.recipes.ov_int8:build_recipe", devices=("cpu",), runtime=True),
)}


def recipe(name: str) -> Recipe:
    """The recipe called `name` (ValueError naming the known ones otherwise)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}: one of {', '.join(RECIPES)} or "
                         f"{AUTO}") from None


def resolve_device(settings: ModelSettings) -> str:
    """Where the models run: `CANARY_DEVICE`, `auto` meaning CUDA when there is one."""
    import torch

    if settings.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CANARY_DEVICE=cuda but no CUDA device is available")
    return settings.device


def recipe_for(arm: str, settings: ModelSettings, device: str) -> str:
    """The arm's configured recipe: `baseline_recipe` (fp32 by default, never `auto`) or
    `optimized_recipe`, where `auto` is decided by measurement when the variant loads
    (serve.recipes.auto.choose)."""
    return settings.baseline_recipe if arm == "baseline" else settings.optimized_recipe
