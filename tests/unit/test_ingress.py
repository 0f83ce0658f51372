"""serve.gateway.ingress: bodies received under a deadline before the app runs, outside any slot;
request ids made safe to echo. Driven as ASGI with a scripted client."""

from __future__ import annotations

import asyncio
import types

import pytest

from rollout.settings import Settings
from serve.gateway.ingress import (
    BODY,
    BODY_PROBLEM,
    BUSY,
    DISCONNECTED,
    TIMEOUT,
    TOO_LARGE,
    BodyGate,
    middlewares,
    sanitize_request_id,
)


class App:
    """Records what it was handed; answers 200."""

    def __init__(self):
        self.calls: list[dict] = []

    async def __call__(self, scope, receive, send):
        first = await receive()
        self.calls.append({"scope": scope, "first": first})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def client(*messages, then_wait: bool = False):
    """A `receive` that gives `messages` (each: bytes with more to come, or a dict), then
    blocks (a client that stops sending) or reports a disconnect."""
    queue = list(messages)

    async def receive():
        if queue:
            item = queue.pop(0)
            return item if isinstance(item, dict) else {
                "type": "http.request", "body": item, "more_body": bool(queue) or then_wait}
        if then_wait:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    return receive


async def nothing(message):
    return None


class Sent(list):
    """A `send` that keeps every message; `headers(i)` reads message i's headers."""

    async def __call__(self, message):
        self.append(message)

    def headers(self, i: int = 0) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self[i]["headers"]}


def counted(body: bytes):
    """A `receive` that gives `body` whole, counting its calls in `receive.reads`."""

    async def receive():
        receive.reads.append(1)
        return {"type": "http.request", "body": body, "more_body": False}

    receive.reads = []
    return receive


def scope(method="POST", headers=()):
    return {"type": "http", "method": method, "path": "/v1/predict", "headers": list(headers)}


def settings(**overrides):
    return Settings(**{"body_timeout_s": 0.2, **overrides})


def run(gate, s, receive):
    asyncio.run(gate(s, receive, nothing))


def test_a_body_in_pieces_is_handed_on_whole_and_replayed():
    app = App()
    s = scope()
    run(BodyGate(app, settings()), s, client(b'{"inputs":', b' ["a"]}'))
    assert s[BODY] == b'{"inputs": ["a"]}' and BODY_PROBLEM not in s
    assert app.calls[0]["first"] == {"type": "http.request", "body": b'{"inputs": ["a"]}',
                                     "more_body": False}


def test_a_body_that_stops_arriving_is_handed_on_as_a_timeout_within_the_deadline():
    app, s = App(), scope()
    gate = BodyGate(app, settings())
    loop = asyncio.new_event_loop()
    started = loop.time()
    loop.run_until_complete(gate(s, client(b"{", then_wait=True), nothing))
    elapsed = loop.time() - started
    loop.close()
    assert s[BODY_PROBLEM] == TIMEOUT and BODY not in s
    assert 0.2 <= elapsed < 1.0
    assert gate.uploading == 0  # the slot of the upload pool is given back


def test_a_client_that_goes_away_mid_body_is_handed_on_as_disconnected():
    s = scope()
    run(BodyGate(App(), settings()), s, client(b"{", {"type": "http.disconnect"}))
    assert s[BODY_PROBLEM] == DISCONNECTED


def test_a_body_over_the_limit_stops_being_read():
    s = scope()
    small = settings(max_items=1, max_item_chars=10, max_total_chars=10)
    chunks = [b"x" * 4096] * 100
    receive = client(*chunks)
    run(BodyGate(App(), small), s, receive)
    assert s[BODY_PROBLEM] == TOO_LARGE


def test_past_the_upload_pool_a_request_is_handed_on_busy_without_reading():
    async def scenario():
        app = App()
        gate = BodyGate(app, settings(body_timeout_s=5, gateway_max_uploading=2))
        slow = [asyncio.create_task(gate(scope(), client(b"{", then_wait=True), nothing))
                for _ in range(2)]
        await asyncio.sleep(0.05)
        assert gate.uploading == 2
        busy = scope()
        receive = counted(b"{}")
        read = receive.reads

        await gate(busy, receive, nothing)
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        return gate, busy, read

    gate, busy, read = asyncio.run(scenario())
    assert busy[BODY_PROBLEM] == BUSY and gate.uploading == 0
    assert read == []  # the app read nothing from the client: the replay gave an empty body


def test_requests_without_a_body_pass_straight_through():
    app, s = App(), scope("GET")
    run(BodyGate(app, settings()), s, client(b""))
    assert BODY not in s and BODY_PROBLEM not in s and len(app.calls) == 1


