"""The dashboard's logic without HTTP: token check, action bodies and rules, reads and their
sharing (serve.dashboard.actions / reads), on the in-memory stores and a fake clock."""

from __future__ import annotations

import json
import threading

import pytest
from pydantic import SecretStr

from rollout import (
    DeploymentReport,
    FakeClock,
    MemoryStateStore,
    MemoryTelemetry,
    PermissionDenied,
    Rollout,
    Settings,
    StoreUnavailable,
)
from rollout.settings import StateSettings, TelemetrySettings
from serve.dashboard.actions import Actions, authorize
from serve.dashboard.errors import (
    ConfirmationRequired,
    Conflict,
    ControlUnavailable,
    InputTooLarge,
    InvalidInput,
    NotFound,
    ReadOnly,
    Unauthorized,
)
from serve.dashboard.reads import Memo, Readings, bounded_int

TOKEN = SecretStr("s3cret-operator-token")
START = 1_700_000_000.0


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


@pytest.fixture
def store():
    store = MemoryStateStore()
    store.report_deployment(DeploymentReport(gateway="g", baseline_version="b",
                                             optimized_version="o", ts=START))
    return store


@pytest.fixture
def actions(store):
    return Actions(Rollout(store, FakeClock(START)))


@pytest.mark.parametrize("header, error", [
    (None, Unauthorized), ("", Unauthorized), ("Bearer", Unauthorized), ("Bearer  ", Unauthorized),
    ("Basic s3cret-operator-token", Unauthorized), ("Bearer s3cret-operator-tokeN", Unauthorized),
    ("Bearer s3cret-operator-token-and-more", Unauthorized),
])
def test_only_the_configured_token_authorizes(header, error):
    with pytest.raises(error) as info:
        authorize(TOKEN, header)
    assert "s3cret" not in info.value.message
    authorize(TOKEN, "Bearer s3cret-operator-token")
    authorize(TOKEN, "bearer s3cret-operator-token")


def test_without_a_configured_token_everything_is_refused():
    with pytest.raises(ReadOnly):
        authorize(None, "Bearer anything-at-all-really")


@pytest.mark.parametrize("raw", [
    b"", b"{", b"[]", b"null", body(percent="5"), body(percent="5", reason=""),
    body(percent="5", reason="x", extra=1), body(percent=None, reason="x"),
    body(percent="5", reason="x", confirm="yes"), body(percent="5", reason="x",
                                                       expected_revision=-1),
    body(percent="5", reason="x", actor="<img src=x>"), body(percent="abc", reason="x"),
    body(percent="100.5", reason="x"), body(percent=5.001, reason="x"),
    body(percent="5", reason="   "), "ü".encode("latin-1"),
])
def test_bad_bodies_are_invalid_input_and_change_nothing(actions, store, raw):
    with pytest.raises(InvalidInput):
        actions.run("canary", raw, "10.0.0.1")
    assert store.get().revision == 0


def test_a_body_over_the_limit_is_refused(actions):
    with pytest.raises(InputTooLarge):
        actions.run("kill", body(reason="x" * 5000), None)


def test_share_changes_are_audited_under_the_dashboard_actor(actions, store):
    answer = actions.run("canary", body(percent="5", reason="first", actor="alice",
                                        expected_revision=0), "10.0.0.1")
    assert answer["changed"] and answer["state"]["canary_bp"] == 500
    [entry] = store.audit()
    assert entry.actor == "dashboard:alice@10.0.0.1" and entry.reason == "first"
    assert store.get().optimized_version == "o"  # bound like the CLI binds it
    again = actions.run("canary", body(percent=5, reason="same"), None)
    assert again["changed"] is False and len(store.audit()) == 1
    actions.run("kill", body(reason="stop"), None)
    assert store.audit()[-1].actor == "dashboard:unknown"


def test_big_moves_need_confirmation(actions, store):
    with pytest.raises(ConfirmationRequired, match="0% to 50%"):
        actions.run("canary", body(percent="50", reason="half"), None)
    with pytest.raises(ConfirmationRequired, match="to 100%"):
        actions.run("canary", body(percent="100", reason="all"), None)
    assert store.get().revision == 0
    actions.run("canary", body(percent="49.99", reason="just under"), None)
    actions.run("canary", body(percent="100", reason="all", confirm=True), None)
    assert store.get().canary_bp == 10_000


def test_unkill_of_a_big_share_asks_and_kill_never_does(actions, store):
    actions.run("canary", body(percent="60", reason="wide", confirm=True), None)
    killed = actions.run("kill", body(reason="stop"), None)
    assert killed["state"]["kill"] is True
    with pytest.raises(ConfirmationRequired, match="60%"):
        actions.run("unkill", body(reason="back"), None)
    done = actions.run("unkill", body(reason="back", confirm=True), None)
    assert done["state"]["kill"] is False
    assert actions.run("unkill", body(reason="twice"), None)["changed"] is False


def test_a_stale_view_is_a_conflict(actions, store):
    actions.run("canary", body(percent="1", reason="one"), None)
    with pytest.raises(Conflict):
        actions.run("canary", body(percent="2", reason="two", expected_revision=0), None)
    with pytest.raises(Conflict):
        actions.run("unkill", body(reason="two", expected_revision=0), None)
    assert store.get().canary_bp == 100


