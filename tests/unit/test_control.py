"""Audited rollout changes (rollout.control) on the in-memory store and a fake clock."""

from __future__ import annotations

import pytest

from rollout import (
    FakeClock,
    InvalidChange,
    MemoryStateStore,
    RevisionConflict,
    RevisionNotFound,
    Rollout,
    RolloutState,
)
from rollout.control import DEPLOYMENT_TTL_S
from rollout.state import DeploymentReport


class InterferingStore(MemoryStateStore):
    """A store where another operator slips in a change just before each of the next
    `interruptions` compare-and-sets, so that those lose."""

    def __init__(self, interruptions: int):
        super().__init__()
        self.interruptions = interruptions
        self.attempts = 0

    def compare_and_set(self, before, after, *, actor, action, reason):
        self.attempts += 1
        if self.interruptions > 0:
            self.interruptions -= 1
            current = self.get()
            other = current.model_copy(
                update=dict(
                    revision=current.revision + 1, canary_bp=(current.canary_bp + 100) % 10_000,
                    updated_by="other-operator", reason="concurrent change",
                )
            )
            super().compare_and_set(
                current, other, actor="other-operator", action="canary", reason="concurrent change"
            )
        return super().compare_and_set(before, after, actor=actor, action=action, reason=reason)


@pytest.fixture
def clock():
    return FakeClock(start=1_700_000_000.0)


@pytest.fixture
def store():
    return MemoryStateStore()


@pytest.fixture
def rollout(store, clock):
    return Rollout(store, clock)


# --- set_canary ----------------------------------------------------------------------------------


def test_set_canary_writes_an_audited_revision(rollout, store, clock):
    clock.advance(42.5)

    before, after = rollout.set_canary(500, actor="alice", reason="first 5%")

    assert before == RolloutState()
    assert after == store.get()
    assert (after.canary_bp, after.revision) == (500, 1)
    assert after.updated_at == 1_700_000_042.5
    assert after.updated_by == "alice"
    assert after.reason == "first 5%"
    [entry] = store.audit()
    assert (entry.actor, entry.reason, entry.revision) == ("alice", "first 5%", 1)
    assert entry.action == "canary 0% -> 5%"
    assert entry.ts == 1_700_000_042.5
    assert entry.before is None
    assert entry.after == after


def test_set_canary_action_names_both_shares(rollout, store, clock):
    rollout.set_canary(1, actor="alice", reason="smallest step")
    clock.advance(60)
    before, after = rollout.set_canary(2_550, actor="bob", reason="widen")

    assert before.canary_bp == 1
    assert after.updated_at == 1_700_000_060.0
    entry = store.audit()[-1]
    assert entry.action == "canary 0.01% -> 25.5%"
    assert entry.before == before


def test_actor_and_reason_are_stripped(rollout, store):
    _, after = rollout.set_canary(100, actor="  alice ", reason=" why \n")

    assert (after.updated_by, after.reason) == ("alice", "why")
    assert (store.audit()[0].actor, store.audit()[0].reason) == ("alice", "why")


@pytest.mark.parametrize(
    ("actor", "reason"), [("", "why"), ("  ", "why"), ("alice", ""), ("alice", " \t")]
)
def test_a_change_without_actor_or_reason_is_refused_and_nothing_is_written(
    rollout, store, actor, reason
):
    with pytest.raises(InvalidChange):
        rollout.set_canary(500, actor=actor, reason=reason)
    with pytest.raises(InvalidChange):
        rollout.kill(actor=actor, reason=reason)

    assert store.get() == RolloutState()
    assert store.audit() == []


@pytest.mark.parametrize("bp", [-1, 10_001])
def test_set_canary_rejects_shares_out_of_range(rollout, store, bp):
    with pytest.raises(InvalidChange):
        rollout.set_canary(bp, actor="alice", reason="typo")

    assert store.audit() == []


def test_set_canary_with_the_expected_revision_succeeds(rollout):
    rollout.set_canary(100, actor="alice", reason="one")

    _, after = rollout.set_canary(200, actor="alice", reason="two", expected_revision=1)

    assert (after.canary_bp, after.revision) == (200, 2)


def test_set_canary_with_a_stale_expected_revision_conflicts(rollout, store):
    rollout.set_canary(100, actor="alice", reason="one")
    rollout.set_canary(200, actor="bob", reason="two")

    with pytest.raises(RevisionConflict) as info:
        rollout.set_canary(
            5_000, actor="alice", reason="confirmed at revision 1", expected_revision=1
        )

    assert (info.value.expected, info.value.actual) == (1, 2)
    assert store.get().canary_bp == 200
    assert len(store.audit()) == 2


