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
from serve.telemetry.aggregate import Aggregates, SdkInstruments

LATENCY_MS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
ARM = ("arm",)


class GatewayMetrics:
    """The instruments above. `instruments`: where they count (serve.telemetry.aggregate:
    this process's `Aggregates`, or by default the SDK's own instruments of `meter`); label
    values go in the order each instrument lists them."""

    def __init__(self, meter: Meter, *, price: float = 0.0,
                 dropped: Callable[[], dict[str, int]] | None = None,
                 instruments: Aggregates | SdkInstruments | None = None):
        self.price = price
        make = instruments or SdkInstruments(meter)
        self.requests = make.counter(
            "canary.requests", "{request}", "requests by routed arm and HTTP status",
            ("arm", "status", "outcome", "protocol"))
        self.calls = make.counter(
            "canary.model.calls", "{call}", "model calls by arm and outcome", ("arm", "outcome"))
        self.retries = make.counter(
            "canary.retries", "{request}", "requests retried on baseline after this arm failed",
            ARM)
        self.fallbacks = make.counter(
            "canary.fallbacks", "{request}", "requests answered by baseline after this arm failed",
            ARM)
        self.latency = make.histogram(
            "canary.request.duration", "ms", "request latency at the gateway", ("arm", "status"),
            LATENCY_MS)
        self.stages = make.histogram(
            "canary.stage.duration", "ms", "time per stage of answered model calls",
            ("arm", "stage"), LATENCY_MS)
        self.batch = make.histogram(
            "canary.batch.size", "{request}", "requests in the batch a call rode in", ARM, COUNTS)
        self.queue = make.histogram(
            "canary.queue.length", "{request}", "requests waiting in the replica on arrival",
            ARM, (0, *COUNTS))
        self.inflight = make.up_down_counter(
            "canary.inflight", "{call}", "model calls in flight", ARM)
        self.compute = make.counter(
            "canary.compute.time", "s", "device time of answered calls (share of their batch)",
            ARM)
        self.cost = make.counter(
            "canary.cost", "1", "compute time priced at CANARY_DEVICE_HOUR_PRICE per hour", ARM)
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
        self.requests.add((arm, status, outcome, protocol), 1)
        self.latency.record((arm, status), record.latency_ms)
        if record.retries:
            self.retries.add((arm,), record.retries)
        if record.fallback:
            self.fallbacks.add((arm,), 1)
        for attempt in record.attempts:
            key = (attempt.arm,)
            self.calls.add((attempt.arm, attempt.outcome), 1)
            if attempt.outcome != "ok":
                continue
            for stage, ms in attempt.stages.items():
                self.stages.record((attempt.arm, stage), ms)
            self.batch.record(key, attempt.batch_requests)
            self.queue.record(key, attempt.queue)
            self.compute.add(key, attempt.compute_s)
            self.cost.add(key, attempt.cost)
        if gateway_ms is not None and record.attempts:
            self.stages.record((record.attempts[-1].arm, "gateway"), gateway_ms)


def observe_store_errors(meter: Meter, errors: Callable[[], dict[str, dict[str, int]]]) -> None:
    """`canary.store.errors`: `errors()` gives component -> kind -> count so far."""
    def observe(_: CallbackOptions):
        for component, kinds in errors().items():
            for kind, n in kinds.items():
                yield Observation(n, {"component": component, "kind": kind})

    meter.create_observable_counter(
        "canary.store.errors", [observe], "{error}", "failed Redis calls survived")
