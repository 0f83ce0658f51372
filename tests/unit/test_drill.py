"""ops.drill: the pure parts (goals, reports, parsing, capacity, recovery, inputs) and the raw
slow-upload client against a tiny loopback server. No gateway, no Ray, no Redis."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import types

import pytest

from ops.cli.types import client_counts, factors, niceness, percent, seconds
from ops.drill import command as drill
from ops.drill import operator_side as drill_control
from ops.drill.client import (
    DrillError,
    SlowResult,
    Target,
    counter_by,
    counter_delta,
    parse_status_line,
    request_id_problems,
    slow_upload,
)
from ops.drill.goals import Goal, Report, format_report, median, pct, ratio, share, summary_table
from ops.drill.headers import cases
from ops.drill.memory import growth_pct, watch_rss
from ops.drill.niceness import Niceness, apply_niceness
from ops.drill.overload import pick_capacity
from ops.drill.texts import batch_bodies, make_texts, small_probe
from ops.load import (
    BadResponse,
    LoopLag,
    Sender,
    Shot,
    bucket,
    closed_loop,
    open_loop,
    parse_head,
    recovery_time,
    summarize,
)
from ops.load.processes import serve_niceness, stat_niceness


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


# --- goals and reports ---------------------------------------------------------------------------

def test_goal_judges_both_directions_and_a_missing_value():
    assert Goal("success", 99.5, ">=", 99, "%").passed is True
    assert Goal("success", 98.9, ">=", 99, "%").passed is False
    assert Goal("p99 ratio", 3.0, "<=", 3, "x").passed is True
    assert Goal("p99 ratio", 3.01, "<=", 3, "x").passed is False
    assert Goal("500s", None, "<=", 0).passed is None
    assert Goal("recovery", None, "<=", 5, "s", if_missing=False).passed is False
    with pytest.raises(ValueError, match="op must be"):
        Goal("x", 1, "<", 2)


def test_report_verdict_and_text():
    report = Report("demo", figures={"p99 ms": 12.345, "statuses": {"200": 9, "503": 1}},
                    goals=[Goal("success", 99.7, ">=", 99, "%"),
                           Goal("recovery", None, "<=", 5, "s", if_missing=False)],
                    notes=["a note"])
    text = format_report(report)
    assert "== demo ==" in text and "12.3" in text and "200=9, 503=1" in text
    assert "PASS  success" in text and "FAIL  recovery" in text and "note: a note" in text
    assert report.passed is False
    assert Report("x", goals=[Goal("a", 1, "<=", 2)]).passed is True
    assert Report("x", goals=[Goal("a", None, "<=", 2)]).passed is None
    assert Report("x", goals=[Goal("a", 1, "<=", 2)], error="boom").passed is False


def test_report_json_is_strict_json():
    report = Report("demo", figures={"inf": float("inf"), "nested": {"x": 1.23456}},
                    goals=[Goal("ratio", 2.5, "<=", 3, "x")])
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["figures"] == {"inf": None, "nested": {"x": 1.235}}
    assert data["goals"][0] == {"name": "ratio", "value": 2.5, "goal": "<= 3", "unit": "x",
                                "passed": True}


def test_summary_table_counts_verdicts_per_scenario():
    table = summary_table([
        Report("overload", goals=[Goal("a", 1, "<=", 2), Goal("b", 3, "<=", 2)]),
        Report("kill", goals=[Goal("a", 0.1, "<=", 0.25)]),
        Report("burst", error="the CLI refused"),
    ])
    lines = table.splitlines()
    assert lines[0].split() == ["scenario", "pass", "fail", "n/a", "verdict"]
    assert lines[2].split() == ["overload", "1", "1", "0", "FAIL"]
    assert lines[3].split() == ["kill", "1", "0", "0", "PASS"]
    assert lines[4].split() == ["burst", "0", "0", "0", "ERROR"]


def test_small_statistics():
    assert pct([], 99) is None
    assert pct([float(i) for i in range(1, 101)], 99) == 99.0
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert median([]) is None
    assert ratio(30.0, 10.0) == 3.0 and ratio(None, 10.0) is None and ratio(1.0, 0.0) is None
    assert share(99, 100) == 99.0 and share(0, 0) is None


# --- arguments, URL, command line ----------------------------------------------------------------

def test_argument_bounds():
    assert factors("2,5,10") == [2.0, 5.0, 10.0]
    assert client_counts("1,2,4") == [1, 2, 4]
    assert percent("50") == 50.0 and seconds()("30") == 30.0
    for parse, bad in ((factors, "2,0"), (factors, "1000"), (client_counts, "1,5000"),
                       (percent, "101"), (seconds(), "601"), (seconds(), "-1"), (seconds(), "x")):
        with pytest.raises(Exception, match="must|not a|give"):
            parse(bad)


def test_target_is_plain_http_on_loopback():
    assert Target.parse("http://127.0.0.1:8000/") == Target("http://127.0.0.1:8000",
                                                            "127.0.0.1", 8000)
    assert Target.parse("http://localhost").port == 80
    for url, message in (("http://10.0.0.5:8000", "loopback only"), ("127.0.0.1:80", "plain http"),
                         ("https://127.0.0.1:8443", "plain http")):
        with pytest.raises(DrillError, match=message):
            Target.parse(url)


def test_every_scenario_has_help_and_the_global_options_survive_the_subcommand(capsys):
    parser = drill.build_parser()
    for name in (*drill.SCENARIOS, "all"):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([name, "--help"])
        assert exit_.value.code == 0
        assert "--url" in capsys.readouterr().out
    args = drill._globals(parser.parse_args(["--url", "http://127.0.0.1:9", "overload"]))
    assert args.url == "http://127.0.0.1:9" and args.json is False
    args = drill._globals(parser.parse_args(["kill", "--json"]))
    assert args.url == drill.DEFAULT_URL and args.json is True and args.times == 5
    slow = parser.parse_args(["slow-bodies"])
    assert (slow.clients, slow.duration, slow.body_timeout) == (150, 30.0, 5.0)
    assert parser.parse_args(["overload"]).factors == [2.0, 5.0]


def test_a_remote_url_is_refused_before_anything_is_sent(capsys):
    assert drill.main(["--url", "http://192.0.2.1:8000", "kill"]) == 2
    assert "loopback only" in capsys.readouterr().err


def test_all_runs_every_scenario_with_its_defaults_and_prints_a_table(monkeypatch, capsys):
    seen = []

    def fake(name, verdict):
        async def run(target, args):
            seen.append((name, args.url, args.size))
            return Report(name, goals=[Goal("g", 1 if verdict else 3, "<=", 2)])
        return types.SimpleNamespace(
            NAME=name, HELP=f"{name} help", run=run,
            add_arguments=lambda p: p.add_argument("--size", type=int, default=7))

    monkeypatch.setattr(drill, "SCENARIOS", {"one": fake("one", True), "two": fake("two", False)})
    monkeypatch.setattr(drill, "_preflight", lambda target: None)
    asked = []  # the test process's niceness is left alone
    monkeypatch.setattr(drill, "apply_niceness",
                        lambda nice: asked.append(nice) or Niceness(15, 0, "auto, because"))
    monkeypatch.setattr(drill, "start_operator_thread", lambda: None)
    assert drill.main(["--url", "http://127.0.0.1:9", "all"]) == 1
    out = capsys.readouterr().out
    assert seen == [("one", "http://127.0.0.1:9", 7), ("two", "http://127.0.0.1:9", 7)]
    assert "== one ==" in out and out.rstrip().splitlines()[-1].split() == ["two", "0", "1", "0",
                                                                            "FAIL"]
    assert out.splitlines()[1].split()[:4] == ["client", "niceness", "used=15,", "was=0,"]
    assert drill.main(["all", "--json", "--nice", "none"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [s["scenario"] for s in data["scenarios"]] == ["one", "two"] and data["exit_code"] == 1
    assert data["scenarios"][0]["figures"]["client niceness"] == {
        "used": 15, "was": 0, "why": "auto, because"}
    assert asked == ["auto", "none"]


# --- raw HTTP ------------------------------------------------------------------------------------

def test_status_line():
    assert parse_status_line(b"HTTP/1.1 408 Request Timeout\r\n") == 408
    assert parse_status_line(b"HTTP/1.0 200 OK\r\n") == 200
    assert parse_status_line(b"HTTP/1.1 503\r\n") == 503
    for bad in (b"", b"\r\n", b"garbage\r\n", b"HTTP/2 200\r\n", b"HTTP/1.1 2000 x\r\n",
                b"HTTP/1.1 abc\r\n"):
        assert parse_status_line(bad) is None


def test_request_id_problems():
    ok = [("content-type", "application/json"), ("x-request-id", "drill-1")]
    assert request_id_problems("drill-1", True, ok) == []
    assert request_id_problems("has spaces", False, [("X-Request-ID", "abc123")]) == []
    twice = [("x-request-id", "abc123"), ("X-Request-ID", "<script>")]
    problems = request_id_problems("<script>", False, twice)
    assert any("2 X-Request-ID" in p for p in problems)
    assert any("reflects the malformed value" in p for p in problems)
    assert request_id_problems("drill-1", True, [("x-request-id", "other")])
    assert request_id_problems("x y", False, [("x-request-id", "a"), ("x-echo", "x y!")])


def test_request_id_cases_have_one_well_formed_and_the_issues_malformed_values():
    found = cases()
    assert [w for _, _, w in found].count(True) == 1
    malformed = [sent for _, sent, well in found if not well]
    assert any(len(s) == 129 for s in malformed) and any(" " in s for s in malformed)
    assert any("%0d%0a" in s for s in malformed) and any("<script>" in s for s in malformed)


PROMETHEUS = """# HELP canary_requests_total requests by routed arm and HTTP status
# TYPE canary_requests_total counter
canary_requests_total{arm="baseline",outcome="ok",status="200"} 10.0
canary_requests_total{arm="optimized",outcome="ok",status="200"} 5.0
canary_requests_total{arm="none",outcome="error",status="500"} 2.0
canary_requests_total{arm="none",outcome="client_closed",status="499"} 1.0
canary_requests_created{arm="none",status="500"} 1.7e9
canary_model_calls_total{arm="baseline",outcome="ok"} 10.0
"""


def test_counter_by_label_and_delta():
    before = counter_by(PROMETHEUS, "canary_requests_total", "status")
    assert before == {"200": 15.0, "500": 2.0, "499": 1.0}
    after = dict(before, **{"200": 30.0, "408": 4.0})
    assert counter_delta(before, after) == {"200": 15, "408": 4}
    assert counter_delta({"500": 9.0}, {"500": 2.0}) == {"500": 2}  # a restart counts from 0
    assert counter_by("", "canary_requests_total", "status") == {}


# --- the slow-upload client against a tiny loopback server ---------------------------------------

async def _server(behaviour):
    """A loopback server reading the request head, then doing `behaviour(reader, writer)`."""
    received: list[bytes] = []

    async def handle(reader, writer):
        received.append(await reader.readuntil(b"\r\n\r\n"))
        try:
            await behaviour(reader, writer, received)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], received


def _answers_408_after(deadline_s: float):
    async def behaviour(reader, writer, received):
        try:
            received.append(await asyncio.wait_for(reader.read(1 << 16), 5))
            await asyncio.sleep(deadline_s)
        except TimeoutError:
            pass
        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
                     b"Connection: close\r\n\r\n")
        await writer.drain()
    return behaviour


def _run(coroutine):
    return asyncio.run(coroutine)


def test_slow_upload_gets_the_408_and_when():
    async def scenario():
        server, port, received = await _server(_answers_408_after(0.3))
        async with server:
            result = await slow_upload("127.0.0.1", port, every_s=0.05, give_up_s=5)
        return result, received

    result, received = _run(scenario())
    assert result.outcome == "answered" and result.status == 408
    assert 0.25 <= result.after_s < 2.0
    head = received[0].decode()
    assert head.startswith("POST /v1/predict HTTP/1.1\r\n") and "Content-Length: 100000" in head
    assert received[1] == b"{"  # the body's first byte, the rest one at a time


def test_slow_chunked_upload_sends_chunks_and_never_the_last():
    async def behaviour(reader, writer, received):
        data = b""
        while data.count(b"\r\n") < 6:  # three chunks of one byte
            data += await reader.read(64)
        received.append(data)
        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async def scenario():
        server, port, received = await _server(behaviour)
        async with server:
            result = await slow_upload("127.0.0.1", port, mode="chunked", every_s=0.02,
                                       give_up_s=5)
        return result, received

    result, received = _run(scenario())
    assert result.status == 408
    assert "Transfer-Encoding: chunked" in received[0].decode()
    assert received[1].startswith(b"1\r\n{\r\n1\r\n\"\r\n") and b"0\r\n\r\n" not in received[1]


def test_slow_upload_without_an_answer_is_counted_as_unanswered():
    async def closes(reader, writer, received):
        await asyncio.sleep(0.1)

    async def hangs(reader, writer, received):
        await asyncio.sleep(2)

    async def scenario(behaviour, give_up):
        server, port, _ = await _server(behaviour)
        async with server:
            return await slow_upload("127.0.0.1", port, every_s=0.05, give_up_s=give_up)

    closed = _run(scenario(closes, 5))
    silent = _run(scenario(hangs, 0.3))
    assert (closed.outcome, silent.outcome) == ("closed", "silent")
    assert closed.unanswered and silent.unanswered and closed.status is None


def test_slow_upload_that_disconnects_mid_body():
    async def behaviour(reader, writer, received):
        while chunk := await reader.read(64):
            received.append(chunk)

    async def scenario():
        server, port, received = await _server(behaviour)
        async with server:
            result = await slow_upload("127.0.0.1", port, mode="disconnect", every_s=0.02,
                                       disconnect_after=3, give_up_s=5)
            await asyncio.sleep(0.1)
        return result, received

    result, received = _run(scenario())
    assert result == SlowResult("disconnect", "disconnected")
    assert b"".join(received[1:]) == b'{"i'  # three body bytes, then the connection closed


def test_slow_upload_to_a_closed_port_is_refused():
    async def scenario():
        server, port, _ = await _server(_answers_408_after(0))
        server.close()
        await server.wait_closed()
        return await slow_upload("127.0.0.1", port, give_up_s=1)

    assert _run(scenario()).outcome == "refused"


# --- the load's raw HTTP/1.1 client against a tiny loopback server --------------------------------

OK_JSON = b'{"outputs": [1]}'


def _ok(extra: bytes = b"", body: bytes = OK_JSON) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


async def _http_server(answer):
    """A loopback HTTP/1.1 server: each request on a connection (head and Content-Length body)
    gets `await answer(conn, n, head, body)` -> (bytes to write, close after?)."""
    seen = {"connections": 0, "requests": []}

    async def handle(reader, writer):
        conn = seen["connections"]
        seen["connections"] += 1
        try:
            for n in range(1_000):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
                body = await reader.readexactly(length)
                seen["requests"].append((conn, head, body))
                reply, close = await answer(conn, n, head, body)
                writer.write(reply)
                await writer.drain()
                if close:
                    return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


async def _always_ok(conn, n, head, body):
    return _ok(), False


def _send(answer, calls, **sender_options):
    """Start the server and run `calls(sender)`: its result, the sender's stats, what the
    server saw."""
    async def scenario():
        server, url, seen = await _http_server(answer)
        async with server:
            sender = Sender(url, **sender_options)
            try:
                result = await calls(sender)
            finally:
                await sender.aclose()
        return result, sender.stats, seen
    return _run(scenario())


def test_raw_client_keeps_one_connection_alive_and_sends_the_request_as_built():
    async def calls(sender):
        return [await sender(b'{"inputs": ["a"]}', f"key-{i}", texts=3) for i in range(5)]

    shots, stats, seen = _send(_always_ok, calls)
    assert [s.status for s in shots] == [200] * 5 and {s.texts for s in shots} == {3}
    assert seen["connections"] == 1 and stats.opened == 1 and stats.dropped == 0
    assert (stats.sends, stats.waited) == (5, 0)
    _, head, body = seen["requests"][4]
    port = head.split(b"Host: 127.0.0.1:")[1].split(b"\r\n")[0].decode()
    assert port.isdigit()
    assert head == (b"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1:" + port.encode()
                    + b"\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
                    b"X-Routing-Key: key-4\r\n\r\n")
    assert body == b'{"inputs": ["a"]}'
    assert all(0 < s.latency_s < 1 for s in shots)


def test_raw_client_reads_content_length_chunked_empty_and_interim_answers():
    answers = [
        _ok(body=b"x" * 70_000),  # over the stream's line limit, read as a body
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(),
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\nRetry-After: 1\r\n\r\nno",
        _ok(),
    ]

    async def answer(conn, n, head, body):
        return answers[n], False

    async def calls(sender):
        return [(await sender(b"{}", "k")).status for _ in answers]

    statuses, stats, seen = _send(answer, calls)
    assert statuses == [200, 200, 204, 200, 503, 200]
    assert seen["connections"] == 1 and stats.dropped == 0  # each body framed exactly


def test_raw_client_drops_a_connection_the_server_closes():
    async def answer(conn, n, head, body):
        if n == 0 and conn == 0:
            return _ok(b"Connection: close\r\n"), True
        if conn == 1:  # HTTP/1.0 without keep-alive, body to the close
            return b"HTTP/1.0 200 OK\r\n\r\nto the end", True
        return _ok(), False

    async def calls(sender):
        return [(await sender(b"{}", "k")).status for _ in range(3)]

    statuses, stats, seen = _send(answer, calls)
    assert statuses == [200, 200, 200]
    assert seen["connections"] == 3 and stats.opened == 3 and stats.dropped == 2


def test_raw_client_times_out_to_no_answer_and_opens_anew():
    async def answer(conn, n, head, body):
        if conn == 0:
            await asyncio.sleep(5)
        return _ok(), False

    async def calls(sender):
        return await sender(b"{}", "slow"), await sender(b"{}", "next")

    (late, after), stats, seen = _send(answer, calls, timeout_s=0.2)
    assert late.status is None and 0.15 < late.latency_s < 1.0
    assert after.status == 200 and seen["connections"] == 2 and stats.dropped == 1


def test_raw_client_counts_an_answer_cut_short_as_none():
    cut = [_ok(body=b'{"outputs": [1, 2, 3]}')[:-5], b"HTTP/1.1 200 OK\r\nContent-Le",
           b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
           b"SSH-2.0-OpenSSH\r\n\r\n", b""]

    async def answer(conn, n, head, body):
        return cut[conn], True

    async def calls(sender):
        return [await sender(b"{}", "k") for _ in cut]

    shots, stats, seen = _send(answer, calls)
    assert [s.status for s in shots] == [None] * 5
    assert seen["connections"] == 5 and stats.dropped == 5 and stats.resent == 0


def test_raw_client_resends_once_when_a_kept_alive_connection_closes_unanswered():
    async def answer(conn, n, head, body):
        if conn == 0 and n == 1:
            return b"", True  # the server dropped the idle connection as the request came
        return _ok(), False

    async def calls(sender):
        return [(await sender(b"{}", f"k{i}")).status for i in range(3)]

    statuses, stats, seen = _send(answer, calls)
    assert statuses == [200, 200, 200] and stats.resent == 1 and seen["connections"] == 2
    assert [h.split(b"X-Routing-Key: ")[1][:2] for _, h, _ in seen["requests"]] == [
        b"k0", b"k1", b"k1", b"k2"]


def test_raw_client_waits_for_a_free_connection_outside_the_latency():
    async def answer(conn, n, head, body):
        await asyncio.sleep(0.2)
        return _ok(), False

    async def calls(sender):
        began = time.perf_counter()
        shots = await asyncio.gather(*(sender(b"{}", f"k{i}") for i in range(6)))
        return shots, time.perf_counter() - began

    (shots, took), stats, seen = _send(answer, calls, connections=2)
    assert [s.status for s in shots] == [200] * 6 and took >= 0.59  # three rounds of two
    assert seen["connections"] == 2 and stats.opened == 2
    assert stats.waited == 4 and 0.35 < stats.wait_max_s < 2.0
    assert max(s.latency_s for s in shots) < 0.39  # the 0.2 s exchange, not the queue
    assert "4 waited for a free connection" in stats.text()


def test_raw_client_frees_the_connection_of_a_cancelled_request():
    async def answer(conn, n, head, body):
        await asyncio.sleep(0.3 if conn == 0 else 0)
        return _ok(), False

    async def calls(sender):
        probe = small_probe(sender)
        return await probe(0.05), await probe(0.5)

    (first, second), stats, seen = _send(answer, calls, connections=1)
    assert (first, second) == (False, True) and seen["connections"] == 2


def test_raw_client_to_a_closed_port_gets_no_answer():
    async def scenario():
        server, url, _ = await _http_server(_always_ok)
        server.close()
        await server.wait_closed()
        sender = Sender(url, timeout_s=2)
        return await sender(b"{}", "k"), await sender(b"{}", "k"), sender._open

    first, second, still_open = _run(scenario())
    assert first.status is None and second.status is None and still_open == 0


def test_raw_client_refuses_a_line_break_in_the_routing_key():
    with pytest.raises(ValueError, match="line break"):
        Sender("http://127.0.0.1:9").request(b"{}", "a\r\nX-Evil: 1")


def test_raw_client_sends_the_headers_it_was_given_on_every_request():
    sender = Sender("http://127.0.0.1:9", headers={"X-Request-Timeout-Ms": "1000"})
    request = sender.request(b"{}", "k")
    head = request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    assert b"X-Request-Timeout-Ms: 1000" in head and b"X-Routing-Key: k" in head
    with pytest.raises(ValueError, match="line break"):
        Sender("http://127.0.0.1:9", headers={"X-A": "1\r\nX-Evil: 1"})


def test_overload_goals_follow_the_factor_and_the_deadline():
    from ops.drill.overload import deadline_goals

    figures = {"sent": 1000, "ok_per_s": 70.0, "p99_ms": 900.0,
               "counts": {"lost": 0, "other": 0}, "statuses": {"200": 700, "503": 290,
                                                                "504": 10}}
    at_2x = {g.name: g.passed for g in deadline_goals("2x: ", figures, 100.0, 2.0, 1000, 1.0)}
    assert at_2x == {"2x: goodput / capacity": False, "2x: p99 of 200s": True,
                     "2x: 504s / sent": True, "2x: lost (no answer)": True,
                     "2x: answered other than 200/503/504": True,
                     "2x: recovery to < 200 ms": True}
    at_5x = {g.name: g.passed for g in deadline_goals("5x: ", figures, 100.0, 5.0, 800, 1.0)}
    assert at_5x["5x: goodput / capacity"] and not at_5x["5x: p99 of 200s"]
    figures["statuses"]["504"] = 11
    assert not {g.name: g.passed for g in deadline_goals("", figures, 100.0, 2.0, 0, 1.0)}[
        "504s / sent"]
    no_deadline = [g.name for g in deadline_goals("", figures, 100.0, 2.0, 0, 1.0)]
    assert "p99 of 200s" not in no_deadline


def test_response_heads():
    assert parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n") == (200, 12, False,
                                                                                False, {})
    assert parse_head(b"HTTP/1.1 503\r\nconnection: Close\r\n\r\n") == (503, None, False, True,
                                                                              {})
    assert parse_head(b"HTTP/1.0 200 OK\r\n\r\n")[3] is True
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n")[3] is False
    assert parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")[2]
    for bad in (b"HTTP/2 200 OK\r\n\r\n", b"HTTP/1.1 20x OK\r\n\r\n", b"HTTP/1.1 2000\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"):
        with pytest.raises(BadResponse):
            parse_head(bad)


def test_loop_lag_measures_a_blocked_loop():
    async def scenario():
        async with LoopLag(every_s=0.01) as lag:
            await asyncio.sleep(0.03)
            time.sleep(0.1)  # the client's own work, holding the loop
            await asyncio.sleep(0.03)
        return lag

    lag = _run(scenario())
    assert lag.max_ms >= 80 and "max" in lag.text()
    assert LoopLag().text() == "-"


# --- the load generator's niceness ---------------------------------------------------------------

STAT = ("4242 (ray::ServeRepli) S 12770 12990 12481 0 -1 4194560 3812782 0 13 0 8281 1128 0 0 35 "
        "15 40 0 1205326 10103980032 218853 18446744073709551615 1 2 3")


def test_niceness_is_field_19_of_a_stat_line_whatever_the_command_name():
    assert stat_niceness(STAT) == 15
    odd = STAT.replace("(ray::ServeRepli)", "(a) b (c) d)")
    assert stat_niceness(odd) == 15
    assert stat_niceness(STAT.replace(" 35 15 40 ", " 20 0 40 ")) == 0
    assert stat_niceness(STAT.replace(" 35 15 40 ", " 39 -19 40 ")) == -19


def _proc(root, pid, title: bytes, nice: int | None):
    entry = root / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes(title + b"\0")
    if nice is not None:
        (entry / "stat").write_text(STAT.replace(" 35 15 40 ", f" 20 {nice} 40 "))


def test_serve_niceness_reads_the_replica_processes_of_a_proc_root(tmp_path):
    assert serve_niceness(tmp_path) is None
    _proc(tmp_path, 100, b"ray::ServeReplica:default:baseline", 15)
    _proc(tmp_path, 101, b"ray::ServeReplica:default:gateway", 10)
    _proc(tmp_path, 102, b"/usr/bin/python", 0)
    _proc(tmp_path, 103, b"ray::ProxyActor", 19)
    _proc(tmp_path, 104, b"ray::ServeReplica:default:optimized", None)  # gone meanwhile
    (tmp_path / "self").mkdir()
    assert serve_niceness(tmp_path) == 15  # the highest of the replicas
    assert serve_niceness(tmp_path / "missing") is None


class FakeNice:
    def __init__(self, now=0, privileged=False):
        self.now, self.privileged = now, privileged

    def __call__(self, increment):
        if increment < 0 and not self.privileged:
            raise PermissionError(1, "Operation not permitted")
        self.now = min(19, self.now + increment)
        return self.now


def test_apply_niceness_reaches_the_replicas_or_what_was_asked():
    nice = FakeNice()
    got = apply_niceness("auto", find=lambda: 15, nice=nice)
    assert (got.used, got.was, nice.now) == (15, 0, 15)
    assert "does not preempt the server it measures" in got.why
    assert apply_niceness("none", find=lambda: 5, nice=FakeNice(3)) == Niceness(
        3, 3, "--nice none: left as it was")
    missing = apply_niceness("auto", find=lambda: None, nice=FakeNice())
    assert missing.used == 0 and "no Serve replica" in missing.why
    lower = apply_niceness(5, find=lambda: 15, nice=FakeNice(10))
    assert lower.used == 10 and "needs privilege" in lower.why
    assert apply_niceness(5, nice=FakeNice(10, privileged=True)).used == 5
    assert niceness("auto") == "auto" and niceness("none") == "none" and niceness("-3") == -3
    for bad in ("20", "-21", "high"):
        with pytest.raises(argparse.ArgumentTypeError):
            niceness(bad)
    parser = drill.build_parser()
    assert drill._globals(parser.parse_args(["overload", "--nice", "7"])).nice == 7
    assert drill._globals(parser.parse_args(["kill"])).nice == "auto"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_operator_thread_keeps_the_niceness_the_drill_started_with():
    code = """if True:
        import os, subprocess, sys, threading
        from ops.drill import niceness as load
        operator = load.start_operator_thread()
        start = os.nice(0)
        os.nice(3)
        child = [sys.executable, "-c", "import os; print(os.nice(0))"]
        spawned = load.as_operator(lambda: subprocess.run(child, capture_output=True, text=True))
        seen = []
        thread = threading.Thread(target=lambda: seen.append(os.nice(0)))
        load.as_operator(thread.start)  # created by the operator's thread
        thread.join()
        print(start, os.nice(0), operator.submit(os.nice, 0).result(), int(spawned.stdout), seen[0])
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr
    start, main, operator, child, thread = map(int, done.stdout.split())
    assert main == min(19, start + 3) and operator == child == thread == start


