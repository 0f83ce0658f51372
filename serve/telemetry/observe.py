"""One request's telemetry at the gateway: its spans, metrics, window record and log line.

    POST /v1/predict     SERVER span; continues an incoming `traceparent`
    ├── route            the decision: canary.arm, canary.bucket, canary.share_bp,
    │                    canary.effective_bp, canary.kill, canary.state_revision,
    │                    canary.state_stale, canary.reason
    ├── model.call       CLIENT span: canary.arm, canary.attempt (1), canary.outcome
    │   └── model.predict ...   in the model replica (serve.telemetry.tracing)
    └── model.call       the retry on baseline after a failed canary call (attempt 2)

`finish()` ends the request span (status code, answering arm, fallback, error type), records
the metrics (serve.telemetry.instruments), offers the request to the Redis windows and writes the
JSON log line; the last two go through sinks, off the request path. With telemetry off the gateway
gets `NULL_OBSERVATION`, whose methods do nothing.

Sampling (serve.telemetry.sampling): an unsampled request creates no spans on its way, only keeps
their timestamps and what they would say (`_route`, `calls`); when it ends in an error, a
fallback or a slow answer, `finish()` records its spans then, with those times
(`_record_after`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from rollout.clock import Clock, SystemClock
from rollout.policy import RoutingDecision
from rollout.telemetry.redis_store import WindowItem
from rollout.telemetry.traces import keep_reason
from rollout.telemetry.window_fields import Generated
from rollout.telemetry.windows import Attempt, RequestRecord
from rollout.watcher import StateView
from serve.common.answer import ModelAnswer
from serve.common.errors import ModelTimeout, Overloaded
from serve.telemetry.instruments import GatewayMetrics
from serve.telemetry.otel import Telemetry
from serve.telemetry.sampling import KEPT
from serve.telemetry.tracing import extract, inject

log = logging.getLogger("canary.telemetry")


def _never_raises(method):
    """Telemetry must not fail a request: a bug in it is logged, and the request goes on."""

    @functools.wraps(method)
    def guarded(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception:
            log.exception("telemetry failed in %s (the request is not affected)",
                          method.__qualname__)
            return None

    return guarded


def call_outcome(exc: BaseException | None) -> str:
    """A model call's outcome label (metrics, spans): ok, timeout, overloaded or error."""
    if exc is None:
        return "ok"
    if isinstance(exc, ModelTimeout):
        return "timeout"
    if isinstance(exc, Overloaded):
        return "overloaded"
    return "error"


def attempt_from(arm: str, result: ModelAnswer, items: int, price: float = 0.0) -> Attempt:
    """What an answered model call reports (its `timing`, `batch`, `queue`) as an Attempt;
    its compute time is its share (by items) of the batch's forward, priced per device-hour;
    its CPU seconds (`cpu_s`, by rows) are what the replica measured (serve.replica.cputime)."""
    timing, batch = result.timing, result.batch
    stages = {"preprocess": timing.preprocess, "queue": timing.queue,
              "forward": timing.model, "postprocess": timing.postprocess}
    share = items / batch.items if batch.items else 1.0
    compute_s = timing.model / 1000 * share
    return Attempt(arm, "ok", stages, batch.requests, int(result.queue),
                   compute_s, compute_s * price / 3600, cpu_s=result.cpu_s, rows=items,
                   gpu=result.gpu)


