"""The drill's clients below httpx: raw-socket slow uploads, raw requests whose every response
header is kept (duplicates included), and reading the gateway's Prometheus counters.

A slow upload (`slow_upload`) sends a POST's complete headers and then its body one piece per
interval, while it waits for an answer: `length` declares a Content-Length larger than it will
ever send, `chunked` sends one-byte chunks and never the last one, `disconnect` sends a few
pieces and closes the connection. It records the status line it got (if any) and when, counted
from the moment its headers were written.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MODES = ("length", "chunked", "disconnect")


class DrillError(Exception):
    """A scenario cannot run (bad URL, gateway unreachable, CLI refused); the message says why."""


@dataclass(frozen=True)
class Target:
    url: str  # without a trailing slash
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Target:
        """The gateway at `url`: plain http on a loopback address only."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise DrillError(f"bad --url {url!r}: give http://HOST:PORT (plain http)")
        if parts.hostname not in LOOPBACK:
            raise DrillError(f"refusing to drill {parts.hostname}: loopback only")
        try:
            port = parts.port or 80
        except ValueError:
            raise DrillError(f"bad --url {url!r}: the port is not a number") from None
        return cls(url.rstrip("/"), parts.hostname, port)


def parse_status_line(line: bytes) -> int | None:
    """The status code of an HTTP/1.x status line (b"HTTP/1.1 408 Request Timeout"), else None."""
    match = re.match(rb"HTTP/1\.[01] ([1-5][0-9]{2})(?: |\r?$)", line.rstrip(b"\r\n") or b"-")
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class SlowResult:
    mode: str
    outcome: str  # answered; closed or silent (no answer by give_up); refused; disconnected
    status: int | None = None
    after_s: float | None = None  # headers written -> status line read

    @property
    def unanswered(self) -> bool:
        return self.outcome in ("closed", "silent")


def _head(mode: str, host: str, port: int, key: str, declared: int) -> bytes:
    framing = "Transfer-Encoding: chunked" if mode == "chunked" else f"Content-Length: {declared}"
    return (f"POST /v1/predict HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\nX-Routing-Key: {key}\r\n\r\n"
            ).encode()


def _piece(mode: str, i: int) -> bytes:
    byte = b'{"inputs": ["'[i:i + 1] or b"a"  # the start of a valid body, then filler
    return b"1\r\n" + byte + b"\r\n" if mode == "chunked" else byte


async def slow_upload(host: str, port: int, *, mode: str = "length", every_s: float = 1.0,
                      give_up_s: float = 30.0, declared: int = 100_000, key: str = "drill-slow",
                      disconnect_after: int = 3) -> SlowResult:
    """One slow upload (see the module docstring); waits at most `give_up_s` for an answer."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return SlowResult(mode, "refused")
    try:
        writer.write(_head(mode, host, port, key, declared))
        await writer.drain()
        started = time.monotonic()
        answer = asyncio.create_task(reader.readline())
        sent = 0
        while not answer.done():
            if mode == "disconnect" and sent >= disconnect_after:
                answer.cancel()
                return SlowResult(mode, "disconnected")
            left = give_up_s - (time.monotonic() - started)
            if left <= 0:
                answer.cancel()
                return SlowResult(mode, "silent")
            await asyncio.wait([answer], timeout=min(every_s, left))
            if not answer.done() and time.monotonic() - started < give_up_s:
                try:
                    writer.write(_piece(mode, sent))
                    await writer.drain()
                    sent += 1
                except OSError:  # the server closed its side; its answer may still be readable
                    await asyncio.wait([answer], timeout=max(0.0, left))
        return _answered(mode, answer, started)
    except OSError:
        return SlowResult(mode, "closed")
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


def _answered(mode: str, answer: asyncio.Task, started: float) -> SlowResult:
    if not answer.done():
        answer.cancel()
        return SlowResult(mode, "silent")
    try:
        line = answer.result()
    except (OSError, ValueError):  # reset by peer; a line over the stream limit
        return SlowResult(mode, "closed")
    if not line:
        return SlowResult(mode, "closed")
    return SlowResult(mode, "answered", parse_status_line(line), time.monotonic() - started)


# --- raw requests, every header kept ------------------------------------------------------------

def raw_predict(host: str, port: int, headers: dict[str, str], *, timeout: float = 10.0,
                text: str = "drill request id check") -> tuple[int, list[tuple[str, str]]]:
    """POST /v1/predict through http.client; the status and every response header as sent,
    duplicates included (httpx would merge them)."""
    body = json.dumps({"inputs": [text]}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/predict", body=body,
                     headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheaders()
    finally:
        conn.close()


def request_id_problems(sent: str, well_formed: bool, headers: list[tuple[str, str]]) -> list[str]:
    """What is wrong with the response headers of a request sent with X-Request-ID `sent`:
    exactly one X-Request-ID comes back, equal to `sent` when it was well formed, and a
    malformed value is reflected by no header at all."""
    problems = []
    ids = [v for k, v in headers if k.lower() == "x-request-id"]
    if len(ids) != 1:
        problems.append(f"{len(ids)} X-Request-ID headers: {ids!r}")
    if well_formed and sent not in ids:
        problems.append(f"the well-formed id {sent!r} did not come back (got {ids!r})")
    if not well_formed:
        problems += [f"{k} reflects the malformed value: {v!r}" for k, v in headers if sent in v]
    return problems


# --- Prometheus text ----------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def counter_by(text: str, metric: str, label: str) -> dict[str, float]:
    """Sum of the samples of `metric` in Prometheus text, by the value of `label`."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != metric:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        key = labels.get(label, "")
        totals[key] = totals.get(key, 0.0) + value
    return totals


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before per key, keys that did not change left out (a reset counts from zero)."""
    delta = {}
    for key, value in after.items():
        change = value - before.get(key, 0.0)
        if change < 0:  # the replica restarted: its counter began again
            change = value
        if change:
            delta[key] = int(change) if float(change).is_integer() else change
    return dict(sorted(delta.items()))
