"""Slow clients, clients that go away, hostile request ids and expired work, against the real
Serve app (HAProxy in front, serve.gateway.ingress installed as Serve's HTTP proxy callback)."""

from __future__ import annotations

import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest


def _address(gw) -> tuple[str, int]:
    url = urlparse(gw.url)
    return url.hostname, url.port


def _slow_client(gw, declared: int = 200, sent: bytes = b'{"inputs": ["a') -> socket.socket:
    sock = socket.create_connection(_address(gw), timeout=15)
    sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % declared + sent)
    return sock


def _status_and_headers(sock: socket.socket) -> tuple[int, list[tuple[str, str]]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in head[1:]]
    return status, headers


def _count(gw, status: int) -> float:
    text = gw.client.get("/metrics").text
    found = re.findall(rf'^canary_requests_total\{{[^}}]*status="{status:d}"[^}}]*\}} (\S+)$',
                       text, re.M)
    return sum(float(v) for v in found)


def test_slow_bodies_get_408_within_the_deadline_and_hold_no_slot(gw):
    timeout_s = gw.settings.body_timeout_s
    before_500 = _count(gw, 500)
    slow = [_slow_client(gw) for _ in range(24)]  # more than gateway_min_in_flight x 4
    started = time.monotonic()
    try:
        # meanwhile, normal requests are answered as usual
        with ThreadPoolExecutor(4) as pool:
            normal = list(pool.map(lambda i: gw.predict([f"normal {i}"]), range(12)))
        assert [r.status_code for r in normal] == [200] * 12
        assert time.monotonic() - started < timeout_s  # they did not wait for the slow ones
        statuses = [_status_and_headers(sock)[0] for sock in slow]
        elapsed = time.monotonic() - started
    finally:
        for sock in slow:
            sock.close()
    assert statuses == [408] * len(slow)
    assert timeout_s <= elapsed < timeout_s + 3
    assert _count(gw, 408) >= len(slow)
    assert _count(gw, 500) == before_500


def test_a_chunked_body_that_never_ends_gets_408(gw):
    sock = socket.create_connection(_address(gw), timeout=15)
    try:
        sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/json\r\n\r\n5\r\n{\"inp\r\n")
        status, _ = _status_and_headers(sock)
    finally:
        sock.close()
    assert status == 408


def test_a_client_gone_mid_body_is_recorded_as_499_not_500(gw):
    before_499, before_500 = _count(gw, 499), _count(gw, 500)
    for _ in range(3):
        sock = _slow_client(gw)
        time.sleep(0.2)
        sock.close()
    deadline = time.monotonic() + 10
    while _count(gw, 499) < before_499 + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _count(gw, 499) == before_499 + 3
    assert _count(gw, 500) == before_500


@pytest.mark.parametrize("bad", ["x" * 129, "has space", "a%0d%0ab", "<script>alert(1)</script>"])
def test_a_malformed_request_id_is_never_echoed_by_any_layer(gw, bad):
    sock = socket.create_connection(_address(gw), timeout=15)
    body = b'{"inputs": ["hello"]}'
    try:
        sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"X-Request-ID: " + bad.encode() + b"\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        status, headers = _status_and_headers(sock)
    finally:
        sock.close()
    assert status == 200
    ids = [value for name, value in headers if name.lower() == "x-request-id"]
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids[0])
    assert not any(bad in value for _, value in headers)


def test_a_well_formed_request_id_comes_back_once(gw):
    response = gw.predict(["hello"], **{"X-Request-ID": "trace-abc.123"})
    assert response.headers.get_list("x-request-id") == ["trace-abc.123"]