# --- load shapes ---------------------------------------------------------------------------------

def test_texts_are_deterministic_and_within_the_gateways_limits():
    texts = make_texts(40, words=200)
    assert texts == make_texts(40, words=200) and texts != make_texts(40, words=200, seed=1)
    assert all(len(t.split()) == 200 and t[0].isupper() and t.endswith(".") for t in texts)
    assert max(len(t) for t in texts) < 8_192  # CANARY_MAX_ITEM_CHARS
    bodies = batch_bodies(texts, per_request=32, count=3)
    inputs = [json.loads(b)["inputs"] for b in bodies]
    assert [len(i) for i in inputs] == [32, 32, 32] and inputs[1][0] == texts[32]
    assert inputs[1][8] == texts[0]  # round the list
    assert sum(len(t) for t in inputs[0]) < 131_072  # CANARY_MAX_TOTAL_CHARS


def test_status_buckets_and_summary():
    assert [bucket(s) for s in (200, 503, 504, 408, 500, None)] == [
        "200", "503", "504", "other", "other", "lost"]
    shots = [Shot(200, 0.01 * i, 32) for i in range(1, 11)] + [Shot(503, 0.001), Shot(None, 30)]
    figures = summarize(shots, elapsed_s=2.0)
    assert figures["sent"] == 12
    assert figures["counts"] == {"200": 10, "503": 1, "504": 0, "other": 0, "lost": 1}
    assert figures["statuses"] == {"200": 10, "503": 1, "lost": 1}
    assert figures["ok_per_s"] == 5.0 and figures["texts_per_s"] == 160.0
    assert figures["p99_ms"] == pytest.approx(100.0) and figures["p50_ms"] == pytest.approx(50.0)
    assert summarize([], 0)["p99_ms"] is None


