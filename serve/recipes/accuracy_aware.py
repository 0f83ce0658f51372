"""The accuracy-aware recipe's per-layer plan: which Linear layers may run in int8.

Algorithm (deterministic for given weights, calibration split and settings):

1. **Sensitivity.** One pass of the fp32 model over the calibration split (every 4th input of
   the regression set) with a hook on every Linear: the layer's int8 output is computed from the
   same input and its relative squared error against the fp32 output is accumulated.
2. **Search.** Layers are ranked from most to least sensitive. Keeping the `k` most sensitive
   in high precision (fp32, or bf16 where the CPU computes bf16 natively) and the rest in int8,
   the top-1 agreement with fp32 on the calibration split is (nearly) monotone in `k`; a binary
   search finds the smallest `k` that reaches `aware_target_agreement`. Fewest layers in high
   precision = the most int8 = the most speed the target allows.
3. **Cache.** The plan is a small JSON file keyed by everything that decides it (weights,
   calibration set, labels, target, precision). Replicas look in `CANARY_PLAN_DIR`, then in the
   plans shipped with the package (`serve/recipes/plans/`), and compute and store it only when
   neither has it, so replicas of one deployment start fast and serve the same plan.

The plan's decision (precision, weight granularity, int8 layer names) is hashed into the
variant's version: a different plan is a different model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from serve.recipes.artifact import cache_root
from serve.recipes.cpu_flags import bf16_native
from serve.recipes.eager import Int8Linear, linear_names, replace_module

SHIPPED_PLANS = Path(__file__).resolve().parent / "plans"
FORMAT = 1

Embed = Callable[[torch.nn.Module, list[str]], torch.Tensor]  # model, texts -> rows


def resolve_high_precision(setting: str) -> str:
    if setting == "auto":
        return "bf16" if bf16_native() else "fp32"
    return setting


def plan_key(*, weights: str, set_digest: str, target: float, high_precision: str,
             labels: tuple[str, ...], template: str, max_tokens: int) -> str:
    parts = [FORMAT, weights, set_digest, f"{target:.6f}", high_precision, list(labels), template,
             max_tokens]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def plan_digest(plan: dict) -> str:
    """Hash of what the plan decides (not of its measurements)."""
    decision = [plan["high_precision"], plan.get("weights", "per-channel"), sorted(plan["int8"])]
    return hashlib.sha256(json.dumps(decision).encode()).hexdigest()[:12]


def default_plan_dir() -> Path:
    return cache_root() / "plans"


def find_plan(key: str, plan_dir: Path | None) -> dict | None:
    for folder in (plan_dir or default_plan_dir(), SHIPPED_PLANS):
        file = Path(folder) / f"{key}.json"
        if file.is_file():
            plan = json.loads(file.read_text())
            if plan.get("format") == FORMAT and plan.get("key") == key:
                return plan
    return None


def store_plan(plan: dict, plan_dir: Path | None) -> Path:
    folder = Path(plan_dir or default_plan_dir())
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{plan['key']}.json"
    tmp = file.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    tmp.replace(file)  # atomic: concurrent replicas never read half a plan
    return file


@torch.inference_mode()
def sensitivity(model: torch.nn.Module, embed: Embed, texts: list[str]) -> dict[str, float]:
    """Relative squared error of each Linear's int8 output against its fp32 output."""
    names = linear_names(model)
    err = dict.fromkeys(names, 0.0)
    ref = dict.fromkeys(names, 0.0)
    handles = []
    for name in names:
        layer = model.get_submodule(name)
        shadow = Int8Linear(copy.deepcopy(layer))

        def hook(_module, inputs, output, name=name, shadow=shadow):
            err[name] += float((shadow(inputs[0]) - output).float().pow(2).sum())
            ref[name] += float(output.float().pow(2).sum())

        handles.append(layer.register_forward_hook(hook))
    try:
        embed(model, texts)
    finally:
        for handle in handles:
            handle.remove()
    return {name: err[name] / max(ref[name], 1e-12) for name in names}


def search_plan(model: torch.nn.Module, embed: Embed, texts: list[str],
                score: Callable[[torch.Tensor], torch.Tensor], *, target: float,
                high_precision: str, progress=None) -> dict:
    """Steps 1 and 2 of the module docstring on an fp32 `model` (left unchanged). `embed` runs a
    model over texts; `score` turns its rows into label scores (top-1 = argmax)."""
    truth = score(embed(model, texts)).argmax(-1)
    scores = sensitivity(model, embed, texts)
    ranked = sorted(scores, key=lambda name: (-scores[name], name))
    tried: dict[int, float] = {}

    def try_keep(k: int) -> float:
        if k not in tried:
            candidate = apply_plan(copy.deepcopy(model), _plan(ranked, k, high_precision))
            found = score(embed(candidate, texts)).argmax(-1)
            tried[k] = float((found == truth).float().mean())
            if progress:
                progress(k, tried[k])
        return tried[k]

    low, high = 0, len(ranked)  # invariant: keeping `high` layers reaches the target (or k = all)
    while low < high:
        middle = (low + high) // 2
        if try_keep(middle) >= target:
            high = middle
        else:
            low = middle + 1
    plan = _plan(ranked, high, high_precision)
    plan.update(
        target=target, calibration={"n": len(texts), "agreement": try_keep(high)},
        tried={str(k): round(v, 6) for k, v in sorted(tried.items())},
        sensitivity={name: round(scores[name], 8) for name in ranked},
    )
    return plan


def _plan(ranked: list[str], keep: int, high_precision: str) -> dict:
    return {
        "format": FORMAT, "recipe": "accuracy-aware", "high_precision": high_precision,
        "weights": "per-channel", "kept": ranked[:keep], "int8": sorted(ranked[keep:]),
    }


def describe(plan: dict) -> str:
    """One line for people, naming the shorter of the two layer lists:
    'bf16 + int8 on 2/36 Linear layers (int8: layer.4.output.dense, layer.5.output.dense)'."""
    total = len(plan["int8"]) + len(plan["kept"])
    if len(plan["int8"]) <= len(plan["kept"]):
        which, names = "int8", plan["int8"]
    else:
        which, names = f"kept in {plan['high_precision']}", plan["kept"]
    names = ", ".join(name.removeprefix("encoder.") for name in names) or "none"
    return (f"{plan['high_precision']} + int8 on {len(plan['int8'])}/{total} Linear layers "
            f"({which}: {names})")


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


def build(model: torch.nn.Module, device: str, plan: dict | None) -> torch.nn.Module:
    """The accuracy-aware recipe's model: `plan` applied (see `apply_plan`)."""
    if plan is None:
        raise ValueError("the accuracy-aware recipe needs a plan")
    return apply_plan(model, plan)
