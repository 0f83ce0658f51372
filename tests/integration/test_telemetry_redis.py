"""The embedded telemetry store against a real Redis: spans through the sink, windows, bounds,
and a Redis outage that costs telemetry, never the caller."""

from __future__ import annotations

import time

import pytest
from opentelemetry.trace import SpanKind

from rollout import Attempt, FakeClock, RequestRecord, Settings, Traces, Windows, open_telemetry
from rollout.shadow import PairOutcome, ShadowItem, shadow_fields, shadow_key
from rollout.telemetry.redis_store import RedisTelemetry, WindowItem
from rollout.telemetry.traces import index_key
from serve.telemetry.otel import Telemetry

APP = "telemetry-itest"


def settings(url: str, **overrides) -> Settings:
    return Settings(**{"redis_url": url, "app_name": APP, "telemetry_flush_s": 0.05,
                       "trace_sample_ratio": 1.0, **overrides})


def test_spans_go_through_the_sink_into_redis_and_read_back_as_a_trace(redis_url):
    config = settings(redis_url)
    telemetry = Telemetry(config, config, "canary-gateway", environ={})
    tracer = telemetry.tracer
    root = tracer.start_span("POST /v1/predict", kind=SpanKind.SERVER, attributes={
        "canary.request_id": "req-redis", "canary.arm": "baseline",
        "http.response.status_code": 200})
    from opentelemetry import trace

    child = tracer.start_span("route", context=trace.set_span_in_context(root),
                              attributes={"canary.bucket": 42})
    child.end()
    root.end()
    telemetry.flush()
    trace_id = format(root.get_span_context().trace_id, "032x")
    config = settings(redis_url)
    store = open_telemetry(config, config)
    try:
        traces = Traces(store)
        [summary] = traces.recent(10)
        assert summary.trace_id == trace_id and summary.request_id == "req-redis"
        assert summary.status == 200 and summary.spans == 2 and summary.root == "POST /v1/predict"
        found_id, spans = traces.by_request("req-redis")
        assert found_id == trace_id
        assert [s["name"] for s in spans] == ["POST /v1/predict", "route"]
        assert spans[1]["parent_id"] == spans[0]["span_id"]
        assert spans[1]["attrs"] == {"canary.bucket": 42}
        assert spans[0]["service"] == "canary-gateway"
    finally:
        store.close()
        telemetry.shutdown()


def test_windows_written_through_the_sink_read_back_per_arm(redis_url):
    config = settings(redis_url)
    store = open_telemetry(config, config)
    now = time.time()
    ok = Attempt("baseline", "ok", {"forward": 3.0}, 2, 0, 0.003, 0.001)
    items = [WindowItem(now, RequestRecord("baseline", 200, 12.0, 1, 4, (ok,)))
             for _ in range(4)]
    items.append(WindowItem(now, RequestRecord("optimized", 200, 30.0, 1, 4,
                                               (Attempt("optimized", "timeout"), ok))))
    store.write(items)
    try:
        stats = Windows(store, APP, clock=FakeClock(now)).arms(10)
        assert stats["baseline"].requests == 4 and stats["baseline"].calls == 5
        assert stats["baseline"].batch_mean == 2.0
        assert stats["baseline"].cost_per_1k == pytest.approx(1.0)
        assert stats["optimized"].requests == 1 and stats["optimized"].timeout_rate == 1.0
        assert stats["optimized"].retry_rate == 1.0
        key = f"rollout:{APP}:telemetry:win:baseline:{int(now)}"
        ttl = store._client.ttl(key)
        assert 0 < ttl <= 3600
    finally:
        store.close()


def test_shadow_counters_written_with_windows_read_back_as_online_agreement(redis_url):
    config = settings(redis_url)
    store = open_telemetry(config, config)
    now = time.time()
    ok = Attempt("baseline", "ok", {"forward": 3.0}, 2, 0, 0.003, 0.001)
    pairs = [PairOutcome(True, 0.2)] * 7 + [PairOutcome(False, 0.001)]
    items = [WindowItem(now, RequestRecord("baseline", 200, 12.0, 1, 4, (ok,))),
             ShadowItem(now, shadow_fields(pairs, calls=2)),
             ShadowItem(now - 1, shadow_fields([PairOutcome(cosine=0.9999)] * 3, calls=1)),
             ShadowItem(now, shadow_fields(shed=1))]
    store.write(items)
    try:
        windows = Windows(store, APP, clock=FakeClock(now))
        stats = windows.shadow(10)
        assert (stats.pairs, stats.agreed, stats.calls, stats.shed) == (8, 7, 3, 1)
        assert stats.by_margin["0-0.005"] == (0, 1)
        assert stats.cosine_n == 3 and stats.cosine_mean == pytest.approx(0.9999)
        assert windows.arms(10)["baseline"].calls == 1  # shadow counters stay out of the arms
        ttl = store._client.ttl(shadow_key(APP, int(now)))
        assert 0 < ttl <= 3600
    finally:
        store.close()


def test_the_trace_index_and_each_trace_are_bounded(redis_url):
    store = RedisTelemetry(redis_url, APP, max_traces=10, trace_ttl_s=60)
    try:
        spans = [{"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_id": None,
                  "name": "POST /v1/predict", "service": "t", "start": 1000.0 + i,
                  "end": 1000.5 + i, "status": "ok", "error": None, "attrs": {}}
                 for i in range(25)]
        store.write(spans)
        ids = store.recent_ids(100)
        assert len(ids) == 10 and ids[0] == f"{24:032x}" and ids[-1] == f"{15:032x}"
        assert store._client.zcard(index_key(APP)) == 10
        assert 0 < store._client.ttl(f"rollout:{APP}:telemetry:trace:{24:032x}") <= 60
    finally:
        store.close()


def test_redis_down_drops_and_counts_but_never_fails_the_caller(redis_server, redis_url):
    state = settings(redis_url, redis_timeout_s=0.5)
    telemetry = Telemetry(state, state, "canary-gateway", environ={})
    try:
        redis_server.stop()
        for _ in range(20):  # ending a span only queues it: no Redis call, no exception
            span = telemetry.tracer.start_span("POST /v1/predict")
            span.end()
        telemetry.sink.close()  # stop the thread, then one last (failing) write
        assert telemetry.dropped()["redis:error"] == 20
        assert telemetry.sink.written == 0
    finally:
        redis_server.start()
        telemetry.shutdown()
