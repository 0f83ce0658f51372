"""Per-arm step series (rollout.telemetry.series) and the shared status document
(rollout.status)."""

from __future__ import annotations

import pytest

from rollout import (
    Attempt,
    DeploymentReport,
    FakeClock,
    MemoryStateStore,
    RequestRecord,
    Rollout,
    StoreUnavailable,
    Windows,
)
from rollout.status import read_status
from rollout.telemetry.series import StepCache, check_span, step_starts
from rollout.telemetry.windows import MemoryHashes, merge_fields

APP = "unit"
START = 1_700_000_040.0  # a multiple of 60


class CountingHashes(MemoryHashes):
    """The in-memory hashes, counting what readers ask for."""

    def __init__(self):
        super().__init__()
        self.reads: list[int] = []

    def hashes(self, keys):
        self.reads.append(len(keys))
        return super().hashes(keys)


def add(source, ts: float, arm: str, latency_ms: float = 10.0, status: int = 200,
        outcome: str = "ok"):
    attempt = Attempt(arm, outcome, {"forward": 1.0}, 4, 2, 0.001, 0.5) if outcome == "ok" \
        else Attempt(arm, outcome)
    source.increment(merge_fields([(ts, RequestRecord(arm, status, latency_ms, 1, 5,
                                                      (attempt,)))], APP))


def test_steps_are_aligned_and_cover_the_span():
    assert step_starts(1_000, 60, 10) == [940, 950, 960, 970, 980, 990, 1000]
    assert step_starts(1_005, 60, 10) == [940, 950, 960, 970, 980, 990, 1000]
    assert step_starts(1_009, 10, 10) == [1000]


@pytest.mark.parametrize("last_s, step_s", [(10, 0), (10, 60), (100_000, 100), (5_000, 1)])
def test_spans_that_cannot_be_drawn_are_refused(last_s, step_s):
    with pytest.raises(ValueError):
        check_span(last_s, step_s)


def test_a_series_sums_each_step_and_divides_by_the_seconds_it_covers():
    clock, source = FakeClock(START + 25), CountingHashes()
    for i in range(30):  # one request a second over the previous minute, 10 ms each
        add(source, START - 30 + i, "baseline")
    add(source, START - 50, "optimized", latency_ms=200.0)
    add(source, START - 49, "optimized", status=503, outcome="error")
    add(source, START + 20, "optimized", latency_ms=20.0)
    series = Windows(source, APP, clock=clock).series(last_s=120, step_s=60)
    assert list(series.arms) == ["baseline", "optimized"]
    baseline, optimized = series.arms["baseline"], series.arms["optimized"]
    assert series.starts == baseline.starts == (int(START) - 120, int(START) - 60, int(START))
    assert series.step_s == 60 and series.now == START + 25
    assert [p.requests for p in baseline.points] == [0, 30, 0]
    assert baseline.points[1].request_rate == pytest.approx(0.5)
    assert baseline.points[1].p50_ms == pytest.approx(10.0, rel=0.05)
    assert baseline.points[0].p50_ms is None  # nothing to divide by: a gap, not a zero
    assert optimized.points[1].error_rate == pytest.approx(0.5)
    # the open step covers 26 seconds so far (START .. START+25)
    assert optimized.points[2].request_rate == pytest.approx(1 / 26)
    columns = optimized.columns()
    assert columns["requests"] == [0, 2, 1] and columns["cost_per_1k"][1] == pytest.approx(500)
    assert source.reads == [2 * 3 * 60 - 34 * 2]  # both arms, one read, no future seconds


def test_sealed_steps_are_cached_and_open_ones_reread():
    clock, source = FakeClock(START + 30), CountingHashes()
    add(source, START - 90, "baseline")
    cache = StepCache(settle_s=5)
    windows = Windows(source, APP, clock=clock)
    first = windows.series(last_s=180, step_s=60, cache=cache)
    assert len(cache) == 2 * 3  # the three closed steps of both arms
    add(source, START - 90, "baseline")  # a straggler older than settle_s: not re-read
    add(source, START + 10, "baseline")
    second = windows.series(last_s=180, step_s=60, cache=cache)
    assert source.reads[-1] == 2 * 31  # only the open step, both arms
    assert [p.requests for p in first.arms["baseline"].points] == [0, 1, 0, 0]
    assert [p.requests for p in second.arms["baseline"].points] == [0, 1, 0, 1]
    clock.advance(60)  # the step that was open is sealed after settle_s
    windows.series(last_s=180, step_s=60, cache=cache)
    assert len(cache) == 2 * 4


def test_the_step_cache_stays_bounded():
    cache = StepCache(max_entries=8)
    stats = Windows(MemoryHashes(), APP, clock=FakeClock(START)).arm("baseline", 1)
    for start in range(0, 600, 60):
        cache.put("baseline", 60, start, stats)
    assert len(cache) <= 8
    assert cache.get("baseline", 60, 540) is stats and cache.get("baseline", 60, 0) is None


def test_status_document_flags_gateways_and_carries_traffic():
    clock, store, source = FakeClock(START), MemoryStateStore(), MemoryHashes()
    Rollout(store, clock).set_canary(500, actor="alice", reason="five")
    store.report_deployment(DeploymentReport(gateway="old", baseline_version="b",
                                             optimized_version="o1", ts=START - 120))
    store.report_deployment(DeploymentReport(gateway="new", baseline_version="b",
                                             optimized_version="o2", ts=START - 1))
    Rollout(store, clock).set_canary(600, actor="alice", reason="six")  # binds to o2
    add(source, START - 1, "baseline")
    doc = read_status(store, source, app=APP, window_s=30, clock=clock).as_json()
    assert doc["canary_bp"] == 600 and doc["effective_percent"] == 6.0
    gateways = {g["gateway"]: g for g in doc["gateways"]}
    assert gateways["old"]["silent"] is True and gateways["old"]["version_mismatch"] is True
    assert gateways["new"]["silent"] is False and gateways["new"]["version_mismatch"] is False
    assert doc["traffic"]["window_s"] == 30 and doc["traffic"]["arms"]["baseline"]["requests"] == 1
    assert doc["traffic"]["error"] is None
    assert "traffic" not in read_status(store, None, app=APP, clock=clock).as_json()


def test_status_survives_unreachable_telemetry():
    class Down:
        def hashes(self, keys):
            raise StoreUnavailable("cannot reach Redis at redis://***@x")

    doc = read_status(MemoryStateStore(), Down(), app=APP, clock=FakeClock(START)).as_json()
    assert doc["traffic"]["arms"] is None and "cannot reach" in doc["traffic"]["error"]
