"""Compute follows the share (serve.replica.thread_share): the policy, and the follower on a state
store."""

import pytest

from rollout.clock import FakeClock
from rollout.control import Rollout
from rollout.store import MemoryStateStore
from serve.replica.thread_share import ComputeFollower, beside_loop, threads_for

POLL_S, STALENESS_S = 0.5, 2.0


@pytest.mark.parametrize(("cores", "bp", "baseline", "optimized"), [
    (2, 0, 2, 1),          # the baseline carries everything; the canary keeps one for shadows
    (2, 500, 2, 1),        # 5 %
    (2, 5000, 1, 1),       # half and half
    (2, 10_000, 1, 2),     # promoted: the optimized arm has the cores
    (16, 2500, 12, 4),
    (16, 1, 16, 1),        # a tiny share still keeps its one thread
    (1, 5000, 1, 1),
])
def test_threads_follow_the_routed_share(cores, bp, baseline, optimized):
    assert threads_for("baseline", bp, cores) == baseline
    assert threads_for("optimized", bp, cores) == optimized
    assert baseline + optimized <= cores + 1


@pytest.mark.parametrize(("threads", "cores", "backlog", "expected"), [
    (2, 2, 0, 2),    # nothing waits behind the batch: every thread
    (2, 2, 5, 1),    # a backlog: the event loop keeps a core
    (16, 16, 1, 15),
    (4, 16, 9, 4),   # the arm's share already leaves the loop cores
    (1, 1, 3, 1),    # one core: the batch keeps its thread
    (1, 2, 3, 1),
])
def test_a_batch_beside_a_busy_event_loop_leaves_it_a_core(threads, cores, backlog, expected):
    assert beside_loop(threads, cores, backlog) == expected


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store():
    return MemoryStateStore()


def _follower(store, clock, arm, applied):
    follower = ComputeFollower(store, arm, 2, applied.append, poll_s=POLL_S,
                               staleness_s=STALENESS_S, clock=clock)
    follower.watcher.refresh()  # what the watcher thread does on a notification or a poll
    follower.check()
    return follower


def test_the_follower_applies_each_change_once(store, clock):
    baseline, optimized = [], []
    followers = [_follower(store, clock, "baseline", baseline),
                 _follower(store, clock, "optimized", optimized)]
    rollout = Rollout(store, clock)
    for bp in (500, 6000, 10_000):
        rollout.set_canary(bp, actor="t", reason="ramp")
        for follower in followers:
            follower.watcher.refresh()
            follower.check()
            follower.check()  # nothing changed: nothing applied again
    assert baseline == [2, 1]         # 0 %, 5 %: 2; from 60 %: 1
    assert optimized == [1, 2]        # up to 5 %: 1; 60 %: round(1.2) = 1; 100 %: 2

    rollout.kill(actor="t", reason="p99")  # everything back to baseline: its cores too
    for follower in followers:
        follower.watcher.refresh()
        follower.check()
    assert (baseline[-1], optimized[-1]) == (2, 1)


def test_a_stale_view_gives_the_baseline_the_cores(store, clock):
    Rollout(store, clock).set_canary(10_000, actor="t", reason="promoted")
    baseline = []
    follower = _follower(store, clock, "baseline", baseline)
    assert baseline == [1]
    clock.advance(STALENESS_S + 1)  # no read since: the gateway routes all to baseline now
    follower.check()
    assert baseline == [1, 2]


def test_a_store_never_read_counts_as_all_baseline(clock):
    class Down(MemoryStateStore):
        def get(self):
            from rollout.errors import StoreUnavailable

            raise StoreUnavailable("redis down")

    applied = []
    _follower(Down(), clock, "optimized", applied)
    assert applied == [1]
