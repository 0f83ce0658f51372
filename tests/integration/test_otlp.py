"""OTLP/HTTP export: a small local receiver takes what the SDK's exporters POST and decodes the
protobuf payloads (opentelemetry-proto), so what reaches a collector is checked field by field."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from rollout import RolloutState, Settings, StateView, decide
from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.telemetry.observe import Observer
from serve.telemetry.otel import Telemetry
from serve.telemetry.tracing import Marks, WallClock, record_model_spans
from tests.servers import free_port

ANSWER = ModelAnswer(arm="baseline", model_version="fp32-test", outputs=[], tokens=0,
                     batch=BatchShape(requests=1, items=1), queue=0,
                     timing=StageTiming(preprocess=1.0, queue=2.0, model=8.0, postprocess=0.5))


class Receiver:
    """An OTLP/HTTP endpoint on a free loopback port that keeps every request body by path."""

    def __init__(self):
        self.bodies: dict[str, list[bytes]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver.lock:
                    receiver.bodies.setdefault(self.path, []).append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def get(self, path: str) -> list[bytes]:
        with self.lock:
            return list(self.bodies.get(path, []))

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def _attrs(proto_attrs) -> dict:
    out = {}
    for kv in proto_attrs:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_spans_and_metrics_reach_an_otlp_receiver(receiver):
    settings = Settings(telemetry_redis=False, trace_sample_ratio=1.0)
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    gateway = Telemetry(settings, settings, "canary-gateway", environ=environ)
    model = Telemetry(settings, settings, "canary-model", environ=environ)
    try:
        obs = Observer(gateway).start("req-otlp", {})
        obs.parsed(["hello"], "classify")
        view = StateView(RolloutState(revision=3), 0.0, False, None, True)
        obs.route(decide(view.state, "k"), view, time.perf_counter())
        with obs.call("baseline") as call:
            p = time.perf_counter()
            marks = Marks(p, p + 0.001, p + 0.002, p + 0.002, p + 0.004, p + 0.004, p + 0.005)
            record_model_spans(model.tracer, call.carrier, WallClock(), marks,
                               {"canary.arm": "baseline"}, queue_length=0,
                               batch={"requests": 1, "items": 1, "id": 1})
            call.answered(ANSWER)
        obs.finish(200, arm="baseline", gateway_ms=0.5)
        gateway.flush()
        model.flush()
    finally:
        gateway.shutdown()
        model.shutdown()

    spans, services = [], set()
    for body in receiver.get("/v1/traces"):
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = _attrs(resource_spans.resource.attributes)["service.name"]
            services.add(service)
            for scope in resource_spans.scope_spans:
                spans += [(service, span) for span in scope.spans]
    assert services == {"canary-gateway", "canary-model"}
    names = {span.name for _, span in spans}
    assert {"POST /v1/predict", "route", "model.call", "model.predict", "forward"} <= names
    assert len({span.trace_id for _, span in spans}) == 1
    root = next(span for _, span in spans if span.name == "POST /v1/predict")
    assert _attrs(root.attributes)["canary.request_id"] == "req-otlp"
    assert _attrs(root.attributes)["http.response.status_code"] == 200
    route = next(span for _, span in spans if span.name == "route")
    assert _attrs(route.attributes)["canary.state_revision"] == 3

    points = {}
    for body in receiver.get("/v1/metrics"):
        request = ExportMetricsServiceRequest.FromString(body)
        for resource_metrics in request.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        attrs = tuple(sorted(_attrs(point.attributes).items()))
                        value = point.count if kind == "histogram" else (
                            point.as_int or point.as_double)
                        points[(metric.name, attrs)] = value
    assert points[("canary.requests", (("arm", "baseline"), ("outcome", "ok"),
                                       ("protocol", "native"), ("status", "200")))] == 1
    assert points[("canary.model.calls", (("arm", "baseline"), ("outcome", "ok")))] == 1
    assert points[("canary.stage.duration", (("arm", "baseline"), ("stage", "forward")))] == 1
