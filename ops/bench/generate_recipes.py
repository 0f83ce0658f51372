"""The encoder recipes applied to a causal LM: decode speed and fidelity to fp32, in process.

    python -m ops.bench.generate_recipes --model DIR
    python -m ops.bench.generate_recipes --model DIR --recipes bf16,int8-torchao --prompts 60

Each recipe of the registry (serve.recipes) that transforms a torch model is built from a fresh
copy of the fp32 model, as an optimized arm's would be, and judged two ways:

- speed: the decode loop's output tokens/s at each `--concurrency` (ops.bench.generate_loop's
  requests), fp32 and every recipe measured in turn, `--rounds` times, best of;
- fidelity, teacher-forced (serve.generative.fidelity): fp32's greedy continuation of each prompt
  (`--tokens`, EOS ends it), then fp32 and the recipe scored on those same tokens in one forward
  each: KL(fp32 || recipe) per token (mean, p99, max), how often the most likely token agrees,
  the perplexity of the continuation under each; and the recipe's own greedy continuation:
  the share identical to fp32's and the mean first position where they part.

A row `4-bit per-tensor (damaged)` rounds every Linear weight to 16 levels per tensor: damage made
by construction, to show what the figures look like when a recipe breaks the model.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path

from ops.bench.generate_loop import (
    checked,
    decode_loop,
    lengths,
    parser_for,
    prompts,
)
from ops.load.tally import pct

DAMAGED = "4-bit per-tensor (damaged)"
DEFAULT_RECIPES = "bf16,int8-dynamic-per-channel,int8-torchao"


def damaged_4bit(model):
    """Every Linear weight rounded to 16 symmetric levels, one scale per tensor."""
    import torch
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                scale = module.weight.abs().max() / 7
                module.weight.copy_((module.weight / scale).round().clamp(-8, 7) * scale)
    return model


def build(fp32, name: str):
    """A recipe's model from a copy of `fp32` (serve.recipes.causal_lm), or the damaged one."""
    from serve.recipes.causal_lm import build as build_recipe
    model = copy.deepcopy(fp32)
    return damaged_4bit(model) if name == DAMAGED else build_recipe(model, name)


def fidelity(fp32, model, tokenizer, requests, reference: list[list[int]]) -> dict:
    from serve.generative.fidelity import (
        compare,
        continuation_logits,
        first_divergence,
        greedy,
    )
    kld, same, nll_ref, nll_other = [], [], [], []
    for prompt, continuation in zip(requests, reference, strict=True):
        if not continuation:
            continue
        scored = compare(continuation_logits(fp32, prompt, continuation),
                         continuation_logits(model, prompt, continuation), continuation)
        kld += scored.kld
        same += scored.same_top
        nll_ref += scored.reference_nll
        nll_other += scored.other_nll
    own = greedy(model, tokenizer, requests, max(len(c) for c in reference))
    parted = [first_divergence(r, o) for r, o in zip(reference, own, strict=True)]
    return {
        "kld_mean": sum(kld) / len(kld), "kld_p99": pct(kld, 99), "kld_max": max(kld),
        "same_top": sum(same) / len(same),
        "identical": sum(p is None for p in parted) / len(parted),
        "first_divergence_mean": _mean([p for p in parted if p is not None]),
        "perplexity_fp32": math.exp(sum(nll_ref) / len(nll_ref)),
        "perplexity": math.exp(sum(nll_other) / len(nll_other)),
        "tokens_scored": len(kld)}


def speed(model, tokenizer, concurrency: int, max_tokens: int) -> float:
    requests = prompts(tokenizer, max(16, 2 * concurrency))
    cell = decode_loop(model, tokenizer, requests, lengths(len(requests), max_tokens),
                       concurrency)
    return cell.tokens / cell.seconds


def measure(folder: Path, names: list[str], concurrencies: list[int], count: int,
            tokens: int, rounds: int, say) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.common.quiet import quiet
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with quiet():
        fp32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    models = {"fp32": fp32}
    for name in names:
        with quiet():
            models[name] = build(fp32, name).eval()
    from serve.generative.fidelity import greedy
    requests = prompts(tokenizer, count)
    reference = greedy(fp32, tokenizer, requests, tokens)
    rows = {name: {"recipe": name} for name in models}
    for c in concurrencies:  # every model in turn, `rounds` times: best of
        for _ in range(rounds):
            for name, model in models.items():
                rate = speed(model, tokenizer, c, 64)
                rows[name][f"tokens_per_s_c{c}"] = max(rate, rows[name].get(
                    f"tokens_per_s_c{c}", 0))
    for name, model in models.items():
        started = time.monotonic()
        rows[name].update(fidelity(fp32, model, tokenizer, requests, reference))
        for c in concurrencies:
            rows[name][f"speedup_c{c}"] = rows[name][f"tokens_per_s_c{c}"] / rows["fp32"][
                f"tokens_per_s_c{c}"]
        say(_line(rows[name], concurrencies) + f"  ({time.monotonic() - started:.0f} s)")
    return list(rows.values())


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _line(row: dict, concurrencies: list[int]) -> str:
    rates = "  ".join(f"c={c} {row[f'tokens_per_s_c{c}']:,.0f} tok/s "
                      f"({row[f'speedup_c{c}']:.2f}x)" for c in concurrencies)
    parted = row["first_divergence_mean"]
    return (f"{row['recipe']:<28} {rates}  KLD mean {row['kld_mean']:.5f} p99 "
            f"{row['kld_p99']:.4f} max {row['kld_max']:.3f}  same top-1 "
            f"{100 * row['same_top']:.2f}%  identical {100 * row['identical']:.1f}% (parted at "
            f"{'-' if parted is None else f'{parted:.1f}'})  ppl {row['perplexity']:.3f} "
            f"(fp32 {row['perplexity_fp32']:.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(
        "python -m ops.bench.generate_recipes", "Decode speed and teacher-forced fidelity to "
        "fp32 (KL divergence, same top-1 token, identical greedy continuations) of torch "
        "recipes applied to a causal LM, in this process.", "1,8")
    parser.add_argument("--recipes", default=DEFAULT_RECIPES,
                        help=f"comma-separated torch recipes (default {DEFAULT_RECIPES}); the "
                        f"damaged 4-bit row is always added")
    parser.add_argument("--prompts", type=int, default=40, help="prompts scored (default 40)")
    parser.add_argument("--tokens", type=int, default=32,
                        help="greedy continuation length scored (default 32)")
    parser.add_argument("--rounds", type=int, default=2, help="speed rounds, best of (2)")
    args = parser.parse_args(argv)
    concurrencies = checked(parser, args)
    if min(args.prompts, args.tokens, args.rounds) < 1:
        parser.error("--prompts, --tokens and --rounds must be >= 1")
    names = [n for n in args.recipes.split(",") if n] + [DAMAGED]
    try:
        rows = measure(args.model, names, concurrencies, args.prompts, args.tokens,
                       args.rounds, print)
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
