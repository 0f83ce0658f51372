"""Metrics counted in process (serve.telemetry.aggregate): the Prometheus text and the OTLP
data points equal the SDK's own instruments fed the same requests, every reader of the
process gets them (one that collects nothing else included), a reader that wants delta keeps
the SDK's instruments, and counts from several threads are all kept."""

import random
import threading

import pytest
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rollout.settings import Settings
from rollout.telemetry.window_fields import Attempt, RequestRecord
from serve.telemetry.aggregate import Aggregates, cumulative
from serve.telemetry.instruments import COUNTS, LATENCY_MS, GatewayMetrics
from serve.telemetry.otel import SCOPE, Telemetry


def _records(n: int, seed: int = 7) -> list[tuple[RequestRecord, str, float | None, str]]:
    """Requests of every shape: answered, failed, retried, fallen back, refused before
    routing; values on bucket bounds, between them and past the last."""
    rng = random.Random(seed)
    edges = [*LATENCY_MS, *COUNTS, 0, 0.5, 20000.0]
    out = []
    for _ in range(n):
        arm = rng.choice(["baseline", "optimized", None])
        attempts = []
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            outcome = rng.choice(["ok", "ok", "ok", "error", "timeout", "overloaded"])
            value = lambda: rng.choice(edges) if rng.random() < 0.3 else rng.uniform(0, 3000)  # noqa: E731
            stages = {s: value() for s in ("preprocess", "queue", "forward", "postprocess")}
            attempts.append(Attempt(rng.choice(["baseline", "optimized"]), outcome,
                                    stages if outcome == "ok" else {},
                                    rng.choice([1, 2, 3, 8, 64, 2000]), rng.choice([0, 1, 5]),
                                    rng.uniform(0, 0.05), rng.uniform(0, 1e-4)))
        status = rng.choice([200, 200, 422, 503, 504])
        latency = rng.choice(edges) if rng.random() < 0.3 else rng.uniform(0, 12000)
        out.append((RequestRecord(arm, status, latency, attempts=tuple(attempts)),
                    "ok" if status == 200 else "error",
                    rng.choice([None, 0.25, 1.0, 2.0]), rng.choice(["native", "openai"])))
    return out


def _samples(text: bytes) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples if family.name != "target_info"}


def _fed(metrics: GatewayMetrics, records) -> None:
    for record, outcome, gateway_ms, protocol in records:
        metrics.record(record, outcome, gateway_ms, protocol)
    metrics.inflight.add(("baseline",), 1)
    metrics.inflight.add(("optimized",), 1)
    metrics.inflight.add(("optimized",), -1)


def test_the_prometheus_text_equals_the_sdk_instruments_fed_the_same_requests():
    settings = Settings()
    telemetry = Telemetry(settings, settings, "canary-gateway", prometheus=True, environ={})
    assert telemetry.aggregates is not None
    local = GatewayMetrics(telemetry.meter, instruments=telemetry.aggregates)
    registry = CollectorRegistry(auto_describe=True)
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    sdk = GatewayMetrics(provider.get_meter(SCOPE))
    records = _records(400)
    _fed(local, records)
    _fed(sdk, records)
    ours, theirs = _samples(telemetry.prometheus_text()), _samples(generate_latest(registry))
    assert ours.keys() == theirs.keys() and len(ours) > 300
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    text = telemetry.prometheus_text().decode()
    assert "# HELP canary_request_duration_milliseconds request latency at the gateway" in text
    assert "# TYPE canary_inflight gauge" in text  # an up-down counter, as the SDK's
    telemetry.shutdown()
    provider.shutdown()


def test_the_data_points_equal_the_sdks_in_every_field_a_reader_exports():
    records = _records(150, seed=11)
    reader, sdk_reader = InMemoryMetricReader(), InMemoryMetricReader()
    aggregates = Aggregates(SCOPE, Resource.create({}))
    provider = MeterProvider(metric_readers=[reader])
    aggregates.attach(reader)
    _fed(GatewayMetrics(provider.get_meter(SCOPE), instruments=aggregates), records)
    sdk_provider = MeterProvider(metric_readers=[sdk_reader])
    _fed(GatewayMetrics(sdk_provider.get_meter(SCOPE)), records)

    def points(data):
        found = {}
        for scoped in data.resource_metrics[0].scope_metrics:
            for metric in scoped.metrics:
                kind = type(metric.data).__name__
                for p in metric.data.data_points:
                    key = (metric.name, metric.unit, metric.description, kind,
                           metric.data.aggregation_temporality,
                           getattr(metric.data, "is_monotonic", None),
                           tuple(sorted(p.attributes.items())))
                    found[key] = ((p.value,) if kind == "Sum" else
                                  (p.count, p.sum, tuple(p.bucket_counts),
                                   tuple(p.explicit_bounds), p.min, p.max))
        return found

    ours, theirs = points(reader.get_metrics_data()), points(sdk_reader.get_metrics_data())
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if key[3] == "Sum":
            assert ours[key][0] == pytest.approx(value[0]), key
            continue
        count, total, *exact = value
        assert ours[key][0] == count and ours[key][1] == pytest.approx(total), key
        assert list(ours[key][2:]) == exact, key  # buckets, bounds, min, max


def test_a_reader_whose_provider_collects_nothing_else_still_gets_them():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    aggregates = Aggregates(SCOPE, Resource.create({"service.name": "x"}))
    aggregates.attach(reader)
    assert reader.get_metrics_data() is None  # nothing counted yet: as the SDK says
    aggregates.counter("canary.requests", "{request}", "requests", ("arm",)).add(("a",), 2)
    data = reader.get_metrics_data()
    scoped = data.resource_metrics[0].scope_metrics[0]
    assert scoped.scope.name == SCOPE
    assert data.resource_metrics[0].resource.attributes["service.name"] == "x"
    assert [p.value for p in scoped.metrics[0].data.data_points] == [2]
    provider.shutdown()


def test_attaching_before_the_provider_is_made_is_refused():
    with pytest.raises(ValueError, match="after its MeterProvider"):
        Aggregates(SCOPE, Resource.create({})).attach(InMemoryMetricReader())


def test_a_reader_that_wants_delta_keeps_the_sdks_instruments():
    delta = InMemoryMetricReader(preferred_temporality={
        Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA})
    assert not cumulative(delta) and cumulative(InMemoryMetricReader())
    settings = Settings()
    telemetry = Telemetry(settings, settings, "canary-gateway", metric_readers=[delta],
                          environ={})
    assert telemetry.aggregates is None
    metrics = GatewayMetrics(telemetry.meter, instruments=telemetry.aggregates)
    _fed(metrics, _records(5))
    names = {m.name for s in delta.get_metrics_data().resource_metrics[0].scope_metrics
             for m in s.metrics}
    assert "canary.requests" in names and "canary.request.duration" in names
    telemetry.shutdown()


def test_counts_from_several_threads_are_all_kept():
    aggregates = Aggregates(SCOPE, Resource.create({}))
    counter = aggregates.counter("c", "1", "c", ("arm",))
    histogram = aggregates.histogram("h", "ms", "h", ("arm",), LATENCY_MS)

    def work():
        for i in range(5000):
            counter.add(("a",), 1)
            histogram.record(("a",), i % 40)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    by_name = {m.name: m for m in aggregates.metrics()}
    assert by_name["c"].data.data_points[0].value == 20000
    point = by_name["h"].data.data_points[0]
    assert point.count == sum(point.bucket_counts) == 20000
    assert (point.min, point.max) == (0, 39)
