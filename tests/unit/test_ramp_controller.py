"""The controller's failure paths: lost compare-and-sets, an unreachable store, a lost lease,
and the loop that must outlive them all (in-memory stores, fake clock, scripted metrics)."""

from __future__ import annotations

import threading

import pytest

from rollout import LeaseLost, RevisionConflict, StoreUnavailable
from rollout.ramp import MemoryRampStore
from tests.ramp_harness import Harness, stats


class ConflictingStates:
    """Makes the next `n` compare-and-sets of a memory store lose, as if someone wrote first."""

    def __init__(self, h: Harness, n: int):
        self.left = n
        original = h.states.compare_and_set

        def compare_and_set(before, after, **kw):
            if self.left > 0:
                self.left -= 1
                raise RevisionConflict(before.revision, before.revision + 1)
            return original(before, after, **kw)

        h.states.compare_and_set = compare_and_set


@pytest.fixture
def h():
    harness = Harness()
    harness.verdict()
    return harness


def test_an_advance_that_loses_its_compare_and_set_is_re_evaluated(h):
    h.start()
    ConflictingStates(h, 1)
    decision = h.tick()
    assert decision.kind == "advance" and h.share == 0
    assert h.ramp.step == -1  # nothing recorded for a move that did not happen
    assert h.tick().kind == "advance" and h.share == 1000 and h.ramp.step == 0


def test_a_rollback_retries_through_concurrent_writes(h):
    h.start()
    h.tick()
    h.metrics.canary = stats("optimized", 100, error_rate=1.0)
    h.tick()
    ConflictingStates(h, 5)
    assert h.tick().kind == "rollback" and h.share == 0 and h.ramp.status == "aborted"


def test_a_controller_that_lost_its_lease_mid_tick_writes_no_ramp(h):
    h.start()
    original = h.ramps.acquire

    def acquire_then_lose(owner, ttl_s):
        granted = original(owner, ttl_s)
        h.ramps.release(owner)
        original("usurper", 60)  # another controller takes over before this one writes
        return granted

    h.ramps.acquire = acquire_then_lose
    with pytest.raises(LeaseLost):
        h.tick()
    assert h.ramp.step == -1 and h.ramps.holder() == "usurper"


class FlakyRamps(MemoryRampStore):
    def __init__(self, states, clock, failures: int):
        super().__init__(states, clock)
        self.failures = failures

    def acquire(self, owner, ttl_s):
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("cannot reach Redis at redis://h:6379/0")
        return super().acquire(owner, ttl_s)


def test_the_loop_survives_an_unreachable_store_and_releases_its_lease_on_stop(h):
    ramps = FlakyRamps(h.states, h.clock, failures=3)
    h.ramps = ramps
    h.control.ramps = ramps
    controller = h.new_controller("loop")
    controller.interval_s = 0.001
    h.start()
    stop = threading.Event()
    original = controller.tick

    def tick():
        decision = original()
        if decision is not None:  # the first evaluation after the outage: done
            stop.set()
        return decision

    controller.tick = tick
    runner = threading.Thread(target=controller.run, args=(stop,))
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert controller.ticks == 4 and h.share == 1000
    assert ramps.holder() is None  # released on the way out


def test_the_loop_survives_an_unexpected_error(h, caplog):
    controller = h.new_controller("loop")
    controller.interval_s = 0.001
    stop = threading.Event()
    calls = []

    def tick():
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")
        stop.set()

    controller.tick = tick
    controller.run(stop)
    assert len(calls) == 2 and "unexpected error" in caplog.text