def test_set_canary_does_not_retry_over_a_concurrent_change():
    store = InterferingStore(interruptions=1)
    rollout = Rollout(store, FakeClock())

    with pytest.raises(RevisionConflict):
        rollout.set_canary(5_000, actor="alice", reason="widen")

    assert store.get().canary_bp == 100  # the other operator's change stands
    assert [e.actor for e in store.audit()] == ["other-operator"]


# --- kill / unkill -------------------------------------------------------------------------------


def test_kill_turns_the_canary_off_and_keeps_the_share(rollout, store):
    rollout.set_canary(2_500, actor="alice", reason="quarter")

    before, after = rollout.kill(actor="oncall", reason="p99 regression")

    assert before.kill is False
    assert after.kill is True
    assert after.canary_bp == 2_500
    assert after.effective_bp == 0
    entry = store.audit()[-1]
    assert (entry.actor, entry.action, entry.reason) == ("oncall", "kill", "p99 regression")


def test_kill_wins_through_concurrent_writes():
    store = InterferingStore(interruptions=3)
    rollout = Rollout(store, FakeClock())

    before, after = rollout.kill(actor="oncall", reason="errors")

    assert store.attempts == 4  # three lost compare-and-sets, then the kill landed
    assert store.get() == after
    assert after.kill is True
    assert after.revision == 4
    assert before.revision == 3  # built on the latest concurrent change, not the first read
    assert after.canary_bp == 300  # which it keeps
    assert [e.actor for e in store.audit()] == ["other-operator"] * 3 + ["oncall"]


def test_kill_gives_up_with_a_conflict_when_it_can_never_win():
    store = InterferingStore(interruptions=10**6)
    rollout = Rollout(store, FakeClock())

    with pytest.raises(RevisionConflict):
        rollout.kill(actor="oncall", reason="errors")

    assert store.get().kill is False
    assert store.attempts > 1  # it did retry


def test_unkill_restores_the_share(rollout, store):
    rollout.set_canary(1_000, actor="alice", reason="ten percent")
    rollout.kill(actor="oncall", reason="investigating")

    before, after = rollout.unkill(actor="oncall", reason="false alarm")

    assert before.kill is True
    assert after.kill is False
    assert after.effective_bp == 1_000
    assert [e.action for e in store.audit()] == ["canary 0% -> 10%", "kill", "unkill"]


def test_unkill_wins_through_concurrent_writes():
    store = InterferingStore(interruptions=2)
    rollout = Rollout(store, FakeClock())

    _, after = rollout.unkill(actor="oncall", reason="recovered")

    assert after.kill is False
    assert store.get() == after


# --- revert ------------------------------------------------------------------------------------


def test_revert_restores_the_share_and_kill_switch_of_an_earlier_revision(rollout, store, clock):
    rollout.set_canary(500, actor="alice", reason="five")  # revision 1
    rollout.set_canary(1_000, actor="alice", reason="ten")  # revision 2
    rollout.kill(actor="oncall", reason="bad")  # revision 3
    clock.advance(5)

    before, after = rollout.revert(1, actor="oncall", reason="back to five")

    assert before.revision == 3
    assert (after.canary_bp, after.kill, after.revision) == (500, False, 4)
    assert after.updated_at == clock.time()
    assert store.get() == after
    entry = store.audit()[-1]
    assert (entry.actor, entry.reason) == ("oncall", "back to five")
    assert entry.action == "revert to revision 1"
    assert entry.before == before
    assert store.state_at(3).kill is True  # history is kept, not rewritten


def test_revert_can_restore_a_kill(rollout, store):
    rollout.set_canary(500, actor="alice", reason="five")
    rollout.kill(actor="oncall", reason="bad")  # revision 2
    rollout.unkill(actor="oncall", reason="ok")

    _, after = rollout.revert(2, actor="oncall", reason="it was bad after all")

    assert after.kill is True
    assert after.effective_bp == 0


def test_revert_to_an_unknown_revision_raises_and_writes_nothing(rollout, store):
    rollout.set_canary(500, actor="alice", reason="five")

    with pytest.raises(RevisionNotFound):
        rollout.revert(7, actor="oncall", reason="typo")

    assert len(store.audit()) == 1


