"""Admission by deadline: a gateway replica refuses a request only when it cannot be answered
within its deadline, and otherwise lets it join the queue, so that batches fill.

Every request has a deadline: `request_timeout_s` from its arrival, or a shorter one the client
sends in `X-Request-Timeout-Ms` (`requested_timeout_s`: a positive integer, capped at the
server's timeout; anything else is the client's error). A request is refused at once (503 with
a `Retry-After`) only when its *predicted completion* passes that deadline:

    predicted = rows ahead for its arm / the arm's measured rate + its own forward

- *Rows ahead* (`ArmQueue.rows`): the inputs this replica has admitted for the arm and not yet
  had answered (queued here, in the model's queue, or in a forward).
  In the colocated topology both arms' forwards take turns on one compute thread
  (`shared_compute`): the other arm's rows ahead, at its rate, are ahead of this arm's too.
- *Measured rate* (`ArmQueue.rate`, rows per second), the higher of two measurements:
  - the rate of a full batch (`ForwardFit`): the forwards answers rode in, as their time
    against their batch's inputs, fitted to `time = fixed + per_row x rows` (exponentially
    weighted least squares), evaluated at the largest batch (`max_batch_size` requests, or the
    most inputs a forward carried, if more). A queue is served in full batches, so this is its
    rate, however small the batches were when it was measured. Until batches of different
    sizes have been seen, the per-row cost is taken as 0 (a forward of a full batch takes as
    long as the ones seen): the optimistic side, since refusing what batching can serve is the
    error this admission exists to avoid; the first full batches correct it.
  - inputs answered per second of time the arm had work outstanding (over windows of at least
    `RATE_WINDOW_S` busy seconds, a moving average): end to end, so it counts every model
    replica of the arm, which the fit of one replica's forwards does not.
- *Own forward*: the fitted time of a forward of the request's own rows (at the rate, beyond a
  full batch).

Nothing is refused before the first measurement, and there is no fixed queue target: a closed
loop of N clients is bounded load, and with the default deadline (10 s) it is never refused
(as Triton's dynamic batcher rejects only requests whose queue timeout passes, and gRPC
propagates deadlines). The memory cap stays: with `ceiling` requests in flight a request is
refused at once. `Retry-After` is the time until the work ahead would have drained to within the
request's deadline, in whole seconds, at least 1.

A request's rows count from its judgement (`Slot.reserve`), though it then awaits its tokenizing
before its model call: requests that arrive together are judged in turn, each behind those
admitted before it. (Counted only once calls started, a burst of 200 large requests on an empty
queue was admitted whole, and most of it answered 504.) They leave the count when its model call
ends, however it ends: an answer, a failure, or the client gone (its task cancelled), so nobody
is refused because of work nobody waits for. Rows of a canary call that falls back move to the
baseline's count.

`door(timeout_s)` is the same judgement before the request's body is read or its arm known
(serve.gateway.ingress): it refuses only when every arm with work outstanding would miss the
deadline for a one-input request, or at the memory cap.

A request's deadline runs from when serve.gateway.ingress first saw it, not from when the gateway's
handler ran, less what it waited for the replica's event loop before any of its code did:
`LoopLag` measures that (how late a timer on the loop fires, a moving average), and it is taken
off each request's time left, at the door and at its arm's judgement. (It read 2-12 ms at 5x
capacity on 2 cores; the 1-2 s waits seen there were new connections waiting to be accepted,
which serve.gateway.ingress avoids by keeping a refused request's connection.)

The clock is injectable (`clock`, seconds); waiting is the caller's.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from serve.common.averages import WindowedRate, moving_average

RATE_WINDOW_S = 0.1  # busy seconds a rate sample covers at least
RATE_WEIGHT = 0.3  # of the newest sample in the moving average of the busy rate
FIT_WEIGHT = 0.05  # of the newest forward in the fit of forward time against rows
TIMEOUT_HEADER = "x-request-timeout-ms"
SHEDDING_S = 1.0  # a replica that refused a request this recently is shedding
BUSY_LOOP_SHARE = 0.25  # of a core: an event loop this busy is busy (serve.replica.thread_share)


def requested_timeout_s(value: str | None, cap_s: float) -> float:
    """The request's timeout in seconds: `cap_s` without the header, else its value (a positive
    integer of milliseconds) capped at `cap_s`. ValueError, naming the header, otherwise."""
    if value is None:
        return cap_s
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12 or int(text) == 0:
        raise ValueError(f"X-Request-Timeout-Ms must be a positive whole number of "
                         f"milliseconds, got {value[:32]!r}")
    return min(int(text) / 1000, cap_s)


def retry_after_s(predicted_s: float, timeout_s: float) -> int:
    """Whole seconds until work predicted to take `predicted_s` would fit in `timeout_s`."""
    return max(1, math.ceil(predicted_s - timeout_s))


@dataclass
class ForwardFit:
    """Forward time against rows, `time(rows) = fixed + per_row x rows`, fitted by
    exponentially weighted least squares over the forwards answers rode in."""

    full_rows: int = 1  # a full batch: at least this many rows
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, b, t, bb, bt
    seen_rows: int = 0  # the most rows one forward carried

    def observe(self, rows: int, seconds: float) -> None:
        keep = 1 - FIT_WEIGHT
        for i, value in enumerate((1.0, rows, seconds, rows * rows, rows * seconds)):
            self._sums[i] = self._sums[i] * keep + value
        self.seen_rows = max(self.seen_rows, rows)

    @property
    def known(self) -> bool:
        return self._sums[0] > 0

    def line(self) -> tuple[float, float]:
        """(fixed seconds, seconds per row); per row 0 until different sizes were seen."""
        n, b, t, bb, bt = self._sums
        mean_b, mean_t = b / n, t / n
        spread = bb / n - mean_b * mean_b
        per_row = max(0.0, (bt / n - mean_b * mean_t) / spread) if spread >= 0.25 else 0.0
        fixed = mean_t - per_row * mean_b
        if fixed < 0:  # all per row
            return 0.0, mean_t / mean_b
        return fixed, per_row

    def time_s(self, rows: int) -> float:
        fixed, per_row = self.line()
        return fixed + per_row * rows

    @property
    def batch_rows(self) -> int:
        return max(self.full_rows, self.seen_rows)

    def full_rate(self) -> float | None:
        """Rows per second of a forward of a full batch (None before any forward)."""
        if not self.known:
            return None
        rows = self.batch_rows
        seconds = self.time_s(rows)
        return rows / seconds if seconds > 0 else None


@dataclass
class ArmQueue:
    """One arm's outstanding rows and measured speed, as one gateway replica sees them."""

    rows: int = 0
    busy_rate: float | None = None  # rows answered per busy second
    fit: ForwardFit = field(default_factory=ForwardFit)
    _mark: float = 0.0  # when `rows` last changed
    _busy_s: float = 0.0  # busy seconds in the current rate window
    _done: int = 0  # rows answered in the current rate window

    def _advance(self, now: float) -> None:
        if self.rows > 0:
            self._busy_s += max(0.0, now - self._mark)
        self._mark = now

    def add(self, rows: int, now: float) -> None:
        self._advance(now)
        self.rows += rows

    def remove(self, rows: int, now: float, answered: bool) -> None:
        self._advance(now)
        self.rows -= rows
        if not answered:
            return
        self._done += rows
        if self._busy_s >= RATE_WINDOW_S:
            self.busy_rate = moving_average(self.busy_rate, self._done / self._busy_s,
                                            RATE_WEIGHT)
            self._busy_s, self._done = 0.0, 0

    def forwarded(self, forward_s: float, batch_rows: int) -> None:
        """An answer's forward: `batch_rows` inputs (of all its requests) in `forward_s`."""
        if forward_s > 0 and batch_rows > 0:
            self.fit.observe(batch_rows, forward_s)

    @property
    def rate(self) -> float | None:
        known = [r for r in (self.busy_rate, self.fit.full_rate()) if r is not None]
        return max(known) if known else None

    def own_forward_s(self, rows: int) -> float:
        """A forward of `rows` (beyond a full batch: at the rate)."""
        if not self.fit.known:
            return 0.0
        full = self.fit.batch_rows
        if rows <= full:
            return self.fit.time_s(rows)
        return rows / (self.rate or 1.0)

    def drain_s(self) -> float:
        """Seconds until the rows ahead are answered, at the measured rate (0 before it)."""
        rate = self.rate
        return 0.0 if rate is None else self.rows / rate

    def predicted_s(self, rows: int) -> float:
        """Seconds until `rows` more would be answered: the rows ahead at the measured rate,
        then their own forward (0 before the first measurement: nothing to predict from)."""
        if self.rate is None:
            return 0.0
        return self.drain_s() + self.own_forward_s(rows)

    def snapshot(self) -> dict:
        rate = self.rate
        return {"rows": self.rows, "rate_per_s": None if rate is None else round(rate, 1),
                "forward_ms": round(self.own_forward_s(1) * 1000, 1),
                "predicted_ms": round(self.predicted_s(1) * 1000, 1)}


