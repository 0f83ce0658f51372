"""Load shapes for the drill: closed loop (N clients, each sends when its last answer came),
open loop (a fixed rate, answered or not), the capacity pick, the recovery probe, and the
deterministic pseudo-English inputs of the long-input burst; the load's client (`Sender`, raw
HTTP/1.1 on kept-alive asyncio connections) and the niceness it runs at.

Both loops stop *sending* after their duration and hand back the requests still in flight, so a
scenario can start timing recovery the moment the load stops, while those drain. Every request
ends as a `Shot`: its status, or None when it got no answer (connection error, client timeout).

The client shares the CPUs with the gateway it measures, so it is made cheap (no HTTP library
on the hot path; see `Sender`), its own delays are reported (`SenderStats`: waits for a free
connection; `LoopLag`: how late its event loop ran), and it runs at the Serve workers'
niceness (`apply_niceness`) so that it does not preempt the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ops.drill.goals import pct

ANSWERED = ("200", "503", "504")  # what an overloaded gateway may answer
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "model data system time people new first year work way could after two made many then them "
    "these may like than other use only more most also any some very well over such our through "
    "where much before right good each those both under same while last might great between "
    "never city world small large market price water energy study report music game team player "
    "school health policy research network server request answer quickly slowly early later "
    "river mountain garden window letter morning evening history science language number"
).split()


def make_text(rng: random.Random, words: int = 200) -> str:
    """`words` words of pseudo-English: sentences of 6-16 words, capitalised, full stops."""
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(min(rng.randint(6, 16), words - len(out)))]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out += sentence
    return " ".join(out)


def make_texts(n: int, words: int = 200, seed: int = 15) -> list[str]:
    """`n` texts of `words` words, the same for the same arguments on every machine."""
    rng = random.Random(seed)
    return [make_text(rng, words) for _ in range(n)]


def batch_bodies(texts: list[str], per_request: int, count: int) -> list[bytes]:
    """`count` JSON request bodies of `per_request` texts each, taken round the list of texts."""
    return [json.dumps({"inputs": [texts[(i * per_request + j) % len(texts)]
                                   for j in range(per_request)]}).encode() for i in range(count)]


@dataclass(frozen=True)
class Shot:
    status: int | None  # None: no answer
    latency_s: float
    texts: int = 1


def bucket(status: int | None) -> str:
    """200 / 503 / 504 as themselves, any other code as `other`, no answer as `lost`."""
    if status is None:
        return "lost"
    return str(status) if str(status) in ANSWERED else "other"


def summarize(shots: list[Shot], elapsed_s: float) -> dict:
    """Counts per status bucket, every status seen, 200s and texts per second, p50/p99 of 200s."""
    ok = [s for s in shots if s.status == 200]
    latencies = [s.latency_s * 1000 for s in ok]
    counts = Counter(bucket(s.status) for s in shots)
    return {
        "sent": len(shots),
        "counts": {k: counts.get(k, 0) for k in (*ANSWERED, "other", "lost")},
        "statuses": dict(sorted(Counter(str(s.status or "lost") for s in shots).items())),
        "ok_per_s": len(ok) / elapsed_s if elapsed_s > 0 else None,
        "texts_per_s": sum(s.texts for s in ok) / elapsed_s if elapsed_s > 0 else None,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
    }


def pick_capacity(steps: list[dict]) -> dict | None:
    """The step with the most 200s per second (the fewest clients on a tie): capacity is the
    best goodput the gateway sustained, not the load that was offered."""
    measured = [s for s in steps if s.get("ok_per_s")]
    return max(measured, key=lambda s: (s["ok_per_s"], -s["concurrency"]), default=None)


class SenderStats:
    """What a Sender did outside the latencies it measured: the sends that waited for a free
    connection (all `connections` busy) and for how long, the connections it opened and the time
    connecting took, the connections dropped, and the requests resent once on a fresh connection
    (a kept-alive one was closed by the server before any answer)."""

    __slots__ = ("sends", "waited", "wait_s", "wait_max_s", "opened", "connect_s", "dropped",
                 "resent")

    def __init__(self) -> None:
        self.sends = self.waited = self.opened = self.dropped = self.resent = 0
        self.wait_s = self.wait_max_s = self.connect_s = 0.0

    def text(self) -> str:
        """The stats as one line of a report."""
        waits = (f"{self.waited} waited for a free connection (mean "
                 f"{self.wait_s / self.waited * 1000:.1f} ms, max {self.wait_max_s * 1000:.1f} ms)"
                 if self.waited else "none waited for a free connection")
        opened = (f"; {self.opened} connections opened (mean "
                  f"{self.connect_s / self.opened * 1000:.1f} ms)" if self.opened else "")
        dropped = f"; {self.dropped} dropped" if self.dropped else ""
        resent = f"; {self.resent} resent" if self.resent else ""
        return f"{self.sends} sends, {waits}{opened}{dropped}{resent}"


class BadResponse(ValueError):
    """The server's bytes are not an HTTP/1.x response the client can frame."""


