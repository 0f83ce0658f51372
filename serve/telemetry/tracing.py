"""Trace context across processes, and the model replica's spans.

Propagation: the gateway injects its model-call span into a W3C `traceparent` carrier (a plain
dict) and passes it to the model deployment's `predict` as an argument; the replica extracts it,
so its spans join the request's trace whatever Ray does between the two processes.

The replica's spans are recorded *after* the request has its answer, from timestamps taken on
the way (`Marks`): a batch serves many requests, each in its own trace, so each request gets its
own `batch` and `forward` spans with the batch's shared timing and a `canary.batch.id` that ties
the requests of one batch together. Recording afterwards keeps the batch loop free of tracing.

    model.predict            (SERVER, child of the gateway's model.call)
    ├── preprocess           tokenize
    ├── queue                waiting for a batch (canary.queue.length: requests ahead)
    ├── batch                canary.batch.requests, canary.batch.items, canary.batch.id
    │   └── forward          the padded batch through the model
    └── postprocess
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def inject(ctx: otel_context.Context) -> dict[str, str]:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context:
    return _PROPAGATOR.extract(carrier or {})


def sampled(ctx: otel_context.Context) -> bool:
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context.is_valid and span_context.trace_flags.sampled


class WallClock:
    """Maps perf_counter readings to epoch nanoseconds, anchored once per request."""

    def __init__(self) -> None:
        self.wall_ns, self.perf = time.time_ns(), time.perf_counter()

    def ns(self, perf: float) -> int:
        return self.wall_ns + int((perf - self.perf) * 1e9)


@dataclass
class Marks:
    """perf_counter readings along one request's path through a model replica."""

    start: float
    queued: float = 0.0
    batch_start: float = 0.0  # 0: the request never left the queue
    forward_start: float = 0.0
    forward_end: float = 0.0
    post_start: float = 0.0
    done: float = 0.0


def record_model_spans(
    tracer: Tracer,
    carrier: Mapping[str, str] | None,
    clock: WallClock,
    marks: Marks,
    attrs: Mapping[str, object],
    *,
    queue_length: int,
    batch: Mapping[str, int] | None = None,
    error: BaseException | None = None,
) -> None:
    parent = extract(carrier)
    if not sampled(parent):
        return
    end = marks.done or time.perf_counter()
    root = tracer.start_span("model.predict", context=parent, kind=SpanKind.SERVER,
                             start_time=clock.ns(marks.start), attributes=dict(attrs))
    inside = trace.set_span_in_context(root)

    def child(name, start, stop, context=inside, **attributes):
        span = tracer.start_span(name, context=context, start_time=clock.ns(start),
                                 attributes=attributes)
        span.end(end_time=clock.ns(stop))
        return span

    if marks.queued:
        child("preprocess", marks.start, marks.queued)
        queue_end = marks.batch_start or end
        child("queue", marks.queued, queue_end, **{"canary.queue.length": queue_length})
    if marks.batch_start:
        batch_end = marks.forward_end or end
        batch_span = tracer.start_span(
            "batch", context=inside, start_time=clock.ns(marks.batch_start),
            attributes={f"canary.batch.{k}": v for k, v in (batch or {}).items()})
        if marks.forward_start:
            child("forward", marks.forward_start, batch_end,
                  context=trace.set_span_in_context(batch_span))
        batch_span.end(end_time=clock.ns(batch_end))
    if marks.post_start:
        child("postprocess", marks.post_start, end)
    if error is not None:
        kind = "cancelled" if isinstance(error, BaseException) and not isinstance(
            error, Exception) else type(error).__name__
        root.set_attribute("error.type", kind)
        root.set_status(Status(StatusCode.ERROR, f"{kind}: {error}"[:200]))
    root.end(end_time=clock.ns(end))
