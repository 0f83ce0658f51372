"""Tokenization in the gateway replicas, off their event loop.

A model replica's event loop merges requests into batches and its forward thread computes;
tokenizing there puts every request's preprocessing on the one loop that also feeds the
forward, and scales only with model replicas. Here the gateway tokenizes instead: each gateway
replica encodes a request's texts and sends the token ids (`Encoded`, with the time it took)
to the model, which then skips its own tokenizer. Tokenization so scales with gateway replicas
and their CPUs, independently of model replicas, and never waits behind a forward.

Where in the gateway: a small request (up to `INLINE_CHARS` characters, ~0.1-0.3 ms of
tokenizing) is encoded right on the event loop, because handing it to a thread costs more than
that under load (the thread has to win the GIL from a busy loop, which Python hands over only
every 5 ms: measured as 2-10 ms of `preprocess` at concurrency 32 on 2 cores). Larger requests
go to the replica's own thread pool (`gateway_tokenize_threads`; the Rust tokenizer releases
the GIL for a batch), so a long request never stalls the loop for the others.

Invariant: the ids are exactly what the model replica would have produced. The gateway loads
the tokenizer of the same model source and compares its digest (tokenizer definition and
truncation length, serve.recipes.source.load_tokenizer) with the digest both arms report in
`info()`; when they differ, or with `gateway_tokenize_threads = 0`, or if encoding fails, the texts
go to the model as before. The model accepts either form (`ModelServer.predict`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from rollout.settings import ModelSettings, ServingSettings
from serve.recipes.source import Encoded, encode_ids, load_tokenizer

log = logging.getLogger("canary.gateway")
INLINE_CHARS = 2048  # requests up to this many characters are tokenized on the event loop


class Preprocessor:
    """`encode(texts)`: the texts as `Encoded` token ids, or unchanged when disabled."""

    def __init__(self, model: ModelSettings, serving: ServingSettings, model_infos: list[dict]):
        """The models' tokenizer (`model`) on `serving`'s tokenize threads, when enabled."""
        self.enabled = False
        self._pool: ThreadPoolExecutor | None = None
        threads = serving.gateway_tokenize_threads
        if threads == 0:
            return
        self.tokenizer, self.max_tokens, digest = load_tokenizer(model)
        reported = {info.get("tokenizer") for info in model_infos}
        if reported != {digest}:
            log.warning("the models tokenize differently from this gateway (%s vs %s): "
                        "sending texts", sorted(map(str, reported)), digest)
            return
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")
        self.enabled = True

    async def encode(self, texts: list[str]) -> list[str] | Encoded:
        if not self.enabled:
            return texts
        start = time.perf_counter()
        try:
            if sum(map(len, texts)) <= INLINE_CHARS:
                ids = encode_ids(self.tokenizer, texts, self.max_tokens)
            else:
                ids = await asyncio.get_running_loop().run_in_executor(
                    self._pool, encode_ids, self.tokenizer, texts, self.max_tokens)
        except Exception as exc:  # the model replica tokenizes instead
            log.warning("gateway tokenization failed (%s): sending texts", type(exc).__name__)
            return texts
        return Encoded(ids, preprocess_ms=round((time.perf_counter() - start) * 1000, 3))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
