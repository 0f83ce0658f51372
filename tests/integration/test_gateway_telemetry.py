"""Telemetry of the real Serve app: one trace across the gateway and model replica processes,
the fallback in the same trace, metric values after a known sequence, and the CLI views."""

from __future__ import annotations

import io
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ops import cli
from rollout.telemetry.windows import telemetry_prefix

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def scrape(gw) -> dict[tuple, float]:
    """GET /metrics as {(sample name, labels without otel_scope_*): value}."""
    response = gw.client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                  if not k.startswith("otel_scope")))
            samples[(sample.name, labels)] = sample.value
    return samples


def delta(before, after, name, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_one_request_is_one_trace_across_gateway_and_model_replica(gw):
    response = gw.predict(["trace me", "twice"], **{
        "X-Request-ID": "trace-req-1", "traceparent": f"00-{TRACE}-{PARENT}-01"})
    assert response.status_code == 200
    store = gw.telemetry()
    try:
        trace_id, spans = gw.wait_for_trace(
            store, "trace-req-1", "POST /v1/predict", "model.predict", "forward")
    finally:
        store.close()
    assert trace_id == TRACE
    assert {span["trace_id"] for span in spans} == {TRACE}
    assert {span["service"] for span in spans} == {"canary-gateway", "canary-model"}
    by_name = {span["name"]: span for span in spans}
    assert set(by_name) == {"POST /v1/predict", "route", "model.call", "model.predict",
                            "preprocess", "queue", "batch", "forward", "postprocess"}
    root = by_name["POST /v1/predict"]
    assert root["parent_id"] == PARENT  # the caller's span
    assert root["attrs"]["http.response.status_code"] == 200
    assert root["attrs"]["canary.items"] == 2
    assert by_name["model.predict"]["parent_id"] == by_name["model.call"]["span_id"]
    assert by_name["forward"]["parent_id"] == by_name["batch"]["span_id"]
    assert by_name["batch"]["attrs"]["canary.batch.requests"] >= 1
    assert by_name["route"]["attrs"]["canary.arm"] == "baseline"
    assert by_name["route"]["attrs"]["canary.state_revision"] >= 1
    # the replica's spans lie inside the gateway's call, across processes
    assert root["start"] <= by_name["model.predict"]["start"]
    assert by_name["model.predict"]["end"] <= root["end"] + 0.005


def test_known_sequence_gives_known_metrics_windows_and_a_fallback_trace(gw):
    """Prometheus counters live in the gateway process, and a redeploy replaces it: each
    phase is compared within one deployment. The Redis windows see the whole sequence."""
    store = gw.telemetry()
    client = store._client
    try:
        # phase 1: the canary is broken; 3 answers on baseline, a 422, a fallback
        gw.redeploy({"optimized": {"fault_error": True}})
        for key in client.scan_iter(f"{telemetry_prefix(gw.settings.app_name)}win:*"):
            client.delete(key)
        before = scrape(gw)
        for i in range(3):
            assert gw.predict([f"fine {i}"]).status_code == 200
        assert gw.client.post("/v1/predict", json={"inputs": []}).status_code == 422
        gw.set_state(canary_bp=10_000)
        fallback = gw.predict(["falls back"], **{"X-Request-ID": "fallback-1"})
        assert fallback.status_code == 200 and fallback.json()["fallback"] is True
        after = scrape(gw)
        requests = "canary_requests_total"
        native = {"protocol": "native"}  # every request here came through POST /v1/predict
        assert delta(before, after, requests, arm="baseline", status="200", outcome="ok",
                     **native) == 3
        assert delta(before, after, requests, arm="optimized", status="200", outcome="ok",
                     **native) == 1
        assert delta(before, after, requests, arm="none", status="422",
                     outcome="invalid_input", **native) == 1
        calls = "canary_model_calls_total"
        assert delta(before, after, calls, arm="baseline", outcome="ok") == 4
        assert delta(before, after, calls, arm="optimized", outcome="error") == 1
        assert delta(before, after, "canary_retries_total", arm="optimized") == 1
        assert delta(before, after, "canary_fallbacks_total", arm="optimized") == 1
        assert delta(before, after, "canary_batch_size_count", arm="baseline") == 4
        assert delta(before, after, "canary_stage_duration_milliseconds_count", arm="baseline",
                     stage="forward") == 4
        assert delta(before, after, "canary_compute_time_seconds_total", arm="baseline") > 0
        assert delta(before, after, "canary_cost_total", arm="baseline") > 0

        # phase 2: baseline is too slow; one request times out
        gw.redeploy({"baseline": {"fault_delay_ms": 8_000}})
        gw.set_state(canary_bp=0)
        before = scrape(gw)
        assert gw.predict(["too slow"]).status_code == 504
        after = scrape(gw)
        assert delta(before, after, requests, arm="baseline", status="504",
                     outcome="timeout", **native) == 1
        assert delta(before, after, calls, arm="baseline", outcome="timeout") == 1
        assert delta(before, after, "canary_request_duration_milliseconds_count",
                     arm="baseline", status="504") == 1
        assert after[("canary_inflight", (("arm", "baseline"),))] == 0

        # the same sequence in the Redis windows (what `rollout status` and ramp gates read)
        windows = gw.windows(store)
        deadline = time.monotonic() + 15
        while windows.arm("baseline", 120).requests < 4:
            assert time.monotonic() < deadline, windows.arm("baseline", 120)
            time.sleep(0.05)
        stats = windows.arms(120)
        base, opt = stats["baseline"], stats["optimized"]
        assert (base.requests, base.calls) == (4, 5)
        assert base.success_rate == pytest.approx(3 / 4)
        assert base.timeout_rate == pytest.approx(1 / 5)
        assert base.statuses == {"200": 3, "504": 1}
        assert base.batch_mean >= 1 and base.compute_ms > 0 and base.cost_per_1k > 0
        assert (opt.requests, opt.calls, opt.fallbacks) == (1, 1, 1)
        assert opt.error_rate == 1.0 and opt.retry_rate == 1.0 and opt.success_rate == 1.0

        # the retry on baseline is in the request's trace, after the failed canary call
        _, spans = gw.wait_for_trace(store, "fallback-1", "model.call", "forward")
        calls = sorted((s for s in spans if s["name"] == "model.call"),
                       key=lambda s: s["attrs"]["canary.attempt"])
        assert [(c["attrs"]["canary.arm"], c["attrs"]["canary.outcome"]) for c in calls] == [
            ("optimized", "error"), ("baseline", "ok")]
        failed = [s for s in spans if s["name"] == "model.predict" and s["status"] == "error"]
        assert failed and failed[0]["attrs"]["canary.arm"] == "optimized"
    finally:
        store.close()


def _cli(gw, *argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--app", gw.settings.app_name, "--redis-url", gw.redis.url,
                     *argv], stdout=out, stderr=err)
    assert err.getvalue() == "", err.getvalue()
    return code, out.getvalue()


def test_rollout_status_and_traces_read_the_gateways_telemetry(gw):
    assert gw.predict(["for the cli"], **{"X-Request-ID": "cli-req-1"}).status_code == 200
    store = gw.telemetry()
    try:
        gw.wait_for_trace(store, "cli-req-1", "POST /v1/predict", "forward")
    finally:
        store.close()
    code, out = _cli(gw, "status", "--window", "300")
    assert code == 0
    assert "traffic over the last 300s:" in out
    assert any(line.startswith("baseline ") and "%" in line for line in out.splitlines())
    code, out = _cli(gw, "traces", "--last", "50")
    assert code == 0 and "cli-req-1" in out
    code, out = _cli(gw, "traces", "--request-id", "cli-req-1")
    assert code == 0
    assert "POST /v1/predict" in out and "`- model.predict" in out.replace("|- model", "`- model")
    assert "canary-model" in out
