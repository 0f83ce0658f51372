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
"""

from __future__ import annotations

import abc
import hashlib
import json
import threading
from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.redis_conn import open_client
from rollout.redis_store import call_redis


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


class IdempotencyStore(abc.ABC):
    @abc.abstractmethod
    def claim(self, key: str, fingerprint: str) -> IdempotencyRecord | None:
        """None when this caller now owns the key; else the record already there."""

    @abc.abstractmethod
    def complete(self, key: str, record: IdempotencyRecord) -> None: ...

    @abc.abstractmethod
    def release(self, key: str) -> None: ...


class MemoryIdempotencyStore(IdempotencyStore):
    """In-process twin for unit tests; expiry follows the injected clock."""

    def __init__(self, *, ttl_s: float, pending_ttl_s: float, clock: Clock | None = None):
        self.ttl_s, self.pending_ttl_s = ttl_s, pending_ttl_s
        self.clock = clock or SystemClock()
        self._records: dict[str, tuple[IdempotencyRecord, float]] = {}
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
        with self._lock:
            self._records[key] = (record, self.clock.monotonic() + self.ttl_s)

    def release(self, key):
        with self._lock:
            self._records.pop(key, None)


class RedisIdempotencyStore(IdempotencyStore):
    """Records under `rollout:<app>:idem:<key>`, created with SET NX and expired by Redis."""

    def __init__(self, url: str, app: str, *, ttl_s: float, pending_ttl_s: float,
                 timeout_s: float = 2.0):
        self.url = url
        self.prefix = f"rollout:{app}:idem:"
        self.ttl_ms, self.pending_ttl_ms = int(ttl_s * 1000), int(pending_ttl_s * 1000)
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
        self._call(self._client.set, self.prefix + key, record.to_json(), px=self.ttl_ms)

    def release(self, key):
        self._call(self._client.delete, self.prefix + key)

    def close(self) -> None:
        self._client.close()
