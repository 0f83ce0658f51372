"""A gateway's cached rollout state (rollout.watcher): freshness, fail-safe staleness, recovery.

Staleness is measured on a FakeClock that the tests advance. The background-thread tests wait
for an outcome by polling `view()` against a deadline; none of them sleeps a fixed time and then
asserts.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from rollout import (
    DeploymentReport,
    FakeClock,
    MemoryStateStore,
    PermissionDenied,
    Rollout,
    RolloutState,
    StateStore,
    StateWatcher,
    StoreUnavailable,
    Subscription,
)
from rollout.errors import StateUnreadable, StoreRefused
from rollout.watcher import error_kind

POLL_S = 1.0
STALENESS_S = 5.0
DEADLINE_S = 5.0


class FailingStore(StateStore):
    """Wraps a store; while `down` is set, reads and subscribing raise `fault()` (by default
    StoreUnavailable)."""

    def __init__(self, inner: StateStore):
        self.inner = inner
        self.down = threading.Event()
        self.failed_reads = 0
        self.fault = lambda what: StoreUnavailable(f"cannot {what}: it is down")

    def get(self):
        if self.down.is_set():
            self.failed_reads += 1
            raise self.fault("reach the test store")
        return self.inner.get()

    def subscribe(self):
        if self.down.is_set():
            raise self.fault("subscribe")
        return self.inner.subscribe()

    def compare_and_set(self, before, after, *, actor, action, reason):
        return self.inner.compare_and_set(before, after, actor=actor, action=action, reason=reason)

    def audit(self, last=None):
        return self.inner.audit(last)

    def state_at(self, revision):
        return self.inner.state_at(revision)

    def report_deployment(self, report):
        if self.down.is_set():
            raise self.fault("report")
        self.inner.report_deployment(report)

    def deployments(self):
        return self.inner.deployments()


class _Silent(Subscription):
    def __init__(self):
        self._closed = threading.Event()

    def wait(self, timeout):
        self._closed.wait(timeout)
        return False

    def close(self):
        self._closed.set()


class DeafStore(MemoryStateStore):
    """A store whose change notifications never arrive: only the poll can see a change."""

    def subscribe(self):
        return _Silent()


def eventually(predicate, timeout: float = DEADLINE_S) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; True if it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def watcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rollout-watcher"]


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def memory():
    return MemoryStateStore()


@pytest.fixture
def failing(memory):
    return FailingStore(memory)


@pytest.fixture
def rollout(memory, clock):
    return Rollout(memory, clock)


@pytest.fixture
def watcher(failing, clock):
    return StateWatcher(failing, poll_s=POLL_S, staleness_s=STALENESS_S, clock=clock)


# --- construction --------------------------------------------------------------------------------


@pytest.mark.parametrize("staleness_s", [0.5, 1.0])
def test_staleness_must_exceed_the_poll_interval(memory, staleness_s):
    with pytest.raises(ValueError, match="staleness_s"):
        StateWatcher(memory, poll_s=1.0, staleness_s=staleness_s)


# --- refresh and staleness, driven by hand -------------------------------------------------------


def test_view_before_any_read_is_stale_and_not_loaded(watcher):
    view = watcher.view()

    assert view.loaded is False
    assert view.stale is True
    assert view.age_s == float("inf")
    assert view.error is None
    assert view.state == RolloutState()


def test_refresh_loads_a_fresh_state(watcher, rollout):
    rollout.set_canary(500, actor="alice", reason="five")

    assert watcher.refresh() is True

    view = watcher.view()
    assert view.loaded is True
    assert view.stale is False
    assert view.age_s == 0
    assert view.error is None
    assert (view.state.canary_bp, view.state.revision) == (500, 1)


def test_the_view_turns_stale_once_older_than_the_staleness_bound(watcher, clock):
    watcher.refresh()

    clock.advance(STALENESS_S)
    assert watcher.view().age_s == STALENESS_S
    assert watcher.view().stale is False  # exactly at the bound is still fresh

    clock.advance(0.001)
    assert watcher.view().stale is True
    assert watcher.view().loaded is True

    watcher.refresh()
    assert watcher.view().stale is False
    assert watcher.view().age_s == 0


def test_a_failing_store_keeps_the_last_state_until_it_is_too_old(
    watcher, failing, rollout, clock
):
    rollout.set_canary(2_500, actor="alice", reason="quarter")
    watcher.refresh()
    failing.down.set()

    assert watcher.refresh() is False  # never raises

    view = watcher.view()
    assert view.state.canary_bp == 2_500  # the cached copy is still served
    assert view.error is not None and "down" in view.error
    assert view.loaded is True
    assert view.stale is False

    clock.advance(STALENESS_S - 0.5)
    assert watcher.refresh() is False
    assert watcher.view().stale is False  # a failed read does not reset the age ...

    clock.advance(1.0)
    view = watcher.view()
    assert view.stale is True  # ... so the copy turns stale on schedule
    assert view.age_s == STALENESS_S + 0.5
    assert view.state.canary_bp == 2_500
    assert view.error is not None


def test_the_view_recovers_when_the_store_works_again(watcher, failing, rollout, clock):
    watcher.refresh()
    failing.down.set()
    watcher.refresh()
    clock.advance(STALENESS_S * 2)
    assert watcher.view().stale is True
    rollout.set_canary(100, actor="alice", reason="changed while we were cut off")

    failing.down.clear()
    assert watcher.refresh() is True

    view = watcher.view()
    assert view.error is None
    assert view.stale is False
    assert view.state.canary_bp == 100


def test_a_store_that_never_answered_stays_unloaded(watcher, failing):
    failing.down.set()

    assert watcher.refresh() is False

    view = watcher.view()
    assert view.loaded is False
    assert view.stale is True
    assert view.error is not None
    assert view.state == RolloutState()


# --- the background thread -----------------------------------------------------------------------


@contextlib.contextmanager
def running(watcher: StateWatcher, wake):
    """Run the watcher's thread; on exit stop it, waking it with `wake()` if it sleeps long."""
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.stop(timeout=0)  # ask it to stop: it may be blocked waiting for a change ...
        wake()  # ... which this provides
        watcher.stop(timeout=DEADLINE_S)


