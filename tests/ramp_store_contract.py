"""The contract every RampStore must pass (the in-memory twin and Redis).

Subclass `RampStoreContract` and supply fixtures: `stores` yields a fresh (StateStore,
RampStore) pair of one application; `lapse` is a `Lapse` whose call lets a lease of `ttl_s`
run out (the memory twin advances its fake clock, Redis waits for the key to expire).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from rollout import LeaseLost, RevisionConflict, RolloutState
from rollout.ramp import Ramp, parse_plan
from tests.store_contract import write

PLAN = parse_plan({"steps": [{"percent": 10}, {"percent": 100}],
                   "gates": {"error_rate_delta": 0.01}})


@dataclass
class Lapse:
    ttl_s: float
    run_out: Callable[[], None]

    def __call__(self) -> None:
        self.run_out()


def ramp(revision: int, **changes) -> Ramp:
    return Ramp(plan=PLAN, revision=revision, updated_at=1_700_000_000.0 + revision, **changes)


class RampStoreContract:
    @pytest.fixture
    def stores(self):  # pragma: no cover - always overridden
        raise NotImplementedError

    @pytest.fixture
    def lapse(self) -> Lapse:  # pragma: no cover - always overridden
        raise NotImplementedError

    # --- the ramp record ---------------------------------------------------------------------

    def test_an_empty_store_has_no_ramp_lease_or_evaluation(self, stores):
        _, ramps = stores
        assert ramps.get() is None and ramps.holder() is None
        assert ramps.last_evaluation() is None

    def test_put_stores_the_ramp_and_audits_it_without_changing_the_state(self, stores):
        states, ramps = stores
        state = write(states, canary_bp=100)
        first = ramps.put(None, ramp(1), actor="alice", action="ramp-start", reason="go",
                          detail={"forced": False})
        assert ramps.get() == first
        entry = states.audit()[-1]
        assert (entry.actor, entry.action, entry.reason) == ("alice", "ramp-start", "go")
        assert (entry.revision, entry.before, entry.after) == (1, state, state)
        assert entry.detail == {"forced": False} and entry.ts == first.updated_at
        assert states.get() == state and ramps.last_evaluation() is None

    def test_put_on_an_empty_state_audits_the_default_state(self, stores):
        states, ramps = stores
        ramps.put(None, ramp(1), actor="alice", action="ramp-start", reason="go")
        entry = states.audit()[-1]
        assert (entry.revision, entry.before, entry.after, entry.detail) == (
            0, None, RolloutState(), None)

    def test_put_is_a_compare_and_set_on_the_ramp_revision(self, stores):
        states, ramps = stores
        first = ramps.put(None, ramp(1), actor="a", action="ramp-start", reason="r")
        second = ramps.put(first, ramp(2, status="paused"), actor="a", action="ramp-pause",
                           reason="r")
        with pytest.raises(RevisionConflict) as caught:
            ramps.put(first, ramp(2, status="aborted"), actor="b", action="ramp-abort",
                      reason="late")
        assert (caught.value.expected, caught.value.actual) == (1, 2)
        with pytest.raises(RevisionConflict):
            ramps.put(None, ramp(1), actor="b", action="ramp-start", reason="late")
        assert ramps.get() == second
        assert [e.action for e in states.audit()] == ["ramp-start", "ramp-pause"]

    def test_after_must_be_the_next_revision(self, stores):
        _, ramps = stores
        with pytest.raises(ValueError, match="after.revision must be 1"):
            ramps.put(None, ramp(2), actor="a", action="ramp-start", reason="r")
        assert ramps.get() is None

    def test_a_fenced_put_needs_the_lease(self, stores, lapse):
        states, ramps = stores
        first = ramps.put(None, ramp(1), actor="a", action="ramp-start", reason="r")
        with pytest.raises(LeaseLost):  # nobody holds it
            ramps.put(first, ramp(2, step=0), actor="c1", action="ramp-advance", reason="r",
                      owner="c1")
        assert ramps.acquire("c2", lapse.ttl_s)
        with pytest.raises(LeaseLost):  # another holds it
            ramps.put(first, ramp(2, step=0), actor="c1", action="ramp-advance", reason="r",
                      owner="c1")
        assert ramps.get() == first and len(states.audit()) == 1
        second = ramps.put(first, ramp(2, step=0), actor="c2", action="ramp-advance",
                           reason="r", owner="c2", detail={"gates": []}, evaluation=True)
        assert ramps.get() == second
        last = ramps.last_evaluation()
        assert (last["action"], last["reason"], last["gates"]) == ("ramp-advance", "r", [])
        assert last["ts"] == second.updated_at

    # --- evaluations -------------------------------------------------------------------------

    def test_record_audits_an_evaluation_and_keeps_the_last(self, stores):
        states, ramps = stores
        state = write(states, canary_bp=1000)
        for n in (1, 2):
            ramps.record(ts=10.0 + n, actor="ramp-controller", action="ramp-evaluate",
                         reason=f"hold {n}", detail={"samples": n})
        assert ramps.last_evaluation() == {"samples": 2, "ts": 12.0, "action": "ramp-evaluate",
                                           "reason": "hold 2"}
        notes = states.audit()[-2:]
        assert [(e.reason, e.detail, e.revision, e.after) for e in notes] == [
            ("hold 1", {"samples": 1}, 1, state), ("hold 2", {"samples": 2}, 1, state)]
        assert states.get() == state

    def test_record_without_audit_keeps_the_last_and_writes_no_entry(self, stores):
        states, ramps = stores
        write(states, canary_bp=1000)
        ramps.record(ts=11.0, actor="ramp-controller", action="ramp-evaluate", reason="hold 1",
                     detail={"samples": 1})
        before = states.audit()
        ramps.record(ts=16.0, actor="ramp-controller", action="ramp-evaluate", reason="hold 2",
                     detail={"samples": 2, "held": {"evaluations": 2}}, audit=False)
        assert states.audit() == before
        assert ramps.last_evaluation() == {"samples": 2, "held": {"evaluations": 2}, "ts": 16.0,
                                           "action": "ramp-evaluate", "reason": "hold 2"}

    # --- the lease ---------------------------------------------------------------------------

    def test_the_lease_has_one_holder_who_can_renew_it(self, stores, lapse):
        _, ramps = stores
        assert ramps.acquire("c1", lapse.ttl_s)
        assert ramps.acquire("c1", lapse.ttl_s)  # renewal
        assert not ramps.acquire("c2", lapse.ttl_s)
        assert ramps.holder() == "c1"

    def test_only_the_holder_releases_the_lease(self, stores, lapse):
        _, ramps = stores
        assert ramps.acquire("c1", lapse.ttl_s)
        ramps.release("c2")
        assert ramps.holder() == "c1"
        ramps.release("c1")
        assert ramps.holder() is None
        assert ramps.acquire("c2", lapse.ttl_s) and ramps.holder() == "c2"

    def test_a_lapsed_lease_is_taken_over_and_the_old_holder_is_fenced_off(self, stores, lapse):
        _, ramps = stores
        first = ramps.put(None, ramp(1), actor="a", action="ramp-start", reason="r")
        assert ramps.acquire("crashed", lapse.ttl_s)
        lapse()  # the holder crashed: it renews no more
        assert ramps.holder() is None
        assert ramps.acquire("successor", lapse.ttl_s)
        assert not ramps.acquire("crashed", lapse.ttl_s)
        with pytest.raises(LeaseLost):
            ramps.put(first, ramp(2), actor="c", action="ramp-advance", reason="r",
                      owner="crashed")
        ramps.put(first, ramp(2), actor="c", action="ramp-advance", reason="r",
                  owner="successor")
        assert ramps.get().revision == 2
