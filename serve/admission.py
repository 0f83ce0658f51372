"""Adaptive admission: how many requests a gateway replica lets in at once, from the queueing
its answered requests saw.

A fixed bound (`gateway_max_in_flight`) caps memory but not latency: under overload every
admitted request waits behind all the others, deadlines pass while the work goes on, and goodput
collapses. So the bound in force, `limit`, follows measurement (additive increase,
multiplicative decrease, as Netflix's concurrency-limits AIMD and TCP do). A request over it
waits for a slot at most `wait_s` (first come, first served; a burst of quick requests rides
through), then is shed with 503 + Retry-After; with `ceiling` requests admitted or waiting, at
once. `wait_s` is `target_s` or, when longer, the forward answered requests recently rode in
(`forward_s`, a moving average): slots free as forwards end, so with forwards longer than the
target (many inputs per request, long inputs) a request that waits only `target_s` for a slot
is shed although the next forward would have carried it, and closed-loop clients then spend the
machine on being refused (8-text requests at concurrency 32 on 2 cores: 97 % shed, a third of
the goodput). Waiting behind one forward is how batching works, as for congestion below.

- Each answered request reports how long it queued: its time since admission minus the time of
  the forward that carried it (`queued_s = total_s - model_s`). It *queued too long* when that
  exceeds both `target_s` and one such forward (waiting behind the forward in progress is how
  batching works; waiting behind several is a queue). A model call that timed out or found the
  model's queue full counts the same.
- Too long: `limit *= backoff`, at most once per window (only requests admitted since the
  last decrease can decrease it again: a batch that ends late for all its requests is one
  signal, not sixteen).
- A deadline missed or a full model queue is worse than a long wait: the limit drops at once
  to `backoff` times the requests in flight, whatever the window (with long inputs, a window
  lasts as long as a request, and a burst would otherwise be admitted for many seconds at a
  limit it cannot meet).
- Otherwise, while the limit binds (at least half of it in use at admission):
  `limit += 1 / limit` per request, about one more per round trip; until the first decrease,
  `limit += 1` (TCP's slow start: a fresh gateway finds its level in a few round trips).
- `floor <= limit <= ceiling`: it starts at the floor, which keeps every model replica busy;
  the ceiling is `gateway_max_in_flight`, the memory cap. Disabled, the limit is the ceiling.

Callers measure the times they report (no clock here); waiting is asyncio's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

FORWARD_WEIGHT = 0.2  # of the newest forward in `AdaptiveLimit.forward_s`


@dataclass
class Slot:
    """One admitted request; `report` what it saw before `AdaptiveLimit.leave`."""

    window: int
    binding: bool  # the limit was at least half in use when it was admitted
    congested: bool | None = None  # None: nothing learned (an input error, a failed model)
    missed: bool = False  # a deadline missed or a full model queue
    model_s: float | None = None  # the forward that carried it, when answered

    def answered(self, total_s: float, model_s: float, target_s: float) -> None:
        queued_s = total_s - model_s
        self.model_s = model_s
        self.congested = queued_s > max(target_s, model_s)

    def overloaded(self) -> None:
        """The model call timed out or was refused for a full queue."""
        self.congested = self.missed = True


class AdaptiveLimit:
    def __init__(self, *, floor: int, ceiling: int, target_s: float, enabled: bool = True,
                 backoff: float = 0.9):
        if not 1 <= floor <= ceiling:
            raise ValueError("need 1 <= floor <= ceiling")
        if not 0 < backoff < 1:
            raise ValueError("backoff must be within (0, 1)")
        self.floor, self.ceiling, self.target_s = floor, ceiling, target_s
        self.enabled, self.backoff = enabled, backoff
        self.limit = float(floor if enabled else ceiling)
        self.in_flight = 0
        self.window = 0  # decreases so far
        self.shed = 0  # requests refused so far
        self.forward_s = 0.0  # moving average of the forwards answered requests rode in
        self._waiting: deque[asyncio.Future] = deque()

    @property
    def wait_s(self) -> float:
        """How long a request over the limit waits for a slot before it is shed."""
        return max(self.target_s, self.forward_s)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def saturated(self) -> bool:
        """Every slot taken and as many requests already waiting: a request arriving now will
        not get a slot within `wait_s` (shed it before spending anything on it)."""
        limit = int(self.limit)
        return self.in_flight >= limit and len(self._waiting) >= limit

    def snapshot(self) -> dict:
        """What `GET /v1/rollout` shows of this replica's admission."""
        return {"limit": int(self.limit), "in_flight": self.in_flight, "waiting": self.waiting,
                "shed": self.shed, "adaptive": self.enabled,
                "wait_ms": round(self.wait_s * 1000, 1)}

    def try_enter(self) -> Slot | None:
        """A slot now, or None when the limit is reached (or others wait for one)."""
        if self.in_flight >= int(self.limit) or self._waiting:
            return None
        return self._admit()

    async def enter(self) -> Slot | None:
        """A slot, waiting for one at most `wait_s`; None: shed the request."""
        slot = self.try_enter()
        if slot is not None:
            return slot
        if self.in_flight + len(self._waiting) >= self.ceiling or self.target_s <= 0:
            self.shed += 1
            return None
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            return await asyncio.wait_for(future, self.wait_s)
        except TimeoutError:
            self.shed += 1
            return None
        except asyncio.CancelledError:  # the client went away; a slot it was given goes back
            if future.done() and not future.cancelled():
                self.leave(future.result())
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove(future)

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[Slot | None]:
        """A slot held for the block (`enter`; None: shed the request), given back by `leave`
        in one place when the block ends, however it ends (an answer, an error, the client
        gone): the in-flight count as a context manager."""
        slot = await self.enter()
        try:
            yield slot
        finally:
            if slot is not None:
                self.leave(slot)

    def _admit(self) -> Slot:
        self.in_flight += 1
        return Slot(self.window, binding=2 * self.in_flight >= int(self.limit))

    def leave(self, slot: Slot) -> None:
        self.in_flight -= 1
        if slot.model_s is not None:
            self.forward_s += FORWARD_WEIGHT * (slot.model_s - self.forward_s)
        if self.enabled and slot.congested is not None:
            if slot.missed:
                cut = max(float(self.floor), (self.in_flight + 1) * self.backoff)
                if cut < self.limit:
                    self.limit = cut
                    self.window += 1
            elif slot.congested:
                if slot.window == self.window:
                    self.limit = max(float(self.floor), self.limit * self.backoff)
                    self.window += 1
            elif slot.binding:
                step = 1.0 if self.window == 0 else 1 / self.limit  # slow start, then additive
                self.limit = min(float(self.ceiling), self.limit + step)
        while self._waiting and self.in_flight < int(self.limit):
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(self._admit())


class ShedSummary:
    """Requests shed without a log line each (serve.ingress) still reach the log: at most one
    line per `every_s`, with how many were shed since the last and the admission's state."""

    def __init__(self, admission: AdaptiveLimit, log: Callable[[str], object], *,
                 every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.admission, self.log, self.every_s, self.clock = admission, log, every_s, clock
        self.count = 0
        self.since = clock()

    def shed(self) -> None:
        self.count += 1
        now = self.clock()
        if now - self.since >= self.every_s:
            a = self.admission
            self.log(f"shed {self.count} requests in the last {now - self.since:.0f} s "
                     f"(admission limit {int(a.limit)}, {a.in_flight} in flight, "
                     f"{a.waiting} waiting)")
            self.count, self.since = 0, now
