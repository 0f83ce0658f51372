"""Optimization recipes: how the optimized variant is made from the fp32 source model.

- `fp32`: the source as is (the baseline);
- `int8-dynamic`: every Linear int8 (per-tensor weights, dynamic per-tensor activations;
  torch.ao);
- `int8-dynamic-per-channel`: the same with per-output-channel weight scales;
- `int8-torchao`: torchao int8 weights, dynamic per-token int8 activations;
- `fp16`, `bf16`: the whole model in half precision (bf16 is fast on CPUs with AVX512-BF16/AMX);
- `fp16-graphs`: CUDA only: fp16; batches of up to 16 rows replayed as CUDA graphs
  (serve.graphs);
- `compiled`: fp32 under `torch.compile` (inductor); compiles on first use of each shape;
- `accuracy-aware`: a per-layer plan (serve.layer_plan): the layers a calibration run found
  sensitive stay in high precision, the rest become int8.

Every recipe takes the fp32 model and returns the model to run; the caller keeps the fp32 model
only as long as it needs it (e.g. to embed the label descriptions once, in full precision).
"""

from __future__ import annotations

import warnings

import torch

RECIPES = (
    "fp32", "int8-dynamic", "int8-dynamic-per-channel", "int8-torchao", "fp16", "bf16",
    "compiled", "accuracy-aware", "fp16-graphs",
)
CPU_ONLY = ("int8-dynamic", "int8-dynamic-per-channel", "accuracy-aware")
CUDA_ONLY = ("fp16-graphs",)


class Int8Linear(torch.nn.Module):
    """A torch.ao dynamically quantized Linear that accepts and returns any float dtype, so int8
    layers can sit inside a bf16 model (fbgemm's kernels take fp32 activations)."""

    def __init__(self, linear: torch.nn.Linear, *, per_channel: bool = True):
        super().__init__()
        self.inner = quantize_linears(torch.nn.Sequential(linear.float()), per_channel)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return self.inner(x)
        return self.inner(x.float()).to(x.dtype)


def quantize_linears(model: torch.nn.Module, per_channel: bool) -> torch.nn.Module:
    """torch.ao dynamic int8 quantization of every Linear (in place where torch.ao allows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager torch.ao quantization announces deprecation
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        spec = {torch.nn.Linear: per_channel_dynamic_qconfig} if per_channel else {torch.nn.Linear}
        return quantize_dynamic(model, spec, dtype=torch.qint8)


def replace_module(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def linear_names(model: torch.nn.Module) -> list[str]:
    """The Linear layers a plan may quantize: the encoder's (not the pooler, which mean pooling
    never uses, nor a classification head, which is tiny and decides the label)."""
    return [
        name for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ".pooler" not in f".{name}"
        and not name.split(".")[-2:-1] == ["classifier"] and not name.startswith("classifier")
    ]


def apply_plan(model: torch.nn.Module, plan: dict) -> torch.nn.Module:
    """The accuracy-aware recipe: `plan["high_precision"]` (fp32 or bf16) for the whole model,
    int8 for the Linear layers named in `plan["int8"]`."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[plan["high_precision"]]
    per_channel = plan.get("weights", "per-channel") == "per-channel"
    int8 = {name: Int8Linear(model.get_submodule(name), per_channel=per_channel)
            for name in plan["int8"]}
    model = model.to(dtype)
    for name, module in int8.items():
        replace_module(model, name, module)
    return model


def apply_recipe(model: torch.nn.Module, recipe: str, device: str,
                 plan: dict | None = None) -> torch.nn.Module:
    if recipe in CPU_ONLY and device != "cpu":
        raise ValueError(f"{recipe} runs on CPU only")
    if recipe in CUDA_ONLY and device != "cuda":
        raise ValueError(f"{recipe} runs on CUDA only")
    if recipe == "fp32":
        return model.to(device)
    if recipe in ("int8-dynamic", "int8-dynamic-per-channel"):
        return quantize_linears(model, per_channel=recipe.endswith("per-channel"))
    if recipe == "int8-torchao":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        model = model.to(device)
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
        return model
    if recipe in ("fp16", "bf16"):
        return model.to(device=device, dtype=torch.float16 if recipe == "fp16" else torch.bfloat16)
    if recipe == "fp16-graphs":
        from serve.graphs import SmallBatchGraphs

        return SmallBatchGraphs(model.to(device=device, dtype=torch.float16))
    if recipe == "compiled":
        return torch.compile(model.to(device), dynamic=True)
    if recipe == "accuracy-aware":
        if plan is None:
            raise ValueError("the accuracy-aware recipe needs a plan")
        return apply_plan(model, plan)
    raise ValueError(f"unknown recipe {recipe!r}")
