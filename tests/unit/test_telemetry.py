"""Gateway and model-replica telemetry through the SDK's in-memory exporter and reader:
spans and their tree, one trace across both sides, sampling, metrics, the JSON log line."""

from __future__ import annotations

import dataclasses
import io
import json
import time

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rollout import FakeClock, RolloutState, Settings, StateView, decide
from rollout.settings import TelemetrySettings
from rollout.telemetry.redis_store import WindowItem
from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.common.errors import ModelFailed, ModelTimeout
from serve.telemetry.observe import NULL_OBSERVATION, Observer
from serve.telemetry.otel import Telemetry, otlp_endpoints
from serve.telemetry.tracing import Marks, WallClock, record_model_spans

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
INCOMING = {"traceparent": f"00-{TRACE}-{PARENT}-01"}
ANSWER = ModelAnswer(arm="baseline", model_version="fp32-test", outputs=[], tokens=0,
                     batch=BatchShape(requests=2, items=4), queue=3,
                     timing=StageTiming(preprocess=1.0, queue=2.0, model=8.0, postprocess=0.5))


class Store:
    """Stands in for the Redis writer: keeps what the sink hands it."""

    def __init__(self):
        self.items = []

    def write(self, items):
        self.items.extend(items)


class Rig:
    def __init__(self, **overrides):
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.store = Store()
        self.log = io.StringIO()
        self.settings = Settings(**{"device_hour_price": 3.6, "trace_sample_ratio": 1.0,
                                    **overrides})
        self.gateway = Telemetry(self.settings, self.settings, "canary-gateway", request_log=True,
                                 span_exporters=[self.spans], metric_readers=[self.reader],
                                 store=self.store, log_stream=self.log, environ={})
        self.model = Telemetry(self.settings, self.settings, "canary-model",
                               span_exporters=[self.spans], store=self.store, environ={})
        self.observer = Observer(self.gateway, clock=FakeClock(1_700_000_000.0))

    def flush(self):
        self.gateway.flush()
        self.model.flush()

    def close(self):
        self.gateway.shutdown()
        self.model.shutdown()

    def by_name(self):
        return {span.name: span for span in self.spans.get_finished_spans()}

    def metrics(self) -> dict[tuple, float]:
        """(metric, sorted attributes) -> value (counters: sum; histograms: count)."""
        out = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        key = (metric.name, tuple(sorted(point.attributes.items())))
                        out[key] = getattr(point, "value", None)
                        if out[key] is None:
                            out[key] = point.count
        return out


@pytest.fixture
def rig():
    rig = Rig()
    yield rig
    rig.close()


def route(obs, canary_bp=10_000, kill=False):
    view = StateView(RolloutState(canary_bp=canary_bp, kill=kill, revision=7), 0.1, False, None,
                     True)
    obs.route(decide(view.state, "user-1"), view, time.perf_counter())


def model_side(rig, carrier, *, error=None):
    p = time.perf_counter()
    marks = Marks(p, p + 0.001, p + 0.002, p + 0.0025, p + 0.006, p + 0.0061, p + 0.007)
    if error is not None:
        marks.post_start = marks.done = 0.0
    record_model_spans(rig.model.tracer, carrier, WallClock(), marks, {"canary.arm": "baseline"},
                       queue_length=3, batch={"requests": 2, "items": 4, "id": 9}, error=error)


