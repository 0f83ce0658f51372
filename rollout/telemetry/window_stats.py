"""The read side of the per-arm metric windows: what a run of one-second hashes (written as
rollout.telemetry.window_fields lays them out) says about an arm, and where the hashes are read
from.

No clock here: the caller says which seconds to sum (rollout.telemetry.windows: the last N seconds;
rollout.telemetry.series: aligned steps). A percentile is reported as its latency bucket's geometric
midpoint: within ±4.5 % of the exact value, whatever the traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from rollout.efficiency import CpuSums
from rollout.telemetry.window_fields import STAGES, bucket_midpoint


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
    cpu: CpuSums = CpuSums()  # measured forward seconds (rollout.efficiency)
    # a generative arm's answers: answers, tokens, tokens_per_s, first_token_p50_ms,
    # first_token_p99_ms, inter_token_ms (the mean between two tokens); None without any
    generation: dict | None = None

    @property
    def cpu_per_1k(self) -> float | None:
        """CPU seconds (GPU seconds on a CUDA replica: `cpu.device`) per 1,000 inputs."""
        return self.cpu.per_1k

    def as_dict(self) -> dict:
        return dict(self.__dict__) | {"cpu": self.cpu.as_dict(), "cpu_per_1k": self.cpu_per_1k}


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
        cpu=CpuSums.from_totals(totals),
        generation=_generation(totals, seconds),
    )


def _generation(totals: Mapping[str, float], seconds: float) -> dict | None:
    """What the generative answers in `totals` say (rollout.telemetry.window_fields `gen_*`,
    `ttft:<i>`), None when there are none."""
    answers = totals.get("gen_answers", 0)
    if not answers:
        return None
    first = {int(k[5:]): v for k, v in totals.items() if k.startswith("ttft:")}
    tokens = totals.get("gen_tokens", 0)
    return {"answers": int(answers), "tokens": int(tokens),
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "first_token_p50_ms": percentile(first, 0.50),
            "first_token_p99_ms": percentile(first, 0.99),
            "inter_token_ms": _ratio(totals.get("gen_decode_ms", 0), totals.get("gen_gaps", 0))}


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