def test_capacity_is_the_best_sustained_goodput():
    steps = [{"concurrency": 1, "ok_per_s": 20.0}, {"concurrency": 4, "ok_per_s": 35.0},
             {"concurrency": 8, "ok_per_s": 35.0}, {"concurrency": 16, "ok_per_s": 30.0}]
    assert pick_capacity(steps)["concurrency"] == 4
    assert pick_capacity([{"concurrency": 1, "ok_per_s": 0.0}]) is None
    assert pick_capacity([]) is None


def test_recovery_is_timed_to_the_first_fast_probe_sent():
    clock = FakeClock()
    answers = iter([False] * 30 + [True])
    limits = []

    async def probe(limit_s):
        limits.append(limit_s)
        clock.now += 0.05  # each probe takes a little time
        return next(answers)

    took = _run(recovery_time(probe, limit_s=0.2, every_s=0.1, give_up_s=60, clock=clock,
                              sleep=clock.sleep))
    assert took == pytest.approx(3.0)  # 30 failed probes, one every 0.1 s
    assert set(limits) == {0.2}


def test_recovery_gives_up():
    clock = FakeClock()

    async def never(limit_s):
        clock.now += limit_s
        return False

    assert _run(recovery_time(never, give_up_s=5, clock=clock, sleep=clock.sleep)) is None
    assert clock.now - 100.0 == pytest.approx(5.2, abs=0.3)


