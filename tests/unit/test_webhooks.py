"""Webhook delivery (serve.control_plane.webhooks) to a real local HTTP receiver: signature, retries
with backoff, a receiver that hangs or is down for a minute, deduplication, filters, bounded queues.

Backoff runs on a FakeClock: the injected sleep advances it, so minutes of retries take no
real time. Waits for an outcome poll against a deadline; no test sleeps and then asserts.
"""

from __future__ import annotations

import hashlib
import hmac
import socket

import pytest

from rollout import FakeClock
from rollout.events import Event, EventFilter
from serve.control_plane.webhooks import MemoryLedger, WebhookSender, sender_from
from tests.webhook_receiver import Receiver

SECRET = "s3cret-for-tests"


def event(n: int = 1, kind: str = "kill", severity: str = "critical") -> Event:
    return Event(id=f"default:{n}-0", kind=kind, severity=severity, ts=1_700_000_000.0 + n,
                 app="default", text=f":rotating_light: [default] event {n}", actor="alice",
                 reason="test", detail={"n": n})


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


class Backoff:
    """The injected sleep: advances the fake clock, records the delays."""

    def __init__(self, clock: FakeClock, then=None):
        self.clock, self.delays, self.then = clock, [], then

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.advance(seconds)
        if self.then is not None:
            self.then()


def make(urls, *, clock=None, ledger=None, **kwargs) -> WebhookSender:
    clock = clock or FakeClock()
    kwargs.setdefault("sleep", Backoff(clock))
    return WebhookSender(urls, secret=SECRET, clock=clock, ledger=ledger or MemoryLedger(),
                         jitter=lambda: 1.0, **kwargs)


@pytest.fixture
def senders():
    made = []
    yield made
    for sender in made:
        sender.close()


def test_an_event_is_posted_as_signed_json_with_its_id(receiver, senders):
    sender = make([receiver.url])
    senders.append(sender)
    assert sender.send(event(1)) is True
    receiver.wait_for(1)
    [(headers, body)] = receiver.received
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-canary-signature"], expected)
    assert headers["x-canary-event-id"] == "default:1-0"
    assert headers["content-type"] == "application/json"
    doc = receiver.events()[0]
    assert {"id", "kind", "ts", "text", "severity", "app", "actor", "reason", "detail"} <= set(doc)
    assert (doc["id"], doc["kind"], doc["detail"]) == ("default:1-0", "kill", {"n": 1})
    assert sender.wait_idle(5)
    assert sender.stats()["delivered"] == 1
    assert sender.ledger.counters["delivered"] == 1
    assert "last_delivered_ts" in sender.ledger.counters


def test_without_a_secret_no_signature_header_is_sent(receiver, senders):
    sender = WebhookSender([receiver.url], ledger=MemoryLedger())
    senders.append(sender)
    sender.send(event(1))
    receiver.wait_for(1)
    assert "x-canary-signature" not in receiver.received[0][0]


def test_two_500s_are_retried_with_growing_backoff_then_delivered(receiver, senders):
    receiver.script = [500, 503]
    clock = FakeClock()
    backoff = Backoff(clock)
    sender = make([receiver.url], clock=clock, sleep=backoff)
    senders.append(sender)
    sender.send(event(1))
    receiver.wait_for(1)
    assert sender.wait_idle(5)
    assert receiver.attempts == 3
    assert backoff.delays == [1.0, 2.0]  # exponential (jitter pinned at its top)
    stats = sender.stats()
    assert (stats["delivered"], stats["failed_attempts"], stats["given_up"]) == (1, 2, 0)
    assert sender.ledger.counters["last_error"].endswith("HTTP 503")
    assert "secret-token" not in sender.ledger.counters["last_error"]  # URLs are redacted


def test_a_429_is_retried_but_another_4xx_or_a_redirect_is_given_up_at_once(receiver, senders):
    receiver.script = [429, 400, 302]
    sender = make([receiver.url])
    senders.append(sender)
    sender.send(event(1))  # 429, then 400: given up
    sender.send(event(2))  # 302: not followed, given up
    sender.send(event(3))  # delivered
    assert [e["id"] for e in receiver.wait_for(1)] == ["default:3-0"]
    assert sender.wait_idle(5)
    stats = sender.stats()
    assert (stats["failed_attempts"], stats["given_up"], stats["delivered"]) == (3, 2, 1)
    assert receiver.attempts == 4
    assert sender.ledger.claims == {("default:3-0", receiver.url)}  # given-up claims released


def test_retries_stop_after_retry_for_s_and_the_event_is_given_up(senders):
    port = _closed_port()
    clock = FakeClock()
    backoff = Backoff(clock)
    sender = make([f"http://127.0.0.1:{port}/x"], clock=clock, sleep=backoff, retry_for_s=100)
    senders.append(sender)
    sender.send(event(1))
    assert sender.wait_idle(10)
    assert sum(backoff.delays) <= 100
    stats = sender.stats()
    assert stats["given_up"] == 1 and stats["failed_attempts"] == len(backoff.delays) + 1
    assert "ConnectionRefusedError" in sender.ledger.counters["last_error"] or \
        "refused" in sender.ledger.counters["last_error"]
    assert "last_given_up_ts" in sender.ledger.counters