@pytest.mark.parametrize("bad", ["x" * 129, "has space", "a%0d%0ab", "<script>", "ok\r\nX: y"])
def test_a_malformed_request_id_is_replaced_before_any_layer_sees_it(bad):
    s = scope(headers=[(b"x-request-id", bad.encode()), (b"host", b"h")])
    sanitize_request_id(s)
    ids = [v for n, v in s["headers"] if n == b"x-request-id"]
    assert len(ids) == 1 and ids[0] != bad.encode() and len(ids[0]) == 32
    assert (b"host", b"h") in s["headers"]


def test_a_well_formed_request_id_is_kept_and_duplicates_are_reduced_to_it():
    s = scope(headers=[(b"x-request-id", b"abc-123")])
    sanitize_request_id(s)
    assert s["headers"] == [(b"x-request-id", b"abc-123")]
    s = scope(headers=[(b"x-request-id", b"abc-123"), (b"X-Request-ID", b"<evil>")])
    sanitize_request_id(s)
    assert [v for n, v in s["headers"] if n.lower() == b"x-request-id"] == [b"abc-123"]
    s = scope()
    sanitize_request_id(s)
    assert s["headers"] == []  # none sent: Serve generates one


def test_the_proxy_callback_gives_the_gate():
    (middleware,) = middlewares()
    assert middleware.cls is BodyGate


class Saturated:
    """An admission whose door refuses (with this Retry-After) or not; records the timeouts it
    was asked about."""

    def __init__(self, saturated: bool, retry_after: int = 1, *, at_cap: bool = False):
        self.value, self.retry_after = saturated, retry_after
        self.asked: list[float] = []
        self.loop = types.SimpleNamespace(lag_s=0.0)
        self.held = 0
        self.ceiling = 8
        self.in_flight = 8 if at_cap else 0

    def door(self, timeout_s: float) -> int | None:
        self.asked.append(timeout_s)
        return self.retry_after if self.value else None

    def enter(self):
        self.held += 1
        return object()

    def leave(self, slot) -> None:
        self.held -= 1


def test_with_the_admission_saturated_a_prediction_is_shed_here_with_503(monkeypatch):
    from serve.gateway import ingress

    shed: list[float] = []
    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    ingress.configure(settings(), settings(), Saturated(True), shed.append)
    app, sent = App(), Sent()

    s = scope(headers=[(b"x-request-id", b"req-1")])
    receive = counted(b'{"inputs": ["a"]}')
    read = receive.reads

    asyncio.run(BodyGate(app)(s, receive, sent))
    assert app.calls == [] and read == []  # nobody saw it, its body was not read
    start, headers = sent[0], sent.headers()
    assert start["status"] == 503 and headers["retry-after"] == "1"
    assert headers["x-request-id"] == "req-1" and headers["connection"] == "close"
    assert b'"type":"overloaded"' in sent[1]["body"]
    assert len(shed) == 1 and shed[0] >= 0

    other = scope()  # not saturated, or another path: handed on
    ingress.configure(settings(), settings(), Saturated(False), shed.append)
    asyncio.run(BodyGate(app)(other, client(b"{}"), sent))
    dashboard = {**scope(), "path": "/v1/dashboard/kill"}
    ingress.configure(settings(), settings(), Saturated(True), shed.append)
    asyncio.run(BodyGate(app)(dashboard, client(b"{}"), sent))
    assert len(app.calls) == 2 and len(shed) == 1


def test_saturated_while_the_body_arrived_the_request_is_shed_keeping_the_connection(
        monkeypatch):
    from serve.gateway import ingress

    class Becomes:
        def __init__(self):
            self.calls = 0

        loop = types.SimpleNamespace(lag_s=0.0)
        in_flight, ceiling = 0, 8

        def door(self, timeout_s: float) -> int | None:
            self.calls += 1
            return 1 if self.calls > 1 else None  # free on arrival, refused once the body is in

    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    ingress.configure(settings(), settings(), Becomes(), lambda ms: None)
    app, sent = App(), Sent()

    asyncio.run(BodyGate(app)(scope(), client(b"{}"), sent))
    headers = sent.headers()
    assert app.calls == [] and sent[0]["status"] == 503 and "connection" not in headers


