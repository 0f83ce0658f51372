"""Per-arm metric windows: what one request adds, and what the last N seconds of an arm say.

Layout: one hash per arm per wall-clock second, `rollout:<app>:telemetry:win:<arm>:<second>`,
whose fields are counters. Writers only ever add to them (HINCRBY / HINCRBYFLOAT), so any number
of gateway replicas on any number of hosts merge without coordination, and every hash expires
after the configured retention, so the windows are bounded in size.

Attribution, per arm:

- a *request* counts under the arm the router chose for it (`requests`, `status:<code>`, `ok`,
  latency, `retries`, `fallbacks`, items and characters): what users routed to that arm saw,
  fallback included;
- a *model call* counts under the arm that was called (`calls`, `call:<outcome>`), and an
  answered call adds its stage times, batch size, queue length and compute time to that arm.
  A request whose optimized call failed and was retried on baseline therefore adds one failed
  call to optimized and one answered call to baseline.

Latency percentiles come from a log-bucketed histogram: bucket i holds latencies in
[B·G^i, B·G^(i+1)) ms with B = 0.1 ms and G = 2^(1/8) (9 % wide). A percentile is reported as
its bucket's geometric midpoint: within ±4.5 % of the exact value, whatever the traffic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rollout.clock import Clock, SystemClock
from rollout.shadow import ShadowStats, aggregate_shadow, shadow_key

OUTCOMES = ("ok", "error", "timeout", "overloaded")  # of one model call
STAGES = ("preprocess", "queue", "forward", "postprocess")  # inside a model replica
_BASE_MS = 0.1
_GROWTH = 2 ** (1 / 8)


def telemetry_prefix(app: str) -> str:
    return f"rollout:{app}:telemetry:"


def window_key(app: str, arm: str, second: int) -> str:
    return f"{telemetry_prefix(app)}win:{arm}:{second}"


def latency_bucket(ms: float) -> int:
    """The histogram bucket of a latency (all latencies under 0.1 ms share bucket 0)."""
    if ms <= _BASE_MS:
        return 0
    return int(math.log(ms / _BASE_MS) / math.log(_GROWTH))


def bucket_midpoint(index: int) -> float:
    return _BASE_MS * _GROWTH ** (index + 0.5)


# --- what one request adds --------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One model call: to which arm, how it ended, and (when answered) what the replica said."""

    arm: str
    outcome: str  # one of OUTCOMES
    stages: Mapping[str, float] = field(default_factory=dict)  # ms per stage, when answered
    batch_requests: int = 0  # requests in the batch this call rode in
    queue: int = 0  # requests waiting in the replica when this one joined the queue
    compute_s: float = 0.0  # this call's share of its batch's forward time
    cost: float = 0.0  # compute_s at the gateway's configured device-hour price


@dataclass(frozen=True)
class RequestRecord:
    """One request as the gateway finished it."""

    routed: str | None  # the arm chosen by the router; None when refused before routing
    status: int  # the HTTP status answered
    latency_ms: float
    items: int = 0
    chars: int = 0
    attempts: tuple[Attempt, ...] = ()

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    @property
    def fallback(self) -> bool:
        return self.retries > 0 and self.attempts[-1].outcome == "ok"


def record_fields(record: RequestRecord) -> dict[str, dict[str, float]]:
    """The counter increments one request adds, per arm."""
    arms: dict[str, dict[str, float]] = {}

    def add(arm: str, name: str, amount: float = 1) -> None:
        fields = arms.setdefault(arm, {})
        fields[name] = fields.get(name, 0) + amount

    if record.routed is not None:
        arm = record.routed
        add(arm, "requests")
        add(arm, f"status:{record.status}")
        if record.status == 200:
            add(arm, "ok")
        add(arm, f"lat:{latency_bucket(record.latency_ms)}")
        add(arm, "lat_sum", record.latency_ms)
        add(arm, "items", record.items)
        add(arm, "chars", record.chars)
        if record.retries:
            add(arm, "retries", record.retries)
        if record.fallback:
            add(arm, "fallbacks")
    for attempt in record.attempts:
        add(attempt.arm, "calls")
        add(attempt.arm, f"call:{attempt.outcome}")
        if attempt.outcome == "ok":
            add(attempt.arm, "answered")
            for stage, ms in attempt.stages.items():
                add(attempt.arm, f"stage:{stage}", ms)
            add(attempt.arm, "batch_sum", attempt.batch_requests)
            add(attempt.arm, "queue_sum", attempt.queue)
            add(attempt.arm, "compute_s", attempt.compute_s)
            add(attempt.arm, "cost", attempt.cost)
    return arms


def merge_fields(
    records: Iterable[tuple[float, RequestRecord]], app: str
) -> dict[str, dict[str, float]]:
    """Many (timestamp, record) pairs as one increment per window key and field."""
    merged: dict[str, dict[str, float]] = {}
    for ts, record in records:
        second = int(ts)
        for arm, fields in record_fields(record).items():
            target = merged.setdefault(window_key(app, arm, second), {})
            for name, amount in fields.items():
                target[name] = target.get(name, 0) + amount
    return merged


# --- what a window says -----------------------------------------------------------------------


