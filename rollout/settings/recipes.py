"""Building a recipe: what the optimized recipes calibrate to and where they cache what they
build."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from rollout.settings.base import CONFIG


class RecipeSettings(BaseSettings):
    """Building a recipe

    What building an arm's recipe reads beyond the model's own settings: `auto`'s choice and
    its cache, the accuracy-aware plan's target, the runtime recipes' calibration and artifacts
    (serving layer: serve.recipes; each recipe's cache key hashes the ones it reads).
    """

    model_config = CONFIG

    torchscript: bool = Field(
        True,
        description="run an eager CPU torch recipe (fp32, bf16, int8-dynamic, ...) as a frozen "
        "TorchScript trace, kept only where it answers as the eager model does: the same "
        "kernels, called from C++ without Python's interpreter lock, so the forward does not "
        "wait on a process's HTTP and telemetry threads; off: the eager model",
    )
    hide_native_bf16: bool = Field(
        False,
        description="`auto` ignores a CPU's native bf16, so that a bf16 machine measures and "
        "serves the int8 runtimes as an AVX2-only one would; part of `auto`'s cache key",
    )
    auto_choice_dir: str | None = Field(
        None,
        description="where `auto` caches its choice and evidence (one JSON file per weights, "
        "hardware, library versions and settings); none: `$XDG_CACHE_HOME/canary-gateway/auto`, "
        "else `~/.cache/canary-gateway/auto`",
    )
    plan_dir: str | None = Field(
        None, description="where accuracy-aware plans are cached (shipped plans in "
        "`serve/recipes/plans/` are read too); none: `~/.cache/canary-gateway/plans`"
    )
    aware_target_agreement: float = Field(
        0.998, gt=0, le=1, description="top-1 agreement with fp32 the accuracy-aware plan must "
        "reach on the calibration split"
    )
    aware_high_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="precision of the layers an accuracy-aware plan keeps; `auto`: "
        "bf16 where the CPU has native bf16, else fp32"
    )
    onnx_dir: str | None = Field(
        None, description="where the runtime recipes (`onnx-*`, `ct2-int8`, `ov-int8`) cache their "
        "built artifacts, checked by digest on every load; none: `~/.cache/canary-gateway/onnx`"
    )
    int8_target_agreement: float = Field(
        0.99, gt=0, le=1, description="top-1 agreement the `onnx-int8` and `ov-int8` calibration "
        "searches must "
        "reach on the calibration split, with no confident flip"
    )
