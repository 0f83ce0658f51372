"""How closely one causal LM follows another on the same tokens, teacher-forced: the figures
quantization research reports for language models (llama.cpp's `perplexity --kl-divergence`:
mean KL divergence and "same top token").

The other arm never generates: one forward over prompt plus the reference's continuation gives
its next-token distribution at every position of the continuation, to compare with the
reference's own at the same positions.

`greedy` gives each prompt's greedy continuation through the decode loop (serve.generative.decode)
and `decode_seconds` times the loop on a batch of prompts: `rollout verify` for a causal LM,
`auto` for a causal LM (serve.recipes.auto.causal) and ops.bench.generate_recipes use both.
`judged_prompts` picks and cuts the prompts both judges score, `score_response` scores one
prompt's continuation under two models, `tokens_per_second` times models side by side.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from rollout.token_fidelity import ResponseFidelity


@dataclass(frozen=True)
class TokenFidelity:
    """Per continuation token: KL(reference || other) in nats, and whether the two most likely
    tokens agree; with the negative log-likelihood of the continuation under each."""
    kld: list[float]
    same_top: list[bool]
    reference_nll: list[float]
    other_nll: list[float]


def continuation_logits(model, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """The model's logits (fp32) at the positions that predict each continuation token."""
    ids = torch.tensor([prompt + continuation])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(continuation)]


def compare(reference: torch.Tensor, other: torch.Tensor,
            continuation: list[int]) -> TokenFidelity:
    """`reference` and `other`: positions x vocabulary logits over the same `continuation`."""
    log_p, log_q = reference.log_softmax(-1), other.log_softmax(-1)
    kld = (log_p.exp() * (log_p - log_q)).sum(-1).clamp(min=0)
    tokens = torch.tensor(continuation).unsqueeze(1)
    return TokenFidelity(
        kld=kld.tolist(),
        same_top=(reference.argmax(-1) == other.argmax(-1)).tolist(),
        reference_nll=(-log_p.gather(1, tokens)).squeeze(1).tolist(),
        other_nll=(-log_q.gather(1, tokens)).squeeze(1).tolist())


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """The first position where two greedy continuations differ (None: identical)."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def unbounded_loop(model, tokenizer, max_batch: int):
    """A decode loop whose KV budget (16 GiB) never holds a request back: a measurement of the
    schedule, not of admission."""
    from serve.generative.decode import DecodeLoop
    from serve.generative.kv import KvBudget, KvCost
    return DecodeLoop(model, tokenizer, KvBudget(1 << 34, KvCost.of_model(model)),
                      max_batch=max_batch)


def greedy(model, tokenizer, prompts: list[list[int]], tokens: int, *, batch: int = 16,
           done=None) -> list[list[int]]:
    """Each prompt's greedy continuation of at most `tokens` (EOS ends it), decoded `batch` at
    a time; `done(n)` hears of each `n` sequences finished."""
    from serve.generative.decode import Sampling, Sequence
    loop = unbounded_loop(model, tokenizer, batch)
    sequences = [loop.submit(Sequence(p, Sampling(max_tokens=tokens, temperature=0),
                                      lambda event: None)) for p in prompts]
    finished = 0
    while finished < len(sequences):
        loop.step()
        now = sum(1 for s in sequences if s.finish)
        if done is not None and now > finished:
            done(now - finished)
        finished = now
    return [s.generated for s in sequences]


def decode_seconds(model, tokenizer, prompts: list[list[int]], tokens: int, batch: int) -> float:
    """Seconds for the decode loop to give every prompt `tokens` tokens (EOS ignored, so that
    two models do the same work), `batch` sequences at a time."""
    from serve.generative.decode import Sampling, Sequence
    loop = unbounded_loop(model, tokenizer, batch)
    started = time.perf_counter()
    sequences = [loop.submit(Sequence(p, Sampling(max_tokens=tokens, temperature=0,
                                                  ignore_eos=True), lambda event: None))
                 for p in prompts]
    while not all(s.finish for s in sequences):
        loop.step()
    return time.perf_counter() - started


def judged_prompts(tokenizer, texts: Sequence[str], indices: Sequence[int], *, count: int,
                   share: float, tokens: int, context: int,
                   whole: Callable[[int], bool] = lambda index: False
                   ) -> tuple[list[tuple[int, list[int]]], int]:
    """At most `count` of `indices` (into `texts`), evenly spaced, each with its prompt ids: the
    text tokenized as a completion's prompt (BOS included) and cut to its first `share` of
    tokens (at least two; `whole(index)`: kept whole). Returns them and how many were left out
    because they leave fewer than `tokens` of the model's `context`."""
    step = max(1, len(indices) / count) if indices else 1
    picked = sorted({indices[int(i * step)] for i in range(min(count, len(indices)))})
    chosen, left_out = [], 0
    for index in picked:
        ids = tokenizer(texts[index])["input_ids"]
        if not whole(index):
            ids = ids[:max(min(2, len(ids)), math.ceil(share * len(ids)))]
        if ids and len(ids) + tokens <= context:
            chosen.append((index, ids))
        else:
            left_out += 1
    return chosen, left_out


def model_context(model) -> int:
    """The positions the model can attend to (2048 where its config does not say)."""
    return getattr(model.config, "max_position_embeddings", None) or 2048


def score_response(reference, other, prompt: list[int], continuation: list[int], *,
                   slices: tuple[str, ...] = (), index: int = -1,
                   own: list[int] | None = None) -> ResponseFidelity:
    """`continuation` (the reference's) teacher-forced through both models, one forward each;
    `own`: the other model's own greedy continuation, when it was generated (whether it is
    identical, or where it parts)."""
    scored = compare(continuation_logits(reference, prompt, continuation),
                     continuation_logits(other, prompt, continuation), continuation)
    parted = None if own is None else first_divergence(continuation, own)
    return ResponseFidelity(
        tuple(scored.kld), tuple(scored.same_top), sum(scored.reference_nll),
        sum(scored.other_nll), slices, None if own is None else parted is None, parted, index)


def tokens_per_second(arms: Mapping[str, tuple[object, object]], prompts: list[list[int]],
                      tokens: int, batch: int, *, rounds: int = 3,
                      done: Callable[[], None] | None = None) -> dict[str, float]:
    """Output tokens per second of each arm's (model, tokenizer) decode loop giving `tokens`
    to each of `prompts`, `batch` at a time: arms interleaved round by round, best of `rounds`,
    after a warm-up (first shapes, lazy initialisation). `done()` hears of each timed pass."""
    for model, tokenizer in arms.values():
        decode_seconds(model, tokenizer, prompts[:2], 2, 2)
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(rounds):
        for name, (model, tokenizer) in arms.items():
            best[name] = min(best[name], decode_seconds(model, tokenizer, prompts, tokens, batch))
            if done is not None:
                done()
    return {name: len(prompts) * tokens / seconds for name, seconds in best.items()}