class Observer:
    """Starts an observation per request; one per gateway replica."""

    def __init__(self, telemetry: Telemetry, *, clock: Clock | None = None):
        self.telemetry = telemetry
        self.clock = clock or SystemClock()
        self.metrics = GatewayMetrics(telemetry.meter, price=telemetry.settings.device_hour_price,
                                      dropped=telemetry.dropped,
                                      instruments=telemetry.aggregates)

    def start(self, request_id: str, headers: Mapping[str, str], protocol: str = "native",
              path: str | None = None) -> Observation:
        """`protocol`: the front door it came through (serve.gateway.protocols), in its span,
        metrics and log line; `path`: its URL path (the span's name)."""
        if not self.telemetry.enabled:
            return NULL_OBSERVATION
        return Observation(self, request_id, headers, protocol, path or "/v1/predict")

    @_never_raises
    def shed(self, latency_ms: float) -> None:
        """A request shed at the ingress (serve.gateway.ingress) under overload: counted in the
        metrics (503, `overloaded`) and nothing else. A span, a window record and a log line per
        shed request would cost the CPU that the admitted requests need."""
        if self.telemetry.enabled:
            self.metrics.record(RequestRecord(None, 503, latency_ms), Overloaded.type, None)


@dataclass(frozen=True)
class _CallRecord:
    """An unsampled request's model call, kept to be recorded after the fact."""

    arm: str
    attempt: int
    start_ns: int
    end_ns: int
    outcome: str
    batch_requests: int | None
    error: str | None


class _Call:
    """One model call: its span (or, unsampled, its record), in-flight gauge and outcome (a
    context manager)."""

    def __init__(self, obs: Observation, arm: str):
        self.obs, self.arm = obs, arm
        self.attempt = len(obs.attempts) + 1
        self.items = obs.items
        self.start_ns = time.time_ns()
        self.span = None
        if obs.sampled:
            self.span = obs.tracer.start_span(
                "model.call", context=obs.context, kind=SpanKind.CLIENT,
                attributes=_call_attributes(arm, self.attempt))
            self.carrier = inject(trace.set_span_in_context(self.span))
        else:  # the model learns the trace is unsampled and records nothing
            self.carrier = obs.carrier
        self.result: ModelAnswer | None = None

    def answered(self, result: ModelAnswer) -> None:
        self.result = result

    def __enter__(self) -> _Call:
        self._entered()
        return self

    @_never_raises
    def _entered(self) -> None:
        self.obs.metrics.inflight.add((self.arm,), 1)

    @_never_raises
    def __exit__(self, exc_type, exc, tb) -> bool:
        self.obs.metrics.inflight.add((self.arm,), -1)
        outcome = call_outcome(exc)
        batch_requests = error = None
        if outcome == "ok" and self.result is not None:
            attempt = attempt_from(self.arm, self.result, self.items, self.obs.metrics.price)
            batch_requests = attempt.batch_requests
        else:
            attempt = Attempt(self.arm, "error" if outcome == "ok" else outcome)
            error = f"{outcome}: {exc}"[:200]
        self.obs.attempts.append(attempt)
        record = _CallRecord(self.arm, self.attempt, self.start_ns, time.time_ns(),
                             attempt.outcome, batch_requests, error)
        if self.span is None:
            self.obs.calls.append(record)
        else:
            _end_call(self.span, record)
        return False


def _call_attributes(arm: str, attempt: int) -> dict:
    return {"canary.arm": arm, "canary.attempt": attempt, "canary.retry": attempt > 1}


def _end_call(span, record: _CallRecord, end_ns: int | None = None) -> None:
    """A model call's span, given what the call came to."""
    if record.batch_requests is not None:
        span.set_attribute("canary.batch.requests", record.batch_requests)
    if record.error is not None:
        span.set_status(Status(StatusCode.ERROR, record.error))
    span.set_attribute("canary.outcome", record.outcome)
    span.end(end_time=end_ns)


def _route_attributes(decision: RoutingDecision, view: StateView) -> dict:
    state = view.state
    return {
        "canary.arm": decision.arm.value, "canary.bucket": decision.bucket,
        "canary.reason": decision.label, "canary.share_bp": state.canary_bp,
        "canary.effective_bp": 0 if view.stale else state.effective_bp,
        "canary.kill": state.kill, "canary.state_revision": state.revision,
        "canary.state_stale": view.stale,
    }