def test_start_reads_the_state_before_returning(watcher, rollout):
    rollout.set_canary(300, actor="alice", reason="three")

    with running(watcher, wake=lambda: rollout.set_canary(0, actor="t", reason="wake")):
        assert watcher.view().loaded is True
        assert watcher.view().state.canary_bp == 300


def test_the_thread_picks_up_a_change_from_its_notification(memory, rollout, clock):
    # The poll is far longer than the deadline: only the change notification can deliver it.
    watcher = StateWatcher(memory, poll_s=600.0, staleness_s=1200.0, clock=clock)

    with running(watcher, wake=lambda: rollout.kill(actor="t", reason="wake")):
        rollout.set_canary(1_000, actor="alice", reason="ten")
        assert eventually(lambda: watcher.view().state.revision == 1)
        rollout.set_canary(2_000, actor="alice", reason="twenty")
        assert eventually(lambda: watcher.view().state.revision == 2)

    assert watcher.view().state.canary_bp == 2_000
    assert watcher_threads() == []


def test_the_poll_catches_a_change_whose_notification_was_lost(clock):
    store = DeafStore()
    watcher = StateWatcher(store, poll_s=0.02, staleness_s=60.0, clock=clock)

    with running(watcher, wake=lambda: None):
        Rollout(store, clock).set_canary(700, actor="alice", reason="seven")
        assert eventually(lambda: watcher.view().state.canary_bp == 700)


def test_the_thread_survives_an_outage_and_recovers(failing, rollout, clock):
    watcher = StateWatcher(failing, poll_s=0.02, staleness_s=1.0, clock=clock)
    failing.down.set()

    with running(watcher, wake=lambda: None):
        # Down from the start: nothing loaded, the error is reported, the thread keeps trying.
        assert watcher.view().loaded is False
        assert watcher.view().error is not None
        assert eventually(lambda: failing.failed_reads >= 3)

        failing.down.clear()
        assert eventually(lambda: watcher.view().loaded and watcher.view().error is None)
        rollout.set_canary(4_000, actor="alice", reason="forty")
        assert eventually(lambda: watcher.view().state.canary_bp == 4_000)

        failing.down.set()
        assert eventually(lambda: watcher.view().error is not None)
        assert watcher.view().state.canary_bp == 4_000
        assert watcher.view().stale is False
        clock.advance(1.5)
        assert watcher.view().stale is True

        failing.down.clear()
        assert eventually(lambda: watcher.view().error is None)
        assert watcher.view().stale is False