def test_open_loop_offers_a_rate_and_keeps_what_is_still_in_flight():
    async def scenario():
        shots: list[Shot] = []
        release = asyncio.Event()

        async def fire(n):
            if n % 2:
                await release.wait()
            return Shot(200, 0.0)

        offered = await open_loop(fire, shots, rate=200, duration_s=0.1)
        in_flight = len(offered.pending)
        release.set()
        await asyncio.gather(*offered.pending)
        return offered, in_flight, shots

    offered, in_flight, shots = _run(scenario())
    assert 1 <= offered.sent <= 21  # never past the rate, whatever the machine's load
    assert in_flight >= offered.sent // 2 and len(shots) == offered.sent


def test_open_loop_skips_sends_past_max_in_flight():
    async def scenario():
        shots: list[Shot] = []
        forever = asyncio.Event()

        async def fire(n):
            await forever.wait()
            return Shot(200, 0.0)

        offered = await open_loop(fire, shots, rate=500, duration_s=0.1, max_in_flight=5)
        for task in offered.pending:
            task.cancel()
        return offered

    offered = _run(scenario())
    assert offered.sent == 5 and offered.capped >= 1


def test_closed_loop_keeps_each_client_busy_until_the_duration():
    async def scenario():
        shots: list[Shot] = []

        async def fire(n):
            await asyncio.sleep(0.01)
            return Shot(200, 0.01)

        offered = await closed_loop(fire, shots, concurrency=3, duration_s=0.1)
        await asyncio.gather(*offered.pending)
        return offered, shots

    offered, shots = _run(scenario())
    assert offered.sent == len(shots) and 3 <= len(shots) <= 40  # every client sent


