"""Injectable clocks: the system one, and a fake one that tests advance by hand."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (for timestamps shown to people)."""

    def monotonic(self) -> float:
        """Monotonic seconds (for ages, deadlines and staleness)."""


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to; thread-safe."""

    def __init__(self, start: float = 1_700_000_000.0):
        self._now = start
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.time()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
