"""The gateway's OpenTelemetry instruments, and how one finished request is recorded in them.

Every instrument carries the `arm` attribute. Requests count under the arm the router chose
(`none` when a request was refused before routing); model calls under the arm that was called.
Stage times, batch size, queue length and compute time come back from the model replica with
each answer (the same numbers as `Server-Timing`), so one process, the gateway, holds every
per-arm metric and its Prometheus endpoint shows all of them.

    canary.requests          counter    arm, status (HTTP code), outcome, protocol (the front
                                        door: native, openai, oip, oip-grpc, tei)
    canary.model.calls       counter    arm, outcome (ok, error, timeout, overloaded)
    canary.retries           counter    arm (that failed and was retried on baseline)
    canary.fallbacks         counter    arm (whose request baseline then answered)
    canary.request.duration  histogram  ms, arm, status
    canary.stage.duration    histogram  ms, arm, stage (preprocess, queue, forward, postprocess,
                                        gateway)
    canary.batch.size        histogram  requests per batch, arm
    canary.queue.length      histogram  requests waiting in the replica on arrival, arm
    canary.inflight          updown     model calls in flight, arm
    canary.compute.time      counter    s, arm: each call's share of its batch's forward
    canary.cost              counter    arm: compute time x CANARY_DEVICE_HOUR_PRICE / 3600
    canary.telemetry.dropped observable telemetry items dropped, by sink and reason
    canary.store.errors      observable failed Redis calls survived, by component (`state`:
                                        the state watcher; `idempotency`: requests served
                                        without deduplication) and kind (READONLY, OOM,
                                        unavailable, unreadable, over budget, ...)

Cost per 1,000 requests is `1000 * rate(canary_cost_total) / rate(canary_model_calls_total
{outcome="ok"})`, per arm (see ops/grafana-dashboard.json).
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from rollout.telemetry.windows import RequestRecord

LATENCY_MS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class GatewayMetrics:
    def __init__(self, meter: Meter, *, price: float = 0.0,
                 dropped: Callable[[], dict[str, int]] | None = None):
        self.price = price
        self.requests = meter.create_counter(
            "canary.requests", "{request}", "requests by routed arm and HTTP status")
        self.calls = meter.create_counter(
            "canary.model.calls", "{call}", "model calls by arm and outcome")
        self.retries = meter.create_counter(
            "canary.retries", "{request}", "requests retried on baseline after this arm failed")
        self.fallbacks = meter.create_counter(
            "canary.fallbacks", "{request}", "requests answered by baseline after this arm failed")
        self.latency = meter.create_histogram(
            "canary.request.duration", "ms", "request latency at the gateway",
            explicit_bucket_boundaries_advisory=LATENCY_MS)
        self.stages = meter.create_histogram(
            "canary.stage.duration", "ms", "time per stage of answered model calls",
            explicit_bucket_boundaries_advisory=LATENCY_MS)
        self.batch = meter.create_histogram(
            "canary.batch.size", "{request}", "requests in the batch a call rode in",
            explicit_bucket_boundaries_advisory=COUNTS)
        self.queue = meter.create_histogram(
            "canary.queue.length", "{request}", "requests waiting in the replica on arrival",
            explicit_bucket_boundaries_advisory=(0, *COUNTS))
        self.inflight = meter.create_up_down_counter(
            "canary.inflight", "{call}", "model calls in flight")
        self.compute = meter.create_counter(
            "canary.compute.time", "s", "device time of answered calls (share of their batch)")
        self.cost = meter.create_counter(
            "canary.cost", "1", "compute time priced at CANARY_DEVICE_HOUR_PRICE per hour")
        if dropped is not None:
            def observe(_: CallbackOptions):
                for key, n in dropped().items():
                    sink, _, reason = key.partition(":")
                    yield Observation(n, {"sink": sink, "reason": reason})

            meter.create_observable_counter(
                "canary.telemetry.dropped", [observe], "{item}", "telemetry items dropped")

    def record(self, record: RequestRecord, outcome: str, gateway_ms: float | None,
               protocol: str = "native") -> None:
        arm = record.routed or "none"
        status = str(record.status)
        self.requests.add(1, {"arm": arm, "status": status, "outcome": outcome,
                              "protocol": protocol})
        self.latency.record(record.latency_ms, {"arm": arm, "status": status})
        if record.retries:
            self.retries.add(record.retries, {"arm": arm})
        if record.fallback:
            self.fallbacks.add(1, {"arm": arm})
        for attempt in record.attempts:
            attrs = {"arm": attempt.arm}
            self.calls.add(1, {"arm": attempt.arm, "outcome": attempt.outcome})
            if attempt.outcome != "ok":
                continue
            for stage, ms in attempt.stages.items():
                self.stages.record(ms, {"arm": attempt.arm, "stage": stage})
            self.batch.record(attempt.batch_requests, attrs)
            self.queue.record(attempt.queue, attrs)
            self.compute.add(attempt.compute_s, attrs)
            self.cost.add(attempt.cost, attrs)
        if gateway_ms is not None and record.attempts:
            self.stages.record(gateway_ms, {"arm": record.attempts[-1].arm, "stage": "gateway"})


def observe_store_errors(meter: Meter, errors: Callable[[], dict[str, dict[str, int]]]) -> None:
    """`canary.store.errors`: `errors()` gives component -> kind -> count so far."""
    def observe(_: CallbackOptions):
        for component, kinds in errors().items():
            for kind, n in kinds.items():
                yield Observation(n, {"component": component, "kind": kind})

    meter.create_observable_counter(
        "canary.store.errors", [observe], "{error}", "failed Redis calls survived")
