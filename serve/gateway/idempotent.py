"""`Idempotency-Key` at the gateway: replay a repeated request's response instead of serving it
again, refuse a reused key, and never let the idempotency store take serving down.

The records live in Redis (rollout.idempotency), in the rollout state's unless
`CANARY_IDEMPOTENCY_REDIS_URL` names another, within a memory budget (a byte cap per answer, a
total per TTL cut at start to a quarter of Redis' `maxmemory`). The store is reached off the
event loop; when it cannot be reached or answers with an error (a full Redis, a demoted
primary), or an answer is over budget, the request is served without deduplication (fail open:
inference has no side effects, and availability wins) and a warning is logged once per kind.
A client that leaves while its claim is on its way to Redis leaves no pending record behind:
the claim, once it lands, is released.
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
from rollout.idempotency import Budget, IdempotencyRecord, RedisIdempotencyStore, fingerprint
from rollout.redis_store import eviction_warning
from rollout.settings import ServingSettings, StateSettings
from rollout.watcher import error_kind
from serve.common.errors import InProgress, InvalidInput, KeyReused

log = logging.getLogger("canary.gateway")

# what a store call may raise that serving goes on through: the store's errors and a record
# this version cannot read
STORE_ERRORS = (RolloutError, ValueError, KeyError, TypeError)

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
        """Records kept in the Redis `serving` or else `state` names, for as long as `serving`
        says, within its budget (cut to Redis' `maxmemory` here)."""
        self.store = RedisIdempotencyStore(
            serving.idempotency_redis_url or state.redis_url, state.app_name,
            ttl_s=serving.idempotency_ttl_s, pending_ttl_s=serving.request_timeout_s * 2,
            timeout_s=state.redis_timeout_s,
            budget=Budget(serving.idempotency_max_record_bytes, serving.idempotency_budget_bytes),
        )
        self.skipped: dict[str, int] = {}  # requests served without deduplication, by why
        self._pending: set[asyncio.Future] = set()  # releases of abandoned claims

    def _skip(self, why: str, detail: object = "") -> None:
        """Count a request served without deduplication; log the first of each kind."""
        self.skipped[why] = self.skipped.get(why, 0) + 1
        if self.skipped[why] == 1:
            log.warning("idempotency: serving without deduplication (%s) %s", why, detail)

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
        claiming = asyncio.ensure_future(asyncio.to_thread(self.store.claim, key, fp))
        try:
            record = await asyncio.shield(claiming)
        except asyncio.CancelledError:  # the client left: a claim that lands is given back
            claiming.add_done_callback(lambda done: self._abandoned(done, key))
            raise
        except STORE_ERRORS as exc:
            self._skip(error_kind(exc), exc)
            return None, False
        if record is None:
            return None, True
        if record.fingerprint != fp:
            raise KeyReused("this Idempotency-Key was already used for a different request")
        if not record.done:
            raise InProgress("a request with this Idempotency-Key is still being served")
        return record.response, False

    def _abandoned(self, claiming: asyncio.Future, key: str) -> None:
        """The claim of a request whose client left has landed: release the key it owns."""
        if claiming.cancelled() or claiming.exception() is not None:
            return
        if claiming.result() is None:
            release = asyncio.ensure_future(self.finish(key, "", None))
            self._pending.add(release)
            release.add_done_callback(self._pending.discard)

    async def finish(self, key: str, fp: str, response: dict | None) -> None:
        """Store the response (or, with None, release the key so a retry can run)."""
        try:
            if response is None:
                await asyncio.to_thread(self.store.release, key)
                return
            record = IdempotencyRecord(fp, True, response)
            if not await asyncio.to_thread(self.store.complete, key, record):
                self._skip("over budget", f"(an answer over {self.store.budget.max_record_bytes}"
                           f" bytes, or past {self.store.budget.budget_bytes} stored per TTL)")
        except STORE_ERRORS as exc:
            self._skip(error_kind(exc), exc)


def fit_budget(store: RedisIdempotencyStore) -> Budget:
    """The store's budget, cut to a quarter of its Redis' `maxmemory` when that is smaller."""
    try:
        maxmemory, _ = store.memory_limits()
    except RolloutError as exc:
        log.info("idempotency: Redis' maxmemory not read (%s); budget %d bytes", exc,
                 store.budget.budget_bytes)
        return store.budget
    if not maxmemory or maxmemory // 4 >= store.budget.budget_bytes:
        return store.budget
    log.info("idempotency: budget cut to %d bytes, a quarter of Redis' maxmemory", maxmemory // 4)
    return Budget(min(store.budget.max_record_bytes, maxmemory // 4), maxmemory // 4)


def check_redis_memory(idempotency: Idempotency, store) -> None:
    """At a gateway replica's start: fit the idempotency budget to its Redis, and warn when the
    state's Redis (`store`, a RedisStateStore) may evict the rollout state. Read once, off the
    event loop; a Redis that cannot say keeps the configured budget."""
    idempotency.store.budget = fit_budget(idempotency.store)
    try:
        _, policy = store.memory_limits()
    except RolloutError as exc:
        log.info("Redis' maxmemory-policy not read (%s)", exc)
        return
    warning = eviction_warning(policy)
    if warning:
        log.warning("%s", warning)