@dataclass(frozen=True)
class ArmStats:
    """One arm over the last `seconds` seconds. Rates are fractions (0..1); None when there is
    nothing to divide by (no requests, no calls)."""

    arm: str
    seconds: float
    requests: int
    calls: int
    request_rate: float  # requests per second
    success_rate: float | None  # requests answered 200
    error_rate: float | None  # calls that failed or were refused (error, overloaded)
    timeout_rate: float | None  # calls that passed their deadline
    retry_rate: float | None  # requests retried on baseline
    fallbacks: int
    p50_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    queue_mean: float | None  # requests waiting in the replica, as calls found it
    batch_mean: float | None  # requests per batch, as calls rode in them
    stage_ms: dict[str, float]  # mean per answered call
    compute_ms: float | None  # mean compute time per answered call
    cost_per_1k: float | None  # cost of 1,000 answered calls (CANARY_DEVICE_HOUR_PRICE)
    statuses: dict[str, int]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def percentile(histogram: Mapping[int, float], q: float) -> float | None:
    total = sum(histogram.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return bucket_midpoint(index)
    return bucket_midpoint(max(histogram))


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def aggregate(arm: str, hashes: Iterable[Mapping[str, str | float]], seconds: float) -> ArmStats:
    """Sum the per-second hashes of one arm into its statistics over `seconds`."""
    totals: dict[str, float] = {}
    for fields in hashes:
        for name, value in fields.items():
            totals[name] = totals.get(name, 0.0) + float(value)
    get = totals.get
    requests, calls, answered = get("requests", 0), get("calls", 0), get("answered", 0)
    histogram = {int(k[4:]): v for k, v in totals.items() if k.startswith("lat:")}
    per_call_s = _ratio(get("compute_s", 0.0), answered)
    per_call_cost = _ratio(get("cost", 0.0), answered)
    return ArmStats(
        arm=arm,
        seconds=seconds,
        requests=int(requests),
        calls=int(calls),
        request_rate=requests / seconds if seconds else 0.0,
        success_rate=_ratio(get("ok", 0), requests),
        error_rate=_ratio(get("call:error", 0) + get("call:overloaded", 0), calls),
        timeout_rate=_ratio(get("call:timeout", 0), calls),
        retry_rate=_ratio(get("retries", 0), requests),
        fallbacks=int(get("fallbacks", 0)),
        p50_ms=percentile(histogram, 0.50),
        p99_ms=percentile(histogram, 0.99),
        mean_ms=_ratio(get("lat_sum", 0), requests),
        queue_mean=_ratio(get("queue_sum", 0), answered),
        batch_mean=_ratio(get("batch_sum", 0), answered),
        stage_ms={s: totals[f"stage:{s}"] / answered for s in STAGES if f"stage:{s}" in totals},
        compute_ms=None if per_call_s is None else per_call_s * 1000,
        cost_per_1k=None if per_call_cost is None else per_call_cost * 1000,
        statuses={k[7:]: int(v) for k, v in sorted(totals.items()) if k.startswith("status:")},
    )


class HashSource(Protocol):
    def hashes(self, keys: list[str]) -> list[Mapping[str, str | float]]:
        """The hash stored at each key, in order; an empty mapping where there is none."""


class MemoryHashes:
    """An in-memory twin of the Redis hashes the windows live in (no expiry), for unit tests."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, float]] = {}

    def increment(self, increments: Mapping[str, Mapping[str, float]]) -> None:
        for key, fields in increments.items():
            target = self.data.setdefault(key, {})
            for name, amount in fields.items():
                target[name] = target.get(name, 0) + amount

    def hashes(self, keys: list[str]) -> list[Mapping[str, float]]:
        return [dict(self.data.get(key, {})) for key in keys]


class Windows:
    """Reads per-arm statistics over the last N seconds (whole seconds, the current one included).

    `arms()` is what `rollout status` shows and what a ramp gate compares: e.g.
    `windows.arm("optimized", 300).error_rate`. Time comes from the injected clock."""

    ARMS = ("baseline", "optimized")

    def __init__(self, source: HashSource, app: str, *, clock: Clock | None = None):
        self.source, self.app = source, app
        self.clock = clock or SystemClock()

    def arm(self, arm: str, last_s: int = 60) -> ArmStats:
        now = int(self.clock.time())
        keys = [window_key(self.app, arm, second) for second in range(now - last_s + 1, now + 1)]
        return aggregate(arm, self.source.hashes(keys), float(last_s))

    def arms(self, last_s: int = 60) -> dict[str, ArmStats]:
        return {arm: self.arm(arm, last_s) for arm in self.ARMS}

    def series(self, last_s: int = 3_600, step_s: int = 60, cache=None) -> dict:
        """Both arms' statistics per `step_s` over the last `last_s` seconds, read in one round
        trip (rollout.series: aligned steps; `cache`, a StepCache, keeps the sealed ones)."""
        from rollout.series import read_series

        return read_series(self.source, self.app, self.ARMS, self.clock.time(), last_s, step_s,
                           cache)

    def shadow(self, last_s: int = 60) -> ShadowStats:
        """Online agreement of shadowed requests over the last `last_s` seconds
        (rollout.shadow), e.g. `windows.shadow(300).lower_bound`."""
        now = int(self.clock.time())
        keys = [shadow_key(self.app, second) for second in range(now - last_s + 1, now + 1)]
        return aggregate_shadow(self.source.hashes(keys), float(last_s))