def test_revert_with_a_stale_expected_revision_conflicts(rollout, store):
    rollout.set_canary(500, actor="alice", reason="five")
    rollout.set_canary(600, actor="alice", reason="six")

    with pytest.raises(RevisionConflict):
        rollout.revert(1, actor="oncall", reason="undo", expected_revision=1)

    assert store.get().canary_bp == 600


def report(store, clock, baseline, optimized, gateway="gw-1"):
    """A gateway's heartbeat: what it serves, now."""
    store.report_deployment(
        DeploymentReport(gateway=gateway, baseline_version=baseline, optimized_version=optimized,
                         ts=clock.time())
    )


def test_revert_keeps_the_deployed_versions(rollout, store, clock):
    report(store, clock, "b1", "o1")
    rollout.set_canary(500, actor="alice", reason="five")  # revision 1, bound to o1
    rollout.set_canary(0, actor="alice", reason="zero")  # revision 2
    report(store, clock, "b2", "o1")  # baseline upgraded
    rollout.set_canary(100, actor="alice", reason="one")  # revision 3, bound to b2/o1

    _, after = rollout.revert(1, actor="alice", reason="undo")

    assert after.canary_bp == 500
    assert (after.baseline_version, after.optimized_version) == ("b2", "o1")


def test_revert_refuses_a_share_approved_for_another_optimized_version(rollout, store, clock):
    report(store, clock, "b1", "o1")
    rollout.set_canary(500, actor="alice", reason="five")  # revision 1: 5% of o1
    report(store, clock, "b1", "o2")  # o2 deployed: gateways route 0 % until a new share

    with pytest.raises(InvalidChange, match="o1"):
        rollout.revert(1, actor="alice", reason="back to five")

    assert store.get().revision == 1
    assert len(store.audit()) == 1


def test_revert_to_a_state_routing_nothing_is_allowed_across_versions(rollout, store, clock):
    report(store, clock, "b1", "o1")
    rollout.set_canary(500, actor="alice", reason="five")
    rollout.kill(actor="oncall", reason="bad")  # revision 2: 5% of o1, but killed
    report(store, clock, "b1", "o2")
    rollout.set_canary(100, actor="alice", reason="one percent of o2")

    _, after = rollout.revert(2, actor="oncall", reason="kill again")

    assert after.kill is True
    assert after.effective_bp == 0
    assert after.optimized_version == "o2"


# --- binding a share to the deployed versions ------------------------------------------------


def test_a_share_is_bound_to_the_versions_gateways_report(rollout, store, clock):
    report(store, clock, "base-1", "opt-1")

    _, state = rollout.set_canary(1_000, actor="alice", reason="ten")

    assert (state.baseline_version, state.optimized_version) == ("base-1", "opt-1")
    assert store.audit()[-1].after == state


def test_without_live_reports_the_versions_are_kept(rollout, store, clock):
    report(store, clock, "base-1", "opt-1")
    rollout.set_canary(1_000, actor="alice", reason="ten")
    clock.advance(DEPLOYMENT_TTL_S + 1)  # the gateway went quiet

    _, state = rollout.set_canary(2_000, actor="alice", reason="twenty")

    assert rollout.live_versions() == set()
    assert state.optimized_version == "opt-1"


def test_a_new_optimized_version_is_bound_by_the_next_change(rollout, store, clock):
    report(store, clock, "base-1", "opt-1")
    rollout.set_canary(2_500, actor="alice", reason="quarter")
    report(store, clock, "base-1", "opt-2")

    _, state = rollout.set_canary(100, actor="alice", reason="start opt-2 at 1%")

    assert state.optimized_version == "opt-2"
    assert store.audit()[-1].before.optimized_version == "opt-1"


def test_a_share_is_refused_while_gateways_disagree(rollout, store, clock):
    report(store, clock, "b", "opt-1", gateway="gw-1")
    report(store, clock, "b", "opt-2", gateway="gw-2")

    with pytest.raises(InvalidChange, match="opt-1, opt-2"):
        rollout.set_canary(500, actor="alice", reason="five")
    _, state = rollout.set_canary(0, actor="alice", reason="zero is always allowed")

    assert state.canary_bp == 0 and store.get().revision == 1


def test_the_newest_report_of_a_gateway_wins(store, clock):
    report(store, clock, "b", "opt-1", gateway="gw-1")
    clock.advance(5)
    report(store, clock, "b", "opt-2", gateway="gw-1")

    [only] = store.deployments()
    assert only.optimized_version == "opt-2"
