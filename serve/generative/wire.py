"""What crosses between the gateway and a generative arm's replica: how a sequence is sampled,
the events it is answered with, and the refusals before its first token. No torch here: the
gateway imports this module."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: every sequence runs to `max_tokens`


@dataclass(frozen=True)
class Event:
    """A piece of a sequence's answer (`finish` None), or its end: `finish` is "stop" (an EOS
    token or a stop string), "length" (`max_tokens` or the model's context), "cancelled",
    "timeout" (its deadline) or "error" (`error` says what). A sequence's first token also
    says how long it waited in the loop before its prefill began (`queued_ms`) and how long
    that prefill took (`prefill_ms`, shared by the sequences prefilled together)."""
    text: str = ""
    token: int | None = None
    finish: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queued_ms: float | None = None
    prefill_ms: float | None = None


class PromptTooLong(ValueError):
    """The prompt (plus room for one token) does not fit the model's context."""


class NeverFits(ValueError):
    """Prompt plus `max_tokens` exceed the KV budget on their own: waiting cannot help."""
