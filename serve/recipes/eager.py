"""The recipes that transform the loaded fp32 model in torch (eager), one function each:

- `fp32`: the source as is (the baseline);
- `int8-dynamic`: every Linear int8 (per-tensor weights, dynamic per-tensor activations;
  torch.ao); `int8-dynamic-per-channel`: the same with per-output-channel weight scales;
- `int8-torchao`: torchao int8 weights, dynamic per-token int8 activations;
- `fp16`, `bf16`: the whole model in half precision (bf16 is fast on CPUs with AVX512-BF16/AMX);
- `compiled`: fp32 under `torch.compile` (inductor); compiles on first use of each shape.

And the int8 Linear layers the accuracy-aware recipe (serve.recipes.accuracy_aware) and the
ONNX calibration (serve.recipes.onnx) place layer by layer. Each recipe takes the fp32 model and
returns the model to run.
"""

from __future__ import annotations

import warnings

import torch


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


def fp32(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return model.to(device)


def int8_dynamic(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return quantize_linears(model, per_channel=False)


def int8_dynamic_per_channel(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return quantize_linears(model, per_channel=True)


def int8_torchao(model: torch.nn.Module, device: str) -> torch.nn.Module:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    model = model.to(device)
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


def fp16(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return model.to(device=device, dtype=torch.float16)


def bf16(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return model.to(device=device, dtype=torch.bfloat16)


def compiled(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return torch.compile(model.to(device), dynamic=True)
