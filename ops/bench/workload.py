"""The texts a benchmark sends (`--workload`):

- `mixed`: the regression set's texts (the shipped one unless `--texts`), `count` of them evenly
  spaced over it, in its order. The shipped set has a long tail (1-256 tokens, median 16): how a
  server batches and pads decides much of its speed.
- `short`: `count` generated texts of `SHORT_WORDS` words each, every word one token of the
  packaged model's vocabulary, so each text is 12 tokens with `[CLS]` and `[SEP]`: padding
  decides nothing and the cost of each request decides everything. Generated from a fixed seed
  with `random.Random.random` (whose sequence Python keeps across versions), nothing read or
  downloaded: the same texts on every machine.
"""

from __future__ import annotations

import random

from ops.bench.endtoend import BenchError

WORKLOADS = ("mixed", "short")
SHORT_WORDS = 10
SEED = 32
# common English words, each a single token of all-MiniLM-L6-v2's (BERT uncased) vocabulary
WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea"
).split()


def short_texts(count: int, seed: int = SEED) -> list[str]:
    """`count` texts of `SHORT_WORDS` words (module docstring)."""
    rng = random.Random(seed)
    return [" ".join(WORDS[int(rng.random() * len(WORDS))] for _ in range(SHORT_WORDS))
            for _ in range(count)]


def mixed_texts(count: int, path: str | None = None) -> list[str]:
    """`count` texts evenly spaced over the regression set at `path` (default: the shipped
    one); a BenchError when it cannot be read."""
    from serve.common.regression import RegressionSetError, load_set

    try:
        texts = load_set(path).texts
    except RegressionSetError as exc:
        raise BenchError(str(exc)) from None
    step = max(1, len(texts) // count)
    return texts[::step][:count]


def texts(workload: str, count: int, path: str | None = None) -> list[str]:
    """The texts of `workload` (module docstring)."""
    if workload == "short":
        return short_texts(count)
    return mixed_texts(count, path)