@dataclass
class Slot:
    """One admitted request: the arm its rows are counted on, from its judgement (`reserve`)
    until its model call ends (`counted`)."""

    admission: Admission
    arm: str | None = None
    rows: int = 0
    reserved: tuple[str, int] | None = None  # (arm, rows) judged and counted, not yet called

    def reserve(self, arm: str, rows: int) -> None:
        """Count `rows` on `arm` from its judgement on, so that requests judged after it, while
        it awaits (its tokenizing), are judged behind them; the call that follows takes them
        over (`counted`), and leaving the slot gives them back if none does."""
        self.release()
        self.admission.queue(arm).add(rows, self.admission.clock())
        self.reserved = (arm, rows)

    def release(self) -> None:
        """Give back rows reserved for a call that did not start."""
        if self.reserved is not None:
            arm, rows = self.reserved
            self.reserved = None
            self.admission.queue(arm).remove(rows, self.admission.clock(), answered=False)

    @contextmanager
    def counted(self, arm: str, rows: int) -> Iterator[None]:
        """`rows` count on `arm` for the block (a model call); they leave when it ends, however
        it ends. The block's caller reports an answer with `answered`."""
        queue = self.admission.queue(arm)
        if self.reserved == (arm, rows):
            self.reserved = None  # already counted since its judgement
        else:
            self.release()
            queue.add(rows, self.admission.clock())
        self.arm, self.rows = arm, rows
        answered = False
        try:
            yield
            answered = True
        finally:
            queue.remove(rows, self.admission.clock(), answered)
            self.arm, self.rows = None, 0

    def answered(self, forward_s: float, batch_rows: int) -> None:
        """The forward that carried this request (`batch_rows` inputs in `forward_s`), for the
        arm's estimates of one forward and of its rate."""
        if self.arm is not None:
            self.admission.queue(self.arm).forwarded(forward_s, batch_rows)


