"""Retry budget: how many fallback retries a gateway may add on top of the canary's traffic.

A failing canary call is retried on baseline, which doubles the work of that request. A sick
canary would then double the load on baseline at the worst moment. The budget caps retries to
`ratio` of the canary calls seen over the last `window_s` seconds, plus `min_per_s` per second
so that a trickle of traffic can still retry. Past the budget a failed canary call is answered
as failed (503) instead of retried.

Invariant: over any window, retries <= ratio * canary calls + min_per_s * window_s (+1).
Counts are kept per second in a ring of `window_s` buckets, on the injected monotonic clock.
"""

from __future__ import annotations

import math
import threading

from rollout.clock import Clock, SystemClock


class RetryBudget:
    def __init__(self, *, ratio: float, min_per_s: float, window_s: int = 10,
                 clock: Clock | None = None):
        if ratio < 0 or min_per_s < 0 or window_s < 1:
            raise ValueError("ratio and min_per_s must be >= 0 and window_s >= 1")
        self.ratio, self.min_per_s, self.window_s = ratio, min_per_s, int(window_s)
        self.clock = clock or SystemClock()
        self._calls = [0] * self.window_s
        self._retries = [0] * self.window_s
        self._second = math.floor(self.clock.monotonic())
        self._lock = threading.Lock()

    def _advance(self) -> int:
        now = math.floor(self.clock.monotonic())
        for second in range(max(self._second + 1, now - self.window_s + 1), now + 1):
            self._calls[second % self.window_s] = 0
            self._retries[second % self.window_s] = 0
        self._second = max(self._second, now)
        return now % self.window_s

    def record_call(self) -> None:
        """A call to the canary (first attempt) was made."""
        with self._lock:
            self._calls[self._advance()] += 1

    def try_retry(self) -> bool:
        """Spend one retry if the budget allows it."""
        with self._lock:
            slot = self._advance()
            allowed = self.ratio * sum(self._calls) + self.min_per_s * self.window_s
            if sum(self._retries) + 1 > allowed:
                return False
            self._retries[slot] += 1
            return True
