"""`auto` for a causal LM: the recipe that decodes fastest among those that keep the model's
tokens, by `rollout verify`'s rule for a causal LM (rollout.verdict.judge_generation), measured
once per weights, host and settings and cached as an encoder's choice is
(serve.recipes.auto.choose, step 4; the same folder, lock and trust rules).

1. **Candidates** (`candidates`, in order of preference; generative arms run on the CPU):
   `bf16` where the CPU computes bf16 natively (AVX512-BF16 or AMX) and `hide_native_bf16` is
   off, then `int8-dynamic-per-channel`, then `int8-dynamic`. Not candidates: `fp16` (emulated
   on a CPU), `compiled` (a decode loop's shapes change every step: it would recompile),
   `int8-torchao` (0.3-0.4x fp32's decode speed measured on CPU: docs/generative.md). No
   candidate passing: `fp32`, with the reason.
2. **Reference** (`reference`), computed once for every candidate: fp32's greedy continuation
   of `verify_continuation_tokens` for prompts of the regression set's *validation* split
   (inputs verify does not judge, as for an encoder), at most `verify_prompts` evenly spaced,
   cut as verify cuts them (serve.generative.fidelity.judged_prompts).
3. **Measure** (`measure_candidate`): speed first, the decode loop's output tokens per second
   of fp32 and the candidate at `max_batch_size` sequences at a time (the most the replica
   decodes together) and at `verify_speed_batch` (the batch verify judges), the lower speedup
   kept: a screen of one round on one batch of the first size, SCREEN_TOKENS tokens each (a
   candidate screened more than serve.recipes.auto.trial.SCREEN_MARGIN below the bar is refused
   on it), then twice that many prompts per size, arms interleaved, best of ROUNDS. A candidate
   no faster than the bar (fp32, `min_speedup`, or an earlier candidate that passed: it could
   not win) is refused without its fidelity measured. Then every reference continuation
   teacher-forced through both models (serve.generative.fidelity.score_response), summed per
   response (rollout.token_fidelity) and judged by verify's rule with `auto`'s margin
   (rollout.verdict.auto_thresholds: the top-1 token agreement's bar raised, the KL divergence's
   lowered by the same share of its budget), and faster than fp32 whatever `min_speedup` says.
4. **Pick** the fastest passing (serve.recipes.auto.choose.pick: ties within TIE go to the
   earlier in preference order). The key hashes, beside an encoder's parts, the task and the
   settings that shape the measurement (prompts, their share, continuation length, batches).

`rollout verify` and a generative replica resolve `auto` through `resolve` with the same
settings, so both find the same cached choice and judge and serve the same version.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.settings import ModelSettings, RecipeSettings, Settings, VerifySettings
from rollout.slices import slices_of
from rollout.token_fidelity import TokenFidelity, summarize
from rollout.verdict import Thresholds, auto_thresholds, judge_generation
from serve.common.regression import load_set
from serve.generative.fidelity import (
    greedy,
    judged_prompts,
    model_context,
    score_response,
    tokens_per_second,
)
from serve.recipes import AUTO, recipe_for
from serve.recipes.auto.choose import (
    Choice,
    Hardware,
    cached,
    choice_dir,
    choice_key,
    describe,
    detect_hardware,
    measure_each,
    pick,
)
from serve.recipes.auto.trial import ROUNDS, SCREEN_MARGIN, Evidence, too_slow
from serve.recipes.causal_lm import build

FALLBACK = "fp32"
SCREEN_TOKENS = 8  # tokens per sequence in the screen's one round
GREEDY_BATCH = 16  # sequences decoded together for the reference continuations


@dataclass
class Reference:
    """fp32 and what every candidate is measured against (module docstring, step 2)."""

    model: object
    tokenizer: object
    responses: list[tuple[int, list[int], list[int], tuple[str, ...]]]  # index, prompt,
    # fp32's continuation, the prompt's slices
    sample: list[list[int]]  # the prompts the speed is measured on: twice the largest batch
    tokens: int
    batches: tuple[int, ...]  # the batch sizes timed
    min_slice_size: int


def candidates(hardware: Hardware, *, hide_native_bf16: bool = False) -> tuple[str, ...]:
    """The recipes `auto` measures for a causal LM on `hardware`, in order of preference."""
    int8 = ("int8-dynamic-per-channel", "int8-dynamic")
    return ("bf16", *int8) if hardware.bf16 and not hide_native_bf16 else int8


def resolve(settings: Settings, arm: str, fp32, tokenizer, *, weights: str, progress=None
            ) -> tuple[str, Choice | None]:
    """The recipe `arm` is built with: its setting, or for `auto` the cached choice for these
    weights (measured now when there is none: minutes), with the choice. `fp32` stays fp32."""
    name = recipe_for(arm, settings, "cpu")
    if name != AUTO:
        return name, None
    choice = choose(settings, settings, settings, fp32, tokenizer, weights=weights,
                    served_batch=settings.max_batch_size, progress=progress)
    logging.getLogger("canary.autopick").info("%s", describe(choice))
    return choice.recipe, choice


def choose(model: ModelSettings, recipe: RecipeSettings, verify: VerifySettings, fp32,
           tokenizer, *, weights: str, served_batch: int, measure=None, progress=None,
           hardware: Hardware | None = None, clock: Clock | None = None) -> Choice:
    """The cached choice for these weights, host and settings, or one measured now and cached.
    `served_batch`: the most sequences a replica decodes together (`max_batch_size`).
    `measure(reference, name, thresholds, beaten_by=)` defaults to `measure_candidate`."""
    hardware = hardware or detect_hardware("cpu")
    batches = tuple(sorted({served_batch, verify.verify_speed_batch}))
    key, context = choice_key(model, recipe, verify, weights=weights, hardware=hardware,
                              labels=(), extra={"task": "generate",
                                                "generate": _shaping(verify, batches)})
    names = candidates(hardware, hide_native_bf16=recipe.hide_native_bf16)
    clock = clock or SystemClock()

    def measure_all() -> Choice:
        found = reference(verify, fp32, tokenizer, batches, progress=progress)
        thresholds = auto_thresholds(verify)
        evidence = measure_each(names, lambda name, beaten_by: (measure or measure_candidate)(
            found, name, thresholds, beaten_by=beaten_by), progress, clock)
        return pick(evidence, hardware, recipe.hide_native_bf16, fallback=FALLBACK, key=key,
                    context=context, at=clock.time())

    return cached(choice_dir(recipe), key, {*names, FALLBACK}, measure_all)


def _shaping(verify: VerifySettings, batches: tuple[int, ...]) -> dict:
    return {"prompts": verify.verify_prompts, "share": verify.verify_prompt_share,
            "tokens": verify.verify_continuation_tokens, "batches": list(batches),
            "min_slice_size": verify.verify_min_slice_size}


def reference(settings: VerifySettings, fp32, tokenizer, batches: tuple[int, ...], *,
              progress=None) -> Reference:
    """Step 2: the validation prompts and fp32's greedy continuation of each; the speed is
    timed at each of `batches`."""
    regression = load_set(settings.regression_set)
    tokens = settings.verify_continuation_tokens
    chosen, _ = judged_prompts(tokenizer, regression.texts, regression.validation(),
                               count=settings.verify_prompts,
                               share=settings.verify_prompt_share, tokens=tokens,
                               context=model_context(fp32))
    if not chosen:
        raise ValueError(f"no validation prompt fits the model's context with {tokens} tokens "
                         "to generate")
    if progress is not None:
        progress(f"auto: fp32's greedy continuations of {len(chosen)} validation prompts, "
                 f"{tokens} tokens each", None)
    prompts = [ids for _, ids in chosen]
    continuations = greedy(fp32, tokenizer, prompts, tokens, batch=GREEDY_BATCH)
    responses = [(index, ids, continuation, slices_of(regression.texts[index], len(ids), None))
                 for (index, ids), continuation in zip(chosen, continuations, strict=True)
                 if continuation]
    return Reference(fp32, tokenizer, responses,
                     [prompts[i % len(prompts)] for i in range(2 * max(batches))], tokens,
                     batches, settings.verify_min_slice_size)


def measure_candidate(found: Reference, recipe: str, thresholds: Thresholds, *,
                      beaten_by: tuple[str, float] | None = None,
                      timer: Callable[[], float] = time.perf_counter) -> Evidence:
    """Step 3 for one candidate."""
    start = timer()
    model = build(copy.deepcopy(found.model), recipe)
    bar = max(1.0, thresholds.min_speedup, beaten_by[1] if beaten_by else 0.0)
    speedups, screened = _speedups(found, model, bar)
    speedup = min(speedups.values())
    if speedup <= bar or screened:
        screen = f"{found.batches[0]} sequences of {SCREEN_TOKENS} tokens" if screened else None
        return Evidence(recipe=recipe, passed=False, speedup=speedup, speedups=speedups,
                        seconds=timer() - start,
                        failures=(too_slow(speedup, bar, beaten_by, screen),))
    fidelity = summarize([score_response(found.model, model, prompt, continuation,
                                         slices=slices, index=index)
                          for index, prompt, continuation, slices in found.responses],
                         min_size=found.min_slice_size)
    failures = judge_generation(thresholds, fidelity, speedup)
    return Evidence(
        recipe=recipe, passed=not failures, failures=tuple(failures), n=fidelity.n,
        agreement=fidelity.agreement, lower_bound=fidelity.agreement_lower_bound,
        kld=fidelity.kld, kld_upper_bound=fidelity.kld_upper_bound,
        closest=closest(thresholds, fidelity), speedup=speedup,
        speedups=speedups, seconds=timer() - start)


def _speedups(found: Reference, model, bar: float) -> tuple[dict[int, float], bool]:
    """The candidate's decode speedup over fp32 per batch size, and whether it is the screen's
    alone (the screen put it too far below `bar` for the full timing to reach it)."""
    arms = {"fp32": (found.model, found.tokenizer), "candidate": (model, found.tokenizer)}
    first = found.batches[0]
    rates = tokens_per_second(arms, found.sample[:first], SCREEN_TOKENS, first, rounds=1)
    if rates["candidate"] / rates["fp32"] * SCREEN_MARGIN < bar:
        return {first: rates["candidate"] / rates["fp32"]}, True
    speedups = {}
    for batch in found.batches:
        rates = tokens_per_second(arms, found.sample[:2 * batch], found.tokens, batch,
                                  rounds=ROUNDS)
        speedups[batch] = rates["candidate"] / rates["fp32"]
    return speedups, False


def closest(thresholds: Thresholds, found: TokenFidelity) -> str:
    """The judged bound closest to its bar, by the share of its budget left."""
    kld_left = 1 - found.kld_upper_bound / thresholds.max_kld if thresholds.max_kld else 0.0
    budget = 1 - thresholds.min_token_agreement
    agree_left = (found.agreement_lower_bound - thresholds.min_token_agreement) / budget \
        if budget else 0.0
    if kld_left <= agree_left:
        return f"KL divergence upper bound {found.kld_upper_bound:.5f} (bar {thresholds.max_kld:g})"
    return (f"top-1 token agreement lower bound {found.agreement_lower_bound:.4f} "
            f"(bar {thresholds.min_token_agreement:g})")