def test_stop_ends_the_thread(memory, clock):
    watcher = StateWatcher(memory, poll_s=0.02, staleness_s=1.0, clock=clock)
    watcher.start()
    assert len(watcher_threads()) == 1

    watcher.stop(timeout=DEADLINE_S)

    assert watcher_threads() == []


def test_heartbeat_runs_on_connect_and_then_every_interval():
    clock = FakeClock()
    store = MemoryStateStore()
    beats = []
    beat = threading.Event()

    def heartbeat():
        beats.append(clock.monotonic())
        beat.set()

    watcher = StateWatcher(
        store, poll_s=0.01, staleness_s=5, clock=clock, heartbeat=heartbeat, heartbeat_s=10
    )
    watcher.start()
    try:
        assert beat.wait(5) and len(beats) == 1
        beat.clear()
        deadline = time.monotonic() + 0.3  # many polls pass; the fake clock has not moved
        while time.monotonic() < deadline:
            assert len(beats) == 1
            time.sleep(0.02)
        clock.advance(10)
        assert beat.wait(5) and len(beats) == 2
    finally:
        watcher.stop()


def test_a_failing_heartbeat_does_not_stop_the_watcher():
    clock = FakeClock()
    store = FailingStore(MemoryStateStore())

    def heartbeat():
        raise PermissionDenied("NOPERM this user has no permissions to access a key")

    watcher = StateWatcher(store, poll_s=0.01, staleness_s=5, clock=clock, heartbeat=heartbeat,
                           heartbeat_s=0)
    watcher.start()
    try:
        store.inner.compare_and_set(
            RolloutState(), RolloutState(revision=1, canary_bp=7), actor="a", action="b", reason="c"
        )
        deadline = time.monotonic() + 5
        while watcher.view().state.revision != 1:
            assert time.monotonic() < deadline, "watcher stopped following changes"
            time.sleep(0.01)
        assert watcher.view().error is None
    finally:
        watcher.stop()


def test_an_outage_is_remembered_as_an_event_once_over(watcher, failing, rollout, clock):
    rollout.set_canary(2_500, actor="alice", reason="quarter")
    watcher.refresh()
    failing.down.set()
    assert not watcher.refresh()
    clock.advance(STALENESS_S + 1)
    assert not watcher.refresh()
    assert watcher.view().events == ()  # nothing to say until it is over
    failing.down.clear()
    assert watcher.refresh()
    [event] = watcher.view().events
    assert f"store reachable again after {STALENESS_S + 1:.1f} s" in event
    assert "routed all to baseline meanwhile" in event
    assert "it is down" in event


def test_a_short_outage_is_not_called_a_failsafe(watcher, failing, rollout, clock):
    watcher.refresh()
    failing.down.set()
    watcher.refresh()
    clock.advance(1)
    failing.down.clear()
    watcher.refresh()
    [event] = watcher.view().events
    assert "after 1.0 s" in event and "baseline" not in event


def test_a_state_that_goes_back_in_revision_is_not_applied(watcher, memory, rollout):
    rollout.set_canary(500, actor="alice", reason="five")
    rollout.set_canary(600, actor="alice", reason="six")
    watcher.refresh()
    memory.__init__()  # the store lost its data (Redis restarted without persistence)
    assert watcher.refresh()
    view = watcher.view()
    assert view.state.revision == 2 and view.stale  # the highest kept, routed as stale
    assert "behind revision 2" in view.error
    [event] = view.events
    assert "from revision 2 to 0" in event