# --- memory --------------------------------------------------------------------------------------

def test_growth_is_the_largest_replica_growth():
    before = {"baseline[1]": 600.0, "optimized[2]": 400.0}
    assert growth_pct(before, {"baseline[1]": 630.0, "optimized[2]": 480.0}) == 20.0
    assert growth_pct(before, {"baseline[1]": 500.0, "optimized[2]": 400.0}) == 0.0
    assert growth_pct(before, {"optimized[9]": 400.0}) is None  # a new process: not comparable


def test_rss_watch_stops_once_back_within_tolerance():
    clock = FakeClock()
    values = iter([680.0, 670.0, 655.0, 640.0])  # +13.3 %, +11.7 %, +9.2 %

    result = _run(watch_rss({"optimized[2]": 600.0}, every_s=5, up_to_s=60,
                            sample=lambda: {"optimized[2]": next(values)}, clock=clock,
                            sleep=clock.sleep))
    assert result["back_after_s"] == 10.0 and result["growth_pct"] == pytest.approx(9.1667, 1e-3)
    assert [s["t_s"] for s in result["samples"]] == [0.0, 5.0, 10.0]


def test_rss_watch_gives_up_after_its_window():
    clock = FakeClock()
    result = _run(watch_rss({"b[1]": 100.0}, every_s=5, up_to_s=20, sample=lambda: {"b[1]": 150.0},
                            clock=clock, sleep=clock.sleep))
    assert result["back_after_s"] is None and result["growth_pct"] == 50.0
    assert len(result["samples"]) == 5  # 0, 5, 10, 15, 20 s
    assert _run(watch_rss({}, sample=lambda: {}))["samples"] == []


