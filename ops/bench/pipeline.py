"""The in-process pipeline: tokenize -> forward -> postprocess of one variant, no server.

Algorithm: for each batch size, the same inputs (the workload, in its order) are cut into
batches of that size; one *pass* runs every batch through `encode`, `forward_rows` and
`postprocess` and times each stage with `perf_counter` (a forward's result is copied to the CPU
inside `forward_rows`, so on CUDA the timer includes the device work). After one unmeasured
warm-up batch per variant, passes alternate between the variants (baseline, optimized,
optimized, baseline, ...) so both see the same machine; the reported figures are the median
pass's throughput and the median batch latency over all passes. What the gateway can at best
reach is this pipeline at its own batch size: `ops.bench.report` divides by it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from serve.common.batching import run_budgeted
from serve.recipes.variants import Variant

STAGES = ("preprocess", "model", "postprocess")


def run_batch(variant: Variant, texts: list[str], task: str) -> dict[str, float]:
    """One batch through the pipeline, forwarded as a model replica forwards a merged batch
    (serve.common.batching: length-sorted chunks under `max_batch_tokens`): seconds per stage."""
    t0 = time.perf_counter()
    encoded = variant.encode(texts)
    t1 = time.perf_counter()
    rows = run_budgeted([encoded.ids], variant.forward_rows,
                        variant.settings.batching.max_batch_tokens, variant.split_tokens)[0]
    t2 = time.perf_counter()
    variant.postprocess(task, rows)
    t3 = time.perf_counter()
    return {"preprocess": t1 - t0, "model": t2 - t1, "postprocess": t3 - t2}


def one_pass(variant: Variant, batches: list[list[str]], task: str) -> list[dict[str, float]]:
    return [run_batch(variant, batch, task) for batch in batches]


def peak_gpu_mib() -> float | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def measure(variants: dict[str, Variant], texts: list[str], batch_sizes: list[int], *,
            rounds: int = 3, task: str = "classify",
            progress: Callable[[str], None] = lambda _: None) -> list[dict]:
    """Rows `{arm, recipe, batch, throughput, p50_ms, stages_ms}` per arm and batch size
    (see the module docstring); `stages_ms` is the mean per batch of each stage."""
    rows = []
    for size in batch_sizes:
        batches = [texts[i:i + size] for i in range(0, len(texts), size)]
        for variant in variants.values():  # warm-up: first shapes, lazy init
            run_batch(variant, batches[0], task)
        passes: dict[str, list[list[dict[str, float]]]] = {arm: [] for arm in variants}
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for arm in order:
                passes[arm].append(one_pass(variants[arm], batches, task))
                progress(f"in-process {arm} batch {size}: pass {r + 1}/{rounds}")
        for arm, variant in variants.items():
            totals = [sum(sum(b.values()) for b in p) for p in passes[arm]]
            latencies = [sum(b.values()) * 1000 for p in passes[arm] for b in p]
            every = [b for p in passes[arm] for b in p]
            rows.append({
                "arm": arm, "recipe": variant.recipe, "batch": size, "inputs": len(texts),
                "throughput": len(texts) / statistics.median(totals),
                "p50_ms": statistics.median(latencies),
                "stages_ms": {s: statistics.fmean(b[s] for b in every) * 1000 for s in STAGES},
            })
    return rows
