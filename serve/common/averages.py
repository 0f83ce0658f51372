"""Moving averages the gateway and the model replicas keep of their own load.

`moving_average`: one step of an exponentially weighted average. `WindowedRate`: the rate at
which a growing count grows over wall time (a thread's CPU seconds, the machine's idle
seconds), averaged over windows of at least `window_s` so that a caller may sample it as often
as it likes (per batch, per timer tick) and pay for a window's arithmetic only when one closes.
"""

from __future__ import annotations


def moving_average(average: float | None, sample: float, weight: float) -> float:
    """`average` moved `weight` of the way to `sample`; the sample itself when there is none."""
    return sample if average is None else average + weight * (sample - average)


class WindowedRate:
    """The average rate of a count (`sample(wall, count)`), over windows of at least `window_s`
    seconds, `weight` for the newest window's rate, each window's rate clipped to `low..high`.
    `value` starts at `start` (None: the first window's rate is taken as it is)."""

    def __init__(self, window_s: float, weight: float, *, start: float | None = None,
                 low: float = 0.0, high: float = float("inf")):
        self.window_s, self.weight, self.low, self.high = window_s, weight, low, high
        self.value = start
        self._since: tuple[float, float] | None = None  # (wall, count) at the window's start

    def sample(self, wall: float, count: float) -> float | None:
        """Close the window if it is `window_s` long by `wall`; the average so far."""
        if self._since is None:
            self._since = (wall, count)
            return self.value
        elapsed = wall - self._since[0]
        if elapsed >= self.window_s:
            rate = min(self.high, max(self.low, (count - self._since[1]) / elapsed))
            self.value = moving_average(self.value, rate, self.weight)
            self._since = (wall, count)
        return self.value
