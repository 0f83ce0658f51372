"""Checks on a causal LM's answers that hold on any CPU: a token is greedy when the model,
scoring the sequence alone, ranks it within float noise of its most likely token (a batch's
padding moves logits by float noise, which may flip a near-tie)."""

from __future__ import annotations

import torch

NOISE = 1e-4  # logits; fp32 batched against alone differ by ~1e-6


def assert_greedy(model, prompt: list[int], generated: list[int]) -> None:
    """Each of `generated` is the model's greedy next token after `prompt` and those before
    it, within NOISE."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + generated])).logits[0]
    for offset, token in enumerate(generated):
        row = logits[len(prompt) + offset - 1]
        assert row[token] >= row.max() - NOISE, (prompt, offset, token, int(row.argmax()))