class _Unanswered(ConnectionError):
    """The connection was closed before a byte of the answer came (a reset is taken as that)."""


_NO_BODY = (204, 304)
_END_OF_HEAD = b"\r\n\r\n"


def parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """An HTTP/1.x response head (status line and headers, up to the blank line): its status,
    Content-Length (None when absent), whether the body is chunked, and whether the connection
    closes after it (`Connection: close`, or HTTP/1.0 without `Connection: keep-alive`). Only
    the headers that frame the body are looked at. BadResponse when it is not a response."""
    lines = head.split(b"\r\n")
    first = lines[0]
    code = first[9:12]
    if not first.startswith(b"HTTP/1.") or first[8:9] != b" " or not code.isdigit() or (
            first[12:13] not in (b"", b" ")):
        raise BadResponse(f"not an HTTP/1.x status line: {first[:40]!r}")
    length, chunked, close = None, False, first[7:8] == b"0"
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon:
            raise BadResponse(f"not a header line: {line[:40]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            if not value.strip().isdigit():
                raise BadResponse(f"bad Content-Length: {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            tokens = value.lower()
            close = b"close" in tokens or (close and b"keep-alive" not in tokens)
    return int(code), length, chunked, close


async def _read_chunked(reader: asyncio.StreamReader) -> None:
    """Read and discard a chunked body, its trailers included."""
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise BadResponse(f"bad chunk size line: {line[:40]!r}") from None
        if size < 0:
            raise BadResponse(f"bad chunk size line: {line[:40]!r}")
        if size == 0:
            break
        if (await reader.readexactly(size + 2))[-2:] != b"\r\n":
            raise BadResponse("a chunk does not end with CRLF")
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the blank line
        pass


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def usable(self) -> bool:
        """False once the server closed it while it was idle (its FIN or an error arrived)."""
        return not (self.writer.is_closing() or self.reader.at_eof()
                    or self.reader.exception() is not None)

    async def exchange(self, request: bytes) -> tuple[int, bool]:
        """Write one request, read its answer: the status and whether the connection may be
        used again. The body is read and thrown away."""
        reader = self.reader
        try:
            self.writer.write(request)
            await self.writer.drain()
            head = await reader.readuntil(_END_OF_HEAD)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            raise _Unanswered("closed before answering") from None
        except ConnectionError as exc:
            raise _Unanswered(str(exc)) from None
        status, length, chunked, close = parse_head(head)
        while 100 <= status < 200:  # an interim answer: the final one follows
            status, length, chunked, close = parse_head(await reader.readuntil(_END_OF_HEAD))
        if status in _NO_BODY:
            pass
        elif chunked:
            await _read_chunked(reader)
        elif length is not None:
            if length:
                await reader.readexactly(length)
        else:  # no framing: the body ends when the server closes
            await reader.read()
            close = True
        return status, not close


class Sender:
    """POSTs bodies to `path` over a pool of persistent HTTP/1.1 connections on raw asyncio
    streams; each call returns a Shot (no answer: status None).

    Far cheaper per request than an HTTP library, so that a load generator sharing the CPUs
    with the gateway offers what it is asked and times the gateway, not itself: a request's
    head is one bytes join (the fixed part is built once per body length), and of the answer
    only the status line and the headers that frame the body are parsed; the body is read and
    discarded. At most `connections` are open, each opened when a send finds none idle; a
    send that finds them all busy waits for one (counted in `stats`). A connection is dropped
    after an error, a timeout or `Connection: close`; a request whose kept-alive connection
    was closed by the server before any byte of an answer is resent once on a fresh one.

    A Shot's latency runs from just before the request is written on a ready connection to the
    end of its answer: neither the wait for a connection nor connecting is in it. `timeout_s`
    bounds the wait for a connection (with connecting) and, separately, the exchange.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, connections: int = 256,
                 path: str = "/v1/predict", headers: dict[str, str] | None = None):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"bad url {url!r}: give http://HOST:PORT")
        if connections < 1:
            raise ValueError("connections must be 1 or more")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s, self.connections = timeout_s, connections
        self.stats = SenderStats()
        headers = headers or {}
        if any(c in f"{name}{value}" for name, value in headers.items() for c in "\r\n"):
            raise ValueError(f"a header cannot hold a line break: {headers!r}")
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._fixed = (f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{extra}"
                       "Content-Type: application/json\r\nContent-Length: ").encode()
        self._heads: dict[int, bytes] = {}
        self._idle: list[_Conn] = []
        self._open = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future] = deque()
        self._closed = False

    def take_stats(self) -> SenderStats:
        """The stats since the last call (or the start); counting starts again."""
        stats, self.stats = self.stats, SenderStats()
        return stats

    def request(self, body: bytes, key: str) -> bytes:
        """The request's bytes: method line, Host, the `headers` given, Content-Type,
        Content-Length, X-Routing-Key, then the body."""
        head = self._heads.get(len(body))
        if head is None:
            if len(self._heads) >= 1024:
                self._heads.clear()
            head = self._heads[len(body)] = (self._fixed + str(len(body)).encode()
                                             + b"\r\nX-Routing-Key: ")
        routing = key.encode("latin-1")
        if b"\r" in routing or b"\n" in routing:
            raise ValueError(f"a routing key cannot hold a line break: {key!r}")
        return b"".join((head, routing, _END_OF_HEAD, body))

    async def __call__(self, body: bytes, key: str, texts: int = 1) -> Shot:
        request = self.request(body, key)
        self.stats.sends += 1
        called = time.perf_counter()
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(self.timeout_s):
                    conn, reused = await self._acquire()
            except OSError:  # refused, unreachable, or no connection within the timeout
                return Shot(None, time.perf_counter() - called, texts)
            keep = False
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self.timeout_s):
                    status, keep = await conn.exchange(request)
                return Shot(status, time.perf_counter() - started, texts)
            except _Unanswered:
                if reused and attempt == 1:
                    self.stats.resent += 1
                    continue
                return Shot(None, time.perf_counter() - started, texts)
            except (OSError, EOFError, ValueError, asyncio.LimitOverrunError):
                # timed out, reset, closed mid-answer, not HTTP, a line over the stream limit
                return Shot(None, time.perf_counter() - started, texts)
            finally:
                if keep:
                    self._release(conn)
                else:
                    self._drop(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _acquire(self) -> tuple[_Conn, bool]:
        """A ready connection and whether it served before: an idle one (the last released
        first), else a new one while fewer than `connections` are open, else the next one
        released or the slot of the next one dropped."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
            self._drop(conn)
        if self._open < self.connections:
            self._open += 1
        else:
            conn = await self._wait()
            if conn is not None:
                return conn, True
        return await self._connect(), False  # in the slot taken or handed over

    async def _wait(self) -> _Conn | None:
        """Wait for a connection released (or None: a dropped one's slot, to open anew)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        began = time.perf_counter()
        try:
            return await waiter
        except BaseException:  # cancelled or timed out: hand on what came meanwhile
            if waiter.done() and not waiter.cancelled():
                got = waiter.result()
                self._free_slot() if got is None else self._release(got)
            else:
                waiter.cancel()
            raise
        finally:
            waited = time.perf_counter() - began
            self.stats.waited += 1
            self.stats.wait_s += waited
            self.stats.wait_max_s = max(self.stats.wait_max_s, waited)

    async def _connect(self) -> _Conn:
        """Open a connection in a slot already counted in `_open`; the slot is freed on failure."""
        began = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except BaseException:
            self._free_slot()
            raise
        self.stats.opened += 1
        self.stats.connect_s += time.perf_counter() - began
        return _Conn(reader, writer)

    def _release(self, conn: _Conn) -> None:
        """A connection that may serve again: to the first waiter, else idle."""
        if self._closed:
            self._drop(conn)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _drop(self, conn: _Conn, *, counted: bool = True) -> None:
        conn.writer.close()
        self.stats.dropped += counted
        self._free_slot()

    def _free_slot(self) -> None:
        """A connection's slot is free: to the first waiter (it opens a connection), else
        one fewer open."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._open -= 1

    async def aclose(self) -> None:
        """Close the idle connections; one still busy is closed when its request ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._drop(conn, counted=False)
        for conn in idle:
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()


def short_body(i: int) -> bytes:
    return json.dumps({"inputs": [f"drill input number {i}"]}).encode()


@dataclass
class Offered:
    """What a loop sent: the requests still in flight when it stopped sending are in `pending`."""

    started: float
    sent_for_s: float = 0.0
    sent: int = 0
    capped: int = 0  # open loop: sends skipped because max_in_flight were outstanding
    pending: list[asyncio.Task] = field(default_factory=list)


async def closed_loop(fire: Callable[[int], Awaitable[Shot]], shots: list[Shot], *,
                      concurrency: int, duration_s: float) -> Offered:
    """`concurrency` clients, each sending `fire(n)` again as soon as it is answered, until
    `duration_s` has passed; the clients still waiting come back in `pending`."""
    offered = Offered(time.monotonic())
    deadline = offered.started + duration_s

    async def client(c: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            offered.sent += 1
            shots.append(await fire(c * 1_000_000 + n))
            n += 1

    tasks = [asyncio.create_task(client(c)) for c in range(concurrency)]
    await asyncio.wait(tasks, timeout=duration_s)
    offered.sent_for_s = time.monotonic() - offered.started
    offered.pending = [t for t in tasks if not t.done()]
    return offered


async def open_loop(fire: Callable[[int], Awaitable[Shot]], shots: list[Shot], *, rate: float,
                    duration_s: float, max_in_flight: int = 2_000) -> Offered:
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


def small_probe(sender: Sender) -> Callable[[float], Awaitable[bool]]:
    """A probe for `recovery_time`: one short text, True when answered 200 within the limit."""
    count = 0

    async def probe(limit_s: float) -> bool:
        nonlocal count
        count += 1
        try:
            shot = await asyncio.wait_for(sender(short_body(count), f"drill-probe-{count}"),
                                          limit_s)
        except TimeoutError:
            return False
        return shot.status == 200 and shot.latency_s < limit_s

    return probe


async def measure_closed(fire: Callable[[int], Awaitable[Shot]], *, concurrency: int,
                         duration_s: float) -> dict:
    """A closed loop run to the end (the last answers included): its `summarize` figures."""
    shots: list[Shot] = []
    offered = await closed_loop(fire, shots, concurrency=concurrency, duration_s=duration_s)
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


# --- the load generator's niceness ---------------------------------------------------------------

NICE_WHY = ("the load generator runs at the Serve workers' niceness, so it does not preempt the "
            "server it measures")
REPLICA_TITLE = b"ray::ServeReplica:"


def stat_niceness(stat: str) -> int:
    """Field 19 (nice) of a /proc/PID/stat line. Field 2, the command in parentheses, may hold
    spaces and parentheses itself: fields are counted from the last `)`."""
    fields = stat[stat.rindex(")") + 1:].split()
    return int(fields[16])  # fields[0] is field 3 (state)


def serve_niceness(proc: Path = Path("/proc")) -> int | None:
    """The niceness of this machine's Serve replica processes (process title
    `ray::ServeReplica:*`), the highest when they differ; None when none is found."""
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(REPLICA_TITLE):
                continue
            found.append(stat_niceness((entry / "stat").read_text()))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not a stat line
            continue
    return max(found, default=None)


@dataclass(frozen=True)
class Niceness:
    used: int
    was: int
    why: str

    def figure(self) -> dict:
        return {"used": self.used, "was": self.was, "why": self.why}


def apply_niceness(asked: int | str, *, find: Callable[[], int | None] = serve_niceness,
                   nice: Callable[[int], int] = os.nice) -> Niceness:
    """Reach the niceness `asked` with os.nice: a number, `auto` (the Serve replicas', see
    `serve_niceness`) or `none` (unchanged). What was used, what it was, and why."""
    was = nice(0)
    if asked == "none":
        return Niceness(was, was, "--nice none: left as it was")
    if asked == "auto":
        target = find()
        if target is None:
            return Niceness(was, was, "auto: no Serve replica process found on this machine, "
                            "left as it was")
        why = f"auto, the Serve replicas' niceness: {NICE_WHY}"
    else:
        target, why = int(asked), f"--nice {asked}"
    if target != was:
        try:
            nice(target - was)
        except OSError:
            return Niceness(was, was, f"{why}; lowering it to {target} needs privilege, "
                            "left as it was")
    return Niceness(nice(0), was, why)


class OperatorThread(ThreadPoolExecutor):
    """One thread started before the drill raises its niceness. On Linux a niceness belongs to
    a thread, and a new thread or process takes its creator's: what runs or starts from this
    thread (the `rollout` commands timed as an operator runs them, a scenario's
    `asyncio.to_thread` work when it is the loop's default executor) keeps the niceness the
    drill was started with. `shutdown`, which `asyncio.run` calls on its default executor, keeps
    it for the next scenario; `close` ends it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="drill-operator")
        self.submit(int).result()  # its thread exists from now on

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Kept: see the class docstring."""

    def close(self) -> None:
        super().shutdown(wait=True)


_operator: OperatorThread | None = None


def start_operator_thread() -> OperatorThread:
    """The operator's thread, started now (call before changing the niceness)."""
    global _operator
    if _operator is None:
        _operator = OperatorThread()
    return _operator


def operator_thread() -> OperatorThread | None:
    return _operator


def as_operator(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` run in the operator's thread (see OperatorThread), here when there is none."""
    return _operator.submit(fn, *args).result() if _operator else fn(*args)