@dataclass
class Refusal:
    """Why a request is refused: what it would have waited, its timeout, when to retry."""

    predicted_s: float
    timeout_s: float

    @property
    def retry_after(self) -> int:
        return retry_after_s(self.predicted_s, self.timeout_s)

    def message(self, arm: str) -> str:
        return (f"the {arm} model would answer in about {self.predicted_s:.2f} s, past the "
                f"request's deadline of {self.timeout_s:.2f} s; retry later")


class LoopLag:
    """How late the event loop runs callbacks, and how much of a core it spends. `lag_s`: what a
    request that reached the replica now waits before its handler runs (a moving average of how
    late a timer every `every_s` fires). `cpu_share`: the loop thread's CPU time over wall time,
    in windows of at least `share_window_s` (a moving average, `share_weight` for the newest):
    how busy its one core is parsing, routing and answering. `run` is the task that measures
    both; `thread_time` (the calling thread's CPU seconds) and `clock` are injectable."""

    def __init__(self, every_s: float = 0.01, weight: float = 0.3, *,
                 share_window_s: float = 0.25, share_weight: float = 0.5,
                 thread_time: Callable[[], float] = time.thread_time,
                 clock: Callable[[], float] = time.monotonic):
        self.every_s, self.weight = every_s, weight
        self.thread_time, self.clock = thread_time, clock
        self.lag_s = 0.0
        self._share = WindowedRate(share_window_s, share_weight, start=0.0, high=1.0)

    def observe(self, late_s: float) -> None:
        self.lag_s += self.weight * (max(0.0, late_s) - self.lag_s)

    @property
    def cpu_share(self) -> float:
        return self._share.value

    def sample(self) -> None:
        """On the loop's thread: close the CPU-share window once it is `share_window_s` long."""
        self._share.sample(self.clock(), self.thread_time())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.every_s
            await asyncio.sleep(self.every_s)
            self.observe(loop.time() - asked)
            self.sample()


