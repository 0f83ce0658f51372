"""Where a ramp's gates read their numbers: a narrow protocol, and its adapter over the windows.

`arm(arm, last_s)` is `rollout.telemetry.windows.Windows.arm`; `agreement(last_s)` answers the
online (shadow) comparison as counts, (pairs, agreed), from which the state machine computes its
anytime-valid bound (rollout.agreement.agreement_cs), and `confident(last_s, min_margin)` the
shadow pairs at a baseline margin >= `min_margin` as (pairs, flips), and `slices(last_s)` the
shadow pairs per slice (rollout.slices) as slice -> (pairs, agreed), and `recall(last_s)` the
embed pairs compared in the shadow's reservoir as (pairs, shared top-10 neighbours).
`horizon_s` is the longest window they can read: the per-second counters expire after
`CANARY_TELEMETRY_WINDOW_TTL_S`.
Unit tests script this protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from rollout.agreement import CONFIDENT_MARGIN
from rollout.shadow import ShadowStats, aggregate_shadow, shadow_key
from rollout.telemetry.windows import ArmStats, Windows

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

    def slices(self, last_s: int) -> dict[str, tuple[int, int]]:
        """Shadow pairs per slice over the last `last_s` seconds: slice -> (pairs, agreed)."""

    def recall(self, last_s: int) -> tuple[int, int]:
        """Embed pairs compared in the reservoir over the last `last_s` seconds, and the sum
        of their shared top-10 neighbours (rollout.shadow)."""

    def tokens(self, last_s: int) -> tuple[int, float, dict[int, int]]:
        """Generated answers the shadow scored over the last `last_s` seconds, the sum of
        their top-1 token agreements, and their count per mean-KLD bin (rollout.shadow)."""


class WindowsMetrics:
    """The ramp's metrics from the per-arm windows (and shadow agreement) in Redis; pass the
    telemetry retention (`settings.telemetry_window_ttl_s`) as `horizon_s`.

    The shadow gates read a whole step, up to `horizon_s` one-second hashes (3,600 by default)
    at every evaluation. So the seconds that ended more than `settle_s` ago (the sinks flush
    within a few seconds) are kept in memory once read, and only the newer ones are read again;
    the shadow gates of one evaluation (same second, same span) share one read. As with
    rollout.telemetry.series, an increment that lands later than `settle_s` is missed, never counted
    twice. Used by one controller thread."""

    def __init__(self, windows: Windows, horizon_s: int = DEFAULT_HORIZON_S,
                 settle_s: int = 10):
        self.windows, self.horizon_s, self.settle_s = windows, horizon_s, settle_s
        self._settled: dict[int, Mapping] = {}  # second -> its shadow hash
        self._last: tuple[tuple[int, int], ShadowStats] | None = None

    def arm(self, arm: str, last_s: int) -> ArmStats:
        return self.windows.arm(arm, last_s)

    def agreement(self, last_s: int) -> tuple[int, int]:
        stats = self._shadow(last_s)  # no pairs: (0, 0), so the gate waits
        return stats.pairs, min(stats.agreed, stats.pairs)

    def confident(self, last_s: int, min_margin: float = CONFIDENT_MARGIN) -> tuple[int, int]:
        pairs, agreed = self._shadow(last_s).confident_from(min_margin)
        return pairs, pairs - min(agreed, pairs)

    def slices(self, last_s: int) -> dict[str, tuple[int, int]]:
        return {key: (pairs, agreed)
                for key, (pairs, agreed, _) in self._shadow(last_s).slices.items()}

    def recall(self, last_s: int) -> tuple[int, int]:
        stats = self._shadow(last_s)
        return stats.recall_queries, stats.recall_hits

    def tokens(self, last_s: int) -> tuple[int, float, dict[int, int]]:
        stats = self._shadow(last_s)
        return stats.token_responses, stats.token_agree_sum, dict(stats.token_bins)

    def _shadow(self, last_s: int) -> ShadowStats:
        """`Windows.shadow(last_s)`, reading only the seconds not settled in memory."""
        now = int(self.windows.clock.time())
        if self._last is not None and self._last[0] == (now, last_s):
            return self._last[1]
        seconds = range(now - last_s + 1, now + 1)
        fresh = [second for second in seconds if second not in self._settled]
        read = self.windows.source.hashes([shadow_key(self.windows.app, s) for s in fresh])
        hashes = dict(zip(fresh, read, strict=True))
        for second, fields in hashes.items():
            if second <= now - self.settle_s:
                self._settled[second] = fields
        for second in [s for s in self._settled if s <= now - max(last_s, self.horizon_s)]:
            del self._settled[second]
        stats = aggregate_shadow([hashes[s] if s in hashes else self._settled[s]
                                  for s in seconds], float(last_s))
        self._last = ((now, last_s), stats)
        return stats
