"""Moving averages of a process's own load (serve.common.averages)."""

import pytest

from serve.common.averages import WindowedRate, moving_average


def test_a_moving_average_starts_at_its_first_sample():
    assert moving_average(None, 4.0, 0.3) == 4.0
    assert moving_average(4.0, 14.0, 0.3) == pytest.approx(7.0)


def test_a_windowed_rate_closes_windows_only_once_they_are_long_enough():
    rate = WindowedRate(0.25, 0.5)
    assert rate.sample(10.0, 100.0) is None  # opens the first window
    assert rate.sample(10.1, 150.0) is None  # too short: nothing closed
    assert rate.sample(10.5, 101.0) == pytest.approx(2.0)  # 1 more over 0.5 s: 2 per s
    assert rate.sample(11.0, 102.0) == pytest.approx(2.0 + 0.5 * (2.0 - 2.0))
    assert rate.sample(11.25, 104.0) == pytest.approx(2.0 + 0.5 * (8.0 - 2.0))


def test_a_windowed_rate_clips_each_window_and_may_start_from_a_value():
    share = WindowedRate(1.0, 0.5, start=0.0, high=1.0)
    assert share.sample(0.0, 0.0) == 0.0
    assert share.sample(1.0, 3.0) == pytest.approx(0.5)  # 3 clipped to 1, half way from 0
    assert share.sample(2.0, 1.0) == pytest.approx(0.25)  # a count that fell: 0, not negative