@pytest.mark.parametrize("failure", [StoreUnavailable("down"), PermissionDenied("no perms")])
def test_store_trouble_is_a_503(failure):
    class Failing(MemoryStateStore):
        def get(self):
            raise failure

    with pytest.raises(ControlUnavailable):
        Actions(Rollout(Failing())).run("kill", body(reason="x"), None)


# --- reads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["x", "-1", "0", "1.5", "10001", " ", "1e3", "9" * 12])
def test_bounded_ints_refuse_what_is_out_of_range(raw):
    with pytest.raises(InvalidInput):
        bounded_int(raw, "n", 7, 1, 10_000)


def test_bounded_ints_default_and_accept():
    assert bounded_int(None, "n", 7, 1, 10) == 7
    assert bounded_int("", "n", 7, 1, 10) == 7
    assert bounded_int("10", "n", 7, 1, 10) == 10


def test_memo_shares_one_read_between_concurrent_callers_and_expires():
    clock = FakeClock(START)
    memo, calls, gate = Memo(clock), [], threading.Event()

    def slow():
        calls.append(1)
        gate.wait(5)
        return len(calls)

    results = []
    threads = [threading.Thread(target=lambda: results.append(memo.get("k", 1.0, slow)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(5)
    assert calls == [1] and results == [1, 1, 1, 1]
    clock.advance(1.5)
    assert memo.get("k", 1.0, slow) == 2


def test_memo_keeps_a_bounded_number_of_keys():
    memo = Memo(FakeClock(START))
    for i in range(500):
        memo.get(("series", i), 10.0, lambda: "v")
    assert len(memo._values) <= Memo.MAX_KEYS + 1


def readings(store, telemetry=None, clock=None):
    return Readings(StateSettings(app_name="unit"), TelemetrySettings(), store,
                    telemetry or MemoryTelemetry(), clock=clock or FakeClock(START))


def test_status_is_cached_until_an_action_or_the_ttl(store):
    clock = FakeClock(START)
    reads = readings(store, clock=clock)
    assert reads.status()["revision"] == 0
    Rollout(store, clock).set_canary(100, actor="a", reason="r")
    assert reads.status()["revision"] == 0  # kept for STATUS_TTL_S
    reads.changed()
    assert reads.status()["revision"] == 1


def test_traces_and_audit_reads(store):
    telemetry = MemoryTelemetry()
    telemetry.add_spans([{"trace_id": "a" * 32, "span_id": "1" * 16, "parent_id": None,
                          "name": "POST /v1/predict", "service": "canary-gateway",
                          "start": 1.0, "end": 1.01, "status": "ok", "error": None,
                          "attrs": {"canary.request_id": "r", "http.response.status_code": 200}}])
    Rollout(store, FakeClock(START)).set_canary(100, actor="a", reason="one")
    Rollout(store, FakeClock(START)).kill(actor="b", reason="two")
    reads = readings(store, telemetry)
    assert [e["reason"] for e in reads.audit(10)] == ["two", "one"]  # newest first
    assert reads.traces(5)[0]["request_id"] == "r"
    assert reads.trace("a" * 32)["spans"][0]["name"] == "POST /v1/predict"
    with pytest.raises(NotFound):
        reads.trace("b" * 32)
    with pytest.raises(InvalidInput):
        reads.trace("A" * 32)


def test_series_reads_refuse_bad_spans_and_map_store_trouble(store):
    with pytest.raises(InvalidInput):
        readings(store).series(10, 60)

    class Down(MemoryTelemetry):
        def hashes(self, keys):
            raise StoreUnavailable("down")

    with pytest.raises(ControlUnavailable):
        readings(store, Down()).series(60, 10)
    series = readings(store).series(600, 60)
    assert len(series["starts"]) in (10, 11) and set(series["arms"]) == {"baseline", "optimized"}


def test_status_and_series_say_whether_cost_is_priced(store):
    """Without CANARY_DEVICE_HOUR_PRICE every cost reads 0: the payloads carry the price (0:
    not set) so the page can say so instead of charting a flat 0."""
    unpriced = readings(store)
    assert unpriced.series(600, 60)["device_hour_price"] == 0
    assert unpriced.status()["device_hour_price"] == 0
    priced = Readings(StateSettings(app_name="unit"), TelemetrySettings(device_hour_price=3.6),
                      store, MemoryTelemetry(), clock=FakeClock(START))
    assert priced.series(600, 60)["device_hour_price"] == 3.6
    assert priced.status()["device_hour_price"] == 3.6


def test_the_operator_token_setting_is_secret_and_not_trivially_short(monkeypatch):
    monkeypatch.setenv("CANARY_OPERATOR_TOKEN", "from-the-environment-0123")
    settings = Settings()
    assert settings.operator_token.get_secret_value() == "from-the-environment-0123"
    assert "from-the-environment" not in repr(settings) + str(settings.model_dump())
    assert Settings(operator_token=None).operator_token is None
    with pytest.raises(ValueError):
        Settings(operator_token="short")
