"""A gateway's cached copy of the rollout state, kept fresh without a Redis call per request.

Refresh: a background thread waits on the store's change notifications (pub/sub) with the poll
interval as its timeout, and re-reads the state after every notification *and* every timeout, so
a lost notification costs at most one poll interval.

Fail-safe: the view is `stale` once the last successful read is older than `staleness_s`
(measured on the injected monotonic clock), and at once while the store holds a state this
replica must not route by (`distrust`). Routing treats a stale view as "all baseline": serving
never stops when Redis is unreachable or answers with errors, it only stops trusting its copy of
the canary share. It recovers by itself on the next good read.

Any exception from the store or from reading its document (StoreUnavailable, StoreRefused:
READONLY, OOM, MISCONF...; StateUnreadable; a bug) is survived the same way: counted by kind
(`StateView.errors`), logged once per kind and outage, retried after a backoff (at most one
second, so a healed store is followed within about a second). A state this version cannot
read turns the view stale at once: it may hold a kill.

A kill is never undone by going back: the highest revision read is remembered, and a state
whose revision is lower (a failover to a replica that missed the last writes, a Redis restarted
empty) is not applied. The view keeps the highest state and turns stale (all baseline, as the
kill would have it) until a revision above the highest arrives; writers number their next
change above what gateways report having seen (rollout.change.stamp).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.errors import StateUnreadable, StoreRefused, StoreUnavailable
from rollout.state import RolloutState
from rollout.store import StateStore, Subscription

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateView:
    state: RolloutState
    age_s: float  # seconds since the last successful read; inf if never read
    stale: bool
    error: str | None  # why the view is not trusted now: the last refresh error, or the store
    #                    holding a state behind the one routed by; None once a read is good
    loaded: bool  # a read has succeeded at least once
    events: tuple[str, ...] = ()  # what happened to the store lately, newest last
    errors: tuple[tuple[str, int], ...] = ()  # refresh errors by kind since the start


MAX_EVENTS = 5
MAX_BACKOFF_S = 1.0


def error_kind(exc: BaseException) -> str:
    """What the watcher counts a failure by: a refusal's reply word (`READONLY`, `OOM`, ...),
    `unavailable`, `unreadable`, or the exception's type for anything else."""
    if isinstance(exc, StoreRefused):
        return exc.kind
    if isinstance(exc, StoreUnavailable):
        return "unavailable"
    if isinstance(exc, StateUnreadable):
        return "unreadable"
    return type(exc).__name__