def test_the_door_judges_the_requests_own_timeout_and_sends_its_retry_after(monkeypatch):
    from serve.gateway import ingress

    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    door = Saturated(True, retry_after=3)
    ingress.configure(settings(), settings(), door, lambda ms: None)
    app, sent = App(), Sent()

    s = scope(headers=[(b"x-request-timeout-ms", b"250")])
    asyncio.run(BodyGate(app)(s, client(b"{}"), sent))
    headers = sent.headers()
    assert door.asked == [0.25] and headers["retry-after"] == "3"
    assert b"within its deadline" in sent[1]["body"]

    # over the server's timeout: capped; malformed: left to the gateway (400), not shed here
    door.asked.clear()
    asyncio.run(BodyGate(app)(scope(headers=[(b"x-request-timeout-ms", b"99999999")]),
                              client(b"{}"), sent))
    assert door.asked == [settings().request_timeout_s]
    door.asked.clear()
    asyncio.run(BodyGate(app)(scope(headers=[(b"x-request-timeout-ms", b"-5")]),
                              client(b"{}"), sent))
    assert door.asked == [] and len(app.calls) == 1


def test_a_prediction_let_through_holds_its_slot_until_answered_and_its_arrival_is_marked(
        monkeypatch):
    """Requests waiting in Serve for the gateway's handler count against the memory cap: the
    slot is taken here once the body is in, and given back when the app has answered."""
    import time

    from serve.gateway import ingress

    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    admission = Saturated(False)
    admission.loop.lag_s = 0.5
    ingress.configure(settings(), settings(), admission, lambda ms: None)
    seen = []

    async def app(scope, receive, send):
        arrived = scope.get(ingress.ARRIVED)
        seen.append((admission.held, scope.get(ingress.SLOT) is not None,
                     None if arrived is None else time.perf_counter() - arrived))

    before = time.perf_counter()
    asyncio.run(BodyGate(app)(scope(), client(b"{}"), nothing))
    held, has_slot, age = seen[0]
    assert held == 1 and has_slot and admission.held == 0
    assert 0.5 <= age <= 0.5 + (time.perf_counter() - before)  # arrival less the loop's lag
    other = {**scope(), "path": "/v1/dashboard/kill"}  # not a prediction: no slot
    seen.clear()
    asyncio.run(BodyGate(app)(other, client(b"{}"), nothing))
    assert seen == [(0, False, None)]


def test_refused_on_arrival_a_small_body_is_read_so_the_connection_carries_the_next_request(
        monkeypatch):
    """Closing the connection of every refused request makes clients and HAProxy open a new
    one for each, which waits to be accepted: only a large body is left unread (and the
    connection closed)."""
    from serve.gateway import ingress

    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    ingress.configure(settings(), settings(), Saturated(True, retry_after=2), lambda ms: None)
    app, sent = App(), Sent()

    small = scope(headers=[(b"content-length", b"17")])
    receive = counted(b'{"inputs": ["a"]}')
    read = receive.reads

    asyncio.run(BodyGate(app)(small, receive, sent))
    headers = sent.headers()
    assert app.calls == [] and read == [1] and sent[0]["status"] == 503
    assert "connection" not in headers and headers["retry-after"] == "2"
    sent.clear()
    large = scope(headers=[(b"content-length", str(ingress.SMALL_BODY + 1).encode())])
    asyncio.run(BodyGate(app)(large, client(b"{}"), sent))
    headers = sent.headers()
    assert headers["connection"] == "close"


def test_shed_at_the_memory_cap_the_answer_says_so(monkeypatch):
    from serve.gateway import ingress

    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    ingress.configure(settings(), settings(), Saturated(True, at_cap=True), lambda ms: None)
    sent = Sent()
    asyncio.run(BodyGate(App())(scope(), client(b"{}"), sent))
    assert sent[0]["status"] == 503 and b"in-flight limit" in sent[1]["body"]
    assert b"deadline" not in sent[1]["body"]


def test_the_deadline_header_is_read_once_and_handed_on_with_the_request(monkeypatch):
    """The door asks twice (on arrival, and once the body is in) and the gateway reads the
    deadline from the scope: the header is parsed here, once."""
    from serve.gateway import admission, ingress
    from serve.gateway.ingress import TIMEOUT_S

    parsed: list[str | None] = []
    real = admission.requested_timeout_s
    monkeypatch.setattr(ingress, "requested_timeout_s",
                        lambda value, cap: parsed.append(value) or real(value, cap))
    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    door = Saturated(False)
    ingress.configure(settings(), settings(), door, lambda ms: None)
    app = App()
    asyncio.run(BodyGate(app)(scope(headers=[(b"x-request-timeout-ms", b"250")]),
                              client(b"{}"), Sent()))
    assert parsed == [b"250".decode()] and door.asked == [0.25, 0.25]
    assert app.calls[0]["scope"][TIMEOUT_S] == 0.25
    app.calls.clear()
    asyncio.run(BodyGate(app)(scope(headers=[(b"x-request-timeout-ms", b"soon")]),
                              client(b"{}"), Sent()))
    assert TIMEOUT_S not in app.calls[0]["scope"]  # the gateway answers 400 for it