def test_one_trace_across_gateway_and_model_continuing_the_incoming_traceparent(rig):
    obs = rig.observer.start("req-1", INCOMING)
    obs.parsed(["hello", "world!"], "classify")
    route(obs, canary_bp=0)
    with obs.call("baseline") as call:
        model_side(rig, call.carrier)
        call.answered(ANSWER)
    obs.finish(200, arm="baseline", gateway_ms=1.0)
    rig.flush()
    spans = rig.by_name()
    assert set(spans) == {"POST /v1/predict", "route", "model.call", "model.predict",
                          "preprocess", "queue", "batch", "forward", "postprocess"}
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {TRACE}
    parent_of = {name: format(s.parent.span_id, "016x") for name, s in spans.items()}
    span_id = {name: format(s.context.span_id, "016x") for name, s in spans.items()}
    assert parent_of["POST /v1/predict"] == PARENT
    assert parent_of["route"] == parent_of["model.call"] == span_id["POST /v1/predict"]
    assert parent_of["model.predict"] == span_id["model.call"]
    for stage in ("preprocess", "queue", "batch", "postprocess"):
        assert parent_of[stage] == span_id["model.predict"]
    assert parent_of["forward"] == span_id["batch"]
    route_attrs = spans["route"].attributes
    assert route_attrs["canary.arm"] == "baseline" and route_attrs["canary.reason"] == "share"
    assert route_attrs["canary.state_revision"] == 7 and route_attrs["canary.kill"] is False
    assert 0 <= route_attrs["canary.bucket"] < 10_000
    assert spans["batch"].attributes["canary.batch.requests"] == 2
    assert spans["queue"].attributes["canary.queue.length"] == 3
    root = spans["POST /v1/predict"].attributes
    assert root["http.response.status_code"] == 200 and root["canary.request_id"] == "req-1"
    assert root["canary.items"] == 2 and root["canary.chars"] == 11
    # the stage spans sit inside their parent in time
    assert spans["model.predict"].start_time <= spans["preprocess"].start_time
    assert spans["forward"].end_time <= spans["model.predict"].end_time


def test_a_retry_on_baseline_is_a_second_model_call_in_the_same_trace(rig):
    obs = rig.observer.start("req-2", {})
    obs.parsed(["x"], "classify")
    route(obs)
    with pytest.raises(ModelFailed), obs.call("optimized"):
        raise ModelFailed("the optimized model failed")
    with obs.call("baseline") as call:
        call.answered(ANSWER)
    obs.finish(200, arm="baseline", fallback=True)
    rig.flush()
    calls = [s for s in rig.spans.get_finished_spans() if s.name == "model.call"]
    assert [(c.attributes["canary.arm"], c.attributes["canary.attempt"],
             c.attributes["canary.outcome"]) for c in calls] == [
        ("optimized", 1, "error"), ("baseline", 2, "ok")]
    assert calls[0].status.status_code.name == "ERROR"
    assert len({s.context.trace_id for s in rig.spans.get_finished_spans()}) == 1
    root = rig.by_name()["POST /v1/predict"].attributes
    assert root["canary.fallback"] is True and root["canary.routed_arm"] == "optimized"


def test_a_failed_model_call_still_records_the_replica_spans_with_the_error(rig):
    obs = rig.observer.start("req-3", {})
    with pytest.raises(ModelFailed), obs.call("baseline") as call:
        model_side(rig, call.carrier, error=RuntimeError("injected fault"))
        raise ModelFailed("boom")
    rig.flush()
    predict = rig.by_name()["model.predict"]
    assert predict.status.status_code.name == "ERROR"
    assert predict.attributes["error.type"] == "RuntimeError"
    assert "postprocess" not in rig.by_name()


def test_metrics_after_a_known_sequence_of_requests(rig):
    for i in range(3):
        obs = rig.observer.start(f"ok-{i}", {})
        obs.parsed(["a"], "classify")
        route(obs, canary_bp=0)
        with obs.call("baseline") as call:
            call.answered(ANSWER)
        obs.finish(200, arm="baseline", gateway_ms=1.5)
    obs = rig.observer.start("timeout", {})
    route(obs, canary_bp=0)
    with pytest.raises(ModelTimeout), obs.call("baseline"):
        raise ModelTimeout("slow")
    obs.finish(504, error_type="timeout")
    obs = rig.observer.start("fallback", {})
    obs.parsed(["b"], "classify")
    route(obs)
    with pytest.raises(ModelFailed), obs.call("optimized"):
        raise ModelFailed("boom")
    with obs.call("baseline") as call:
        call.answered(ANSWER)
    obs.finish(200, arm="baseline", fallback=True)
    rig.observer.start("bad", {}).finish(422, error_type="invalid_input")

    m = rig.metrics()
    req = "canary.requests"

    def requests(arm, outcome, status):  # every request here came through the native door
        return m[(req, (("arm", arm), ("outcome", outcome), ("protocol", "native"),
                        ("status", status)))]

    assert requests("baseline", "ok", "200") == 3
    assert requests("baseline", "timeout", "504") == 1
    assert requests("optimized", "ok", "200") == 1
    assert requests("none", "invalid_input", "422") == 1
    calls = "canary.model.calls"
    assert m[(calls, (("arm", "baseline"), ("outcome", "ok")))] == 4
    assert m[(calls, (("arm", "baseline"), ("outcome", "timeout")))] == 1
    assert m[(calls, (("arm", "optimized"), ("outcome", "error")))] == 1
    assert m[("canary.retries", (("arm", "optimized"),))] == 1
    assert m[("canary.fallbacks", (("arm", "optimized"),))] == 1
    assert m[("canary.inflight", (("arm", "baseline"),))] == 0
    assert m[("canary.batch.size", (("arm", "baseline"),))] == 4  # histogram count
    assert m[("canary.stage.duration", (("arm", "baseline"), ("stage", "forward")))] == 4
    assert m[("canary.stage.duration", (("arm", "baseline"), ("stage", "gateway")))] == 3
    assert m[("canary.request.duration", (("arm", "baseline"), ("status", "504")))] == 1
    # each answered call: 8 ms forward, 1 of the batch's 4 items -> 2 ms; at 3.6 per hour
    assert m[("canary.compute.time", (("arm", "baseline"),))] == pytest.approx(4 * 0.002)
    assert m[("canary.cost", (("arm", "baseline"),))] == pytest.approx(4 * 0.002 * 3.6 / 3600)
    # the windows got every routed request, not the refused one
    rig.flush()
    windows = [i for i in rig.store.items if isinstance(i, WindowItem)]
    assert [w.record.status for w in windows] == [200, 200, 200, 504, 200]