# --- the rollout CLI and state -------------------------------------------------------------------

def test_cli_run_times_the_process_and_reports_a_failure_in_one_line():
    ok = drill_control.Cli((sys.executable, "-c", "pass"))
    assert 0 < ok.run("kill") < 30
    failing = drill_control.Cli((sys.executable, "-c",
                                  "import sys; print('store unavailable', file=sys.stderr); "
                                  "sys.exit(1)"))
    with pytest.raises(DrillError, match="kill --reason drill` exited 1: store unavailable"):
        failing.kill()
    with pytest.raises(DrillError, match="cannot run"):
        drill_control.Cli(("/nonexistent/rollout",)).kill()


class FakeRollout:
    """A gateway's /v1/rollout and the CLI that changes it, in memory."""

    def __init__(self, percent=5.0, kill=False):
        self.percent, self.kill_on, self.calls = percent, kill, []

    def view(self, url):
        return {"canary_percent": self.percent, "state": {"kill": self.kill_on}}

    def run(self, *args):
        self.calls.append(args[0])
        if args[0] == "canary":
            self.percent = float(args[1])
        else:
            self.kill_on = args[0] == "kill"
        return 0.01


def test_canary_and_kill_switch_are_restored_even_when_the_block_fails(monkeypatch):
    fake = FakeRollout(percent=5.0, kill=True)
    monkeypatch.setattr(drill_control, "rollout_view", fake.view)
    cli = drill_control.Cli(("rollout",))
    monkeypatch.setattr(drill_control.Cli, "run", lambda self, *args: fake.run(*args))
    with pytest.raises(RuntimeError):
        with drill_control.canary_at(cli, "http://x", 50) as before:
            assert before == 5.0 and fake.percent == 50.0
            with drill_control.kill_restored(cli, "http://x", settle_s=0) as was_on:
                assert was_on is True
                assert drill_control.time_kills(cli, 2) == [0.01, 0.01]
                assert fake.kill_on is False
                raise RuntimeError("the burst broke")
    assert fake.percent == 5.0 and fake.kill_on is True
    assert fake.calls == ["canary", "kill", "unkill", "kill", "unkill", "kill", "canary"]