def test_requests_whose_deadline_passed_in_the_queue_are_not_forwarded(gw):
    """Each baseline batch takes 1.5 s; of 24 requests with a 5 s deadline, the later batches'
    expire while queued: the replica drops them instead of forwarding them, and they get 504.
    This is the replica's safety net for when the gateway's admission has no rate to predict
    with: a fresh gateway replica (the override replaces it) has measured nothing yet, so it
    admits all 24, where one that had measured the slow batches would refuse the later ones
    at once (the test below)."""
    from ray import serve

    gw.redeploy({"baseline": {"fault_delay_ms": 1500, "max_batch_size": 4}},
                gateway_max_in_flight=64)
    assert gw.served_state()["admission"]["arms"].get("baseline", {}).get("rate_per_s") is None
    model = serve.get_deployment_handle("baseline", app_name="canary")
    before = model.info.remote().result()["expired"]
    with ThreadPoolExecutor(24) as pool:
        responses = list(pool.map(lambda i: gw.predict([f"queued {i}"]), range(24)))
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {200, 504} and 200 in statuses and 504 in statuses
    deadline = time.monotonic() + 10
    while (expired := model.info.remote().result()["expired"] - before) == 0:
        assert time.monotonic() < deadline, "the replica never dropped an expired request"
        time.sleep(0.2)
    assert expired >= 1


def test_a_request_is_refused_at_once_only_when_it_would_miss_its_own_deadline(gw):
    """Each baseline batch takes 300 ms. With `X-Request-Timeout-Ms: 1000`, of 40 concurrent
    requests those that would be answered after a second are refused at once with 503 and a
    Retry-After (serve.gateway.admission); without the header (the server's 5 s) the same 40 are all
    answered: a bounded queue is not refused. A malformed header is a 400 naming it."""
    gw.redeploy({"baseline": {"fault_delay_ms": 300}})
    for i in range(3):  # the arm's rate, measured
        assert gw.predict([f"warm {i}"]).status_code == 200
    arms = gw.served_state()["admission"]["arms"]
    assert arms["baseline"]["rate_per_s"] > 0 and arms["baseline"]["rows"] == 0

    def timed(i, **headers):
        gw.client.get("/healthz")  # this thread's own connection, opened before the clock
        started = time.monotonic()
        response = gw.predict([f"flood {i}"], **headers)
        return response, time.monotonic() - started

    with ThreadPoolExecutor(40) as pool:
        short = list(pool.map(lambda i: timed(i, **{"X-Request-Timeout-Ms": "1000"}),
                              range(40)))
    statuses = [r.status_code for r, _ in short]
    assert set(statuses) <= {200, 503, 504} and 200 in statuses and 503 in statuses
    for response, elapsed in short:
        if response.status_code == 503:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["type"] == "overloaded"
            assert elapsed < 1.0  # refused at once, not after waiting
        elif response.status_code == 200:
            assert elapsed < 2.0
    with ThreadPoolExecutor(40) as pool:
        bounded = list(pool.map(timed, range(40)))
    assert [r.status_code for r, _ in bounded] == [200] * 40, (
        [(r.status_code, r.headers.get("retry-after"), round(t, 2)) for r, t in bounded
         if r.status_code != 200],
        gw.served_state()["admission"])
    bad = gw.predict(["x"], **{"X-Request-Timeout-Ms": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_timeout"
    assert "X-Request-Timeout-Ms" in bad.json()["error"]["message"]
    admission = gw.served_state()["admission"]
    assert admission["shed"] >= statuses.count(503)
    assert admission["in_flight"] == 0 and admission["arms"]["baseline"]["rows"] == 0


def test_clients_that_send_and_close_free_their_places_at_once(gw):
    """300 clients send a request and close their socket at once (baseline batches slowed to
    200 ms, so their work would queue for seconds): the next 20 normal requests, with a 2 s
    deadline, are all answered, and nothing stays counted for the clients that left."""
    gw.redeploy({"baseline": {"fault_delay_ms": 200}})
    assert gw.predict(["warm"]).status_code == 200
    body = b'{"inputs": ["gone"]}'
    request = (b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
    for _ in range(300):
        with socket.create_connection(_address(gw), timeout=5) as sock:
            sock.sendall(request)
    time.sleep(0.5)  # the gateway hears of the disconnects
    with ThreadPoolExecutor(4) as pool:
        after = list(pool.map(
            lambda i: gw.predict([f"after {i}"], **{"X-Request-Timeout-Ms": "2000"}),
            range(20)))
    assert [r.status_code for r in after] == [200] * 20
    deadline = time.monotonic() + 5
    while (admission := gw.served_state()["admission"])["in_flight"]:
        assert time.monotonic() < deadline, admission
        time.sleep(0.1)
    assert admission["arms"]["baseline"]["rows"] == 0
