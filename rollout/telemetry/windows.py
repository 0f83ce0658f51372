"""Per-arm metric windows: what the last N seconds of an arm say, read on an injected clock.

The windows are one Redis hash of counters per arm per second. Writing them and summing them are
clock-free and live in their own modules, so that imports run one way:

    window_fields   where a second's counters live, what one request adds (write side)
    window_stats    what a run of seconds says about an arm: ArmStats (read side)
    series          aligned steps of those seconds, for charts
    windows         Windows: the last N seconds on the clock (this module)

(each a module of rollout.telemetry)

This module re-exports the names of the first two, which is where most callers take them from.
"""

from __future__ import annotations

from rollout.clock import Clock, SystemClock
from rollout.shadow import ShadowStats, aggregate_shadow, shadow_key
from rollout.telemetry.series import SeriesReading, StepCache, read_series
from rollout.telemetry.window_fields import (
    OUTCOMES,
    STAGES,
    Attempt,
    RequestRecord,
    bucket_midpoint,
    latency_bucket,
    merge_fields,
    record_fields,
    telemetry_prefix,
    window_key,
)
from rollout.telemetry.window_stats import ArmStats, HashSource, MemoryHashes, aggregate, percentile

__all__ = [
    "OUTCOMES", "STAGES", "ArmStats", "Attempt", "HashSource", "MemoryHashes", "RequestRecord",
    "Windows", "aggregate", "bucket_midpoint", "latency_bucket", "merge_fields", "percentile",
    "record_fields", "telemetry_prefix", "window_key",
]


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

    def series(self, last_s: int = 3_600, step_s: int = 60,
               cache: StepCache | None = None) -> SeriesReading:
        """Both arms' statistics per `step_s` over the last `last_s` seconds, read in one round
        trip (rollout.telemetry.series: aligned steps; `cache` keeps the sealed ones)."""
        return read_series(self.source, self.app, self.ARMS, self.clock.time(), last_s, step_s,
                           cache)

    def shadow(self, last_s: int = 60) -> ShadowStats:
        """Online agreement of shadowed requests over the last `last_s` seconds
        (rollout.shadow), e.g. `windows.shadow(300).lower_bound`."""
        now = int(self.clock.time())
        keys = [shadow_key(self.app, second) for second in range(now - last_s + 1, now + 1)]
        return aggregate_shadow(self.source.hashes(keys), float(last_s))
