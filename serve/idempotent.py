"""`Idempotency-Key` at the gateway: replay a repeated request's response instead of serving it
again, refuse a reused key, and never let the idempotency store take serving down.

The records live in Redis (rollout.idempotency). The store is reached off the event loop; when
it cannot be reached the request is served without deduplication (fail open: inference has no
side effects, and availability wins) and a warning is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rollout import RolloutError
from rollout.idempotency import IdempotencyRecord, RedisIdempotencyStore, fingerprint
from rollout.settings import ServingSettings, StateSettings
from serve.errors import InProgress, InvalidInput, KeyReused

log = logging.getLogger("canary.gateway")

_KEY = re.compile(r"^[A-Za-z0-9._:@+=/-]{1,128}$")
REPLAYED = {"Idempotency-Status": "replayed"}


@dataclass
class Claim:
    """A request's hold on its `Idempotency-Key` (`Idempotency.claim`)."""

    replay: dict | None = None  # a stored response: send it instead of serving the request
    response: dict | None = None  # the response to store, once the request is answered

    def complete(self, response: dict) -> None:
        """The request was answered: store `response` for a retry with the same key."""
        self.response = response


class Idempotency:
    def __init__(self, state: StateSettings, serving: ServingSettings):
        """Records kept in the Redis `state` names, for as long as `serving` says."""
        self.store = RedisIdempotencyStore(
            state.redis_url, state.app_name, ttl_s=serving.idempotency_ttl_s,
            pending_ttl_s=serving.request_timeout_s * 2, timeout_s=state.redis_timeout_s,
        )

    @staticmethod
    def key_from(header: str | None) -> str | None:
        if header is None:
            return None
        if not _KEY.fullmatch(header):
            raise InvalidInput(
                "Idempotency-Key must be 1-128 characters of A-Z a-z 0-9 . _ : @ + = / -"
            )
        return header

    @staticmethod
    def fingerprint(task: str, inputs: list[str]) -> str:
        return fingerprint(task, json.dumps(inputs, ensure_ascii=False))

    @contextlib.asynccontextmanager
    async def claim(self, header: str | None, task: str,
                    inputs: list[str]) -> AsyncIterator[Claim]:
        """The request's key (`header`) held for the block: a stored response to replay
        (`Claim.replay`), a reused key or one still being served refused (KeyReused,
        InProgress), an invalid one refused (InvalidInput). No key, or the store unreachable:
        the block runs without deduplication. A key this request owns is settled in exactly
        one place, when the block ends however it ends: the response `Claim.complete` gave is
        stored; without one (an error response, the client gone, a cancelled call) the key is
        released so that a retry can run."""
        key = self.key_from(header)
        if key is None:
            yield Claim()
            return
        fp = self.fingerprint(task, inputs)
        stored, owned = await self.begin(key, fp)
        claim = Claim(replay=stored)
        if not owned:  # a replay, or the store is unreachable: nothing to settle
            yield claim
            return
        try:
            yield claim
        finally:
            await asyncio.shield(self.finish(key, fp, claim.response))

    async def begin(self, key: str, fp: str) -> tuple[dict | None, bool]:
        """(stored response to replay or None, whether this request owns the key)."""
        try:
            record = await asyncio.to_thread(self.store.claim, key, fp)
        except RolloutError as exc:
            log.warning("idempotency store unavailable, serving without it: %s", exc)
            return None, False
        if record is None:
            return None, True
        if record.fingerprint != fp:
            raise KeyReused("this Idempotency-Key was already used for a different request")
        if not record.done:
            raise InProgress("a request with this Idempotency-Key is still being served")
        return record.response, False

    async def finish(self, key: str, fp: str, response: dict | None) -> None:
        """Store the response (or, with None, release the key so a retry can run)."""
        try:
            if response is None:
                await asyncio.to_thread(self.store.release, key)
            else:
                record = IdempotencyRecord(fp, True, response)
                await asyncio.to_thread(self.store.complete, key, record)
        except RolloutError as exc:
            log.warning("could not record the idempotent response: %s", exc)
