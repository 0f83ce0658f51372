"""`rollout verify` for a causal LM: the two arms judged by their tokens (rollout.token_fidelity).

Used in place of ops.verify.runner when the baseline folder holds a causal LM. Both arms are built
as the gateway's generative replicas build them (serve.recipes.causal_lm: the arm's folder
under its recipe, fp32 loaded first), so the versions judged are the versions served. Their
tokenizers must be the same (the other arm reads the answering arm's tokens); if not, verify
refuses before scoring anything.

The prompts are the regression set's texts: the judged split (the held-out split of the
configured set, an external set whole, each text once, as for an encoder), at most
`verify_prompts` of them evenly spaced, each tokenized as a completion's prompt (the tokenizer's
BOS included) and cut to the first `verify_prompt_share` of its tokens (at least two): a
complete sentence's likeliest continuation is its end, half of one leaves the continuation
something to say (1 gives each text whole: a set of prompts; so does a row of `kind: "parted"`,
a prompt flip capture exported: rollout.flips). A prompt that leaves less than
`verify_continuation_tokens` of the model's context is left out and counted. The cost, stated
up front with progress, per prompt:

1. the baseline's greedy continuation of `verify_continuation_tokens` tokens (EOS ends it
   sooner), by the decode loop, 16 prompts at a time;
2. both arms teacher-forced on it, one forward each (serve.generative.fidelity): KL(baseline ||
   optimized) and whether the top tokens agree at every position of the continuation, and the
   continuation's log-likelihood under each;
3. the optimized arm's own greedy continuation: identical to the baseline's, or the first
   position where they part.

Speed: the decode loop of each arm giving `verify_continuation_tokens` tokens (EOS ignored: both
arms do the same work) to twice `verify_speed_batch` prompts, that many sequences at a time,
arms interleaved over three rounds, best of; the speedup is the ratio of output tokens per
second. Memory: each arm's serialized weights and KV cache bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ops.verify.runner import Bar, split_of, weights_bytes
from rollout.settings import Settings
from rollout.slices import slices_of
from rollout.token_fidelity import ResponseFidelity, TokenFidelity, summarize
from serve.common.quiet import quiet
from serve.common.regression import RegressionSet, load_set
from serve.generative.fidelity import (
    greedy,
    judged_prompts,
    model_context,
    score_response,
    tokens_per_second,
)
from serve.generative.kv import KvCost
from serve.recipes.auto.causal import resolve
from serve.recipes.causal_lm import build
from serve.recipes.source import ModelSourceError, model_dir, variant_version, weights_digest

ROUNDS = 3  # speed rounds, best of
GREEDY_BATCH = 16  # sequences decoded together for the greedy continuations


@dataclass
class Arm:
    name: str
    path: Path
    recipe: str
    version: str
    model: object
    tokenizer: object
    choice: object = None  # serve.recipes.auto.choose.Choice when the recipe was `auto`


@dataclass
class GenerateReport:
    baseline: Arm
    optimized: Arm
    regression: RegressionSet
    split: str  # "held-out" or "external" (rollout.verdict)
    tokens: int  # the continuation length asked for
    fidelity: TokenFidelity
    responses: list[ResponseFidelity] = field(default_factory=list)
    left_out: int = 0  # prompts that leave too little of the context
    sampled_from: int = 0  # the judged split's distinct texts, before the even sample
    said: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # index -> prompt,
    # the baseline's continuation and the optimized arm's own, as text
    prompt_ids: dict[int, list[int]] = field(default_factory=dict)  # index -> the prompt given
    throughput: dict = field(default_factory=dict)
    speedup: float | None = None
    memory: dict = field(default_factory=dict)


def applies(settings: Settings) -> bool:
    """Whether verify judges tokens: the baseline folder holds a causal LM."""
    from serve.recipes.source import is_causal_lm
    try:
        return is_causal_lm(model_dir(settings, "baseline", generative=None))
    except FileNotFoundError:
        return False


def _arm(settings: Settings, name: str, progress=None) -> Arm:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = model_dir(settings, name, generative=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    weights = weights_digest(path)
    with quiet():
        fp32 = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32).eval()
        try:
            recipe, choice = resolve(settings, name, fp32, tokenizer, weights=weights,
                                     progress=progress)
            model = build(fp32, recipe)
        except ValueError as exc:
            raise ModelSourceError(f"{name} arm: {exc}") from None
    return Arm(name, path, recipe, variant_version(weights, recipe), model, tokenizer, choice)


def _check_tokenizers(baseline: Arm, optimized: Arm) -> None:
    if baseline.tokenizer.get_vocab() != optimized.tokenizer.get_vocab():
        raise ModelSourceError(
            f"the arms' tokenizers differ ({baseline.path} and {optimized.path}): one arm "
            "cannot score the other's tokens")


def run(settings: Settings, *, set_path: str | None = None, limit: int | None = None,
        progress_stream=None, speed: bool = True) -> GenerateReport:
    """Both arms on the prompts of the set at `set_path` (default: `settings.regression_set`)."""
    torch.set_num_threads(settings.threads_per_model(replicas=1))
    bar = Bar(progress_stream, progress_stream is not None)
    try:
        bar.stage("loading baseline", 1)
        baseline = _arm(settings, "baseline")
        bar.stage(f"loading {settings.optimized_recipe}", 1)
        optimized = _arm(settings, "optimized", progress=lambda step, _: bar.note(step))
        _check_tokenizers(baseline, optimized)
        regression = load_set(set_path or settings.regression_set).limited(limit)
        split = split_of(settings, regression)
        judged = regression.held_out() if split == "held-out" else regression.distinct()
        tokens = settings.verify_continuation_tokens
        chosen, left_out = _prompts(baseline, regression, judged, settings, tokens)
        if progress_stream is not None:
            progress_stream.write(
                f"verify: {len(chosen)} prompts of the {split} split ({left_out} left out: "
                f"they leave fewer than {tokens} tokens of the context), {tokens} tokens "
                "each: the baseline's greedy continuation, one forward per arm, the optimized "
                "arm's own continuation\n")
        responses, said = _responses(baseline, optimized, regression, chosen, tokens, bar)
        report = GenerateReport(
            baseline, optimized, regression, split, tokens,
            summarize(responses, min_size=settings.verify_min_slice_size), responses,
            left_out, len(judged), said, dict(chosen))
        if speed:
            _speed(report, [ids for _, ids in chosen], settings.verify_speed_batch, bar)
        return report
    finally:
        bar.close()


def _prompts(baseline: Arm, regression: RegressionSet, judged: list[int], settings: Settings,
             tokens: int) -> tuple[list[tuple[int, list[int]]], int]:
    """At most `verify_prompts` of the `judged` indices, evenly spaced, with their prompt ids
    (cut to `verify_prompt_share`, a captured prompt whole); and how many of them leave fewer
    than `tokens` of the model's context."""
    context = model_context(baseline.model)
    chosen, left_out = judged_prompts(
        baseline.tokenizer, regression.texts, judged, count=settings.verify_prompts,
        share=settings.verify_prompt_share, tokens=tokens, context=context,
        whole=lambda index: regression.examples[index].meta.get("kind") == "parted")
    if not chosen:
        raise ModelSourceError(f"no prompt of the set fits the model's context of {context} "
                               f"tokens with {tokens} to generate")
    return chosen, left_out