def test_a_kill_is_not_undone_by_a_store_that_went_back(memory, clock):
    rollout = Rollout(memory, clock)
    watcher = StateWatcher(memory, poll_s=POLL_S, staleness_s=STALENESS_S, clock=clock)
    rollout.set_canary(5_000, actor="alice", reason="half")
    before_kill = memory.get()
    rollout.kill(actor="alice", reason="p99")
    watcher.refresh()
    memory.__init__()  # a failover to a replica that missed the kill
    memory.compare_and_set(RolloutState(), before_kill, actor="alice", action="x", reason="y")
    watcher.refresh()
    assert watcher.view().stale and watcher.view().state.kill  # still all baseline

    # the gateway reports the revision it saw; the next change is numbered above it
    memory.report_deployment(DeploymentReport(
        gateway="g", baseline_version="b", optimized_version="o", ts=clock.time(),
        state_revision=watcher.view().state.revision))
    _, after = rollout.set_canary(100, actor="alice", reason="resume at 1 %")
    assert after.revision == 3  # above the 2 the gateway saw, not the store's 1 + 1
    watcher.refresh()
    assert not watcher.view().stale and watcher.view().state.canary_bp == 100


def test_a_state_this_version_cannot_read_is_stale_at_once(watcher, failing, rollout, clock):
    rollout.set_canary(500, actor="alice", reason="five")
    watcher.refresh()
    failing.fault = lambda what: StateUnreadable(f"cannot {what}: canary_bp: not an integer")
    failing.down.set()
    assert not watcher.refresh()
    assert watcher.view().stale and "canary_bp" in watcher.view().error
    failing.down.clear()
    rollout.set_canary(600, actor="alice", reason="six")
    assert watcher.refresh() and not watcher.view().stale


@pytest.mark.parametrize("fault", [
    lambda what: StoreRefused(f"READONLY cannot {what}", "READONLY"),
    lambda what: StoreRefused(f"OOM cannot {what}", "OOM"),
    lambda what: RuntimeError(f"a bug while trying to {what}"),
    lambda what: ValueError(f"cannot parse what {what} answered"),
])
def test_the_thread_survives_any_error_and_follows_the_next_change(failing, rollout, clock,
                                                                    fault):
    watcher = StateWatcher(failing, poll_s=0.02, staleness_s=1.0, clock=clock)
    with running(watcher, wake=lambda: None):
        failing.fault = fault
        failing.down.set()
        assert eventually(lambda: failing.failed_reads >= 3)
        kind = error_kind(fault("x"))
        assert dict(watcher.view().errors)[kind] >= 3
        assert watcher_threads()
        failing.down.clear()
        rollout.set_canary(4_000, actor="alice", reason="forty")
        assert eventually(lambda: watcher.view().state.canary_bp == 4_000, timeout=2.0)
        assert watcher.view().error is None


def test_each_kind_of_error_is_logged_once_per_outage(watcher, failing, caplog):
    failing.down.set()
    for _ in range(5):
        watcher.refresh()
    failing.fault = lambda what: StoreRefused(f"OOM cannot {what}", "OOM")
    for _ in range(5):
        watcher.refresh()
    logged = [r.getMessage() for r in caplog.records if "cannot refresh" in r.getMessage()]
    assert len(logged) == 2 and "(unavailable)" in logged[0] and "(OOM)" in logged[1]
    assert dict(watcher.view().errors) == {"unavailable": 5, "OOM": 5}


def test_a_heartbeat_that_raises_anything_does_not_stop_the_watcher(memory, clock):
    def heartbeat():
        raise TypeError("a bug in the report")

    watcher = StateWatcher(memory, poll_s=0.01, staleness_s=5, clock=clock,
                           heartbeat=heartbeat, heartbeat_s=0)
    with running(watcher, wake=lambda: None):
        Rollout(memory, clock).set_canary(300, actor="alice", reason="three")
        assert eventually(lambda: watcher.view().state.canary_bp == 300)


def test_a_failing_heartbeat_is_logged_once_per_kind_until_it_works(memory, clock, caplog):
    failures = [StoreRefused("OOM no memory", "OOM")] * 3 + [None]
    failures += [StoreRefused("READONLY demoted", "READONLY")] * 3
    done = threading.Event()

    def heartbeat():
        if not failures:
            done.set()
            return
        failure = failures.pop(0)
        if failure is not None:
            raise failure

    watcher = StateWatcher(memory, poll_s=0.01, staleness_s=5, clock=clock,
                           heartbeat=heartbeat, heartbeat_s=0)
    with running(watcher, wake=lambda: None):
        assert done.wait(DEADLINE_S)
    logged = [r.getMessage() for r in caplog.records if "heartbeat failed" in r.getMessage()]
    assert len(logged) == 2 and "OOM" in logged[0] and "READONLY" in logged[1]