class StateWatcher:
    def __init__(
        self,
        store: StateStore,
        *,
        poll_s: float,
        staleness_s: float,
        clock: Clock | None = None,
        heartbeat: Callable[[], object] | None = None,
        heartbeat_s: float = 10.0,
        on_stale: Callable[[bool, StateView], object] | None = None,
    ):
        """`heartbeat` runs in the watcher thread when it (re)subscribes and then at least every
        `heartbeat_s`: the gateway reports what it serves there, so a Redis restarted empty
        learns it again. Any exception from it is logged like a failed refresh; it never stops
        the watcher. `on_stale(stale, view)` runs in the watcher thread when the view turns
        stale and when it is fresh again (the gateway's store-outage notifications)."""
        if staleness_s <= poll_s:
            raise ValueError("staleness_s must be longer than poll_s")
        self.store = store
        self.poll_s = poll_s
        self.staleness_s = staleness_s
        self.clock = clock or SystemClock()
        self.heartbeat = heartbeat
        self.heartbeat_s = heartbeat_s
        self.on_stale = on_stale
        self._was_stale = False
        self._beat_at: float | None = None
        self._state = RolloutState()
        self._read_at: float | None = None
        self._error: str | None = None
        self._distrust: str | None = None  # the store holds a state behind the one routed by
        self._outage_since: float | None = None  # wall time of the current outage's first failure
        self._events: list[str] = []
        self._counts: dict[str, int] = {}
        self._logged: set[str] = set()  # kinds logged in the current outage
        self._beat_failures: set[str] = set()  # kinds of heartbeat failure logged since a beat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def view(self) -> StateView:
        with self._lock:
            state, read_at, error, distrust = self._state, self._read_at, self._error, \
                self._distrust
            events, counts = tuple(self._events), tuple(sorted(self._counts.items()))
        age = float("inf") if read_at is None else self.clock.monotonic() - read_at
        stale = age > self.staleness_s or distrust is not None
        return StateView(state, age, stale, error or distrust, read_at is not None, events,
                         counts)

    def _event(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.time()))
        self._events = (self._events + [f"{stamp} {text}"])[-MAX_EVENTS:]

    def refresh(self) -> bool:
        """Read the state once; True on success. Never raises."""
        try:
            state = self.store.get()
        except Exception as exc:  # any store or parsing failure: the view ages toward stale
            self._failed(exc)
            return False
        with self._lock:
            if self._error:
                self._recovered(state)
            if state.revision < self._state.revision:
                self._behind(state)
            else:
                if self._distrust:
                    log.warning("rollout state moved past the revision routed by (%d -> %d)",
                                self._state.revision, state.revision)
                self._state, self._distrust = state, None
            self._read_at, self._error = self.clock.monotonic(), None
            self._outage_since = None
            self._logged.clear()
        return True

    def _recovered(self, state: RolloutState) -> None:
        """The store answers again after an outage (under the lock): an event says how long
        it lasted and whether the view went stale meanwhile."""
        log.warning("rollout state readable again (revision %d)", state.revision)
        outage = self.clock.time() - (self._outage_since or self.clock.time())
        failsafe = self._read_at is None or (
            self.clock.monotonic() - self._read_at > self.staleness_s)
        self._event(
            f"store reachable again after {outage:.1f} s"
            + (" (routed all to baseline meanwhile)" if failsafe else "")
            + f"; error was: {self._error}"
        )

    def _behind(self, state: RolloutState) -> None:
        """The store's revision is below the highest read (under the lock): not applied; the
        view is distrusted until a revision above the highest arrives."""
        highest = self._state.revision
        if self._distrust is None:
            self._event(
                f"rollout state went back from revision {highest} to {state.revision} "
                "(failover to a replica that missed writes, or a store restarted without its "
                "data?): routing all to baseline until a change above it")
            log.warning("rollout state revision went backwards: %d -> %d; routing all to "
                        "baseline until a revision above %d", highest, state.revision, highest)
        self._distrust = (f"the store is at revision {state.revision}, behind revision "
                          f"{highest} routed by before: all baseline until a change above it")
        self._beat_at = None  # report at once: writers number their next change above it

    def _failed(self, exc: BaseException) -> None:
        kind = error_kind(exc)
        with self._lock:
            first = self._error is None
            self._error = str(exc) or kind
            self._counts[kind] = self._counts.get(kind, 0) + 1
            if first:
                self._outage_since = self.clock.time()
            if isinstance(exc, StateUnreadable):  # the state changed to what cannot be read
                self._distrust = str(exc)
            new_kind = kind not in self._logged
            self._logged.add(kind)
        if new_kind:
            log.warning("cannot refresh rollout state (%s), serving on the cached copy: %s",
                        kind, exc)

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="rollout-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)

    def _beat(self) -> None:
        now = self.clock.monotonic()
        if self.heartbeat is None or (
            self._beat_at is not None and now - self._beat_at < self.heartbeat_s
        ):
            return
        self._beat_at = now
        try:
            self.heartbeat()
        except Exception as exc:  # a report that cannot be written is retried next beat
            kind = error_kind(exc)
            if kind not in self._beat_failures:
                log.warning("heartbeat failed (serving goes on): %s: %s", kind, exc)
            self._beat_failures.add(kind)
        else:
            self._beat_failures.clear()

    def check_stale(self) -> None:
        """Call `on_stale` when the view's staleness changed since the last check."""
        if self.on_stale is None:
            return
        view = self.view()
        if view.stale == self._was_stale:
            return
        self._was_stale = view.stale
        try:
            self.on_stale(view.stale, view)
        except Exception:  # a notification must never stop the watcher
            log.exception("on_stale hook failed")

    def _run(self) -> None:
        subscription: Subscription | None = None
        backoff = 0.0
        while not self._stop.is_set():
            try:
                if subscription is None:
                    subscription = self.store.subscribe()
                    self._beat_at = None
                    self.refresh()  # catch up on what happened while unsubscribed
                self._beat()
                subscription.wait(self.poll_s)
                backoff = 0.0
            except Exception as exc:  # whatever the store raised: count it, back off, retry
                self._failed(exc)
                subscription = self._dropped(subscription)
                backoff = min(max(2 * backoff, 0.1), MAX_BACKOFF_S, self.poll_s)
                self._stop.wait(backoff)
            self.refresh()
            self.check_stale()
        self._dropped(subscription)

    @staticmethod
    def _dropped(subscription: Subscription | None) -> None:
        """Close `subscription` (if any) whatever closing raises; None, the one to open next."""
        if subscription is not None:
            try:
                subscription.close()
            except Exception:  # closing a broken connection may fail too: it is dropped
                pass
        return None
