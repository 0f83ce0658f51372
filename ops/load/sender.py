"""The load generator's HTTP client: `Sender`, raw HTTP/1.1 on kept-alive asyncio connections,
and `Shot`, what one request came to.

Why not httpx here (httpx stays for single control calls: a health check, a state poll): a load
generator shares the CPUs with the server it measures, so its own cost per request is taken from
the server's. Measured side by side (`python -m ops.bench.client_cost`: 3 alternating rounds of
4,000 one-text POSTs per client, best round, against a loopback server in another process;
2026-12-01, Intel Xeon, 2 vCPUs, avx2 and avx512f/bw/vl/vnni, no avx512_bf16, no AMX):

    clients   Sender CPU ms/request   httpx.AsyncClient CPU ms/request   ratio
          8                   0.039                              1.318   34x
         64                   0.051                              4.017   79x

At the gateway's 300-600 requests/s on this machine, httpx would take 0.4-2.4 of its 2 cores;
`Sender` takes 0.01-0.03.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple
from urllib.parse import urlsplit

NO_HEADERS: Mapping[str, str] = MappingProxyType({})
SHED = (429, 503)  # the answers whose Retry-After a well-behaved client waits


@dataclass(frozen=True)
class Shot:
    """One request's end: its status (None: no answer, a connection error or a client
    timeout), its latency, the texts it carried, the response headers the Sender was asked to
    keep (lower-case names), and when it was written (`time.monotonic()`)."""

    status: int | None
    latency_s: float
    texts: int = 1
    headers: Mapping[str, str] = field(default_factory=lambda: NO_HEADERS, compare=False)
    sent_at: float = field(default=0.0, compare=False)

    def retry_after_s(self) -> float:
        """The Retry-After (delay-seconds form) of a shed answer (429 or 503), else 0."""
        value = self.headers.get("retry-after", "").strip()
        return float(value) if self.status in SHED and value.isdigit() else 0.0


class Head(NamedTuple):
    """What the client reads of an answer's head."""

    status: int
    length: int | None  # Content-Length, None when absent
    chunked: bool
    close: bool  # the connection closes after this answer
    headers: dict[str, str]  # the ones asked for, by lower-case name

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


def parse_head(head: bytes, capture: frozenset[bytes] = frozenset()) -> Head:
    """An HTTP/1.x response head (status line and headers, up to the blank line): its status,
    Content-Length, whether the body is chunked, whether the connection closes after it
    (`Connection: close`, or HTTP/1.0 without `Connection: keep-alive`), and the headers named
    in `capture` (lower-case). Only those and the ones that frame the body are looked at.
    BadResponse when it is not a response."""
    lines = head.split(b"\r\n")
    first = lines[0]
    code = first[9:12]
    if not first.startswith(b"HTTP/1.") or first[8:9] != b" " or not code.isdigit() or (
            first[12:13] not in (b"", b" ")):
        raise BadResponse(f"not an HTTP/1.x status line: {first[:40]!r}")
    length, chunked, close, kept = None, False, first[7:8] == b"0", {}
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
        if name in capture:
            kept[name.decode("latin-1")] = value.strip().decode("latin-1")
    return Head(int(code), length, chunked, close, kept)


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

    async def exchange(self, request: bytes, capture: frozenset[bytes]) -> tuple[Head, bool]:
        """Write one request, read its answer: its head (with the headers in `capture`) and
        whether the connection may be used again. The body is read and thrown away."""
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
        answer = parse_head(head, capture)
        while 100 <= answer.status < 200:  # an interim answer: the final one follows
            answer = parse_head(await reader.readuntil(_END_OF_HEAD), capture)
        status, length, chunked, close = answer.status, answer.length, answer.chunked, answer.close
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
        return answer, not close


class Sender:
    """POSTs bodies to `path` (after the URL's own path, if any) over a pool of persistent
    HTTP/1.1 connections on raw asyncio streams; each call returns a Shot (no answer: status
    None).

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
    bounds the wait for a connection (with connecting) and, separately, the exchange. The
    response headers named in `capture` come back in the Shot (Retry-After by default, so that
    a loop can honour it).
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, connections: int = 256,
                 path: str = "/v1/predict", headers: dict[str, str] | None = None,
                 capture: Iterable[str] = ("retry-after",)):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"bad url {url!r}: give http://HOST:PORT")
        if connections < 1:
            raise ValueError("connections must be 1 or more")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s, self.connections = timeout_s, connections
        self.stats = SenderStats()
        self.capture = frozenset(name.lower().encode("latin-1") for name in capture)
        headers = headers or {}
        if any(c in f"{name}{value}" for name, value in headers.items() for c in "\r\n"):
            raise ValueError(f"a header cannot hold a line break: {headers!r}")
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        path = parts.path.rstrip("/") + path  # a URL with a path prefix (a route prefix)
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
        """POST `body` with `X-Routing-Key: key`; the Shot it came to (it never raises for the
        server's or the network's sake)."""
        request = self.request(body, key)
        self.stats.sends += 1
        called = time.perf_counter()
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(self.timeout_s):
                    conn, reused = await self._acquire()
            except OSError:  # refused, unreachable, or no connection within the timeout
                return Shot(None, time.perf_counter() - called, texts)
            keep, sent_at = False, time.monotonic()
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self.timeout_s):
                    answer, keep = await conn.exchange(request, self.capture)
                return Shot(answer.status, time.perf_counter() - started, texts,
                            answer.headers or NO_HEADERS, sent_at)
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

