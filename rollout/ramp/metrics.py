"""Where a ramp's gates read their numbers: a narrow protocol, and its adapter over the windows.

`arm(arm, last_s)` is `rollout.windows.Windows.arm`; `agreement(last_s)` answers the online
(shadow) comparison as counts, (pairs, agreed), from which the state machine computes its
anytime-valid bound (rollout.agreement.agreement_cs), and `confident(last_s, min_margin)` the
shadow pairs at a baseline margin >= `min_margin` as (pairs, flips). `horizon_s` is the longest
window they can read: the per-second counters expire after `CANARY_TELEMETRY_WINDOW_TTL_S`.
Unit tests script this protocol.
"""

from __future__ import annotations

from typing import Protocol

from rollout.agreement import CONFIDENT_MARGIN
from rollout.windows import ArmStats, Windows

DEFAULT_HORIZON_S = 3_600  # the default of CANARY_TELEMETRY_WINDOW_TTL_S


class RampMetrics(Protocol):
    horizon_s: int  # the longest `last_s` that still reads every second (telemetry retention)

    def arm(self, arm: str, last_s: int) -> ArmStats:
        """One arm's statistics over the last `last_s` seconds."""

    def agreement(self, last_s: int) -> tuple[int, int]:
        """Shadow pairs compared over the last `last_s` seconds, and how many agreed."""

    def confident(self, last_s: int, min_margin: float = CONFIDENT_MARGIN) -> tuple[int, int]:
        """Shadow pairs at a baseline margin >= `min_margin` (a bucket edge, rollout.shadow)
        over the last `last_s` seconds, and how many of them flipped."""


class WindowsMetrics:
    """The ramp's metrics from the per-arm windows (and shadow agreement) in Redis; pass the
    telemetry retention (`settings.telemetry_window_ttl_s`) as `horizon_s`."""

    def __init__(self, windows: Windows, horizon_s: int = DEFAULT_HORIZON_S):
        self.windows, self.horizon_s = windows, horizon_s

    def arm(self, arm: str, last_s: int) -> ArmStats:
        return self.windows.arm(arm, last_s)

    def agreement(self, last_s: int) -> tuple[int, int]:
        stats = self.windows.shadow(last_s)  # no pairs: (0, 0), so the gate waits
        return stats.pairs, min(stats.agreed, stats.pairs)

    def confident(self, last_s: int, min_margin: float = CONFIDENT_MARGIN) -> tuple[int, int]:
        pairs, agreed = self.windows.shadow(last_s).confident_from(min_margin)
        return pairs, pairs - min(agreed, pairs)
