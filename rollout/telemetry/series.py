"""Per-arm time series for charts: the one-second windows (rollout.telemetry.window_fields) summed
into steps (rollout.telemetry.window_stats); `Windows.series` (rollout.telemetry.windows) reads
them on its clock.

Steps are aligned to multiples of `step_s` in epoch seconds, so a step means the same seconds on
every read. Over the last `last_s` seconds the series holds every step that overlaps them, oldest
first; the newest step is still open (it ends at the current second) and the oldest may reach
back before the window. A step's rates divide by the seconds it covers up to now, so the open
step is not diluted by seconds that have not happened yet.

Reading an hour at one-second resolution is 3,600 hashes per arm. `StepCache` keeps the steps
that can no longer change: a step is *sealed* once it ended more than `settle_s` ago (writers
flush their increments within a few seconds), so a refresh reads only the open steps' hashes,
all arms in one round trip, and sums the sealed ones from memory. A cached step is never
re-read: increments that land later than `settle_s` (a sink that was cut off from Redis and
retried) are missed by the chart, never counted twice.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from rollout.telemetry.window_fields import window_key
from rollout.telemetry.window_stats import ArmStats, HashSource, aggregate

MAX_POINTS = 1_000  # steps in one series
MAX_SPAN_S = 86_400
# what a chart shows of each step's ArmStats
FIELDS = ("requests", "request_rate", "error_rate", "timeout_rate", "p50_ms", "p99_ms",
          "queue_mean", "batch_mean", "cost_per_1k")


@dataclass(frozen=True)
class Series:
    """One arm's statistics per step: `starts[i]` is the epoch second step i begins at."""

    arm: str
    step_s: int
    starts: tuple[int, ...]
    points: tuple[ArmStats, ...]

    def columns(self) -> dict[str, list]:
        """Column per field, None where a step had nothing to divide by."""
        return {name: [getattr(p, name) for p in self.points] for name in FIELDS}


@dataclass(frozen=True)
class SeriesReading:
    """Every arm's series, read at `now` over the same aligned steps: `arms` by arm name, in the
    order asked for (`Windows.series`: baseline, then optimized)."""

    now: float
    step_s: int
    starts: tuple[int, ...]
    arms: Mapping[str, Series]


def check_span(last_s: int, step_s: int) -> None:
    """Refuse series that are empty, finer than a second or too long to draw."""
    if step_s < 1 or last_s < step_s:
        raise ValueError("the step must be at least 1 s and no longer than the span")
    if last_s > MAX_SPAN_S:
        raise ValueError(f"the span can be at most {MAX_SPAN_S} s")
    if last_s // step_s > MAX_POINTS:
        raise ValueError(f"at most {MAX_POINTS} steps per series: use a longer step")


def step_starts(now: int, last_s: int, step_s: int) -> list[int]:
    """Aligned starts of the steps that overlap the seconds (now - last_s, now]."""
    first = (now - last_s + 1) // step_s * step_s
    return list(range(first, now // step_s * step_s + 1, step_s))


def covered(start: int, step_s: int, now: int) -> range:
    """The seconds of a step that have begun by `now`."""
    return range(start, min(start + step_s, now + 1))


class StepCache:
    """Sealed steps' statistics by (arm, step_s, start), bounded; safe to share between threads."""

    def __init__(self, settle_s: float = 5.0, max_entries: int = 20_000):
        self.settle_s, self.max_entries = settle_s, max_entries
        self._steps: dict[tuple[str, int, int], ArmStats] = {}
        self._lock = threading.Lock()

    def sealed(self, start: int, step_s: int, now: float) -> bool:
        return start + step_s <= now - self.settle_s

    def get(self, arm: str, step_s: int, start: int) -> ArmStats | None:
        with self._lock:
            return self._steps.get((arm, step_s, start))

    def put(self, arm: str, step_s: int, start: int, stats: ArmStats) -> None:
        with self._lock:
            if len(self._steps) >= self.max_entries:  # the oldest steps go first
                for key in sorted(self._steps, key=lambda k: k[2])[: self.max_entries // 4]:
                    del self._steps[key]
            self._steps[(arm, step_s, start)] = stats

    def __len__(self) -> int:
        with self._lock:
            return len(self._steps)


def read_series(
    source: HashSource, app: str, arms: tuple[str, ...], now: float, last_s: int, step_s: int,
    cache: StepCache | None = None,
) -> SeriesReading:
    """Every arm's series over the last `last_s` seconds, from one `source.hashes` call."""
    check_span(last_s, step_s)
    second = int(now)
    starts = step_starts(second, last_s, step_s)
    found: dict[tuple[str, int], ArmStats] = {}
    wanted: list[tuple[str, int, range]] = []
    for arm in arms:
        for start in starts:
            hit = cache.get(arm, step_s, start) if cache is not None else None
            if hit is not None:
                found[(arm, start)] = hit
            else:
                wanted.append((arm, start, covered(start, step_s, second)))
    keys = [window_key(app, arm, s) for arm, _, seconds in wanted for s in seconds]
    hashes: list[Mapping] = source.hashes(keys) if keys else []
    offset = 0
    for arm, start, seconds in wanted:
        stats = aggregate(arm, hashes[offset:offset + len(seconds)], float(len(seconds)))
        offset += len(seconds)
        found[(arm, start)] = stats
        if cache is not None and cache.sealed(start, step_s, now):
            cache.put(arm, step_s, start, stats)
    steps = tuple(starts)
    return SeriesReading(now, step_s, steps, {
        arm: Series(arm, step_s, steps, tuple(found[(arm, s)] for s in starts)) for arm in arms
    })