class Observation:
    def __init__(self, observer: Observer, request_id: str, headers: Mapping[str, str],
                 protocol: str = "native", path: str = "/v1/predict"):
        self.observer, self.metrics = observer, observer.metrics
        self.protocol, self.path = protocol, path
        self.tracer = observer.telemetry.tracer
        self.request_id = request_id
        self.start, self.start_ns = time.perf_counter(), time.time_ns()
        self.parent = extract(headers)
        self.span = self.tracer.start_span(
            f"POST {path}", context=self.parent, kind=SpanKind.SERVER,
            attributes=self._root_attributes())
        self.sampled = self.span.is_recording()  # else maybe recorded after the fact
        self.kept: str | None = None  # why it was, then (rollout.telemetry.traces keep_reason)
        self.context = trace.set_span_in_context(self.span)
        self._carrier: dict[str, str] | None = None
        self.attempts: list[Attempt] = []
        self.calls: list[_CallRecord] = []  # unsampled: its model calls, to record after
        self._route: tuple | None = None  # unsampled: (decision, view, start_ns, end_ns)
        self.routed: str | None = None
        self.items = self.chars = 0
        self.task: str | None = None

    def _root_attributes(self) -> dict:
        return {"http.request.method": "POST", "url.path": self.path,
                "canary.request_id": self.request_id, "canary.protocol": self.protocol}

    @property
    def trace_id(self) -> str:
        return format(self.span.get_span_context().trace_id, "032x")

    @property
    def carrier(self) -> dict[str, str]:
        """The request span's `traceparent` (for an unsampled request's model calls)."""
        if self._carrier is None:
            self._carrier = inject(self.context)
        return self._carrier

    @_never_raises
    def parsed(self, inputs: list[str], task: str) -> None:
        self.items, self.chars, self.task = len(inputs), sum(map(len, inputs)), task
        if self.sampled:
            self.span.set_attributes(self._parsed_attributes())

    def _parsed_attributes(self) -> dict:
        if self.task is None:
            return {}
        return {"canary.items": self.items, "canary.chars": self.chars,
                "canary.task": self.task}

    @_never_raises
    def route(self, decision: RoutingDecision, view: StateView, started: float) -> None:
        """Record the routing decision taken from `started` (perf_counter) until now."""
        self.routed = decision.arm.value
        start_ns = time.time_ns() - int((time.perf_counter() - started) * 1e9)
        if not self.sampled:
            self._route = (decision, view, start_ns, time.time_ns())
            return
        self.tracer.start_span("route", context=self.context, start_time=start_ns,
                               attributes=_route_attributes(decision, view)).end()

    def call(self, arm: str) -> _Call:
        return _Call(self, arm)

    @_never_raises
    def generated(self, first_token_ms: float, decode_ms: float, tokens: int) -> None:
        """A generative answer's times and tokens, on its last model call (the windows'
        `gen_*` counters: rollout.telemetry.window_fields)."""
        if self.attempts:
            self.attempts[-1] = dataclasses.replace(
                self.attempts[-1], generated=Generated(first_token_ms, decode_ms, tokens))

    @_never_raises
    def stages(self, stages: list[tuple[str, int, int]], **attributes) -> None:
        """Spans of steps the caller timed (name, start and end in time_ns) under the
        request's span, when it is sampled."""
        if not self.sampled:
            return
        for name, start_ns, end_ns in stages:
            self.tracer.start_span(name, context=self.context, start_time=start_ns,
                                   attributes=attributes).end(end_time=end_ns)

    def _record_after(self, reason: str, finished: dict, error: str | None,
                      end_ns: int) -> None:
        """An unsampled request's spans, recorded once it is answered (`reason`: why), with
        the times they had, in the trace its log line names (serve.telemetry.sampling)."""
        span_context = self.span.get_span_context()
        if not trace.get_current_span(self.parent).get_span_context().is_valid:
            self.observer.telemetry.ids.prime(span_context.trace_id)
        root = self.tracer.start_span(
            f"POST {self.path}", context=self.parent, kind=SpanKind.SERVER,
            start_time=self.start_ns,
            attributes={**self._root_attributes(), **self._parsed_attributes(), KEPT: reason})
        inside = trace.set_span_in_context(root)
        if self._route is not None:
            decision, view, start_ns, route_end_ns = self._route
            self.tracer.start_span("route", context=inside, start_time=start_ns,
                                   attributes=_route_attributes(decision, view)
                                   ).end(end_time=route_end_ns)
        for call in self.calls:
            span = self.tracer.start_span(
                "model.call", context=inside, kind=SpanKind.CLIENT, start_time=call.start_ns,
                attributes={**_call_attributes(call.arm, call.attempt), KEPT: reason})
            _end_call(span, call, call.end_ns)
        _end_request(root, finished, error, end_ns)
        self.kept = reason

    @_never_raises
    def finish(self, status: int, *, error_type: str | None = None, arm: str | None = None,
               fallback: bool = False, gateway_ms: float | None = None,
               replayed: bool = False) -> None:
        """`replayed`: answered from an idempotency record; traced and logged, but not
        counted again in metrics or windows (the original request was). An unsampled request
        worth a look (an error, a fallback, a slow answer) is traced now (`_record_after`)."""
        latency_ms = (time.perf_counter() - self.start) * 1000
        record = RequestRecord(self.routed, status, latency_ms, self.items, self.chars,
                               tuple(self.attempts))
        finished = {"http.response.status_code": status, "canary.fallback": fallback,
                    "canary.routed_arm": self.routed or "none", "canary.replayed": replayed}
        if arm:
            finished["canary.arm"] = arm
        if error_type:
            finished["error.type"] = error_type
        failed = (error_type or str(status)) if status >= 500 else None
        if self.sampled:
            _end_request(self.span, finished, failed)
        else:
            reason = keep_reason(status, fallback, latency_ms,
                                 self.observer.telemetry.settings.trace_slow_ms)
            if reason is not None:
                self._record_after(reason, finished, failed, time.time_ns())
        if not replayed:
            self.metrics.record(record, "ok" if status == 200 else (error_type or "error"),
                                gateway_ms, protocol=self.protocol)
        self._offer(record, arm, fallback, latency_ms, status, error_type, replayed)

    def _offer(self, record: RequestRecord, arm: str | None, fallback: bool, latency_ms: float,
               status: int, error_type: str | None, replayed: bool) -> None:
        """The request's window record and its log line, to their sinks."""
        telemetry = self.observer.telemetry
        now = self.observer.clock.time()
        if telemetry.sink is not None and record.routed is not None and not replayed:
            telemetry.sink.offer(WindowItem(now, record))
        if telemetry.request_log is not None:
            telemetry.request_log.log({
                "ts": round(now, 3), "request_id": self.request_id, "trace_id": self.trace_id,
                "sampled": self.sampled or self.kept is not None,
                "arm": arm, "routed_arm": self.routed, "fallback": fallback,
                "items": self.items, "chars": self.chars, "task": self.task,
                "latency_ms": round(latency_ms, 3), "status": status, "error_type": error_type,
                "replayed": replayed, "protocol": self.protocol,
            })


def _end_request(span, finished: dict, failed: str | None, end_ns: int | None = None) -> None:
    """The request span, given how the request ended (`failed`: a 5xx's description)."""
    span.set_attributes(finished)
    if failed is not None:
        span.set_status(Status(StatusCode.ERROR, failed))
    span.end(end_time=end_ns)


class _NullCall:
    carrier = None

    def answered(self, result: ModelAnswer) -> None:
        pass

    def __enter__(self) -> _NullCall:
        return self

    def __exit__(self, *exc) -> bool:
        return False


class _NullObservation:
    """What the gateway observes with telemetry off: nothing."""

    trace_id = None
    context = None
    _call = _NullCall()

    def parsed(self, inputs, task) -> None:
        pass

    def route(self, decision, view, started) -> None:
        pass

    def call(self, arm: str) -> _NullCall:
        return self._call

    def finish(self, status: int, **kwargs) -> None:
        pass


NULL_OBSERVATION = _NullObservation()
