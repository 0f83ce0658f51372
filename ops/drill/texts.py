"""The drills' inputs: deterministic pseudo-English texts for the long-input burst, request
bodies made of them, the short body of the load and the probe, and the recovery probe."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable

from ops.load import Sender

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "model data system time people new first year work way could after two made many then them "
    "these may like than other use only more most also any some very well over such our through "
    "where much before right good each those both under same while last might great between "
    "never city world small large market price water energy study report music game team player "
    "school health policy research network server request answer quickly slowly early later "
    "river mountain garden window letter morning evening history science language number"
).split()


def make_text(rng: random.Random, words: int = 200) -> str:
    """`words` words of pseudo-English: sentences of 6-16 words, capitalised, full stops."""
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(min(rng.randint(6, 16), words - len(out)))]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out += sentence
    return " ".join(out)


def make_texts(n: int, words: int = 200, seed: int = 15) -> list[str]:
    """`n` texts of `words` words, the same for the same arguments on every machine."""
    rng = random.Random(seed)
    return [make_text(rng, words) for _ in range(n)]


def batch_bodies(texts: list[str], per_request: int, count: int) -> list[bytes]:
    """`count` JSON request bodies of `per_request` texts each, taken round the list of texts."""
    return [json.dumps({"inputs": [texts[(i * per_request + j) % len(texts)]
                                   for j in range(per_request)]}).encode() for i in range(count)]


def short_body(i: int) -> bytes:
    return json.dumps({"inputs": [f"drill input number {i}"]}).encode()


def small_probe(sender: Sender) -> Callable[[float], Awaitable[bool]]:
    """A probe for `recovery_time`: one short text, True when answered 200 within the limit."""
    count = 0

    async def probe(limit_s: float) -> bool:
        nonlocal count
        count += 1
        try:
            shot = await asyncio.wait_for(sender(short_body(count), f"drill-probe-{count}"),
                                          limit_s)
        except TimeoutError:
            return False
        return shot.status == 200 and shot.latency_s < limit_s

    return probe
