"""The write side of the per-arm metric windows: where a second's counters live and what one
request adds to them (rollout.telemetry.windows reads them back, rollout.telemetry.window_stats
sums them).

Layout: one hash per arm per wall-clock second, `rollout:<app>:telemetry:win:<arm>:<second>`,
whose fields are counters. Writers only ever add to them (HINCRBY / HINCRBYFLOAT), so any number
of gateway replicas on any number of hosts merge without coordination, and every hash expires
after the configured retention, so the windows are bounded in size.

Attribution, per arm:

- a *request* counts under the arm the router chose for it (`requests`, `status:<code>`, `ok`,
  latency, `retries`, `fallbacks`, items and characters): what users routed to that arm saw,
  fallback included;
- a *model call* counts under the arm that was called (`calls`, `call:<outcome>`), and an
  answered call adds its stage times, batch size, queue length and compute time to that arm,
  and, when its replica measured them, its share of the forward's CPU seconds (`cpu_*`,
  rollout.efficiency: realized cost per input); a generative answer adds its tokens, its
  time to first token (`ttft:<i>`, bucketed as latency) and its decode time (`gen_*`).
  A request whose optimized call failed and was retried on baseline therefore adds one failed
  call to optimized and one answered call to baseline.

Latency goes into a log-bucketed histogram: bucket i holds latencies in [B·G^i, B·G^(i+1)) ms
with B = 0.1 ms and G = 2^(1/8) (9 % wide), fields `lat:<i>`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rollout.efficiency import request_fields

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
    cpu_s: float | None = None  # its share (by rows) of the forward's CPU (or GPU) seconds
    rows: int = 0  # its inputs (the rows the share is by)
    gpu: bool = False  # cpu_s is GPU seconds (a CUDA replica)
    generated: Generated | None = None  # a generative answer's tokens and times


@dataclass(frozen=True)
class Generated:
    """What a generative model call produced: its time to the first token (from the
    request's arrival), the time from there to its last, and the tokens it generated."""

    first_token_ms: float
    decode_ms: float
    tokens: int


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
            _add_cpu(attempt, add)
            _add_generated(attempt, add)
    return arms


def _add_generated(attempt: Attempt, add: Callable[[str, str, float], None]) -> None:
    """A generative answer's counters: answers, time to first token (a histogram like
    latency's, `ttft:<i>`), tokens, and the decode time and gaps the mean between tokens is
    read from."""
    generated = attempt.generated
    if generated is None:
        return
    add(attempt.arm, "gen_answers")
    add(attempt.arm, f"ttft:{latency_bucket(generated.first_token_ms)}")
    add(attempt.arm, "gen_tokens", generated.tokens)
    add(attempt.arm, "gen_decode_ms", generated.decode_ms)
    add(attempt.arm, "gen_gaps", max(generated.tokens - 1, 0))


def _add_cpu(attempt: Attempt, add: Callable[[str, str, float], None]) -> None:
    """The realized-efficiency counters (rollout.efficiency) of an answered call whose replica
    measured its forwards (one that did not, e.g. of an older version, adds none)."""
    if attempt.cpu_s is None or attempt.rows <= 0:
        return
    fields = request_fields(attempt.cpu_s, attempt.rows, attempt.batch_requests, attempt.gpu)
    for name, amount in fields.items():
        add(attempt.arm, name, amount)


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
