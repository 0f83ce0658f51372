"""What the dashboard shows, read from Redis with the gateway's own (read-mostly) connection.

Every read is blocking Redis I/O: the routes run them in a worker thread, never on the event
loop that serves predictions. Many viewers polling at once cost one read per interval: results
are kept for a short TTL and a read in progress is shared (one lock per kind of read, so a
second viewer waits for the first one's answer instead of reading again). The hour-long series
reads only the steps that are still open (rollout.telemetry.series.StepCache).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from rollout import PermissionDenied, StateStore, StoreUnavailable, Traces, Windows
from rollout.clock import Clock, SystemClock
from rollout.settings import StateSettings, TelemetrySettings
from rollout.status import read_status
from rollout.telemetry.series import StepCache, check_span
from serve.dashboard.errors import ControlUnavailable, InvalidInput, NotFound

STATUS_WINDOW_S = 60  # the per-arm table, as `rollout status`
AGREEMENT_WINDOW_S = 300  # online agreement needs more pairs than a minute brings
STATUS_TTL_S = 1.0
SERIES_TTL_S = 2.0
LIST_TTL_S = 1.0
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


class Memo:
    """Values kept for a TTL, computed once at a time per key (single flight)."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self._values: dict[Any, tuple[float, Any]] = {}
        self._locks: dict[Any, threading.Lock] = {}
        self._guard = threading.Lock()

    MAX_KEYS = 64  # keys come from query parameters: bound what they can make us keep

    def get(self, key, ttl_s: float, compute: Callable[[], Any]):
        with self._guard:
            if len(self._locks) > self.MAX_KEYS:
                self._locks.clear()
                self._values.clear()
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            hit = self._values.get(key)
            if hit is not None and self.clock.monotonic() - hit[0] < ttl_s:
                return hit[1]
            value = compute()
            self._values[key] = (self.clock.monotonic(), value)
            return value

    def forget(self, key) -> None:
        self._values.pop(key, None)


def _reading(fn):
    """Store trouble while reading becomes a 503 (never a 500)."""

    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StoreUnavailable as exc:
            raise ControlUnavailable(f"cannot read the rollout store: {exc}") from None
        except PermissionDenied as exc:
            raise ControlUnavailable(
                f"{exc} (the gateway's Redis user needs the dashboard's read permissions, "
                "see ops/redis-users.acl)"
            ) from None

    return wrapper


def bounded_int(raw: str | int | None, name: str, default: int, low: int, high: int) -> int:
    """A query parameter as an int within [low, high], or 422."""
    if raw is None or raw == "":
        return default
    text = str(raw).strip()
    if not re.fullmatch(r"\d{1,9}", text) or not low <= int(text) <= high:
        raise InvalidInput(f"{name} must be a whole number within {low}..{high}, got {raw!r}")
    return int(text)


class Readings:
    def __init__(self, state: StateSettings, settings: TelemetrySettings, store: StateStore,
                 telemetry, *, clock: Clock | None = None):
        """What the page reads of `state`'s application, priced and paced by `settings`."""
        self.settings, self.store, self.telemetry = settings, store, telemetry
        self.clock = clock or SystemClock()
        self.memo = Memo(self.clock)
        # a step is sealed once every sink has flushed it
        self.steps = StepCache(settle_s=max(5.0, 4 * settings.telemetry_flush_s))
        self.app = state.app_name

    @property
    def device_hour_price(self) -> float:
        """This gateway's CANARY_DEVICE_HOUR_PRICE: 0 means cost is not priced (every cost
        figure reads 0), which the page says instead of drawing a flat line."""
        return self.settings.device_hour_price

    @_reading
    def status(self) -> dict:
        def read():
            return read_status(
                self.store, self.telemetry, app=self.app, window_s=STATUS_WINDOW_S,
                agreement_s=AGREEMENT_WINDOW_S, clock=self.clock,
            ).as_json() | {"device_hour_price": self.device_hour_price}

        return self.memo.get("status", STATUS_TTL_S, read)

    def changed(self) -> None:
        """An action went through: the next status and ramp reads go to the store."""
        self.memo.forget("status")
        self.memo.forget("ramp")

    @_reading
    def series(self, last_s: int, step_s: int) -> dict:
        try:
            check_span(last_s, step_s)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

        def read():
            windows = Windows(self.telemetry, self.app, clock=self.clock)
            series = windows.series(last_s, step_s, cache=self.steps)
            return {"last_s": last_s, "step_s": step_s, "now": self.clock.time(),
                    "starts": list(series.starts), "device_hour_price": self.device_hour_price,
                    "arms": {arm: s.columns() for arm, s in series.arms.items()}}

        return self.memo.get(("series", last_s, step_s), SERIES_TTL_S, read)

    @_reading
    def audit(self, last: int) -> list[dict]:
        def read():
            return [
                {"id": e.id, "ts": e.ts, "actor": e.actor, "action": e.action,
                 "reason": e.reason, "revision": e.revision}
                for e in reversed(self.store.audit(last=last))
            ]

        return self.memo.get(("audit", last), LIST_TTL_S, read)

    @_reading
    def traces(self, last: int) -> list[dict]:
        def read():
            return [t.as_dict() for t in Traces(self.telemetry).recent(last)]

        return self.memo.get(("traces", last), LIST_TTL_S, read)

    @_reading
    def trace(self, trace_id: str) -> dict:
        if not _TRACE_ID.match(trace_id):
            raise InvalidInput("a trace id is 32 lowercase hex digits")
        spans = Traces(self.telemetry).get(trace_id)
        if not spans:
            raise NotFound(f"no trace {trace_id} recorded (expired, not sampled, or "
                           "telemetry off)")
        return {"trace_id": trace_id, "spans": spans}
