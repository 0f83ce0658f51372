"""The dashboard's JSON API and actions over real HTTP, against the session gateway (real Ray
Serve, TLS + ACL Redis; the gateway reads as its read-mostly user and acts through the control
connection)."""

from __future__ import annotations

import io
import json
import time

import pytest

from ops.cli import main
from rollout import bucket_of
from tests.serve_app import OPERATOR_TOKEN

AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def post(gw, kind: str, body, headers=AUTH):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return gw.client.post(f"/v1/rollout/{kind}", content=content,
                          headers={"Content-Type": "application/json", **headers})


def wait_for(fetch, check, timeout: float = 15.0):
    """Poll `fetch()` until `check(result)` holds (bounded: telemetry lands through sinks)."""
    deadline = time.monotonic() + timeout
    while True:
        result = fetch()
        if check(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {result}")
        time.sleep(0.1)


def test_page_and_assets_are_served_with_a_strict_policy(gw):
    page = gw.client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    # assets relative to the page: under a route prefix they come from the same application
    assert '"dashboard/static/app.js"' in page.text and "http" not in page.text.split("<body>")[0]
    for name, kind in (("app.js", "javascript"), ("charts.js", "javascript"), ("style.css", "css")):
        asset = gw.client.get(f"/dashboard/static/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
    for bad in ("index.py", "..%2Froutes.py", "missing.js"):
        missing = gw.client.get(f"/dashboard/static/{bad}")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


def test_status_is_what_the_cli_shows_plus_the_replica_routing(gw, monkeypatch):
    for i in range(6):
        assert gw.predict([f"status {i}"]).status_code == 200
    status = wait_for(lambda: gw.client.get("/v1/status").json(),
                      lambda s: (s["traffic"]["arms"]["baseline"]["requests"] or 0) >= 6)
    monkeypatch.setenv("REDIS_URL", gw.redis.url)
    monkeypatch.setenv("CANARY_APP_NAME", gw.settings.app_name)
    out, err = io.StringIO(), io.StringIO()
    assert main(["status", "--json"], stdout=out, stderr=err) == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    for key in ("revision", "canary_bp", "kill", "canary_percent", "effective_percent",
                "optimized_version"):
        assert status[key] == doc[key], key
    assert [g["gateway"] for g in status["gateways"]] == [g["gateway"] for g in doc["gateways"]]
    # the serving replica reports; replicas replaced by earlier redeploys are flagged silent
    assert any(g["silent"] is False and g["version_mismatch"] is False
               for g in status["gateways"])
    assert set(status["traffic"]["arms"]) == set(doc["traffic"]["arms"]) == {"baseline",
                                                                              "optimized"}
    assert status["routing"]["routing"] == "0% to optimized" and status["actions"] is True


def test_series_chart_the_last_hour_per_step(gw):
    for i in range(5):
        assert gw.predict([f"series {i}"]).status_code == 200
    series = wait_for(lambda: gw.client.get("/v1/series?last_s=600&step_s=10").json(),
                      lambda s: sum(s["arms"]["baseline"]["requests"][-3:]) >= 5)
    assert series["step_s"] == 10 and len(series["starts"]) in (60, 61)
    assert all(b - a == 10 for a, b in zip(series["starts"], series["starts"][1:], strict=False))
    baseline = series["arms"]["baseline"]
    assert max(v for v in baseline["request_rate"] if v is not None) > 0
    assert any(v is not None for v in baseline["p99_ms"])
    assert set(baseline) >= {"error_rate", "timeout_rate", "p50_ms", "queue_mean", "batch_mean",
                             "cost_per_1k"}
    default = gw.client.get("/v1/series").json()
    assert default["last_s"] == 3600 and default["step_s"] == 60


@pytest.mark.parametrize("query", ["last_s=abc", "step_s=0", "last_s=10&step_s=60",
                                   "last_s=86400&step_s=1", "last_s=-5", "last_s=99999999999"])
def test_bad_series_queries_are_422(gw, query):
    reply = gw.client.get(f"/v1/series?{query}")
    assert reply.status_code == 422 and reply.json()["error"]["type"] == "invalid_input"


def test_traces_list_and_one_trace(gw):
    reply = gw.predict(["trace me"])
    rid = reply.headers["x-request-id"]
    store = gw.telemetry()
    try:
        trace_id, _ = gw.wait_for_trace(store, rid, "POST /v1/predict", "model.predict")
    finally:
        store.close()
    listed = wait_for(lambda: gw.client.get("/v1/traces?last=50").json()["traces"],
                      lambda ts: any(t["trace_id"] == trace_id for t in ts))
    assert any(t["request_id"] == rid for t in listed)
    spans = gw.client.get(f"/v1/traces/{trace_id}").json()["spans"]
    names = {s["name"] for s in spans}
    assert {"POST /v1/predict", "route", "model.call", "model.predict"} <= names
    assert gw.client.get("/v1/traces/" + "0" * 32).status_code == 404
    bad = gw.client.get("/v1/traces/not-a-trace")
    assert bad.status_code == 422
    assert gw.client.get("/v1/traces?last=0").status_code == 422


def ramp_doc(gw) -> dict:
    return gw.client.get("/v1/ramp").json()


def test_the_ramp_is_what_the_cli_shows_with_gates_against_thresholds(gw, dashboard_ramp):
    doc = wait_for(lambda: ramp_doc(gw), lambda d: d["ramp"] and d["ramp"]["step"] == 0
                   and d["last_evaluation"])
    canary_keys = [k for k in (f"ramp-{i}" for i in range(200)) if bucket_of(k) < 1_000][:4]
    for key in canary_keys:  # the canary's samples for the gates (10 %: these keys)
        assert gw.predict(["ramp traffic"], **{"X-Routing-Key": key}).headers[
            "x-canary-arm"] == "optimized"
    doc = wait_for(lambda: ramp_doc(gw), lambda d: any(
        g["name"] == "p99_ms" and g["status"] in ("pass", "fail")
        for g in d["last_evaluation"]["gates"]))
    assert doc["active"] is True and doc["ramp"]["status"] == "running"
    assert [s["percent"] for s in doc["ramp"]["plan"]["steps"]] == [10, 100]
    p99 = next(g for g in doc["last_evaluation"]["gates"] if g["name"] == "p99_ms")
    assert p99["threshold"] == 4000 and p99["value"] is not None
    assert doc["controller"]  # the in-app controller holds the lease
    assert gw.rollout().state().canary_bp == 1_000


def test_ramp_actions_need_the_token_and_a_ramp_that_allows_them(gw, dashboard_ramp):
    reply = gw.client.post("/v1/ramp/pause", json={"reason": "no token"})
    assert reply.status_code == 401
    assert gw.client.post("/v1/ramp/promote", json={"reason": "x"}, headers=AUTH).status_code \
        == 404
    for bad in ({"reason": ""}, {"reason": "x", "confirm": True}, {"reason": "x", "step": 2}):
        assert gw.client.post("/v1/ramp/pause", json=bad, headers=AUTH).status_code == 422
    refused = gw.client.post("/v1/ramp/resume", json={"reason": "not paused"}, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "ramp_not_allowed"
    paused = gw.client.post("/v1/ramp/pause", json={"reason": "look first", "actor": "carol"},
                            headers=AUTH)
    assert paused.status_code == 200 and paused.json()["ramp"]["status"] == "paused"
    approved = gw.client.post("/v1/ramp/approve", json={"reason": "fine"}, headers=AUTH)
    assert approved.status_code == 200 and approved.json()["ramp"]["approved"] == [1]
    aborted = gw.client.post("/v1/ramp/abort", json={"reason": "enough"}, headers=AUTH)
    assert aborted.status_code == 200 and aborted.json()["ramp"]["status"] == "aborted"
    assert gw.rollout().state().canary_bp == 0
    again = gw.client.post("/v1/ramp/abort", json={"reason": "twice"}, headers=AUTH)
    assert again.status_code == 409
    actions = [e["action"] for e in gw.client.get("/v1/audit?last=10").json()["entries"]]
    assert "ramp-pause" in actions and "ramp-abort" in actions
    entry = next(e for e in gw.client.get("/v1/audit?last=10").json()["entries"]
                 if e["action"] == "ramp-pause")
    assert entry["actor"].startswith("dashboard:carol@")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0123456789"},
                                     {"Authorization": f"Basic {OPERATOR_TOKEN}"},
                                     {"Authorization": "Bearer"}])
def test_actions_without_the_token_are_refused_and_change_nothing(gw, headers):
    before = gw.served_state()["state"]["revision"]
    reply = post(gw, "kill", {"reason": "no token"}, headers=headers)
    assert reply.status_code == 401 and reply.json()["error"]["type"] == "unauthorized"
    assert OPERATOR_TOKEN not in reply.text
    assert gw.rollout().state().revision == before


@pytest.mark.parametrize("kind, body, status", [
    ("canary", b"not json", 422),
    ("canary", {"percent": "5"}, 422),  # no reason
    ("canary", {"percent": "5", "reason": "   "}, 422),
    ("canary", {"percent": "5.001", "reason": "too fine"}, 422),
    ("canary", {"percent": "101", "reason": "too much"}, 422),
    ("canary", {"percent": True, "reason": "a bool"}, 422),
    ("canary", {"percent": "5", "reason": "x", "extra": 1}, 422),
    ("canary", {"percent": "5", "reason": "x", "actor": "<script>"}, 422),
    ("kill", [], 422),
    ("kill", {"reason": "x" * 5000}, 413),
    ("promote", {"reason": "no such action"}, 404),
])
def test_bad_actions_are_4xx_and_change_nothing(gw, kind, body, status):
    before = gw.rollout().state().revision
    reply = post(gw, kind, body)
    assert reply.status_code == status, reply.text
    assert set(reply.json()["error"]) == {"type", "message", "request_id"}
    assert gw.rollout().state().revision == before


def test_share_change_with_confirmation_conflict_and_audit(gw):
    state = gw.rollout().state()
    small = post(gw, "canary", {"percent": "5", "reason": "first 5", "actor": "alice",
                                "expected_revision": state.revision})
    assert small.status_code == 200 and small.json()["changed"] is True
    after = small.json()["state"]
    assert after["canary_bp"] == 500 and after["updated_by"].startswith("dashboard:alice@")
    stale = post(gw, "canary", {"percent": "10", "reason": "stale view",
                                "expected_revision": state.revision})
    assert stale.status_code == 409 and stale.json()["error"]["type"] == "revision_conflict"
    big = {"percent": "100", "reason": "all in", "expected_revision": after["revision"]}
    asked = post(gw, "canary", big)
    assert asked.status_code == 428 and "5% to 100%" in asked.json()["error"]["message"]
    assert gw.rollout().state().canary_bp == 500
    confirmed = post(gw, "canary", {**big, "confirm": True})
    assert confirmed.status_code == 200 and confirmed.json()["state"]["canary_bp"] == 10_000
    same = post(gw, "canary", {"percent": 100, "reason": "again"})
    assert same.status_code == 200 and same.json()["changed"] is False
    entries = wait_for(lambda: gw.client.get("/v1/audit?last=5").json()["entries"],
                       lambda es: es and es[0]["revision"] == confirmed.json()["state"]["revision"])
    assert entries[0]["action"] == "canary 5% -> 100%" and entries[0]["reason"] == "all in"
    assert entries[1]["actor"].startswith("dashboard:alice@")


def test_kill_flips_routing_and_unkill_asks_first(gw):
    gw.set_state(canary_bp=10_000)
    assert gw.predict(["to the canary"]).headers["x-canary-arm"] == "optimized"
    killed = post(gw, "kill", {"reason": "drill from the page"})
    assert killed.status_code == 200 and killed.json()["state"]["kill"] is True
    served = gw.wait_for_revision(killed.json()["state"]["revision"])
    assert served["effective_percent"] == 0
    assert gw.predict(["after the kill"]).headers["x-canary-arm"] == "baseline"
    revision = killed.json()["state"]["revision"]
    asked = post(gw, "unkill", {"reason": "back", "expected_revision": revision})
    assert asked.status_code == 428
    done = post(gw, "unkill", {"reason": "back", "expected_revision": revision, "confirm": True})
    assert done.status_code == 200 and done.json()["state"]["kill"] is False
    again = post(gw, "unkill", {"reason": "twice"})
    assert again.status_code == 200 and again.json()["changed"] is False
