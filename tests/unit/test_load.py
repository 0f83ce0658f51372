"""The load-generation library (ops.load): the headers a Shot keeps, the closed loop's
Retry-After, warm-up and stop, the status histogram and the process helpers. Against a tiny
loopback HTTP server; no gateway, no Ray, no Redis. (The raw client's framing and pooling are
tested in test_drill.py, where the drills first needed them.)"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from ops.bench.client_cost import fixed_answer_server
from ops.load import Sender, Shot, closed_loop, no_backoff, statuses, summarize
from ops.load.processes import cpu_seconds, rss_mib, stat_fields, titled


async def _server(status_line: bytes, headers: bytes = b""):
    """A loopback server answering every request with `status_line` and `headers`."""
    server = await fixed_answer_server(b"HTTP/1.1 " + status_line + b"\r\nContent-Length: 2\r\n"
                                       + headers + b"\r\n{}")
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_a_shot_keeps_the_headers_asked_for_and_when_it_was_sent():
    async def scenario():
        server, url = await _server(b"503 Service Unavailable",
                                    b"Retry-After: 2\r\nX-Canary-Arm: optimized\r\nX-Other: 1\r\n")
        async with server:
            sender = Sender(url, capture=("retry-after", "X-Canary-Arm"))
            before = time.monotonic()
            shot = await sender(b"{}", "k")
            await sender.aclose()
        return before, shot

    before, shot = asyncio.run(scenario())
    assert shot.status == 503 and dict(shot.headers) == {"retry-after": "2",
                                                         "x-canary-arm": "optimized"}
    assert before <= shot.sent_at <= before + shot.latency_s + 1
    assert shot.retry_after_s() == 2.0


def test_retry_after_counts_only_on_a_shed_answer_in_seconds_form():
    assert Shot(503, 0.1, headers={"retry-after": "3"}).retry_after_s() == 3.0
    assert Shot(429, 0.1, headers={"retry-after": "1"}).retry_after_s() == 1.0
    assert Shot(200, 0.1, headers={"retry-after": "3"}).retry_after_s() == 0.0
    assert Shot(503, 0.1, headers={"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}
                ).retry_after_s() == 0.0
    assert Shot(503, 0.1).retry_after_s() == 0.0 and Shot(None, 30).retry_after_s() == 0.0


def _shed_then_ok(retry_after: str):
    """A fire(n) whose first request per client is shed with `retry_after`, then answered."""
    first: set[int] = set()

    async def fire(n):
        client = n // 1_000_000
        if client not in first:
            first.add(client)
            return Shot(503, 0.0, headers={"retry-after": retry_after})
        await asyncio.sleep(0.005)
        return Shot(200, 0.005)

    return fire


def _closed(fire, **options):
    async def scenario():
        shots: list[Shot] = []
        offered = await closed_loop(fire, shots, **options)
        await asyncio.gather(*offered.pending)
        return offered, shots
    return asyncio.run(scenario())


def test_the_closed_loop_waits_the_retry_after_of_a_shed_answer():
    offered, shots = _closed(_shed_then_ok("1"), concurrency=2, duration_s=0.3)
    # each client was shed once and then waited past the end: nothing else was sent
    assert [s.status for s in shots] == [503, 503] and offered.sent == 2
    offered, shots = _closed(_shed_then_ok("1"), concurrency=2, duration_s=0.3,
                             backoff=no_backoff)
    assert offered.sent > 10 and sum(s.status == 200 for s in shots) == offered.sent - 2


def test_the_closed_loop_keeps_only_what_was_sent_after_the_warm_up():
    async def fire(n):
        await asyncio.sleep(0.01)
        return Shot(200, 0.01, sent_at=time.monotonic())

    began = time.monotonic()
    offered, shots = _closed(fire, concurrency=2, duration_s=0.2, warmup_s=0.2)
    assert offered.warmup_sent >= 2 and offered.sent == len(shots) >= 2
    assert offered.started >= began + 0.2 and min(s.sent_at for s in shots) >= offered.started


def test_the_closed_loop_stops_when_told():
    async def scenario():
        shots: list[Shot] = []
        stop = asyncio.Event()

        async def fire(n):
            await asyncio.sleep(0.01)
            return Shot(200, 0.01)

        asyncio.get_running_loop().call_later(0.1, stop.set)
        began = time.monotonic()
        offered = await closed_loop(fire, shots, concurrency=2, duration_s=60, stop=stop)
        await asyncio.gather(*offered.pending)
        return time.monotonic() - began, offered

    took, offered = asyncio.run(scenario())
    assert took < 5 and offered.sent >= 2


def test_the_status_histogram_counts_every_shot():
    shots = [Shot(200, 0.01)] * 3 + [Shot(503, 0.0), Shot(None, 30), Shot(418, 0.0)]
    assert statuses(shots) == {"200": 3, "418": 1, "503": 1, "lost": 1}
    figures = summarize(shots, 2.0)
    assert figures["counts"] == {"200": 3, "503": 1, "504": 0, "other": 1, "lost": 1}
    assert figures["ok_per_s"] == 1.5 and figures["p99_ms"] == 10.0


def test_processes_are_found_by_title_and_read_from_proc(tmp_path):
    for pid, title in ((10, b"ray::ServeReplica:a:gateway"), (11, b"ray::ProxyActor"),
                       (12, b"/usr/bin/python")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(title + b"\0--flag\0")
    assert titled(("ray::ServeReplica", "ray::ProxyActor"), tmp_path) == {
        10: "ray::ServeReplica:a:gateway", 11: "ray::ProxyActor"}
    assert titled("x", tmp_path / "missing") == {}
    assert stat_fields("1 (a) b) R 0")[0] == "R"
    me = os.getpid()
    assert rss_mib(me) > 1 and rss_mib(2 ** 30) is None
    assert cpu_seconds([me]) > 0 and cpu_seconds([2 ** 30]) == 0


def test_a_request_is_routed_when_the_gateway_started_on_it():
    from ops.drill.measure import routed_at, routed_since

    timed = Shot(200, 0.050, headers={"server-timing": "queue;dur=1.0, total;dur=20.0",
                                      "x-canary-arm": "optimized"}, sent_at=10.0)
    # received at 10.050, 20 ms of it in the gateway
    assert routed_at(timed) == pytest.approx(10.030)
    slow_network = Shot(200, 0.050, headers={"server-timing": "total;dur=60.0"}, sent_at=10.0)
    assert routed_at(slow_network) == 10.0  # never before it was sent
    # no Server-Timing: on arrival
    assert routed_at(Shot(200, 0.050, sent_at=10.0)) == pytest.approx(10.050)
    shots = [timed, Shot(503, 0.0, sent_at=11.0), Shot(200, 0.01, sent_at=9.0)]
    assert routed_since(shots, 10.0) == [(pytest.approx(10.030), "optimized")]