def test_one_json_log_line_per_request(rig):
    obs = rig.observer.start("req-log", INCOMING)
    obs.parsed(["abc", "de"], "embed")
    route(obs)
    with obs.call("optimized") as call:
        call.answered(dataclasses.replace(ANSWER, arm="optimized"))
    obs.finish(200, arm="optimized")
    rig.observer.start("req-bad", {}).finish(413, error_type="input_too_large")
    rig.flush()
    lines = [json.loads(line) for line in rig.log.getvalue().splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert first["request_id"] == "req-log" and first["trace_id"] == TRACE
    assert (first["arm"], first["items"], first["chars"], first["task"]) == ("optimized", 2, 5,
                                                                             "embed")
    assert first["status"] == 200 and first["error_type"] is None and first["latency_ms"] >= 0
    assert second["status"] == 413 and second["error_type"] == "input_too_large"
    assert second["arm"] is None and len(second["trace_id"]) == 32


def test_sampling_ratio_zero_records_no_spans_but_keeps_metrics_and_trace_ids():
    rig = Rig(trace_sample_ratio=0.0)
    try:
        obs = rig.observer.start("req-unsampled", {})
        route(obs, canary_bp=0)
        with obs.call("baseline") as call:
            model_side(rig, call.carrier)
            call.answered(ANSWER)
        obs.finish(200, arm="baseline")
        rig.flush()
        assert rig.spans.get_finished_spans() == ()
        assert len(obs.trace_id) == 32 and obs.trace_id != "0" * 32
        assert rig.metrics()[("canary.model.calls", (("arm", "baseline"), ("outcome", "ok")))] == 1
    finally:
        rig.close()


def test_an_incoming_sampled_trace_is_followed_even_at_ratio_zero():
    rig = Rig(trace_sample_ratio=0.0)
    try:
        rig.observer.start("req-followed", INCOMING).finish(200)
        rig.flush()
        assert [s.name for s in rig.spans.get_finished_spans()] == ["POST /v1/predict"]
    finally:
        rig.close()


def test_telemetry_off_observes_nothing():
    settings = Settings(telemetry_enabled=False)
    telemetry = Telemetry(settings, settings, "canary-gateway", prometheus=True, request_log=True)
    assert telemetry.sink is None and telemetry.request_log is None
    assert Observer(telemetry).start("req", INCOMING) is NULL_OBSERVATION
    assert NULL_OBSERVATION.call("baseline").carrier is None
    assert telemetry.prometheus_text() == b""


def test_otlp_is_enabled_only_by_an_endpoint_variable():
    assert otlp_endpoints({}) == {}
    assert otlp_endpoints({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == {
        "traces": "http://c:4318/v1/traces", "metrics": "http://c:4318/v1/metrics"}
    assert otlp_endpoints({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}) == {
        "traces": "http://t/x"}
    assert otlp_endpoints({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                           "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/v1/metrics"}) == {
        "traces": "http://c:4318/v1/traces", "metrics": "http://m/v1/metrics"}


def test_the_grafana_dashboard_only_uses_metrics_the_gateway_exports(rig):
    import re
    from pathlib import Path

    telemetry = Telemetry(Settings(), TelemetrySettings(), "canary-gateway", prometheus=True,
                          environ={}, store=Store())
    try:
        observer = Observer(telemetry)
        obs = observer.start("req", {})
        obs.parsed(["a"], "classify")
        route(obs, canary_bp=10_000)
        with pytest.raises(ModelFailed), obs.call("optimized"):
            raise ModelFailed("boom")
        with obs.call("baseline") as call:
            call.answered(ANSWER)
        obs.finish(200, arm="baseline", fallback=True, gateway_ms=1.0)
        text = telemetry.prometheus_text().decode()
    finally:
        telemetry.shutdown()
    exported = set(re.findall(r"^(canary_\w+?)(?:\{| )", text, re.M))
    dashboard = (Path(__file__).resolve().parents[2] / "ops" / "grafana-dashboard.json").read_text()
    used = set(re.findall(r"canary_\w+", dashboard)) - {"canary_gateway"}
    assert used, "the dashboard queries no canary metric"
    missing = {name for name in used if name not in exported}
    assert not missing, f"the dashboard queries metrics nobody exports: {missing}"


def test_a_malformed_traceparent_starts_a_new_trace(rig):
    obs = rig.observer.start("req-bad-parent", {"traceparent": "00-not-a-trace-01"})
    obs.finish(200)
    rig.flush()
    [span] = rig.spans.get_finished_spans()
    assert span.parent is None and span.context.trace_id != 0


def test_a_telemetry_bug_never_fails_the_request(rig, monkeypatch, caplog):
    obs = rig.observer.start("req-bug", {})

    def broken(*args, **kwargs):
        raise RuntimeError("bug in a metric")

    monkeypatch.setattr(rig.observer.metrics, "record", broken)
    monkeypatch.setattr(rig.observer.metrics.inflight, "add", broken)
    with obs.call("baseline") as call:
        call.answered(ANSWER)
    obs.finish(200, arm="baseline")  # does not raise
    assert any("telemetry failed" in r.getMessage() for r in caplog.records)


def test_the_request_log_writes_through_serves_stderr_logger_without_walking_the_stack(
        monkeypatch):
    """In a replica stderr is Serve's StreamToLogger: the request log's lines reach the logger
    it wraps, at its level, one record per line, and no stack is extracted for them."""
    import logging
    import traceback

    from ray.serve._private.logging_utils import StreamToLogger

    from serve.telemetry.otel import RequestLog

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("test.request-log")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    log = RequestLog(TelemetrySettings(), StreamToLogger(logger, logging.INFO, io.StringIO()))

    def no_stack(*args, **kwargs):
        raise AssertionError("the stack was walked for a request-log line")

    monkeypatch.setattr(traceback, "extract_stack", no_stack)
    log._write(['{"id":"a"}', '{"id":"b"}'])
    assert [r.getMessage() for r in records] == ['{"id":"a"}', '{"id":"b"}']
    assert {r.levelno for r in records} == {logging.INFO}


def test_the_request_log_writes_lines_to_a_plain_stream():
    from serve.telemetry.otel import RequestLog

    stream = io.StringIO()
    RequestLog(TelemetrySettings(), stream)._write(['{"id":"a"}', '{"id":"b"}'])
    assert stream.getvalue() == '{"id":"a"}\n{"id":"b"}\n'


def test_requests_are_sampled_by_their_id_at_the_ratio():
    from rollout.telemetry.traces import request_sampled

    ids = [f"req-{i}" for i in range(20_000)]
    assert all(request_sampled(i, 1.0) for i in ids[:100])
    assert not any(request_sampled(i, 0.0) for i in ids[:100])
    share = sum(request_sampled(i, 0.1) for i in ids) / len(ids)
    assert 0.09 < share < 0.11
    assert [request_sampled(i, 0.1) for i in ids[:500]] == [request_sampled(i, 0.1)
                                                             for i in ids[:500]]
    assert request_sampled("\udcff-lone-surrogate", 0.5) in (True, False)


@pytest.mark.parametrize("status, fallback, latency_ms, reason", [
    (200, False, 5.0, None), (200, True, 5.0, "fallback"), (200, False, 250.0, "slow"),
    (404, False, 1.0, "error"), (503, False, 1.0, "error"), (499, False, 1.0, "error"),
])
def test_what_an_unsampled_request_is_kept_for(status, fallback, latency_ms, reason):
    from rollout.telemetry.traces import keep_reason

    assert keep_reason(status, fallback, latency_ms, slow_ms=250.0) == reason


def unsampled_request(rig, request_id, status, **finish):
    obs = rig.observer.start(request_id, finish.pop("headers", {}))
    obs.parsed(["abc"], "embed")
    route(obs, canary_bp=0)
    with obs.call("baseline") as call:
        model_side(rig, call.carrier)
        call.answered(ANSWER)
    obs.finish(status, **finish)
    rig.flush()
    return obs


def test_an_unsampled_answer_records_nothing_and_its_log_line_says_so():
    rig = Rig(trace_sample_ratio=0.0, trace_slow_ms=60_000)
    try:
        obs = unsampled_request(rig, "req-quiet", 200, arm="baseline")
        assert rig.spans.get_finished_spans() == () and obs.kept is None
        [line] = [json.loads(x) for x in rig.log.getvalue().splitlines()]
        assert line["sampled"] is False and line["trace_id"] == obs.trace_id
        assert not [i for i in rig.store.items if hasattr(i, "span_record")]
    finally:
        rig.close()


@pytest.mark.parametrize("status, finish, reason", [
    (503, {"error_type": "overloaded"}, "error"),
    (200, {"arm": "baseline", "fallback": True}, "fallback"),
    (200, {"arm": "baseline", "slow": True}, "slow"),
])
def test_an_unsampled_error_fallback_or_slow_answer_is_recorded_after_the_fact(
        status, finish, reason):
    rig = Rig(trace_sample_ratio=0.0,
              trace_slow_ms=0.001 if finish.pop("slow", False) else 60_000)
    try:
        obs = unsampled_request(rig, f"req-{reason}", status, **finish)
        spans = rig.by_name()
        assert set(spans) == {"POST /v1/predict", "route", "model.call"}  # the gateway's side
        assert obs.kept == reason
        assert {format(s.context.trace_id, "032x") for s in spans.values()} == {obs.trace_id}
        root, routed, called = spans["POST /v1/predict"], spans["route"], spans["model.call"]
        assert root.parent is None and root.attributes["canary.kept"] == reason
        assert root.attributes["http.response.status_code"] == status
        assert root.attributes["canary.request_id"] == f"req-{reason}"
        assert root.attributes["canary.items"] == 1 and root.attributes["canary.task"] == "embed"
        assert routed.parent.span_id == called.parent.span_id == root.context.span_id
        assert routed.attributes["canary.arm"] == "baseline"
        assert called.attributes["canary.outcome"] == "ok"
        assert called.attributes["canary.batch.requests"] == 2
        assert root.start_time <= routed.start_time <= routed.end_time <= root.end_time
        assert root.start_time <= called.start_time <= called.end_time <= root.end_time
        assert (root.status.status_code.name == "ERROR") == (status >= 500)
        [line] = [json.loads(x) for x in rig.log.getvalue().splitlines()]
        assert line["sampled"] is True and line["trace_id"] == obs.trace_id
    finally:
        rig.close()


def test_a_kept_request_joins_an_incoming_unsampled_trace_and_the_next_trace_is_new():
    rig = Rig(trace_sample_ratio=0.0, trace_slow_ms=60_000)
    try:
        unsampled = {"traceparent": f"00-{TRACE}-{PARENT}-00"}
        obs = unsampled_request(rig, "req-in", 504, error_type="model_timeout",
                                headers=unsampled)
        root = rig.by_name()["POST /v1/predict"]
        assert obs.trace_id == TRACE and format(root.context.trace_id, "032x") == TRACE
        assert format(root.parent.span_id, "016x") == PARENT
        rig.spans.clear()
        other = unsampled_request(rig, "req-next", 500, error_type="internal_error")
        assert other.trace_id not in (TRACE, "0" * 32)
        assert {format(s.context.trace_id, "032x")
                for s in rig.spans.get_finished_spans()} == {other.trace_id}
    finally:
        rig.close()
