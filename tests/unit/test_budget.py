"""The retry budget with a fake clock."""

import pytest

from rollout import FakeClock
from rollout.budget import RetryBudget


def test_retries_are_capped_by_the_ratio_of_calls():
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=0, window_s=10, clock=clock)
    for _ in range(100):
        budget.record_call()
    granted = sum(budget.try_retry() for _ in range(100))
    assert granted == 20


def test_a_trickle_of_traffic_can_still_retry():
    budget = RetryBudget(ratio=0.0, min_per_s=0.5, window_s=10, clock=FakeClock())
    assert sum(budget.try_retry() for _ in range(10)) == 5


def test_the_window_slides_and_old_retries_are_forgotten():
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, min_per_s=0, window_s=10, clock=clock)
    for _ in range(10):
        budget.record_call()
    assert sum(budget.try_retry() for _ in range(10)) == 5
    clock.advance(10)  # everything has left the window: no calls, no budget
    assert budget.try_retry() is False
    for _ in range(4):
        budget.record_call()
    assert sum(budget.try_retry() for _ in range(10)) == 2


def test_sick_canary_never_doubles_the_load():
    """Every canary call fails for a minute: retries stay within the budget in every window."""
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, min_per_s=1, window_s=10, clock=clock)
    retries_per_second = []
    for _ in range(60):
        granted = 0
        for _ in range(50):  # 50 canary calls a second, each failing
            budget.record_call()
            granted += budget.try_retry()
        retries_per_second.append(granted)
        clock.advance(1)
    for start in range(0, 51):
        window = sum(retries_per_second[start:start + 10])
        assert window <= 0.1 * 500 + 1 * 10 + 1


@pytest.mark.parametrize(
    "kwargs", [dict(ratio=-1, min_per_s=0), dict(ratio=0, min_per_s=0, window_s=0)]
)
def test_invalid_budgets_are_refused(kwargs):
    with pytest.raises(ValueError):
        RetryBudget(**kwargs)
