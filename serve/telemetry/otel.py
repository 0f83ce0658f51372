"""OpenTelemetry for one process (a gateway or a model replica): providers, exporters, sinks.

Where telemetry goes, decided once when the process starts:

- **embedded** (`CANARY_TELEMETRY_REDIS`, on by default): spans and per-arm windows go to Redis
  through a bounded, batched `TelemetrySink` off the request path (rollout.telemetry.redis_store);
  `rollout traces` and `rollout status` read them back.
- **OTLP over HTTP**: traces when `OTEL_EXPORTER_OTLP_ENDPOINT` or
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, metrics when `OTEL_EXPORTER_OTLP_ENDPOINT` or
  `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set (read here, from the environment passed in, when
  the process starts). The SDK's exporters read the other standard variables themselves
  (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`, `OTEL_METRIC_EXPORT_INTERVAL`,
  `OTEL_RESOURCE_ATTRIBUTES`).
- **Prometheus** (gateway only): a reader with a registry of its own (`registry`), rendered by
  `prometheus_text()` for `GET /metrics` and served on the replica's own port for Prometheus'
  service discovery (serve.telemetry.metrics_targets).

`instance` names the process among its peers (the Serve replica id): it is the resource's
`service.instance.id`, so OTLP metrics from several replicas stay apart in a collector as
Prometheus' `instance` keeps scraped ones apart (else the SDK makes up a random one).

The tracer and meter providers belong to this object and are never installed globally, so two
Telemetry objects in one process (tests, two applications) do not see each other's data.
With `CANARY_TELEMETRY_ENABLED=false` the tracer and meter are the API's no-op ones, nothing is
exported and nothing is logged.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import IO

from opentelemetry.metrics import Meter, NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NoOpTracer, Tracer

from rollout import open_telemetry
from rollout.settings import StateSettings, TelemetrySettings
from rollout.telemetry.sink import TelemetrySink
from serve.telemetry.aggregate import Aggregates, cumulative
from serve.telemetry.sampling import KeptOrSampled, PrimedIds

SCOPE = "canary"


def otlp_endpoints(environ: Mapping[str, str]) -> dict[str, str]:
    """The OTLP/HTTP endpoint of each signal ("traces", "metrics") the environment asks for:
    the per-signal variable as given, else the base endpoint plus `/v1/<signal>`."""
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/")
    endpoints = {}
    for signal in ("traces", "metrics"):
        own = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
        if own or base:
            endpoints[signal] = own or f"{base}/v1/{signal}"
    return endpoints


def span_record(span: ReadableSpan, service: str) -> dict:
    """A finished SDK span as a rollout.telemetry.traces span record."""
    context, parent = span.context, span.parent
    return {
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_id": format(parent.span_id, "016x") if parent else None,
        "name": span.name,
        "service": service,
        "start": span.start_time / 1e9,
        "end": span.end_time / 1e9,
        "status": span.status.status_code.name.lower(),
        "error": span.status.description,
        "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()},
    }


class _QueuedSpan:
    """A span waiting in the sink; converted to a record in the sink's thread, not the caller's."""

    __slots__ = ("span", "service")

    def __init__(self, span: ReadableSpan, service: str):
        self.span, self.service = span, service

    def span_record(self) -> dict:
        return span_record(self.span, self.service)


class SinkSpanProcessor(SpanProcessor):
    """Hands each finished span to a TelemetrySink: one non-blocking queue put, nothing else
    (the SDK's SimpleSpanProcessor would add a context switch and an export call per span)."""

    def __init__(self, sink: TelemetrySink, service: str):
        self.sink, self.service = sink, service

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.sink.offer(_QueuedSpan(span, self.service))

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class RequestLog:
    """One JSON line per request, written to a stream by a sink thread (never on the request
    path; lines are dropped and counted when the queue is full)."""

    def __init__(self, settings: TelemetrySettings, stream: IO[str] | None = None):
        self.stream = stream or sys.stderr
        # In a Serve replica stderr is Serve's StreamToLogger, whose write() walks the whole
        # stack (traceback.extract_stack, reading source lines) once per line to name the
        # caller: about 3 % of a busy gateway replica's CPU for its request log. The lines go
        # to the logger it wraps, at its level, instead: the same handlers and files.
        self.logger: logging.Logger | None = getattr(self.stream, "_logger", None)
        self.level: int = getattr(self.stream, "_log_level", logging.INFO)
        self.sink = TelemetrySink(self._write, capacity=settings.telemetry_queue_size,
                                  flush_s=settings.telemetry_flush_s, name="request-log")

    def _write(self, lines: Sequence[object]) -> None:
        if isinstance(self.logger, logging.Logger):
            for line in lines:
                self.logger.log(self.level, "%s", line)
            return
        self.stream.write("".join(f"{line}\n" for line in lines))
        self.stream.flush()

    def log(self, fields: Mapping[str, object]) -> None:
        self.sink.offer(json.dumps(fields, separators=(",", ":")))


class Telemetry:
    """Tracer, meter, sinks and request log of one process, as `settings` configures them;
    `state` names the application (`canary.app`) and the Redis the telemetry is written to.

    `instance` becomes `service.instance.id`; `span_exporters` and `metric_readers` add test
    doubles (the SDK's in-memory ones);
    `store` replaces the Redis writer (anything with `write(items)`); `environ` replaces
    `os.environ` for the OTLP decision.
    """

    def __init__(
        self,
        state: StateSettings,
        settings: TelemetrySettings,
        service: str,
        *,
        prometheus: bool = False,
        request_log: bool = False,
        instance: str | None = None,
        environ: Mapping[str, str] | None = None,
        span_exporters: Sequence[SpanExporter] = (),
        metric_readers: Sequence[MetricReader] = (),
        store=None,
        log_stream: IO[str] | None = None,
    ):
        self.state, self.settings, self.service = state, settings, service
        self.enabled = settings.telemetry_enabled
        self.sink: TelemetrySink | None = None
        self.request_log: RequestLog | None = None
        self._registry = None
        self._pushers: list[MetricReader] = []  # readers that push (OTLP), flushed by flush()
        self._tracer_provider: TracerProvider | None = None
        self._meter_provider: MeterProvider | None = None
        self.tracer: Tracer = NoOpTracer()
        self.ids = PrimedIds()  # the tracer's ids (serve.telemetry.sampling)
        self.meter: Meter = NoOpMeter(SCOPE)
        # this process's metrics counted locally, where every reader takes them cumulatively
        # (serve.telemetry.aggregate); None: the SDK's instruments
        self.aggregates: Aggregates | None = None
        if not self.enabled:
            return
        environ = os.environ if environ is None else environ
        otlp = otlp_endpoints(environ)
        self._start_sinks(store, request_log, log_stream)
        attributes = {"service.name": service, "canary.app": state.app_name}
        if instance:
            attributes["service.instance.id"] = instance
        resource = Resource.create(attributes)
        self._tracer_provider = self._traces(resource, otlp, span_exporters)
        self._meter_provider = self._metrics(resource, otlp, metric_readers, prometheus)
        self.tracer = self._tracer_provider.get_tracer(SCOPE)
        self.meter = self._meter_provider.get_meter(SCOPE)

    def _start_sinks(self, store, request_log: bool, log_stream: IO[str] | None) -> None:
        """The Redis sink (or `store`'s) and the JSON request log, each where configured."""
        settings = self.settings
        if settings.telemetry_redis or store is not None:
            self.store = store or open_telemetry(self.state, settings)
            self.sink = TelemetrySink(self.store.write, capacity=settings.telemetry_queue_size,
                                      flush_s=settings.telemetry_flush_s,
                                      name=f"{self.service}-telemetry").start()
        if request_log and settings.request_log:
            self.request_log = RequestLog(settings, log_stream)
            self.request_log.sink.start()

    def _traces(self, resource: Resource, otlp: Mapping[str, str],
                span_exporters: Sequence[SpanExporter]) -> TracerProvider:
        """Sampled spans (serve.telemetry.sampling) to the sink, to OTLP and to any test
        exporters."""
        sampler = KeptOrSampled(self.settings.trace_sample_ratio)
        tracer_provider = TracerProvider(resource=resource, sampler=sampler, id_generator=self.ids)
        if self.sink is not None:
            tracer_provider.add_span_processor(SinkSpanProcessor(self.sink, self.service))
        if "traces" in otlp:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            tracer_provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp["traces"])))
        for exporter in span_exporters:
            tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        return tracer_provider

    def _metrics(self, resource: Resource, otlp: Mapping[str, str],
                 metric_readers: Sequence[MetricReader], prometheus: bool) -> MeterProvider:
        """Metrics to any test readers, to Prometheus (pulled) and to OTLP (pushed)."""
        readers = list(metric_readers)
        if prometheus:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=True)
            readers.append(PrometheusMetricReader(registry=self._registry))
        if "metrics" in otlp:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            self._pushers.append(PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=otlp["metrics"])))
            readers.append(self._pushers[-1])
        provider = MeterProvider(resource=resource, metric_readers=readers)
        if all(cumulative(reader) for reader in readers):
            self.aggregates = Aggregates(SCOPE, resource)
            for reader in readers:
                self.aggregates.attach(reader)
        return provider

    def dropped(self) -> dict[str, int]:
        """Telemetry items dropped so far, by sink and reason."""
        out = {}
        for name, sink in (("redis", self.sink),
                           ("log", self.request_log.sink if self.request_log else None)):
            if sink is not None:
                out.update({f"{name}:{reason}": n for reason, n in sink.dropped.items()})
        return out

    @property
    def registry(self):
        """The Prometheus registry (a prometheus_client CollectorRegistry), or None without
        one (not asked for, or telemetry off)."""
        return self._registry

    def prometheus_text(self) -> bytes:
        if self._registry is None:
            return b""
        from prometheus_client import generate_latest

        return generate_latest(self._registry)

    def flush(self, timeout_s: float = 5.0) -> None:
        """Push out everything buffered (tests, shutdown)."""
        if self._tracer_provider is not None:
            self._tracer_provider.force_flush(int(timeout_s * 1000))
        for reader in self._pushers:  # a pull reader (Prometheus) must not collect twice
            reader.force_flush(int(timeout_s * 1000))
        for sink in (self.sink, self.request_log.sink if self.request_log else None):
            if sink is not None:
                sink.drain()

    def shutdown(self) -> None:
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()
        if self._meter_provider is not None:
            self._meter_provider.shutdown()
        for sink in (self.sink, self.request_log.sink if self.request_log else None):
            if sink is not None:
                sink.close()
        store = getattr(self, "store", None)
        if store is not None and hasattr(store, "close"):
            store.close()
        self._tracer_provider = self._meter_provider = None
