"""The contract every StateStore must pass, whatever keeps the state.

Subclass `StoreContract` in a test module and supply a `store` fixture that yields a fresh, empty
store; every test here then runs against that implementation. The in-memory twin and the Redis
store both run it, which is what keeps the twin honest.
"""

from __future__ import annotations

import threading

import pytest

from rollout import (
    RevisionConflict,
    RevisionNotFound,
    Rollout,
    RolloutState,
    StateStore,
    Verdict,
)

WRITERS = 8
INCREMENTS_PER_WRITER = 25


def successor(before: RolloutState, **changes) -> RolloutState:
    """`before` with `changes`, at the next revision, as a caller of compare_and_set builds it."""
    revision = before.revision + 1
    fields = dict(
        revision=revision, updated_at=1_700_000_000.0 + revision, updated_by="tester",
        reason=f"change {revision}",
    )
    fields.update(changes)
    return before.model_copy(update=fields)


def write(store: StateStore, **changes) -> RolloutState:
    before = store.get()
    after = successor(before, **changes)
    return store.compare_and_set(
        before, after, actor="tester", action=f"write {after.revision}", reason=after.reason
    )


def make_verdict(baseline: str, optimized: str, *, passed: bool, agreement: float,
                 failures: tuple[str, ...] | None = None) -> Verdict:
    if failures is None:
        failures = () if passed else (f"agreement {agreement} < 0.995",)
    return Verdict(
        baseline_version=baseline, optimized_version=optimized, passed=passed, failures=failures,
        n=2600, agreement=agreement, agreement_lower_bound=max(0.0, agreement - 0.004),
        speedup=2.1, cosine_p1=0.99, recipe="int8-aware", set_digest="abc", at=1_700_000_000.5,
        by="alice@host",
    )


