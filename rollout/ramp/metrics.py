"""Where a ramp's gates read their numbers: a narrow protocol, and its adapter over the windows.

`arm(arm, last_s)` is `rollout.windows.Windows.arm`; `agreement(last_s)` answers the online
(shadow) agreement as (pairs, Wilson 95 % lower bound), and `confident(last_s)` the shadow pairs
at a baseline margin >= 0.05 as (pairs, flips). Unit tests script this protocol.
"""

from __future__ import annotations

from typing import Protocol

from rollout.windows import ArmStats, Windows


class RampMetrics(Protocol):
    def arm(self, arm: str, last_s: int) -> ArmStats:
        """One arm's statistics over the last `last_s` seconds."""

    def agreement(self, last_s: int) -> tuple[int, float | None]:
        """Shadow pairs compared over the last `last_s` seconds and the agreement's lower
        bound (None when there is nothing to judge)."""

    def confident(self, last_s: int) -> tuple[int, int]:
        """Shadow pairs at a baseline margin >= 0.05 (rollout.shadow) over the last `last_s`
        seconds, and how many of them flipped."""


class WindowsMetrics:
    """The ramp's metrics from the per-arm windows (and shadow agreement) in Redis."""

    def __init__(self, windows: Windows):
        self.windows = windows

    def arm(self, arm: str, last_s: int) -> ArmStats:
        return self.windows.arm(arm, last_s)

    def agreement(self, last_s: int) -> tuple[int, float | None]:
        stats = self.windows.shadow(last_s)  # no pairs: (0, None), so the gate waits
        return stats.pairs, stats.lower_bound

    def confident(self, last_s: int) -> tuple[int, int]:
        stats = self.windows.shadow(last_s)
        return stats.confident_pairs, stats.confident_pairs - stats.confident_agreed
