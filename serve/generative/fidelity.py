"""How closely one causal LM follows another on the same tokens, teacher-forced: the figures
quantization research reports for language models (llama.cpp's `perplexity --kl-divergence`:
mean KL divergence and "same top token").

The other arm never generates: one forward over prompt plus the reference's continuation gives
its next-token distribution at every position of the continuation, to compare with the
reference's own at the same positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
