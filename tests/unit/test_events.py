"""Rollout events (rollout.events): audit entries mapped to notifications, signatures,
filters, the status summary of the counters; the sources of events that are not plain
audit entries (verify verdicts, stalled ramps, a gateway's stale store) and the audit tailer,
on in-memory stores and a real local HTTP receiver. No Redis, no Ray."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading

import pytest

from rollout import FakeClock, MemoryStateStore, Rollout, StateWatcher, StoreUnavailable
from rollout.events import (
    KINDS,
    Event,
    EventFilter,
    event_from_audit,
    redact_webhook,
    sign,
    store_event,
    webhook_health,
)
from rollout.ramp import CONTROLLER
from serve.control_plane.notify import AuditTailer, StoreOutageNotifier
from serve.control_plane.webhooks import MemoryLedger, WebhookSender
from tests.webhook_receiver import Receiver


def last_event(store: MemoryStateStore, app: str = "default") -> Event | None:
    return event_from_audit(store.audit()[-1], app)


@pytest.fixture
def store():
    return MemoryStateStore()


def test_a_kill_is_a_critical_event_with_a_stable_id_and_a_slack_text(store):
    Rollout(store).kill(actor="alice", reason="p99 regression")
    entry = store.audit()[-1]
    event = event_from_audit(entry, "default")
    assert (event.id, event.kind, event.severity) == (f"default:{entry.id}", "kill", "critical")
    assert event == event_from_audit(entry, "default")  # the same entry, the same event
    assert event.text == (":rotating_light: [default] KILL SWITCH ON: all traffic to baseline: "
                          "p99 regression (by alice)")
    doc = json.loads(event.body())
    assert {"id", "kind", "ts", "text", "severity", "app", "actor", "reason", "detail"} <= set(doc)
    assert doc["detail"]["kill"] is True and doc["ts"] == entry.ts


def test_share_unkill_and_revert_events(store):
    rollout = Rollout(store)
    rollout.set_canary(500, actor="alice", reason="first 5%")
    share = last_event(store)
    assert (share.kind, share.severity) == ("share", "info")
    assert "canary share 0% -> 5%" in share.text
    assert share.detail["canary_bp"] == 500 and share.detail["canary_bp_before"] == 0
    rollout.kill(actor="a", reason="r")
    rollout.unkill(actor="a", reason="r")
    assert (last_event(store).kind, last_event(store).severity) == ("unkill", "warning")
    rollout.revert(1, actor="bob", reason="back")
    assert (last_event(store).kind, last_event(store).severity) == ("revert", "warning")


def test_the_ramps_own_share_moves_and_held_evaluations_are_not_events(store):
    Rollout(store).set_canary(500, actor=CONTROLLER, reason="ramp step 1")
    assert last_event(store) is None  # its ramp-advance tells it
    store.note(ts=1.0, actor=CONTROLLER, action="ramp-evaluate", reason="hold: soak")
    assert last_event(store) is None
    store.note(ts=2.0, actor=CONTROLLER, action="something-new", reason="x")
    assert last_event(store) is None


def test_ramp_events_say_the_step_and_share(store):
    Rollout(store).set_canary(0, actor="a", reason="r")
    store.note(ts=1.0, actor=CONTROLLER, action="ramp-rollback",
               reason="p99_ms 812 <= 500: fail", detail={"step": 1, "status": "aborted"})
    event = last_event(store)
    assert (event.kind, event.severity) == ("ramp-rollback", "critical")
    assert event.text == (":rotating_light: [default] ramp rolled back (step 2, share 0%): "
                          "p99_ms 812 <= 500: fail (by ramp-controller)")
    store.note(ts=2.0, actor="alice", action="ramp-start --force", reason="go")
    assert (last_event(store).kind, last_event(store).severity) == ("ramp-start", "warning")


def test_wait_for_approval_is_told_once_not_on_each_heartbeat(store):
    store.note(ts=1.0, actor=CONTROLLER, action="ramp-wait-approval", reason="waiting",
               detail={"step": 0, "held": {"evaluations": 1}})
    assert last_event(store).kind == "ramp-wait-approval"
    store.note(ts=301.0, actor=CONTROLLER, action="ramp-wait-approval", reason="waiting [..]",
               detail={"step": 0, "held": {"evaluations": 61}})
    assert last_event(store) is None


@pytest.mark.parametrize(("detail", "severity"), [
    ({"on_deadline": "abort"}, "critical"), ({"on_deadline": "pause"}, "warning")])
def test_a_deadline_is_critical_when_it_aborts(store, detail, severity):
    store.note(ts=1.0, actor=CONTROLLER, action="ramp-deadline", reason="step 2 stuck",
               detail=detail)
    assert (last_event(store).kind, last_event(store).severity) == ("ramp-deadline", severity)


@pytest.mark.parametrize(("passed", "severity"), [(True, "info"), (False, "warning")])
def test_a_verify_verdict_note_is_an_event(store, passed, severity):
    store.note(ts=1.0, actor="alice", action="verify-verdict", reason="verify ...",
               detail={"passed": passed})
    assert (last_event(store).kind, last_event(store).severity) == ("verify-verdict", severity)


def test_every_simple_action_maps_to_its_kind(store):
    for action in ("ramp-advance", "ramp-stalled", "ramp-promote", "ramp-abort", "ramp-pause",
                   "ramp-resume", "ramp-approve", "route-add", "route-remove"):
        store.note(ts=1.0, actor="a", action=action, reason="r", detail={"step": 0})
        assert last_event(store).kind == action and action in KINDS


def test_sign_is_the_hex_hmac_sha256_of_the_body():
    body = b'{"id":"x"}'
    expected = hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert sign(body, "k") == f"sha256={expected}"


def test_the_filter_by_kinds_and_minimum_severity():
    kill = Event("1", "kill", "critical", 0.0, "a", "t")
    share = Event("2", "share", "info", 0.0, "a", "t")
    assert EventFilter().accepts(kill) and EventFilter().accepts(share)
    assert not EventFilter.of(["kill"]).accepts(share)
    assert not EventFilter.of([], "warning").accepts(share)
    assert EventFilter.of([], "critical").accepts(kill)
    with pytest.raises(ValueError, match="unknown event kind"):
        EventFilter.of(["kil"])
    with pytest.raises(ValueError, match="min_severity"):
        EventFilter.of([], "loud")


def test_store_events_are_named_by_the_gateway_and_when_it_went_stale():
    stale = store_event("app", "gw@h:1", stale=True, since=100.0, now=100.0, error="down")
    back = store_event("app", "gw@h:1", stale=False, since=100.0, now=160.0)
    assert (stale.kind, stale.severity) == ("store-stale", "critical")
    assert stale.id == "app:gw@h:1:100.000"
    assert (back.kind, back.id) == ("store-recovered", "app:gw@h:1:100.000:recovered")
    assert "routing all traffic to baseline" in stale.text and "after 60 s" in back.text


def test_webhook_urls_are_redacted_to_their_host():
    assert redact_webhook("https://hooks.slack.com/services/T/B/tok") == "https://hooks.slack.com/***"
    assert redact_webhook("http://user:pw@host:8080/x?t=1") == "http://host:8080/***"


def test_webhook_health_warns_while_failing_and_after_a_recent_give_up():
    assert webhook_health({}, 1000.0) is None
    ok = webhook_health({"delivered": "3", "last_delivered_ts": "990"}, 1000.0)
    assert ok["delivered"] == 3 and ok["warnings"] == []
    failing = webhook_health({"delivered": "3", "failed_attempts": "2", "last_delivered_ts": "900",
                              "last_error_ts": "990", "last_error": "https://h/***: HTTP 500"},
                             1000.0)
    assert failing["warnings"] == ["webhook deliveries are failing: last error 10s ago: "
                                   "https://h/***: HTTP 500"]
    gave_up = webhook_health({"given_up": "1", "last_given_up_ts": "900"}, 1000.0)
    assert "1 webhook event(s) given up" in gave_up["warnings"][0]
    assert webhook_health({"given_up": "1", "last_given_up_ts": "900"}, 900 + 86_401)[
        "warnings"] == []


# --- where events come from ------------------------------------------------------------------


class FlakyStore(MemoryStateStore):
    def __init__(self):
        super().__init__()
        self.down = False

    def get(self):
        if self.down:
            raise StoreUnavailable("cannot reach Redis at redis://db:6379/0")
        return super().get()


def test_the_watcher_calls_on_stale_once_when_stale_and_once_when_fresh_again():
    clock, store, calls = FakeClock(), FlakyStore(), []
    watcher = StateWatcher(store, poll_s=1.0, staleness_s=5.0, clock=clock,
                           on_stale=lambda stale, view: calls.append((stale, view.error)))
    watcher.refresh()
    watcher.check_stale()
    store.down = True
    for _ in range(10):
        clock.advance(1.0)
        watcher.refresh()
        watcher.check_stale()
    store.down = False
    watcher.refresh()
    watcher.check_stale()
    watcher.check_stale()
    assert calls == [(True, "cannot reach Redis at redis://db:6379/0"), (False, None)]


def test_a_failing_on_stale_hook_never_stops_the_watcher():
    clock, store = FakeClock(), FlakyStore()

    def broken(stale, view):
        raise RuntimeError("bug")

    watcher = StateWatcher(store, poll_s=1.0, staleness_s=5.0, clock=clock, on_stale=broken)
    store.down = True
    clock.advance(10)
    watcher.check_stale()  # logged, not raised
    assert watcher.view().stale


def test_the_gateways_outage_notifier_sends_stale_then_recovered():
    sent = []

    class Capture:
        def send(self, event, mark=None):
            sent.append(event)

    clock = FakeClock(1000.0)
    notifier = StoreOutageNotifier(Capture(), "app", "gw-1", clock)
    notifier(False, None)  # fresh from the start: nothing to say
    notifier(True, type("V", (), {"error": "down"})())
    clock.advance(30)
    notifier(False, type("V", (), {"error": None})())
    assert [(e.kind, e.id) for e in sent] == [("store-stale", "app:gw-1:1000.000"),
                                              ("store-recovered", "app:gw-1:1000.000:recovered")]


def test_the_tailer_starts_at_the_end_sends_new_entries_and_moves_its_cursor(store):
    receiver = Receiver()
    ledger = MemoryLedger()
    sender = WebhookSender([receiver.url], ledger=ledger)
    try:
        rollout = Rollout(store)
        rollout.set_canary(100, actor="alice", reason="history: not replayed")
        tailer = AuditTailer(store, ledger, sender, "default")
        assert tailer.step() == 0 and ledger.cursor == store.audit()[-1].id
        rollout.kill(actor="alice", reason="p99")
        store.note(ts=1.0, actor=CONTROLLER, action="ramp-evaluate", reason="hold")
        assert tailer.step() == 2
        assert [e["kind"] for e in receiver.wait_for(1)] == ["kill"]
        assert sender.wait_idle(5)
        tailer.settle()
        assert ledger.cursor == store.audit()[-1].id  # past the kill and the held evaluation
        # a restarted tailer with the same ledger resends nothing
        again = AuditTailer(store, ledger, sender, "default")
        assert again.step() == 0 and len(receiver.events()) == 1
    finally:
        sender.close()
        receiver.close()


def test_the_cursor_stays_before_an_event_not_yet_delivered(store):
    receiver = Receiver()
    receiver.hang.set()
    ledger = MemoryLedger()
    sender = WebhookSender([receiver.url], ledger=ledger, timeout_s=0.2, retry_for_s=3_600,
                           sleep=lambda s: None)
    try:
        tailer = AuditTailer(store, ledger, sender, "default")
        tailer.step()
        start = ledger.cursor
        Rollout(store).kill(actor="alice", reason="p99")
        store.note(ts=1.0, actor=CONTROLLER, action="ramp-evaluate", reason="hold")
        tailer.step()
        assert ledger.cursor == start  # the kill is still being delivered
    finally:
        sender.close()
        receiver.close()


def test_a_tailer_that_is_not_the_leader_sends_nothing(store):
    ledger, sent = MemoryLedger(), []

    class Capture:
        def send(self, event, mark=None):
            sent.append(event)
            return True

        def outstanding(self):
            return set()

    leader = threading.Event()
    tailer = AuditTailer(store, ledger, Capture(), "default", leader=leader.is_set)
    Rollout(store).kill(actor="a", reason="r")
    assert tailer.step() == 0 and sent == [] and ledger.cursor is None
    leader.set()
    tailer.step()  # starts at the end: the kill before it became leader is not replayed
    Rollout(store).unkill(actor="a", reason="r")
    tailer.step()
    assert [e.kind for e in sent] == ["unkill"]


def test_a_held_step_is_noted_stalled_once_when_its_soak_is_over():
    from tests.ramp_harness import Harness, stats

    h = Harness()
    h.verdict(passed=True)
    h.start()
    h.healthy()
    assert h.tick().kind == "advance"
    h.metrics.canary = stats("optimized", 3)  # too few samples: the gates wait
    stalled = lambda: [e for e in h.states.audit() if e.action == "ramp-stalled"]  # noqa: E731
    for _ in range(5):  # 25 s: within the step's 30 s soak
        assert h.tick().kind == "hold"
    assert stalled() == []
    for _ in range(120):  # 10 more minutes held
        h.tick()
    [note] = stalled()
    assert note.actor == CONTROLLER and note.reason.startswith("held step 1 past its soak time")
    event = event_from_audit(note, "default")
    assert (event.kind, event.severity) == ("ramp-stalled", "warning")
    h.healthy()
    h.run_until("advance")  # the next step: a new stall would be noted again
    h.metrics.canary = stats("optimized", 3)
    for _ in range(20):
        h.tick()
    assert len(stalled()) == 2


def test_a_stored_verdict_is_audited_as_a_verify_verdict_event(store):
    from ops.verify.command import audit_verdict
    from rollout import Verdict

    verdict = Verdict(baseline_version="b", optimized_version="o", passed=False,
                      failures=("agreement 0.9 < 0.98",), n=100, agreement=0.9,
                      agreement_lower_bound=0.85, at=5.0, by="alice")
    audit_verdict(store, verdict)
    event = last_event(store)
    assert (event.kind, event.severity, event.actor) == ("verify-verdict", "warning", "alice")
    assert "failed: agreement 0.9 < 0.98" in event.text
    assert event.detail["optimized_version"] == "o" and event.detail["passed"] is False


def test_webhook_settings_parse_comma_lists_and_name_what_is_wrong():
    from pydantic import ValidationError

    from rollout import Settings

    settings = Settings(webhook_urls=" https://hooks.slack.com/services/T/B/x ,http://h:8080/y,",
                        webhook_kinds="kill, ramp-rollback", webhook_min_severity="warning")
    assert settings.webhook_urls == ("https://hooks.slack.com/services/T/B/x", "http://h:8080/y")
    assert settings.webhook_kinds == ("kill", "ramp-rollback")
    assert Settings(webhook_urls="").webhook_urls == ()
    for bad, message in [({"webhook_urls": "ftp://h/x"}, "http:// or https://"),
                         ({"webhook_urls": "https:///nohost"}, "name a host"),
                         ({"webhook_kinds": "kil"}, r"unknown event kind\(s\) kil"),
                         ({"webhook_min_severity": "loud"}, "webhook_min_severity"),
                         ({"webhook_queue": 0}, "webhook_queue"),
                         ({"webhook_timeout_s": 0}, "webhook_timeout_s")]:
        with pytest.raises(ValidationError, match=message):
            Settings(**bad)


def test_rollout_status_shows_the_webhook_counters_and_warns(store):
    import io

    from ops.cli import main
    from rollout.telemetry.windows import MemoryHashes

    hashes, clock = MemoryHashes(), FakeClock(10_000.0)
    hashes.data["rollout:default:webhooks"] = {
        "delivered": "4", "failed_attempts": "2", "given_up": "1", "dropped": "0",
        "last_delivered_ts": "9000", "last_error_ts": "9990", "last_given_up_ts": "9990",
        "last_error": "https://hooks.slack.com/***: HTTP 503"}
    out, err = io.StringIO(), io.StringIO()
    assert main(["status"], store=store, clock=clock, telemetry=hashes, stdout=out,
                stderr=err) == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert "webhooks: 4 delivered, 2 failed attempts, 1 given up, 0 dropped (last delivered " \
        "16m 40s ago)" in lines
    assert "WARNING: webhook deliveries are failing: last error 10s ago: " \
        "https://hooks.slack.com/***: HTTP 503" in lines
    assert any(line.startswith("WARNING: 1 webhook event(s) given up") for line in lines)
    hashes.data.clear()
    out = io.StringIO()
    main(["status"], store=store, clock=clock, telemetry=hashes, stdout=out, stderr=err)
    assert "webhooks" not in out.getvalue()  # notifications never used: nothing to show
