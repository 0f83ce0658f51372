"""Load shapes: the closed loop (N clients, each sends when its last answer came, after
waiting the Retry-After of a shed answer), the open loop (a fixed rate, answered or not), a
recovery probe, and `LoopLag`, how late the client's own event loop runs.

Both loops stop *sending* after their duration and hand back the requests still in flight
(`Offered.pending`), so a caller can start timing recovery the moment the load stops, while
those drain; `drain` waits for them. A request is sent by `fire(n)`, which returns a Shot
(ops.load.sender): every request sent ends as exactly one Shot.

A closed-loop client whose request was shed (429 or 503 with Retry-After) waits that long
before its next request, as a well-behaved client does (`backoff`): resending at once would
measure the cost of refusing requests, not the goodput the server serves. The open loop never
waits: it offers its rate whatever the answers, which is what an overload test is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ops.load.sender import Shot
from ops.load.tally import pct, summarize

Fire = Callable[[int], Awaitable[Shot]]


def honour_retry_after(shot: Shot) -> float:
    """The closed loop's default backoff: the Retry-After of a shed answer, else no wait."""
    return shot.retry_after_s()


def no_backoff(shot: Shot) -> float:
    """A backoff that never waits (a client that resends at once)."""
    return 0.0


@dataclass
class Offered:
    """What a loop sent: the requests still in flight when it stopped sending are in `pending`.
    `started` is the start of the measured window (after a closed loop's warm-up)."""

    started: float
    sent_for_s: float = 0.0
    sent: int = 0
    capped: int = 0  # open loop: sends skipped because max_in_flight were outstanding
    warmup_sent: int = 0  # closed loop: sent during the warm-up (their shots are not kept)
    pending: list[asyncio.Task] = field(default_factory=list)


async def closed_loop(fire: Fire, shots: list[Shot], *, concurrency: int, duration_s: float,
                      warmup_s: float = 0.0,
                      backoff: Callable[[Shot], float] = honour_retry_after,
                      stop: asyncio.Event | None = None) -> Offered:
    """`concurrency` clients, each sending `fire(n)` again as soon as it is answered (after
    `backoff(shot)` seconds, at most until the end), for `warmup_s` unmeasured and then
    `duration_s` measured seconds, or until `stop` is set; only the shots sent in the measured
    window are appended to `shots`. Client `c` numbers its requests `c * 1_000_000 + k`. The
    clients still waiting come back in `pending`."""
    began = time.monotonic()
    offered = Offered(began + warmup_s)
    deadline = offered.started + duration_s

    async def client(c: int) -> None:
        n = c * 1_000_000
        while (sent := time.monotonic()) < deadline and not (stop and stop.is_set()):
            measured = sent >= offered.started
            offered.sent += measured
            offered.warmup_sent += not measured
            shot = await fire(n)
            n += 1
            if measured:
                shots.append(shot)
            if wait := min(backoff(shot), deadline - time.monotonic()):
                await asyncio.sleep(max(0.0, wait))

    tasks = [asyncio.create_task(client(c)) for c in range(concurrency)]
    waits = [asyncio.create_task(asyncio.wait(tasks, timeout=deadline - began))]
    if stop:
        waits.append(asyncio.create_task(stop.wait()))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    offered.sent_for_s = time.monotonic() - offered.started
    offered.pending = [t for t in tasks if not t.done()]
    return offered


async def open_loop(fire: Fire, shots: list[Shot], *, rate: float, duration_s: float,
                    max_in_flight: int = 2_000) -> Offered:
    """`fire(n)` at `rate` per second for `duration_s`, whether or not earlier ones were answered;
    a send is skipped (and counted in `capped`) while `max_in_flight` are outstanding. A client
    that falls behind catches up in bursts but never sends past `duration_s`: `sent` says what
    it managed to offer."""
    offered = Offered(time.monotonic())
    ends = offered.started + duration_s
    in_flight: set[asyncio.Task] = set()

    async def one(n: int) -> None:
        shots.append(await fire(n))

    n = 0
    while (due := offered.started + n / rate) < ends:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if time.monotonic() >= ends:
            break
        n += 1
        if len(in_flight) >= max_in_flight:
            offered.capped += 1
            continue
        task = asyncio.create_task(one(n))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        offered.sent += 1
    offered.sent_for_s = time.monotonic() - offered.started
    offered.pending = list(in_flight)
    return offered


async def drain(offered: Offered) -> float:
    """Wait for the requests still in flight; seconds from the loop's start to the last answer."""
    if offered.pending:
        await asyncio.gather(*offered.pending)
    return time.monotonic() - offered.started


async def recovery_time(probe: Callable[[float], Awaitable[bool]], *, limit_s: float = 0.2,
                        every_s: float = 0.1, give_up_s: float = 60.0,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> float | None:
    """Seconds from now until `probe(limit_s)` (a small request answered 200 within `limit_s`)
    first succeeds, counted to the moment that probe was sent; a probe starts every `every_s`
    (or as soon as the last one gave up). None when none succeeded within `give_up_s`."""
    start = clock()
    while (sent := clock()) - start <= give_up_s:
        if await probe(limit_s):
            return sent - start
        await sleep(max(0.0, every_s - (clock() - sent)))
    return None


async def measure_closed(fire: Fire, *, concurrency: int, duration_s: float,
                         warmup_s: float = 0.0) -> dict:
    """A closed loop run to the end (the last answers included): its `summarize` figures."""
    shots: list[Shot] = []
    offered = await closed_loop(fire, shots, concurrency=concurrency, duration_s=duration_s,
                                warmup_s=warmup_s)
    return {"concurrency": concurrency, **summarize(shots, await drain(offered))}


class LoopLag:
    """How late this event loop runs a timer, sampled every `every_s` inside the block: what the
    client's own work adds to each latency it measures (and to its send times)."""

    def __init__(self, every_s: float = 0.05):
        self.every_s = every_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task | None = None

    async def _sample(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(self.every_s)
            self.lags_ms.append(max(0.0, time.perf_counter() - began - self.every_s) * 1000)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def max_ms(self) -> float | None:
        return max(self.lags_ms, default=None)

    def text(self) -> str:
        if not self.lags_ms:
            return "-"
        return (f"p50 {pct(self.lags_ms, 50):.1f} ms, p99 {pct(self.lags_ms, 99):.1f} ms, "
                f"max {self.max_ms:.1f} ms ({len(self.lags_ms)} samples)")
