"""A gateway's cached copy of the rollout state, kept fresh without a Redis call per request.

Refresh: a background thread waits on the store's change notifications (pub/sub) with the poll
interval as its timeout, and re-reads the state after every notification *and* every timeout, so
a lost notification costs at most one poll interval.

Fail-safe: the view is `stale` once the last successful read is older than `staleness_s`
(measured on the injected monotonic clock). Routing treats a stale view as "all baseline":
serving never stops when Redis is unreachable, it only stops trusting its copy of the canary
share. It recovers by itself on the next successful read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.errors import RolloutError
from rollout.state import RolloutState
from rollout.store import StateStore, Subscription

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateView:
    state: RolloutState
    age_s: float  # seconds since the last successful read; inf if never read
    stale: bool
    error: str | None  # the last refresh error, None once a read succeeds again
    loaded: bool  # a read has succeeded at least once
    events: tuple[str, ...] = ()  # what happened to the store lately, newest last


MAX_EVENTS = 5


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
        learns it again. A RolloutError from it is logged like a failed refresh; it never stops
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
        self._outage_since: float | None = None  # wall time of the current outage's first failure
        self._events: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def view(self) -> StateView:
        with self._lock:
            state, read_at, error = self._state, self._read_at, self._error
            events = tuple(self._events)
        age = float("inf") if read_at is None else self.clock.monotonic() - read_at
        return StateView(state, age, age > self.staleness_s, error, read_at is not None, events)

    def _event(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.time()))
        self._events = (self._events + [f"{stamp} {text}"])[-MAX_EVENTS:]

    def refresh(self) -> bool:
        """Read the state once; True on success. Never raises for store failures."""
        try:
            state = self.store.get()
        except RolloutError as exc:
            self._failed(exc)
            return False
        now = self.clock.monotonic()
        with self._lock:
            if self._error:
                log.warning("rollout state readable again (revision %d)", state.revision)
                outage = self.clock.time() - (self._outage_since or self.clock.time())
                failsafe = self._read_at is None or now - self._read_at > self.staleness_s
                self._event(
                    f"store reachable again after {outage:.1f} s"
                    + (" (routed all to baseline meanwhile)" if failsafe else "")
                    + f"; error was: {self._error}"
                )
            if state.revision < self._state.revision:
                self._event(
                    f"rollout state went back from revision {self._state.revision} to "
                    f"{state.revision} (store restarted without its data?)"
                )
                log.warning("rollout state revision went backwards: %d -> %d",
                            self._state.revision, state.revision)
            self._state, self._read_at, self._error = state, now, None
            self._outage_since = None
        return True

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            first = self._error is None
            self._error = str(exc)
            if first:
                self._outage_since = self.clock.time()
        if first:
            log.warning("cannot refresh rollout state, serving on the cached copy: %s", exc)

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
        except RolloutError as exc:
            log.warning("heartbeat failed (serving goes on): %s", exc)

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
        while not self._stop.is_set():
            try:
                if subscription is None:
                    subscription = self.store.subscribe()
                    self._beat_at = None
                    self.refresh()  # catch up on what happened while unsubscribed
                self._beat()
                subscription.wait(self.poll_s)
            except RolloutError as exc:
                self._failed(exc)
                if subscription is not None:
                    subscription.close()
                    subscription = None
                self._stop.wait(min(self.poll_s, 0.5))
            self.refresh()
            self.check_stale()
        if subscription is not None:
            subscription.close()
