"""Where a ramp lives: the ramp record, its controller's lease and its last evaluation.

- The ramp record is written by compare-and-set on its own revision (`put`), and every write
  appends an audit entry to the application's audit stream in the same atomic step. A write
  may be fenced by a lease `owner`: it then succeeds only while that owner holds the lease, so
  a controller that lost its lease (paused, partitioned) cannot overwrite its successor's work.
- The lease (`acquire`) makes one controller per application the active one: acquiring sets it
  when free or renews it when already held by the caller; it lapses `ttl_s` after the last
  renewal, so a crashed controller loses it. `release` frees it only for its holder.
- `record` keeps an evaluation as the last one, for `rollout ramp status`, and with `audit`
  also appends it to the audit stream (a note: the rollout state is unchanged). The controller
  audits only the evaluations rollout.ramp.audit selects; the last one is kept every time.

`MemoryRampStore` is the in-memory twin (lease time from an injected clock); `RedisRampStore`
(rollout.ramp.redis_store) is the real one. Both pass tests/ramp_store_contract.py.
"""

from __future__ import annotations

import abc
import threading

from rollout.clock import Clock, SystemClock
from rollout.errors import LeaseLost, RevisionConflict
from rollout.ramp.machine import Ramp
from rollout.store import MemoryStateStore


def check_next(before: Ramp | None, after: Ramp) -> int:
    expected = (before.revision if before else 0) + 1
    if after.revision != expected:
        raise ValueError(f"after.revision must be {expected}, got {after.revision}")
    return expected - 1


class RampStore(abc.ABC):
    @abc.abstractmethod
    def get(self) -> Ramp | None:
        """The application's ramp (the latest one, running or finished), or None."""

    @abc.abstractmethod
    def put(self, before: Ramp | None, after: Ramp, *, actor: str, action: str, reason: str,
            detail: dict | None = None, owner: str | None = None,
            evaluation: bool = False) -> Ramp:
        """Store `after` if the ramp is still at `before`'s revision (0 for None) and, with
        `owner`, that owner holds the lease; audit it (and keep `detail` as the last evaluation
        when `evaluation`). RevisionConflict / LeaseLost otherwise, and nothing is written."""

    @abc.abstractmethod
    def record(self, *, ts: float, actor: str, action: str, reason: str, detail: dict,
               audit: bool = True) -> None:
        """Keep one evaluation (state unchanged) as the last one; with `audit`, also append
        it to the audit stream, in the same atomic step."""

    @abc.abstractmethod
    def last_evaluation(self) -> dict | None:
        """The detail of the last recorded evaluation, with its `ts`, `action` and `reason`."""

    @abc.abstractmethod
    def acquire(self, owner: str, ttl_s: float) -> bool:
        """Take the lease if free, or renew it if `owner` holds it; False if another does."""

    @abc.abstractmethod
    def release(self, owner: str) -> None:
        """Free the lease if `owner` holds it (else nothing)."""

    @abc.abstractmethod
    def holder(self) -> str | None:
        """Who holds the lease now, or None."""

    def close(self) -> None:  # noqa: B027 - a store without connections has nothing to do
        """Release connections."""


class MemoryRampStore(RampStore):
    """The in-memory twin; audit entries go to the given in-memory state store."""

    def __init__(self, states: MemoryStateStore, clock: Clock | None = None):
        self.states = states
        self.clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._ramp: Ramp | None = None
        self._last: dict | None = None
        self._lease: tuple[str, float] | None = None  # owner, expiry (monotonic)

    def _held_by(self, owner: str) -> bool:
        return self.holder() == owner

    def get(self):
        with self._lock:
            return self._ramp

    def put(self, before, after, *, actor, action, reason, detail=None, owner=None,
            evaluation=False):
        expected = check_next(before, after)
        with self._lock:
            current = self._ramp.revision if self._ramp else 0
            if current != expected:
                raise RevisionConflict(expected, current)
            if owner is not None and not self._held_by(owner):
                raise LeaseLost(f"the ramp lease is not held by {owner}")
            self._ramp = after
            self.states.note(ts=after.updated_at, actor=actor, action=action, reason=reason,
                             detail=detail)
            if evaluation:
                self._last = dict(detail or {}, ts=after.updated_at, action=action, reason=reason)
            return after

    def record(self, *, ts, actor, action, reason, detail, audit=True):
        with self._lock:
            if audit:
                self.states.note(ts=ts, actor=actor, action=action, reason=reason,
                                 detail=detail)
            self._last = dict(detail, ts=ts, action=action, reason=reason)

    def last_evaluation(self):
        with self._lock:
            return dict(self._last) if self._last else None

    def acquire(self, owner, ttl_s):
        now = self.clock.monotonic()
        with self._lock:
            if self._lease and self._lease[0] != owner and self._lease[1] > now:
                return False
            self._lease = (owner, now + ttl_s)
            return True

    def release(self, owner):
        with self._lock:
            if self._lease and self._lease[0] == owner:
                self._lease = None

    def holder(self):
        now = self.clock.monotonic()
        lease = self._lease
        return lease[0] if lease and lease[1] > now else None
