"""The model deployment of a generative arm: a causal LM under its recipe, one decode loop
(serve.generative.decode) on a thread of its own, each request's tokens streamed back through
Ray Serve's streaming handle (`handle.options(stream=True).generate.remote(...)`).

The loop is the replica's only torch work, so its thread is the one OpenMP team of the process.
Its KV cache budget is `CANARY_KV_CACHE_MIB` (0: a quarter of the memory available at start);
`CANARY_MAX_BATCH_SIZE` caps the sequences decoded together. A request that cannot fit now
waits in the loop within its deadline; one whose prompt leaves no room in the model's context
or whose prompt plus `max_tokens` can never fit is refused before its first token
(`PromptTooLong`, `NeverFits`). A consumer that stops reading (the client left) cancels its
sequence: it leaves the batch and frees its cache at the next step.

`serve.config` binds one per arm when the baseline folder holds a causal LM; the gateway's
generative doors call it (serve.gateway.generation).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from dataclasses import asdict

from ray import serve

from rollout.settings import Settings
from serve.common.quiet import quiet
from serve.generative.decode import DecodeLoop, Sampling
from serve.generative.fidelity import compare, continuation_logits
from serve.generative.kv import KvBudget, KvCost
from serve.generative.streaming import Runner
from serve.recipes.auto.causal import resolve
from serve.recipes.auto.choose import describe
from serve.recipes.causal_lm import build
from serve.recipes.source import model_dir, variant_version, weights_digest

MIB = 1 << 20


def kv_budget_bytes(kv_cache_mib: float, meminfo: str = "/proc/meminfo") -> int:
    """`kv_cache_mib`, or a quarter of MemAvailable (a quarter of physical memory where
    /proc/meminfo cannot be read)."""
    if kv_cache_mib:
        return int(kv_cache_mib * MIB)
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 4
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


@serve.deployment(name="generator", health_check_period_s=10, health_check_timeout_s=30)
class GenerateServer:
    def __init__(self, settings: Settings, arm: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.arm, self.path = arm, model_dir(settings, arm, generative=True)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        weights = weights_digest(self.path)
        with quiet():  # transformers' model code loads here first (serve.common.quiet)
            fp32 = AutoModelForCausalLM.from_pretrained(
                self.path, local_files_only=True, dtype=torch.float32).eval()
            self.recipe, self.choice = resolve(settings, arm, fp32, self.tokenizer,
                                               weights=weights)
            self.model = build(fp32, self.recipe)  # fp32 is not kept: no copy
        budget = KvBudget(kv_budget_bytes(settings.kv_cache_mib), KvCost.of_model(self.model))
        self.loop = DecodeLoop(self.model, self.tokenizer, budget,
                               max_batch=settings.max_batch_size)
        self.runner = Runner(self.loop)
        self.version = variant_version(weights, self.recipe)

    def info(self) -> dict:
        budget = self.loop.budget
        return {
            "arm": self.arm, "pid": os.getpid(), "recipe": self.recipe, "tasks": ["generate"],
            "version": self.version, "labels": [], "tokenizer": None,
            "auto": describe(self.choice) if self.choice else None,
            "model": self.path.name, "context": self.loop.context,
            "max_batch_size": self.loop.max_batch,
            "kv_budget_bytes": budget.capacity_bytes, "kv_token_bytes": budget.cost.per_token,
            "kv_in_use_bytes": budget.in_use_bytes, "kv_peak_bytes": budget.peak_bytes,
            "sequences_running": self.loop.sequences_running,
            "sequences_waiting": self.loop.sequences_waiting,
        }

    async def generate(self, prompt: list[int], sampling: dict,
                       remaining_s: float | None = None) -> AsyncIterator[dict]:
        """The sequence's events as dicts (serve.generative.decode.Event), the last with
        `finish`. `remaining_s`: what is left of the request's deadline."""
        deadline = None if remaining_s is None else time.monotonic() + remaining_s
        sampling = Sampling(**{**sampling, "stop": tuple(sampling.get("stop", ()))})
        stream = self.runner.stream(prompt, sampling, deadline)
        try:
            async for event in stream:
                yield asdict(event)
        finally:  # cancelled, or closed between two events: the sequence is freed now
            await stream.aclose()

    async def logprobs(self, prompt: list[int], continuation: list[int]):
        """This arm's log-probabilities (fp32, positions x vocabulary) at every position of
        `continuation` after `prompt`, teacher-forced in one forward on the loop's thread: what
        the other arm's `token_fidelity` compares with its own."""
        return await self.runner.call(lambda: continuation_logits(
            self.model, prompt, continuation).log_softmax(-1))

    async def token_fidelity(self, prompt: list[int], continuation: list[int],
                             other) -> dict:
        """This arm (the reference) against `other`'s log-probabilities on the same tokens
        (serve.generative.fidelity.compare): per position, KL(this || other) and whether the
        most likely tokens agree; the continuation's negative log-likelihood under each."""
        def job() -> dict:
            mine = continuation_logits(self.model, prompt, continuation)
            if mine.shape != other.shape:
                raise ValueError(f"the other arm's log-probabilities are {tuple(other.shape)}, "
                                 f"this arm's {tuple(mine.shape)}: their vocabularies differ")
            return asdict(compare(mine, other, continuation))

        return await self.runner.call(job)

    def check_health(self) -> None:
        if not self.runner.alive:
            raise RuntimeError("the decode loop's thread is not running")

    def __del__(self):
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close()
