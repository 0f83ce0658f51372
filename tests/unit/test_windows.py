"""Per-arm windows (rollout.telemetry.windows): what a request adds, and what a window says."""

from __future__ import annotations

import pytest

from rollout import Attempt, FakeClock, RequestRecord, Windows
from rollout.telemetry.windows import (
    MemoryHashes,
    bucket_midpoint,
    latency_bucket,
    merge_fields,
    percentile,
    record_fields,
)

START = 1_700_000_000.0
STAGES = {"preprocess": 1.0, "queue": 2.0, "forward": 4.0, "postprocess": 0.5}


def ok(arm: str, batch: int = 2, queue: int = 1, compute_s: float = 0.004, cost: float = 0.0):
    return Attempt(arm, "ok", STAGES, batch, queue, compute_s, cost)


def test_a_fallback_counts_the_request_under_the_routed_arm_and_calls_under_each_arm():
    record = RequestRecord("optimized", 200, 12.0, items=2, chars=30,
                           attempts=(Attempt("optimized", "error"), ok("baseline")))
    assert record.retries == 1 and record.fallback
    fields = record_fields(record)
    optimized, baseline = fields["optimized"], fields["baseline"]
    assert optimized["requests"] == 1 and optimized["ok"] == 1 and optimized["status:200"] == 1
    assert optimized["retries"] == 1 and optimized["fallbacks"] == 1
    assert optimized["calls"] == 1 and optimized["call:error"] == 1
    assert "answered" not in optimized and "compute_s" not in optimized
    assert "requests" not in baseline
    assert baseline["calls"] == 1 and baseline["answered"] == 1
    assert baseline["stage:forward"] == 4.0 and baseline["batch_sum"] == 2
    assert baseline["compute_s"] == 0.004


def test_a_request_refused_before_routing_adds_nothing():
    assert record_fields(RequestRecord(None, 422, 0.4)) == {}


def test_latency_buckets_are_within_five_percent():
    for ms in (0.2, 1.0, 3.7, 12.5, 99.0, 1234.0, 60_000.0):
        mid = bucket_midpoint(latency_bucket(ms))
        assert abs(mid - ms) / ms < 0.05, (ms, mid)


def test_percentiles_over_a_known_distribution():
    histogram = {}
    for ms in [10.0] * 98 + [500.0] * 2:
        b = latency_bucket(ms)
        histogram[b] = histogram.get(b, 0) + 1
    assert percentile(histogram, 0.5) == pytest.approx(10.0, rel=0.05)
    assert percentile(histogram, 0.99) == pytest.approx(500.0, rel=0.05)
    assert percentile({}, 0.5) is None


def windows_with(records: list[tuple[float, RequestRecord]], now: float):
    hashes = MemoryHashes()
    hashes.increment(merge_fields(records, "app"))
    return Windows(hashes, "app", clock=FakeClock(now))


def test_window_statistics_after_a_known_sequence():
    t = START
    records = [(t, RequestRecord("baseline", 200, 10.0, 1, 5, (ok("baseline", cost=0.001),)))
               for _ in range(8)]
    records += [
        (t + 1, RequestRecord("baseline", 504, 5000.0, 1, 5, (Attempt("baseline", "timeout"),))),
        (t + 1, RequestRecord("baseline", 503, 3.0, 1, 5, (Attempt("baseline", "error"),))),
        (t + 2, RequestRecord("optimized", 200, 20.0, 1, 5,
                              (Attempt("optimized", "error"), ok("baseline", cost=0.001)))),
    ]
    stats = windows_with(records, t + 2.5).arms(10)
    base, opt = stats["baseline"], stats["optimized"]
    assert base.requests == 10 and base.calls == 11
    assert base.request_rate == pytest.approx(1.0)
    assert base.success_rate == pytest.approx(0.8)
    assert base.timeout_rate == pytest.approx(1 / 11) and base.error_rate == pytest.approx(1 / 11)
    assert base.p50_ms == pytest.approx(10.0, rel=0.05)
    assert base.p99_ms == pytest.approx(5000.0, rel=0.05)
    assert base.batch_mean == pytest.approx(2.0) and base.queue_mean == pytest.approx(1.0)
    assert base.stage_ms["forward"] == pytest.approx(4.0)
    assert base.compute_ms == pytest.approx(4.0)
    assert base.cost_per_1k == pytest.approx(1.0)  # 0.001 per call
    assert base.statuses == {"200": 8, "503": 1, "504": 1}
    assert opt.requests == 1 and opt.success_rate == 1.0 and opt.retry_rate == 1.0
    assert opt.fallbacks == 1 and opt.error_rate == 1.0 and opt.compute_ms is None


def test_the_window_only_counts_the_last_n_seconds():
    records = [(START, RequestRecord("baseline", 200, 10.0, attempts=(ok("baseline"),))),
               (START + 30, RequestRecord("baseline", 200, 10.0, attempts=(ok("baseline"),)))]
    clock = FakeClock(START + 30.2)
    hashes = MemoryHashes()
    hashes.increment(merge_fields(records, "app"))
    windows = Windows(hashes, "app", clock=clock)
    assert windows.arm("baseline", 10).requests == 1
    assert windows.arm("baseline", 31).requests == 2
    clock.advance(60)
    empty = windows.arm("baseline", 10)
    assert empty.requests == 0 and empty.success_rate is None and empty.p50_ms is None


def test_windows_of_different_apps_do_not_mix():
    hashes = MemoryHashes()
    hashes.increment(merge_fields([(START, RequestRecord("baseline", 200, 1.0))], "one"))
    assert Windows(hashes, "two", clock=FakeClock(START)).arm("baseline").requests == 0
    assert Windows(hashes, "one", clock=FakeClock(START)).arm("baseline").requests == 1