@dataclass
class Admission:
    """A gateway replica's admission (see the module docstring)."""

    ceiling: int
    batch_rows: int = 1  # inputs a full batch carries at least (`max_batch_size`)
    # the arms' forwards take turns on one compute thread (the colocated topology): the rows
    # ahead of every arm are ahead of each
    shared_compute: bool = False
    arms: dict[str, ArmQueue] = field(default_factory=dict)
    loop: LoopLag = field(default_factory=LoopLag)
    clock: Callable[[], float] = time.monotonic
    in_flight: int = 0
    shed: int = 0  # requests refused so far
    shed_at: float | None = None  # when the last was refused (`clock`)

    def __post_init__(self) -> None:
        if self.ceiling < 1:
            raise ValueError("ceiling must be at least 1")

    def queue(self, arm: str) -> ArmQueue:
        if arm not in self.arms:
            self.arms[arm] = ArmQueue(fit=ForwardFit(full_rows=self.batch_rows))
        return self.arms[arm]

    def enter(self) -> Slot | None:
        """A slot, or None at the memory cap (refuse at once)."""
        if self.in_flight >= self.ceiling:
            self.refused()
            return None
        self.in_flight += 1
        return Slot(self)

    def refused(self) -> None:
        """Count a refused request (here, or at the door by its caller)."""
        self.shed += 1
        self.shed_at = self.clock()

    def shedding(self, within_s: float = SHEDDING_S) -> bool:
        """Whether this replica refused a request within the last `within_s` seconds: its
        event loop is busy turning the excess away (serve.replica.thread_share `beside_loop`)."""
        return self.shed_at is not None and self.clock() - self.shed_at <= within_s

    def loop_busy(self, share: float = BUSY_LOOP_SHARE) -> bool:
        """Whether this replica's event loop is busy: it is shedding, or it spent at least
        `share` of a core over its last windows (`LoopLag.cpu_share`). What a colocated model's
        batches ask before leaving the loop a core (serve.replica.thread_share `beside_loop`)."""
        return self.shedding() or self.loop.cpu_share >= share

    def leave(self, slot: Slot) -> None:
        slot.release()
        self.in_flight -= 1

    @contextmanager
    def admitted(self) -> Iterator[Slot | None]:
        """A slot held for the block (None: at the memory cap), given back when it ends."""
        slot = self.enter()
        try:
            yield slot
        finally:
            if slot is not None:
                self.leave(slot)

    def predicted_s(self, arm: str, rows: int) -> float:
        """Seconds until `rows` more for `arm` would be answered: its queue's prediction, and
        with `shared_compute` the other arms' rows ahead too, at their rates."""
        predicted = self.queue(arm).predicted_s(rows)
        if self.shared_compute:
            predicted += sum(q.drain_s() for other, q in self.arms.items() if other != arm)
        return predicted

    def judge(self, arm: str, rows: int, timeout_s: float) -> Refusal | None:
        """A Refusal when `rows` more for `arm` would be answered after `timeout_s` (counted
        as shed), else None."""
        predicted = self.predicted_s(arm, rows)
        if predicted <= timeout_s:
            return None
        self.refused()
        return Refusal(predicted, timeout_s)

    def late(self, arm: str, rows: int, timeout_s: float) -> bool:
        """Whether `rows` more for `arm` would be answered after `timeout_s` (not counted: the
        gateway gives a late canary's request to the baseline instead of refusing it)."""
        return self.predicted_s(arm, rows) > timeout_s

    def sooner(self, arm: str, than: str, rows: int) -> bool:
        """Whether `rows` more would be answered sooner on `arm` than on `than`, where that
        decides anything: with `shared_compute` both wait behind the same rows ahead, so the
        arm with the faster forward answers first; remote arms each have their own queue and
        model, and this says True (the late arm's queue is the one to leave)."""
        if not self.shared_compute:
            return True
        return self.predicted_s(arm, rows) < self.predicted_s(than, rows)

    def door(self, timeout_s: float) -> int | None:
        """Before the body or the arm is known: a Retry-After when the request cannot be
        served (at the memory cap, or every arm with work would miss `timeout_s`, less what it
        waited for the loop, for one input), else None. Not counted: the caller reports what
        it sheds."""
        if self.in_flight >= self.ceiling:
            return 1
        timeout_s -= self.loop.lag_s
        busy = [self.predicted_s(arm, 1) for arm, q in self.arms.items() if q.rows > 0]
        if busy and min(busy) > timeout_s:
            return retry_after_s(min(busy), timeout_s)
        return None

    def snapshot(self) -> dict:
        """What `GET /v1/rollout` shows of this replica's admission."""
        return {"in_flight": self.in_flight, "ceiling": self.ceiling, "shed": self.shed,
                "loop_lag_ms": round(self.loop.lag_s * 1000, 1),
                "loop_cpu_share": round(self.loop.cpu_share, 2),
                "arms": {arm: {**q.snapshot(),
                               "predicted_ms": round(self.predicted_s(arm, 1) * 1000, 1)}
                         for arm, q in sorted(self.arms.items())}}


class ShedSummary:
    """Requests shed without a log line each (serve.gateway.ingress) still reach the log: at most
    one line per `every_s`, with how many were shed since the last and the admission's state."""

    def __init__(self, admission: Admission, log: Callable[[str], object], *,
                 every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.admission, self.log, self.every_s, self.clock = admission, log, every_s, clock
        self.count = 0
        self.since = clock()

    def shed(self) -> None:
        self.count += 1
        now = self.clock()
        if now - self.since >= self.every_s:
            a = self.admission
            rows = ", ".join(f"{arm} {q.rows} rows" for arm, q in sorted(a.arms.items()))
            self.log(f"shed {self.count} requests in the last {now - self.since:.0f} s "
                     f"({a.in_flight} in flight of {a.ceiling}; {rows or 'nothing queued'})")
            self.count, self.since = 0, now