def _responses(baseline: Arm, optimized: Arm, regression: RegressionSet,
               chosen: list[tuple[int, list[int]]], tokens: int,
               bar: Bar) -> tuple[list[ResponseFidelity], dict[int, tuple[str, str, str]]]:
    """Each prompt's response scored, and what was said (prompt, both continuations)."""
    prompts = [ids for _, ids in chosen]
    bar.stage("greedy: baseline", len(prompts))
    reference = greedy(baseline.model, baseline.tokenizer, prompts, tokens,
                       batch=GREEDY_BATCH, done=bar.step)
    bar.stage("greedy: optimized", len(prompts))
    own = greedy(optimized.model, optimized.tokenizer, prompts, tokens, batch=GREEDY_BATCH,
                 done=bar.step)
    bar.stage("teacher-forced: both arms", len(prompts))
    found, said = [], {}
    text = baseline.tokenizer.decode
    for (index, prompt), continuation, mine in zip(chosen, reference, own, strict=True):
        bar.step()
        said[index] = (text(prompt, skip_special_tokens=True),
                       text(continuation, skip_special_tokens=True),
                       text(mine, skip_special_tokens=True))
        if not continuation:  # EOS at once: nothing to score
            continue
        found.append(score_response(
            baseline.model, optimized.model, prompt, continuation,
            slices=slices_of(regression.texts[index], len(prompt), None), index=index, own=mine))
    return found, said


def _speed(report: GenerateReport, prompts: list[list[int]], batch: int, bar: Bar) -> None:
    sample = [prompts[i % len(prompts)] for i in range(2 * batch)]
    arms = {"baseline": report.baseline, "optimized": report.optimized}
    bar.stage("throughput", ROUNDS * len(arms))
    rates = tokens_per_second({name: (arm.model, arm.tokenizer) for name, arm in arms.items()},
                              sample, report.tokens, batch, rounds=ROUNDS, done=bar.step)
    report.throughput = {"batch": batch, "sequences": len(sample), "tokens": report.tokens,
                         **rates}
    report.speedup = rates["optimized"] / rates["baseline"]
    report.memory = {name: {"weights_mib": weights_bytes(arm.model) / 2**20,
                            "kv_bytes_per_token": KvCost.of_model(arm.model).per_token}
                     for name, arm in arms.items()}