def test_a_receiver_down_for_a_minute_gets_every_event_afterwards_in_order(senders):
    port = _closed_port()
    clock = FakeClock()
    start = clock.time()
    revived: list[Receiver] = []

    def revive_after_a_minute():
        if not revived and clock.time() - start >= 60:
            revived.append(Receiver(port))

    sender = make([f"http://127.0.0.1:{port}/hook"], clock=clock,
                  sleep=Backoff(clock, then=revive_after_a_minute))
    senders.append(sender)
    try:
        for n in range(1, 6):
            sender.send(event(n))
        assert sender.wait_idle(20)
        [receiver] = revived
        assert [e["id"] for e in receiver.events()] == [f"default:{n}-0" for n in range(1, 6)]
        stats = sender.stats()
        assert stats["given_up"] == 0 and stats["delivered"] == 5 and stats["failed_attempts"] >= 5
        assert clock.time() - start >= 60
    finally:
        for receiver in revived:
            receiver.close()


def test_a_receiver_that_hangs_costs_a_timeout_and_never_holds_up_another_url(senders):
    hanging, healthy = Receiver(), Receiver()
    hanging.hang.set()
    try:
        sender = make([hanging.url, healthy.url], timeout_s=0.3, retry_for_s=3_600,
                      queue_size=3)
        senders.append(sender)
        for n in range(1, 21):
            sender.send(event(n))
        # the healthy URL gets what its queue kept (the last three at least), in order, while
        # the hanging one is still on its first event
        assert _until(lambda: "default:20-0" in [e["id"] for e in healthy.events()])
        ids = [e["id"] for e in healthy.events()]
        assert ids[-3:] == ["default:18-0", "default:19-0", "default:20-0"]
        assert ids == sorted(ids, key=lambda i: int(i.split(":")[1].split("-")[0]))
        assert _until(lambda: "timed out" in str(sender.ledger.counters.get("last_error")))
        stuck = sender.channels[0]
        assert stuck.busy is not None and len(stuck.queue) <= 3  # bounded while it hangs
        assert [item.event.id for item in stuck.queue][-1] == "default:20-0"
        assert sender.stats()["given_up"] == 0
    finally:
        hanging.close()
        healthy.close()


def test_a_full_queue_drops_its_oldest_event_and_counts_it(receiver, senders):
    receiver.hang.set()  # the first event occupies the worker
    sender = make([receiver.url], queue_size=2, timeout_s=0.5, retry_for_s=0)
    senders.append(sender)
    sender.send(event(1))
    assert _until(lambda: sender.channels[0].busy is not None)
    for n in range(2, 6):
        sender.send(event(n))
    assert [item.event.id for item in sender.channels[0].queue] == ["default:4-0", "default:5-0"]
    assert _until(lambda: receiver.attempts == 1)  # event 1 reached the receiver: it hangs
    receiver.hang.clear()
    assert sender.wait_idle(10)
    assert [e["id"] for e in receiver.events()] == ["default:4-0", "default:5-0"]
    assert sender.stats()["dropped"] == 2 and sender.ledger.counters["dropped"] == 2


def test_the_same_event_twice_is_delivered_once(receiver, senders):
    sender = make([receiver.url])
    senders.append(sender)
    sender.send(event(1))
    receiver.wait_for(1)
    assert sender.wait_idle(5)
    sender.send(event(1))
    assert sender.wait_idle(5)
    assert len(receiver.events()) == 1 and sender.stats()["duplicates"] == 1


def test_two_senders_sharing_a_ledger_deliver_an_event_once(receiver, senders):
    ledger = MemoryLedger()  # as two processes share the Redis ledger
    first, second = make([receiver.url], ledger=ledger), make([receiver.url], ledger=ledger)
    senders.extend([first, second])
    first.send(event(7))
    second.send(event(7))
    assert first.wait_idle(5) and second.wait_idle(5)
    assert len(receiver.events()) == 1
    assert first.stats()["duplicates"] + second.stats()["duplicates"] == 1


def test_the_filter_sends_only_the_kinds_and_severities_asked_for(receiver, senders):
    sender = make([receiver.url], event_filter=EventFilter.of(["kill", "ramp-rollback"],
                                                              "warning"))
    senders.append(sender)
    assert sender.send(event(1, "kill", "critical")) is True
    assert sender.send(event(2, "share", "info")) is False  # kind not asked for
    assert sender.send(event(3, "ramp-rollback", "critical")) is True
    sender2 = make([receiver.url], event_filter=EventFilter.of([], "critical"))
    senders.append(sender2)
    assert sender2.send(event(4, "unkill", "warning")) is False  # below the minimum
    assert sender2.send(event(5, "kill", "critical")) is True
    assert sorted(e["id"] for e in receiver.wait_for(3)) == [
        "default:1-0", "default:3-0", "default:5-0"]


def test_a_failing_ledger_does_not_stop_deliveries(receiver, senders):
    class Down(MemoryLedger):
        def claim(self, event_id, url):
            raise OSError("redis down")

        def record(self, counts, fields):
            raise OSError("redis down")

    sender = make([receiver.url], ledger=Down())
    senders.append(sender)
    sender.send(event(1))
    receiver.wait_for(1)
    assert sender.wait_idle(5) and sender.stats()["delivered"] == 1


def test_sender_from_settings():
    from rollout import Settings

    assert sender_from(Settings(webhook_urls="")) is None
    sender = sender_from(Settings(webhook_urls="http://127.0.0.1:9/a,http://127.0.0.1:9/a",
                                  webhook_secret="k", webhook_kinds="kill",
                                  webhook_min_severity="warning", webhook_queue=7))
    try:
        assert [c.url for c in sender.channels] == ["http://127.0.0.1:9/a"]  # deduplicated
        assert sender.secret == "k" and sender.channels[0].size == 7
        assert sender.filter == EventFilter(frozenset({"kill"}), "warning")
    finally:
        sender.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(predicate, timeout_s: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
