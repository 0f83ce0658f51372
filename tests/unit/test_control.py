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


def test_revert_keeps_the_deployed_versions(rollout, store):
    rollout.register_versions("b1", "o1", actor="gateway")  # revision 1
    rollout.set_canary(500, actor="alice", reason="five")  # revision 2
    rollout.register_versions("b2", "o1", actor="gateway")  # revision 3: baseline upgraded

    _, after = rollout.revert(1, actor="alice", reason="undo")

    assert after.canary_bp == 0
    assert (after.baseline_version, after.optimized_version) == ("b2", "o1")


def test_revert_refuses_a_share_approved_for_another_optimized_version(rollout, store):
    rollout.register_versions("b1", "o1", actor="gateway")  # revision 1
    rollout.set_canary(500, actor="alice", reason="five")  # revision 2: 5% of o1
    rollout.register_versions("b1", "o2", actor="gateway")  # revision 3: o2 deployed, share 0

    with pytest.raises(InvalidChange, match="o1"):
        rollout.revert(2, actor="alice", reason="back to five")

    assert store.get().revision == 3
    assert store.get().canary_bp == 0
    assert len(store.audit()) == 3


def test_revert_to_a_state_routing_nothing_is_allowed_across_versions(rollout, store):
    rollout.register_versions("b1", "o1", actor="gateway")
    rollout.set_canary(500, actor="alice", reason="five")
    rollout.kill(actor="oncall", reason="bad")  # revision 3: 5% of o1, but killed
    rollout.register_versions("b1", "o2", actor="gateway")
    rollout.set_canary(100, actor="alice", reason="one percent of o2")

    _, after = rollout.revert(3, actor="oncall", reason="kill again")

    assert after.kill is True
    assert after.effective_bp == 0
    assert after.optimized_version == "o2"


# --- register_versions ---------------------------------------------------------------------------


def test_register_versions_records_the_versions(rollout, store):
    state = rollout.register_versions("base-1", "opt-1", actor="gateway")

    assert (state.baseline_version, state.optimized_version) == ("base-1", "opt-1")
    assert state.revision == 1
    [entry] = store.audit()
    assert (entry.actor, entry.action) == ("gateway", "register versions")
    assert "base-1" in entry.reason and "opt-1" in entry.reason


def test_register_versions_is_a_no_op_when_unchanged(rollout, store):
    first = rollout.register_versions("base-1", "opt-1", actor="gateway")

    again = rollout.register_versions("base-1", "opt-1", actor="another-replica")

    assert again == first
    assert store.get().revision == 1
    assert len(store.audit()) == 1


def test_a_new_baseline_keeps_the_share(rollout, store):
    rollout.register_versions("base-1", "opt-1", actor="gateway")
    rollout.set_canary(1_000, actor="alice", reason="ten")

    state = rollout.register_versions("base-2", "opt-1", actor="gateway")

    assert state.canary_bp == 1_000
    assert state.baseline_version == "base-2"


def test_a_new_optimized_version_starts_again_from_zero(rollout, store):
    rollout.register_versions("base-1", "opt-1", actor="gateway")
    rollout.set_canary(2_500, actor="alice", reason="quarter")

    state = rollout.register_versions("base-1", "opt-2", actor="gateway")

    assert state.canary_bp == 0
    assert state.optimized_version == "opt-2"
    assert store.get() == state
    entry = store.audit()[-1]
    assert "reset to 0" in entry.reason
    assert entry.before.canary_bp == 2_500


def test_register_versions_retries_through_concurrent_writes():
    store = InterferingStore(interruptions=2)
    rollout = Rollout(store, FakeClock())

    state = rollout.register_versions("base-1", "opt-1", actor="gateway")

    assert (state.baseline_version, state.optimized_version) == ("base-1", "opt-1")
    assert store.get() == state
