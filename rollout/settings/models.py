"""Models: what each arm serves (weights, recipe, labels, device, threads)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode

from rollout.settings.base import CONFIG

DEFAULT_LABELS = ("technology", "sports", "politics", "business", "entertainment", "health")
Recipe = Literal[
    "auto", "fp32", "int8-dynamic", "int8-dynamic-per-channel", "int8-torchao", "fp16",
    "bf16", "compiled", "accuracy-aware", "fp16-graphs", "onnx-int8", "onnx-fp32",
    "ct2-int8", "ov-int8",
]


class ModelSettings(BaseSettings):
    """Models

    What each arm serves: its weights, which recipe it runs, its labels and how it runs (read
    by the serving layer's model replicas and by `rollout verify`; what building the recipe
    reads is the next group).
    """

    model_config = CONFIG

    model_path: str | None = Field(
        None, description="any local Hugging Face model folder (encoder or sequence "
        "classifier) of both arms unless an arm has its own; none: the packaged "
        "all-MiniLM-L6-v2"
    )
    baseline_model_path: str | None = Field(
        None, description="the baseline arm's own model folder ([Roll out new weights]"
        "(operator-guide.md#roll-out-new-weights)); none: `CANARY_MODEL_PATH`"
    )
    optimized_model_path: str | None = Field(
        None, description="the optimized arm's own model folder: new weights to canary; none: "
        "`CANARY_MODEL_PATH`"
    )
    baseline_recipe: Recipe = Field(
        "fp32", description="the baseline arm's recipe: any of `CANARY_OPTIMIZED_RECIPE`'s "
        "except `auto` (auto is judged against an fp32 reference); after a promotion, the "
        "promoted arm's recipe"
    )
    optimized_recipe: Recipe = Field(
        "auto", description="the optimized arm's recipe ([Optimization recipes](recipes.md)); "
        "`auto`: the fastest candidate for this host that passes the gate on the validation "
        "split, measured once and cached ([`auto`](recipes.md#auto-the-recipe-picked-by-"
        "measurement)); a named recipe pins it"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the models run; `auto`: cuda when available"
    )
    labels: Annotated[tuple[str, ...], NoDecode] = Field(
        DEFAULT_LABELS, description="zero-shot labels, comma-separated or a JSON list (at least "
        "two, distinct)"
    )
    label_template: str = Field(
        "This text is about {}.", description="how a label is described to the encoder "
        "(`{}` exactly once)"
    )
    default_task: Literal["classify", "embed", "generate"] = Field(
        "classify", description="task when a request names none (a causal LM's requests "
        "all generate, whatever this says)"
    )
    served_model_name: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$",
        description="the model's name in the OpenAI, Open Inference Protocol and TEI routes "
        "([HTTP API](http-api.md)); another name is a 404; none: the baseline model folder's "
        "name (`all-MiniLM-L6-v2` for the packaged model)"
    )
    max_tokens: int = Field(
        256, ge=8, le=8192, description="inputs are truncated to this many tokens"
    )
    torch_threads: int = Field(
        0, ge=0, le=256, description="threads per model replica; 0: cores / 2 at start, then "
        "following the share (`CANARY_COMPUTE_FOLLOWS_SHARE`)"
    )
    compute_follows_share: bool = Field(
        True, description="with `CANARY_TORCH_THREADS=0`: each model replica watches the "
        "rollout state and takes round(cores x the share its arm carries) threads, at least "
        "one; the kill switch and a stale state count as all baseline ([compute follows the "
        "share](production.md#compute-follows-the-share))"
    )
    yield_to_neighbours: bool = Field(
        True, description="a model replica in a process of its own runs a small batch on one "
        "thread fewer while its machine is saturated (idle cores read from `/proc/stat`), "
        "leaving the gateway and the other processes beside it a core ([leaving the "
        "neighbours a core](production.md#leaving-the-neighbours-a-core)); off for a container "
        "whose CPU quota is a part of a host"
    )
    kv_cache_mib: float = Field(
        0, ge=0, le=1 << 20, description="a generative model replica's KV cache budget, MiB "
        "([generative arms](generative.md)): a request that cannot fit now waits, one that can "
        "never fit is refused; 0: a quarter of the memory available when the replica starts"
    )
    @field_validator("labels", mode="before")
    @classmethod
    def _split_labels(cls, value):
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                value = json.loads(text)
            else:
                value = [part for part in text.split(",")]
        labels = tuple(str(v).strip() for v in value)
        if len(labels) < 2 or any(not label for label in labels):
            raise ValueError("give at least two non-empty labels")
        if len(set(labels)) != len(labels):
            raise ValueError("labels must be distinct")
        return labels

    @field_validator("baseline_recipe")
    @classmethod
    def _baseline_recipe(cls, value: str) -> str:
        if value == "auto":
            raise ValueError("baseline_recipe cannot be auto: auto picks the optimized arm's "
                             "recipe by measuring against fp32; name the baseline's recipe, "
                             "e.g. fp32 or bf16")
        return value

    @field_validator("label_template")
    @classmethod
    def _template(cls, value: str) -> str:
        if value.count("{}") != 1:
            raise ValueError("label_template must contain '{}' exactly once")
        return value

    def threads_per_model(self, replicas: int = 2) -> int:
        return self.torch_threads or max(1, (os.cpu_count() or 1) // replicas)
