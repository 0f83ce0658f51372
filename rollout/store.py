"""The state store: the narrow interface every rollout change goes through, and its in-memory twin.

A store keeps, per application: the current `RolloutState`, every state it ever held by revision
(the rollback path), an append-only audit log, what each gateway reports it serves, and the
latest `rollout verify` verdict per (baseline version, optimized version) pair. Its single write is
`compare_and_set`: it succeeds only when the stored revision is still the one the caller read,
so two operators acting at once never lose an update. Every successful write notifies
subscribers, which is how gateways hear of a change within milliseconds.

`MemoryStateStore` is for unit tests of logic; `RedisStateStore` (rollout.redis_store) is the
real one. Both pass the same contract tests (tests/store_contract.py).
"""

from __future__ import annotations

import abc
import itertools
import threading

from rollout.errors import RevisionConflict, RevisionNotFound
from rollout.state import AuditEntry, DeploymentReport, RolloutState
from rollout.verdict import Verdict


class Subscription(abc.ABC):
    """Change notifications for one listener."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True when a change was published meanwhile."""

    @abc.abstractmethod
    def close(self) -> None: ...


class StateStore(abc.ABC):
    @abc.abstractmethod
    def get(self) -> RolloutState:
        """The current state; a store that holds none yet answers the default (revision 0)."""

    @abc.abstractmethod
    def compare_and_set(
        self, before: RolloutState, after: RolloutState, *, actor: str, action: str, reason: str
    ) -> RolloutState:
        """Store `after` if the current revision is still `before.revision`.

        `after.revision` must be above `before.revision` (one above, or above the highest
        revision gateways report: rollout.change.stamp). Appends an audit entry and notifies
        subscribers in the same atomic step. Raises RevisionConflict when the state moved.
        """

    @abc.abstractmethod
    def audit(self, last: int | None = None) -> list[AuditEntry]:
        """Audit entries, oldest first; only the newest `last` when given."""

    @abc.abstractmethod
    def state_at(self, revision: int) -> RolloutState:
        """The state as it was recorded at `revision`; RevisionNotFound if never recorded."""

    @abc.abstractmethod
    def subscribe(self) -> Subscription: ...

    @abc.abstractmethod
    def report_deployment(self, report: DeploymentReport) -> None:
        """Record what one gateway serves (a heartbeat; the newest report per gateway wins).

        This is the only write a gateway makes: it never changes the rollout state."""

    @abc.abstractmethod
    def deployments(self) -> list[DeploymentReport]:
        """The newest report of every gateway, oldest first (readers judge freshness by `ts`)."""

    # Verdicts and notes are not abstract, so test doubles that wrap a store need not implement
    # them; both real stores do, and run the same contract tests.
    def put_verdict(self, verdict: Verdict) -> None:
        """Keep `verdict` as the latest for its (baseline, optimized) version pair."""
        raise NotImplementedError(f"{type(self).__name__} keeps no verdicts")

    def get_verdict(self, baseline_version: str, optimized_version: str) -> Verdict | None:
        """The latest verdict for exactly this version pair, or None."""
        raise NotImplementedError(f"{type(self).__name__} keeps no verdicts")

    def audit_after(self, entry_id: str, count: int) -> list[AuditEntry]:
        """At most `count` audit entries after the one with id `entry_id` ("0-0": from the
        first), oldest first: how the notifier (serve.control_plane.notify) tails the stream."""
        raise NotImplementedError(f"{type(self).__name__} cannot tail its audit")

    def note(self, *, ts: float, actor: str, action: str, reason: str,
             detail: dict | None = None) -> None:
        """Append an audit entry that changes nothing (e.g. a ramp evaluation): its revision is
        the current one, `before` and `after` are both the current state, nobody is notified."""
        raise NotImplementedError(f"{type(self).__name__} keeps no notes")

    # Hooks with a default: an in-process store is always reachable and holds no connections,
    # so only a networked store (RedisStateStore) overrides them.
    def ping(self) -> None:
        """Raise StoreUnavailable when the store cannot be reached; by default a no-op."""
        return None

    def close(self) -> None:
        """Release connections; by default a no-op."""
        return None


def _stream_id(entry_id: str) -> tuple[int, int]:
    """A Redis stream id ("<ms>-<seq>") as a tuple that orders like the stream."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def check_successor(before: RolloutState, after: RolloutState) -> None:
    if after.revision <= before.revision:
        raise ValueError(
            f"after.revision must be above {before.revision}, got {after.revision}"
        )


class _MemorySubscription(Subscription):
    def __init__(self, store: MemoryStateStore):
        self._store = store
        self._seen = store._published

    def wait(self, timeout: float) -> bool:
        with self._store._changed:
            self._store._changed.wait_for(
                lambda: self._store._published != self._seen, timeout=timeout
            )
            fired = self._store._published != self._seen
            self._seen = self._store._published
            return fired

    def close(self) -> None:
        pass


class MemoryStateStore(StateStore):
    """An honest in-process twin of the Redis store, for unit tests."""

    def __init__(self) -> None:
        self._state = RolloutState()
        self._history: dict[int, RolloutState] = {}
        self._audit: list[AuditEntry] = []
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._ids = itertools.count(1)
        self._changed = threading.Condition()
        self._published = 0
        self._deployments: dict[str, DeploymentReport] = {}

    def get(self) -> RolloutState:
        with self._changed:
            return self._state

    def compare_and_set(self, before, after, *, actor, action, reason):
        check_successor(before, after)
        with self._changed:
            if self._state.revision != before.revision:
                raise RevisionConflict(before.revision, self._state.revision)
            previous = self._state if self._state.revision else None
            self._state = after
            self._history[after.revision] = after
            self._audit.append(
                AuditEntry(
                    id=f"{next(self._ids)}-0", ts=after.updated_at, actor=actor,
                    action=action, reason=reason, revision=after.revision,
                    before=previous, after=after,
                )
            )
            self._published += 1
            self._changed.notify_all()
            return after

    def note(self, *, ts, actor, action, reason, detail=None):
        with self._changed:
            state = self._state
            self._audit.append(
                AuditEntry(
                    id=f"{next(self._ids)}-0", ts=ts, actor=actor, action=action, reason=reason,
                    revision=state.revision, before=state if state.revision else None,
                    after=state, detail=detail,
                )
            )

    def audit(self, last=None):
        with self._changed:
            entries = list(self._audit)
        return entries[-last:] if last else entries

    def audit_after(self, entry_id, count):
        after = _stream_id(entry_id)
        with self._changed:
            entries = [e for e in self._audit if _stream_id(e.id) > after]
        return entries[:count]

    def state_at(self, revision):
        with self._changed:
            try:
                return self._history[revision]
            except KeyError:
                raise RevisionNotFound(f"no state recorded at revision {revision}") from None

    def subscribe(self) -> Subscription:
        return _MemorySubscription(self)

    def report_deployment(self, report):
        with self._changed:
            self._deployments[report.gateway] = report

    def deployments(self):
        with self._changed:
            return sorted(self._deployments.values(), key=lambda r: r.ts)

    def put_verdict(self, verdict):
        with self._changed:
            self._verdicts[(verdict.baseline_version, verdict.optimized_version)] = verdict

    def get_verdict(self, baseline_version, optimized_version):
        with self._changed:
            return self._verdicts.get((baseline_version, optimized_version))
