"""Notifications on a real Redis (TLS, the shipped ACL users) and a real local HTTP receiver:
audited changes reach the receiver through the audit tailer as signed events; a restart neither
resends nor misses; two tailers deliver once; the counters show in `rollout status`; the
gateway's user may write its claims and counters and nothing more of them."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import threading
import time
import uuid

import pytest
import redis
from pydantic import SecretStr

from rollout import DeploymentReport, PermissionDenied, Rollout, Settings
from rollout.events import event_from_audit
from rollout.ramp import RampControl, parse_plan
from rollout.ramp.redis_store import RedisRampStore
from rollout.redis_store import RedisStateStore
from serve.control_plane.notify import RedisLedger, start_notifications
from serve.control_plane.webhooks import WebhookSender
from tests.ramp_harness import PLAN
from tests.webhook_receiver import Receiver

SECRET = "itest-webhook-secret"


@pytest.fixture
def app():
    return f"notify-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def operator(secured, app):
    store = RedisStateStore(secured.url, app, timeout_s=5.0)
    yield store
    store.close()


@pytest.fixture
def notifier(secured, app, receiver):
    """start_notifications as the ramp controller deployment calls it (controller user)."""
    started = []

    def start(**overrides):
        settings = Settings(redis_url=secured.url_for("controller"), app_name=app,
                            webhook_urls=receiver.url, webhook_secret=SECRET, **overrides)
        states = RedisStateStore(settings.redis_url, app, timeout_s=5.0)
        running = start_notifications(settings, settings, states, leader=lambda: True,
                                      stop=threading.Event(), poll_s=0.05)
        started.append((running, states))
        return running

    yield start
    for running, states in started:
        running.close()
        states.close()


def signed(receiver: Receiver) -> list[dict]:
    """The received events, each after checking its signature and id header."""
    events = []
    for headers, body in receiver.received:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-canary-signature"], expected)
        doc = json.loads(body)
        assert headers["x-canary-event-id"] == doc["id"]
        events.append(doc)
    return events


def wait_until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_a_kill_and_ramp_actions_reach_the_receiver_as_signed_events(
        secured, app, operator, receiver, notifier):
    rollout = Rollout(operator)
    rollout.set_canary(100, actor="alice", reason="before notifications: not replayed")
    running = notifier()
    wait_until(lambda: running.tailer.position is not None)
    rollout.kill(actor="alice", reason="p99 regression")
    operator.report_deployment(DeploymentReport(gateway="gw", baseline_version="b1",
                                                optimized_version="o1", ts=time.time()))
    rollout.unkill(actor="alice", reason="fixed")
    ramps = RedisRampStore(secured.url, app, timeout_s=5.0)
    try:
        control = RampControl(operator, ramps)
        control.start(parse_plan(PLAN), actor="alice", reason="ramp o1", force=True)
        control.pause(actor="bob", reason="lunch")
    finally:
        ramps.close()
    receiver.wait_for(4)
    events = signed(receiver)
    assert [e["kind"] for e in events] == ["kill", "unkill", "ramp-start", "ramp-pause"]
    for doc in events:
        assert {"id", "kind", "ts", "text"} <= set(doc) and doc["app"] == app
    entries = {e.id: e for e in operator.audit()}
    kill = events[0]
    assert kill["id"] == f"{app}:{next(i for i, e in entries.items() if e.action == 'kill')}"
    assert kill["text"] == (f":rotating_light: [{app}] KILL SWITCH ON: all traffic to baseline: "
                            "p99 regression (by alice)")
    assert events[2]["severity"] == "warning"  # a forced start
    wait_until(lambda: running.ledger.get_cursor() == operator.audit()[-1].id)
    counters = RedisLedger(secured.url, app).counters()
    assert counters["delivered"] == "4" and "last_delivered_ts" in counters


def test_a_restarted_notifier_resends_nothing_and_misses_nothing(
        app, operator, receiver, notifier):
    rollout = Rollout(operator)
    first = notifier()
    wait_until(lambda: first.tailer.position is not None)
    rollout.kill(actor="alice", reason="one")
    receiver.wait_for(1)
    wait_until(lambda: first.ledger.get_cursor() == operator.audit()[-1].id)
    first.close()
    rollout.unkill(actor="alice", reason="while the controller restarts")
    second = notifier()
    receiver.wait_for(2)
    wait_until(lambda: second.tailer.sender.idle() and
               second.ledger.get_cursor() == operator.audit()[-1].id)
    assert [e["kind"] for e in signed(receiver)] == ["kill", "unkill"]


def test_two_tailers_at_once_deliver_each_event_once(app, operator, receiver, notifier):
    rollout = Rollout(operator)
    one, two = notifier(), notifier()
    wait_until(lambda: one.tailer.position is not None and two.tailer.position is not None)
    for n in range(3):
        rollout.kill(actor="alice", reason=f"kill {n}")
        rollout.unkill(actor="alice", reason=f"unkill {n}")
    receiver.wait_for(6)
    last = operator.audit()[-1].id
    wait_until(lambda: one.tailer.position == last and two.tailer.position == last)
    wait_until(lambda: one.tailer.sender.idle() and two.tailer.sender.idle())
    assert len(receiver.events()) == 6
    assert len({e["id"] for e in receiver.events()}) == 6
    duplicates = one.tailer.sender.stats()["duplicates"] + two.tailer.sender.stats()["duplicates"]
    assert duplicates == 6


def test_failed_deliveries_show_in_rollout_status(secured, app, operator, monkeypatch):
    from ops.cli import main

    closed = Receiver()
    url = closed.url
    closed.close()  # nothing listens there any more
    ledger = RedisLedger(secured.url_for("controller"), app)
    sender = WebhookSender([url], ledger=ledger, retry_for_s=0)
    try:
        Rollout(operator).kill(actor="a", reason="r")
        sender.send(event_from_audit(operator.audit()[-1], app))
        assert sender.wait_idle(10)
    finally:
        sender.close()
        ledger.close()
    monkeypatch.setenv("REDIS_URL", secured.url)
    monkeypatch.setenv("CANARY_APP_NAME", app)
    out, err = io.StringIO(), io.StringIO()
    assert main(["status"], stdout=out, stderr=err) == 0, err.getvalue()
    text = out.getvalue()
    assert "webhooks: 0 delivered, 1 failed attempts, 1 given up, 0 dropped" in text
    assert "WARNING: webhook deliveries are failing" in text
    assert "WARNING: 1 webhook event(s) given up" in text
    assert "secret-token" not in text and "127.0.0.1:" in text  # the URL's path is redacted
    out = io.StringIO()
    assert main(["status", "--json"], stdout=out, stderr=err) == 0
    doc = json.loads(out.getvalue())["webhooks"]
    assert (doc["given_up"], doc["failed_attempts"], len(doc["warnings"])) == (1, 1, 2)


def test_the_gateway_user_may_claim_and_count_but_not_move_the_cursor(secured, app):
    gateway = RedisLedger(secured.url_for("gateway"), app)
    try:
        assert gateway.claim(f"{app}:gw:1.000", "http://x/") is True
        assert gateway.claim(f"{app}:gw:1.000", "http://x/") is False
        gateway.release(f"{app}:gw:1.000", "http://x/")
        gateway.record({"delivered": 1}, {"last_delivered_ts": "1.0"})
        with pytest.raises(PermissionDenied):
            gateway.set_cursor("1-0")
    finally:
        gateway.close()
    client = redis.Redis.from_url(secured.url, decode_responses=True)
    try:
        assert client.hget(f"rollout:{app}:webhooks", "delivered") == "1"
    finally:
        client.close()


def test_end_to_end_on_the_real_app_audited_changes_and_a_store_outage(gw, receiver):
    """The Serve app with webhooks configured: the ramp controller deployment tails the audit
    stream into the receiver, and the gateway posts its own store-stale / store-recovered."""
    cursor_key = f"rollout:{gw.settings.app_name}:notify:cursor"
    client = gw.redis.client()
    # redeploy copies the settings without validation: give the fields their parsed types
    gw.redeploy({}, webhook_urls=(receiver.url,), webhook_secret=SecretStr(SECRET))
    try:
        wait_until(lambda: client.exists(cursor_key), 60)  # the tailer started (at the end)
        gw.set_state(canary_bp=0, kill=True)
        wait_until(lambda: any(e["kind"] == "kill" for e in receiver.events()), 30)
        kill = next(e for e in signed(receiver) if e["kind"] == "kill")
        assert kill["severity"] == "critical" and kill["text"].startswith(":rotating_light:")
        gw.set_state(canary_bp=0, kill=False)
        gw.redis.pause()
        try:
            wait_until(lambda: any(e["kind"] == "store-stale" for e in receiver.events()), 30)
        finally:
            gw.redis.resume()
        wait_until(lambda: any(e["kind"] == "store-recovered" for e in receiver.events()), 30)
        # the unkill may wait for Redis like the tailer, and arrive after the gateway's events
        wait_until(lambda: any(e["kind"] == "unkill" for e in receiver.events()), 30)
        kinds = [e["kind"] for e in signed(receiver)]
        assert kinds.index("kill") < kinds.index("unkill")
        assert kinds.index("store-stale") < kinds.index("store-recovered")
        stale = next(e for e in receiver.events() if e["kind"] == "store-stale")
        recovered = next(e for e in receiver.events() if e["kind"] == "store-recovered")
        assert recovered["id"] == stale["id"] + ":recovered"
        assert "routing all traffic to baseline" in stale["text"]
    finally:
        client.close()
        gw.redeploy({})
