"""Idempotency records: a repeated request with the same `Idempotency-Key` gets the same answer.

Protocol, per key (scoped to the application, kept for `ttl_s`):

1. `claim(key, fingerprint)`: atomically create a *pending* record owned by this request, or
   return the record already there. The fingerprint is a hash of the request's content.
2. The owner serves the request and then either `complete`s the record with the response, or
   `release`s it (the request failed: a retry with the same key may run again).
3. Another request with the same key sees the existing record: a different fingerprint is a
   conflict (the key was reused for another request); the same fingerprint gets the stored
   response when complete, or "in progress" while pending.

A pending record expires after `pending_ttl_s`, so an owner that crashed does not block its key
for long. Only successful responses are stored; errors are never replayed.

Memory: the records share Redis with the rollout state and the kill switch (unless
`CANARY_IDEMPOTENCY_REDIS_URL` gives them one of their own), so they never crowd it out. A
record over `max_record_bytes` is not stored, and neither is one that would take the bytes
stored within the last `ttl_s` past `budget_bytes` (counted in per-interval counters every
gateway replica adds to): `complete` then releases the key and answers False, the request was
served without deduplication. Over budget the records are also what Redis refuses first: their
writes run as plain commands, which a full Redis (`noeviction`) answers with OOM, while the
control plane's scripts run with `allow-oom` (rollout.redis_layout).
"""

from __future__ import annotations

import abc
import hashlib
import json
import threading
from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.redis_conn import open_client
from rollout.redis_store import call_redis, memory_limits


@dataclass(frozen=True)
class IdempotencyRecord:
    fingerprint: str
    done: bool
    response: dict | None = None  # {"status": int, "body": ..., "headers": {...}} when done

    def to_json(self) -> str:
        return json.dumps({"fp": self.fingerprint, "done": self.done, "response": self.response})

    @classmethod
    def from_json(cls, raw: str) -> IdempotencyRecord:
        data = json.loads(raw)
        return cls(data["fp"], data["done"], data.get("response"))


def fingerprint(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Budget:
    """How much the records may take: each at most `max_record_bytes`, all those stored within
    the last TTL at most `budget_bytes`."""

    max_record_bytes: int = 256 * 1024
    budget_bytes: int = 64 * 1024 * 1024


BUCKETS_PER_TTL = 8  # the budget's counters: one per eighth of the TTL


class IdempotencyStore(abc.ABC):
    @abc.abstractmethod
    def claim(self, key: str, fingerprint: str) -> IdempotencyRecord | None:
        """None when this caller now owns the key; else the record already there."""

    @abc.abstractmethod
    def complete(self, key: str, record: IdempotencyRecord) -> bool:
        """Store the answered record; False (and the key released) when it is over the
        record cap or the budget (module docstring)."""

    @abc.abstractmethod
    def release(self, key: str) -> None: ...


class MemoryIdempotencyStore(IdempotencyStore):
    """In-process twin for unit tests; expiry follows the injected clock."""

    def __init__(self, *, ttl_s: float, pending_ttl_s: float, clock: Clock | None = None,
                 budget: Budget | None = None):
        self.ttl_s, self.pending_ttl_s = ttl_s, pending_ttl_s
        self.clock = clock or SystemClock()
        self.budget = budget or Budget()
        self._records: dict[str, tuple[IdempotencyRecord, float]] = {}
        self._stored: list[tuple[float, int]] = []  # (expiry, bytes) of each record stored
        self._lock = threading.Lock()

    def _live(self, key: str) -> IdempotencyRecord | None:
        entry = self._records.get(key)
        if entry and entry[1] > self.clock.monotonic():
            return entry[0]
        self._records.pop(key, None)
        return None

    def claim(self, key, fingerprint):
        with self._lock:
            existing = self._live(key)
            if existing is None:
                expires = self.clock.monotonic() + self.pending_ttl_s
                self._records[key] = (IdempotencyRecord(fingerprint, False), expires)
            return existing

    def complete(self, key, record):
        size, now = len(record.to_json().encode()), self.clock.monotonic()
        with self._lock:
            self._stored = [(until, n) for until, n in self._stored if until > now]
            used = sum(n for _, n in self._stored)
            if size > self.budget.max_record_bytes or used + size > self.budget.budget_bytes:
                self._records.pop(key, None)
                return False
            self._records[key] = (record, now + self.ttl_s)
            self._stored.append((now + self.ttl_s, size))
            return True

    def release(self, key):
        with self._lock:
            self._records.pop(key, None)


class RedisIdempotencyStore(IdempotencyStore):
    """Records under `rollout:<app>:idem:<key>`, created with SET NX and expired by Redis; the
    budget's counters under `rollout:<app>:idem-bytes:<interval>`, expired with the records
    they count."""

    def __init__(self, url: str, app: str, *, ttl_s: float, pending_ttl_s: float,
                 timeout_s: float = 2.0, budget: Budget | None = None,
                 clock: Clock | None = None):
        self.url = url
        self.prefix = f"rollout:{app}:idem:"
        self.bytes_prefix = f"rollout:{app}:idem-bytes:"
        self.ttl_ms, self.pending_ttl_ms = int(ttl_s * 1000), int(pending_ttl_s * 1000)
        self.bucket_s = max(1, int(ttl_s // BUCKETS_PER_TTL))
        self.buckets = -(-int(ttl_s) // self.bucket_s) + 1  # those that may hold live records
        self.budget = budget or Budget()
        self.clock = clock or SystemClock()
        self._client = open_client(url, timeout_s=timeout_s)

    def _call(self, fn, *args, **kwargs):
        return call_redis(self.url, fn, *args, **kwargs)

    def claim(self, key, fingerprint):
        pending = IdempotencyRecord(fingerprint, False).to_json()
        name = self.prefix + key
        for _ in range(3):  # the record can expire between SET NX and GET: try again
            if self._call(self._client.set, name, pending, nx=True, px=self.pending_ttl_ms):
                return None
            raw = self._call(self._client.get, name)
            if raw is not None:
                return IdempotencyRecord.from_json(raw)
        return IdempotencyRecord(fingerprint, False)  # churning: report it as in progress

    def complete(self, key, record):
        raw = record.to_json()
        size = len(raw.encode())
        if size > self.budget.max_record_bytes or size + self.used() > self.budget.budget_bytes:
            self.release(key)
            return False
        bucket = self.bytes_prefix + str(int(self.clock.time() // self.bucket_s))
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self.prefix + key, raw, px=self.ttl_ms)
        pipe.incrby(bucket, size)
        pipe.expire(bucket, int(self.ttl_ms / 1000) + 2 * self.bucket_s)
        self._call(pipe.execute)
        return True

    def memory_limits(self) -> tuple[int, str]:
        """This Redis' maxmemory and policy (rollout.redis_store.memory_limits)."""
        return memory_limits(self._client, self.url)

    def used(self) -> int:
        """Bytes of the records stored within the last TTL, by every replica (an upper bound:
        a record overwritten or released early still counts until its interval ends)."""
        now = int(self.clock.time() // self.bucket_s)
        names = [self.bytes_prefix + str(now - back) for back in range(self.buckets)]
        return sum(int(n) for n in self._call(self._client.mget, names) if n)

    def release(self, key):
        self._call(self._client.delete, self.prefix + key)

    def close(self) -> None:
        self._client.close()