class StoreContract:
    """Tests every StateStore must pass. Subclasses provide the `store` fixture."""

    @pytest.fixture
    def store(self) -> StateStore:  # pragma: no cover - always overridden
        raise NotImplementedError("a StoreContract subclass must provide the `store` fixture")

    # --- reading an empty store ----------------------------------------------------------

    def test_empty_store_answers_the_default_state_at_revision_0(self, store):
        state = store.get()
        assert state == RolloutState()
        assert state.revision == 0
        assert state.canary_bp == 0
        assert state.kill is False
        assert store.audit() == []

    # --- compare-and-set -------------------------------------------------------------------

    def test_compare_and_set_stores_the_new_state_and_audits_it(self, store):
        before = store.get()
        after = successor(before, canary_bp=500, updated_by="alice", reason="first 5%")

        result = store.compare_and_set(
            before, after, actor="alice", action="canary 0% -> 5%", reason="first 5%"
        )

        assert result == after
        assert store.get() == after
        assert store.get().revision == 1
        [entry] = store.audit()
        assert entry.actor == "alice"
        assert entry.action == "canary 0% -> 5%"
        assert entry.reason == "first 5%"
        assert entry.revision == 1
        assert entry.ts == after.updated_at
        assert entry.before is None  # the first write has no recorded state before it
        assert entry.after == after

    def test_each_write_bumps_the_revision_and_records_the_state_before_it(self, store):
        first = write(store, canary_bp=100)
        second = write(store, canary_bp=200)
        third = write(store, kill=True)

        assert [first.revision, second.revision, third.revision] == [1, 2, 3]
        assert store.get() == third
        entries = store.audit()
        assert [e.revision for e in entries] == [1, 2, 3]
        assert [e.before for e in entries] == [None, first, second]
        assert [e.after for e in entries] == [first, second, third]
        assert len({e.id for e in entries}) == 3

    def test_conflict_raises_and_changes_nothing(self, store):
        stale = store.get()
        winner = write(store, canary_bp=100)
        loser = successor(stale, canary_bp=9_000, updated_by="bob")

        with pytest.raises(RevisionConflict) as info:
            store.compare_and_set(stale, loser, actor="bob", action="canary", reason="late")

        assert info.value.expected == 0
        assert info.value.actual == 1
        assert store.get() == winner
        assert store.state_at(1) == winner  # the loser did not overwrite the history either
        [entry] = store.audit()
        assert entry.actor == "tester"
        assert entry.after == winner

    def test_conflict_reports_the_current_revision(self, store):
        for _ in range(3):
            write(store)
        stale = store.state_at(1)

        with pytest.raises(RevisionConflict) as info:
            store.compare_and_set(stale, successor(stale), actor="a", action="x", reason="y")

        assert (info.value.expected, info.value.actual) == (1, 3)
        assert len(store.audit()) == 3

    @pytest.mark.parametrize("step", [0, -1])
    def test_after_must_be_above_the_revision_before(self, store, step):
        write(store)
        before = store.get()
        after = before.model_copy(update=dict(revision=before.revision + step, canary_bp=42))

        with pytest.raises(ValueError, match="revision"):
            store.compare_and_set(before, after, actor="a", action="x", reason="y")

        assert store.get() == before
        assert len(store.audit()) == 1

    def test_a_change_may_jump_past_revisions_gateways_saw(self, store):
        write(store)
        before = store.get()
        after = before.model_copy(update=dict(revision=before.revision + 5, canary_bp=42))

        assert store.compare_and_set(before, after, actor="a", action="x", reason="y") == after
        assert store.get().revision == before.revision + 5
        assert store.state_at(after.revision) == after

    def test_fields_of_a_newer_version_are_kept(self, store):
        write(store)
        before = store.get()
        newer = RolloutState.model_validate({**before.model_dump(), "canary_cohort": "eu"})
        after = newer.model_copy(update=dict(revision=before.revision + 1, kill=True))

        store.compare_and_set(before, after, actor="a", action="x", reason="y")
        stored = store.get()
        assert stored.kill and stored.model_extra == {"canary_cohort": "eu"}

    # --- history -----------------------------------------------------------------------------

    def test_state_at_returns_every_recorded_revision(self, store):
        written = [write(store, canary_bp=bp) for bp in (1, 50, 2_500, 10_000)]

        for state in written:
            assert store.state_at(state.revision) == state

    @pytest.mark.parametrize("revision", [2, 3, 99])
    def test_state_at_an_unknown_revision_raises_revision_not_found(self, store, revision):
        write(store)

        with pytest.raises(RevisionNotFound):
            store.state_at(revision)

    def test_state_at_on_an_empty_store_raises_revision_not_found(self, store):
        with pytest.raises(RevisionNotFound):
            store.state_at(1)

    # --- audit -------------------------------------------------------------------------------

    def test_audit_last_returns_the_newest_entries_oldest_first(self, store):
        for bp in range(1, 6):
            write(store, canary_bp=bp)

        assert [e.revision for e in store.audit()] == [1, 2, 3, 4, 5]
        assert [e.revision for e in store.audit(last=2)] == [4, 5]
        assert [e.revision for e in store.audit(last=1)] == [5]
        assert [e.revision for e in store.audit(last=5)] == [1, 2, 3, 4, 5]
        assert [e.revision for e in store.audit(last=50)] == [1, 2, 3, 4, 5]
        assert [e.after.canary_bp for e in store.audit(last=3)] == [3, 4, 5]

    def test_audit_after_tails_the_stream_from_an_entry_id(self, store):
        assert store.audit_after("0-0", 10) == []
        for bp in range(1, 6):
            write(store, canary_bp=bp)
        entries = store.audit()

        assert store.audit_after("0-0", 10) == entries
        assert [e.revision for e in store.audit_after(entries[1].id, 2)] == [3, 4]
        assert store.audit_after(entries[-1].id, 10) == []

    # --- change notifications ----------------------------------------------------------------

    def test_a_note_is_audited_without_changing_the_state(self, store):
        store.note(ts=5.0, actor="ramp-controller", action="ramp-evaluate", reason="hold",
                   detail={"gates": [{"name": "error_rate", "value": 0.0}]})
        first = store.audit()[-1]
        assert (first.revision, first.before, first.after) == (0, None, RolloutState())
        state = write(store, canary_bp=500)
        store.note(ts=6.5, actor="ramp-controller", action="ramp-evaluate", reason="hold again")
        entries = store.audit()
        assert [e.action for e in entries] == ["ramp-evaluate", "write 1", "ramp-evaluate"]
        assert entries[0].detail == {"gates": [{"name": "error_rate", "value": 0.0}]}
        assert entries[0].ts == 5.0 and entries[0].reason == "hold"
        note = entries[-1]
        assert (note.revision, note.before, note.after, note.detail) == (1, state, state, None)
        assert note.ts == 6.5
        assert store.get() == state and entries[1].detail is None

    def test_a_note_notifies_no_one(self, store):
        subscription = store.subscribe()
        try:
            store.note(ts=1.0, actor="a", action="ramp-evaluate", reason="r")
            assert subscription.wait(0.2) is False
        finally:
            subscription.close()

    def test_subscription_wakes_on_a_write_from_another_thread(self, store):
        subscription = store.subscribe()
        try:
            writer = threading.Thread(target=write, args=(store,), kwargs=dict(canary_bp=7))
            writer.start()
            try:
                assert subscription.wait(timeout=10.0) is True
            finally:
                writer.join(10.0)
            assert store.get().canary_bp == 7
        finally:
            subscription.close()

    def test_subscription_reports_a_write_made_before_wait_is_called(self, store):
        subscription = store.subscribe()
        try:
            write(store, canary_bp=7)
            assert subscription.wait(timeout=10.0) is True
        finally:
            subscription.close()

    def test_subscription_wait_times_out_when_nothing_is_written(self, store):
        subscription = store.subscribe()
        try:
            assert subscription.wait(timeout=0.05) is False
        finally:
            subscription.close()

    def test_subscription_reports_a_write_once(self, store):
        subscription = store.subscribe()
        try:
            write(store)
            assert subscription.wait(timeout=10.0) is True
            assert subscription.wait(timeout=0.05) is False
        finally:
            subscription.close()

    def test_a_failed_write_notifies_no_one(self, store):
        stale = store.get()
        write(store)
        subscription = store.subscribe()
        try:
            with pytest.raises(RevisionConflict):
                store.compare_and_set(stale, successor(stale), actor="a", action="x", reason="y")
            assert subscription.wait(timeout=0.05) is False
        finally:
            subscription.close()

    # --- verify verdicts ----------------------------------------------------------------------

    def test_verdict_round_trips_under_its_version_pair(self, store):
        assert store.get_verdict("fp32-aaa", "int8-bbb") is None
        verdict = make_verdict("fp32-aaa", "int8-bbb", passed=True, agreement=0.997)

        store.put_verdict(verdict)

        assert store.get_verdict("fp32-aaa", "int8-bbb") == verdict
        assert store.get_verdict("int8-bbb", "fp32-aaa") is None  # the order of the pair matters
        assert store.get_verdict("fp32-aaa", "int8-ccc") is None
        assert store.get() == RolloutState()  # a verdict is not a state change
        assert store.audit() == []

    def test_a_new_verdict_replaces_the_old_one_for_the_same_pair_only(self, store):
        store.put_verdict(make_verdict("b", "o1", passed=False, agreement=0.9))
        store.put_verdict(make_verdict("b", "o2", passed=True, agreement=0.999))
        newer = make_verdict("b", "o1", passed=True, agreement=0.996, failures=())

        store.put_verdict(newer)

        assert store.get_verdict("b", "o1") == newer
        assert store.get_verdict("b", "o2").agreement == 0.999

    def test_versions_with_separators_do_not_collide(self, store):
        store.put_verdict(make_verdict("a|b", "c", passed=True, agreement=1.0))
        assert store.get_verdict("a", "b|c") is None
        assert store.get_verdict("a|b", "c").passed is True

    # --- concurrency -------------------------------------------------------------------------

    def test_concurrent_read_modify_write_loses_no_update(self, store):
        """8 threads each add 1 to the canary share 25 times, retrying on conflict."""
        rollout = Rollout(store)
        start = threading.Barrier(WRITERS)
        successes = [0] * WRITERS
        conflicts = [0] * WRITERS
        failures: list[BaseException] = []

        def writer(index: int) -> None:
            try:
                start.wait(10.0)
                for _ in range(INCREMENTS_PER_WRITER):
                    for _attempt in range(10_000):
                        seen = store.get()
                        try:
                            rollout.set_canary(
                                seen.canary_bp + 1, actor=f"writer-{index}", reason="increment",
                                expected_revision=seen.revision,
                            )
                        except RevisionConflict:
                            conflicts[index] += 1
                            continue
                        successes[index] += 1
                        break
                    else:
                        raise AssertionError(f"writer {index} never won a compare-and-set")
            except BaseException as exc:  # surfaced in the main thread below
                failures.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60.0)

        assert not [t for t in threads if t.is_alive()], "a writer thread hung"
        assert failures == []
        total = WRITERS * INCREMENTS_PER_WRITER
        assert successes == [INCREMENTS_PER_WRITER] * WRITERS
        final = store.get()
        assert final.revision == total
        assert final.canary_bp == total  # no increment was lost
        entries = store.audit()
        assert len(entries) == final.revision
        # Every write built on the one before it: revision r set the share to exactly r.
        assert [e.revision for e in entries] == list(range(1, total + 1))
        assert [e.after.canary_bp for e in entries] == list(range(1, total + 1))
        assert [e.before.revision if e.before else 0 for e in entries] == list(range(total))
        assert {e.actor for e in entries} == {f"writer-{i}" for i in range(WRITERS)}

    # --- gateway reports -----------------------------------------------------------------

    def test_no_gateway_has_reported_in_an_empty_store(self, store):
        assert store.deployments() == []

    def test_reports_keep_the_newest_per_gateway_oldest_first(self, store):
        from rollout import DeploymentReport

        def report(gateway, optimized, ts):
            store.report_deployment(DeploymentReport(
                gateway=gateway, baseline_version="b", optimized_version=optimized, ts=ts))

        report("gw-a", "o1", 10.0)
        report("gw-b", "o1", 5.0)
        report("gw-a", "o2", 20.0)

        assert [(r.gateway, r.optimized_version, r.ts) for r in store.deployments()] == [
            ("gw-b", "o1", 5.0), ("gw-a", "o2", 20.0)
        ]

    def test_a_report_changes_neither_state_nor_audit_nor_notifies(self, store):
        from rollout import DeploymentReport

        write(store, canary_bp=5)
        subscription = store.subscribe()
        try:
            store.report_deployment(DeploymentReport(
                gateway="gw", baseline_version="b", optimized_version="o", ts=1.0))
            assert store.get().revision == 1 and len(store.audit()) == 1
            assert subscription.wait(0.2) is False
        finally:
            subscription.close()
