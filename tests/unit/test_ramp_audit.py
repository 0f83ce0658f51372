"""The ramp's bounded audit (rollout.ramp.audit): a held step is summarised, every change is
written at once. In-memory stores, a fake clock, an evaluation every 5 s (no Redis, no Ray)."""

from __future__ import annotations

import io
import json

import pytest

from ops import cli
from rollout.ramp import CONTROLLER
from rollout.ramp.audit import CHANGES_PER_PERIOD, Held, summarise
from tests.ramp_harness import PLAN, Harness, stats

INTERVAL_S = 5.0
HEARTBEAT_S = 300.0
HOUR = int(3600 / INTERVAL_S)  # evaluations in one simulated hour


def entries(h: Harness) -> list:
    """The controller's audit entries (its share changes included)."""
    return [e for e in h.states.audit() if e.actor == CONTROLLER]


def held_by_a_failing_verdict() -> Harness:
    """A started ramp whose first step cannot start: the verify verdict failed."""
    h = Harness()
    h.verdict(passed=False)
    h.start()
    h.healthy()
    return h


def test_a_ramp_held_for_an_hour_writes_one_entry_plus_a_heartbeat_every_5_minutes():
    h = held_by_a_failing_verdict()
    decisions = [h.tick(INTERVAL_S) for _ in range(HOUR)]
    assert {d.kind for d in decisions} == {"hold"} and h.ramp.step == -1
    stalls = [e for e in entries(h) if e.action == "ramp-stalled"]
    assert len(stalls) == 1 and stalls[0].ts == entries(h)[0].ts  # once per stall, at once
    written = [e for e in entries(h) if e.action != "ramp-stalled"]
    assert len(written) <= 1 + 3600 / HEARTBEAT_S  # instead of 720
    assert len(written) == 12  # t = 5 s, then every 300 s up to 3305 s
    assert written[0].reason.startswith("hold: the verify verdict failed")
    assert all(e.action == "ramp-evaluate" for e in written)
    assert [e.ts - written[0].ts for e in written[1:3]] == [HEARTBEAT_S, 2 * HEARTBEAT_S]
    beat = written[1]
    assert "[unchanged for 300s; this entry stands for 60 evaluations]" in beat.reason
    assert beat.detail["held"]["since"] == written[0].ts
    assert beat.detail["held"]["evaluations"] == 61
    # every evaluation is accounted for: the entries stand for them, the rest wait for the next
    last = h.ramps.last_evaluation()
    stood_for = 1 + 60 * (len(written) - 1)
    assert stood_for + last["held"]["unaudited"] == HOUR
    assert last["held"]["evaluations"] == HOUR


def test_the_last_evaluation_is_fresh_on_every_interval_without_an_entry():
    h = held_by_a_failing_verdict()
    h.tick(INTERVAL_S)
    count = len(h.states.audit())
    for n in range(2, 6):
        h.tick(INTERVAL_S)
        last = h.ramps.last_evaluation()
        assert last["ts"] == h.clock.time() and last["held"]["evaluations"] == n
        assert last["reason"].startswith("hold: the verify verdict failed")
    assert len(h.states.audit()) == count


def test_a_change_of_hold_reason_is_written_at_once():
    h = held_by_a_failing_verdict()
    for _ in range(10):
        h.tick(INTERVAL_S)
    before = len(entries(h))
    h.rollout.kill(actor="bob", reason="incident")
    decision = h.tick(INTERVAL_S)
    assert decision.reason == "hold: the kill switch is on"
    written = entries(h)
    assert len(written) == before + 1 and written[-1].reason == decision.reason
    assert written[-1].ts == h.clock.time()
    h.tick(INTERVAL_S)  # the same reason again: summarised
    assert len(entries(h)) == before + 1
    h.rollout.unkill(actor="bob", reason="over")
    assert h.tick(INTERVAL_S).reason.startswith("hold: the verify verdict failed")
    assert len(entries(h)) == before + 2


def test_a_change_of_gate_status_is_written_at_once():
    h = Harness(dict(PLAN, steps=[{"percent": 10, "min_duration_s": 3600, "min_samples": 50},
                                  {"percent": 100}]))
    h.verdict()
    h.start()
    h.healthy()
    assert h.tick().kind == "advance"
    for _ in range(5):
        h.tick(INTERVAL_S)  # soaking, unchanged: one entry
    before = len(entries(h))
    h.metrics.canary = stats("optimized", 5)  # too few samples: every gate waits
    decision = h.tick(INTERVAL_S)
    assert {g.status for g in decision.gates} == {"wait"}
    assert len(entries(h)) == before + 1
    assert entries(h)[-1].detail["gates"][0]["status"] == "wait"


def test_a_flapping_outcome_is_bounded_too():
    h = Harness(dict(PLAN, steps=[{"percent": 10, "min_duration_s": 7200, "min_samples": 50},
                                  {"percent": 100}]))
    h.verdict()
    h.start()
    h.healthy()
    h.tick()
    start = len(entries(h))
    for n in range(HOUR):  # the gates flip between pass and wait on every evaluation
        h.metrics.canary = stats("optimized", 100 if n % 2 else 5)
        h.tick(INTERVAL_S)
    written = len(entries(h)) - start
    periods = 3600 / HEARTBEAT_S
    assert written <= periods * (CHANGES_PER_PERIOD + 1) + 1  # 133, instead of 720
    assert written >= periods * CHANGES_PER_PERIOD  # changes are still written, up to the budget


def test_advance_and_rollback_are_written_at_once():
    plan = dict(PLAN, failures_tolerated=1,
                steps=[{"percent": 10, "min_duration_s": 120, "min_samples": 50},
                       {"percent": 50, "min_duration_s": 3600, "min_samples": 50},
                       {"percent": 100}])
    h = Harness(plan)
    h.verdict()
    h.start()
    h.healthy()
    h.tick()
    for _ in range(23):  # soaking 115 s of 120 s: written once
        assert h.tick(INTERVAL_S).kind == "hold"
    before = len(entries(h))
    advance = h.tick(INTERVAL_S)
    assert advance.kind == "advance" and h.share == 5000
    actions = [e.action for e in entries(h)[before:]]
    assert actions == ["canary 10% -> 50%", "ramp-advance"]
    assert entries(h)[-1].ts == h.clock.time()
    for _ in range(10):
        h.tick(INTERVAL_S)
    before = len(entries(h))
    h.metrics.canary = stats("optimized", 100, error_rate=0.5)
    assert h.tick(INTERVAL_S).kind == "hold" and h.ramp.failures == 1
    assert [e.action for e in entries(h)[before:]] == ["ramp-evaluate"]  # counted: written
    assert h.tick(INTERVAL_S).kind == "rollback" and h.share == 0
    assert [e.action for e in entries(h)[before + 1:]] == ["canary 50% -> 0%", "ramp-rollback"]


def test_operator_actions_are_written_and_end_the_summary():
    h = held_by_a_failing_verdict()
    for _ in range(10):
        h.tick(INTERVAL_S)
    h.control.pause(actor="bob", reason="look")
    assert h.states.audit()[-1].action == "ramp-pause"
    decision = h.tick(INTERVAL_S)
    assert decision.reason == "hold: paused" and entries(h)[-1].reason == "hold: paused"


def test_a_controller_taking_over_goes_on_with_the_summary():
    h = held_by_a_failing_verdict()
    for _ in range(10):
        h.tick(INTERVAL_S)
    before = len(entries(h))
    successor = h.new_controller("c2")
    h.clock.advance(20)  # c1 stopped renewing: its lease lapsed
    assert h.tick(INTERVAL_S, controller=successor).kind == "hold"
    assert h.ramps.holder() == "c2" and len(entries(h)) == before
    assert h.ramps.last_evaluation()["held"]["evaluations"] == 11


def test_a_new_ramp_held_as_the_last_one_was_is_written_at_once():
    h = held_by_a_failing_verdict()
    for _ in range(10):
        h.tick(INTERVAL_S)
    h.control.abort(actor="bob", reason="start over")
    h.clock.advance(INTERVAL_S)
    h.start()
    assert h.control.view().held_since is None  # the last evaluation is the old ramp's
    before = len(entries(h))
    assert h.tick(INTERVAL_S).reason.startswith("hold: the verify verdict failed")
    assert len(entries(h)) == before + 1
    assert h.control.view().held_since == h.clock.time()


def test_an_evaluation_kept_by_an_older_controller_is_written_again():
    assert Held.from_last({"ts": 1.0, "reason": "hold"}) is None
    assert Held.from_last(None) is None
    held, why = summarise(None, "hold|running|-1||hold", 10.0, HEARTBEAT_S)
    assert why == "change" and held == Held.start("hold|running|-1||hold", 10.0)
    assert Held.from_last({"held": held.as_dict()}) == held


def test_ramp_status_shows_a_stalled_ramp_since_when_and_why():
    h = held_by_a_failing_verdict()
    for _ in range(120):  # 10 minutes
        h.tick(INTERVAL_S)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["ramp", "status"], store=h.states, clock=h.clock, ramps=h.ramps,
                    stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    row = next(line for line in out.getvalue().splitlines() if line.startswith("STALLED"))
    assert "since 2023-11-14T22:13:25Z (9m 55s, 120 evaluations): hold: the verify verdict " \
           "failed" in row
    out = io.StringIO()
    cli.main(["ramp", "status", "--json"], store=h.states, clock=h.clock, ramps=h.ramps,
             stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["stalled"] is True and doc["held_since"] == h.clock.time() - 595
    assert doc["last_evaluation"]["held"]["evaluations"] == 120


@pytest.mark.parametrize("soaked, stalled", [(60, False), (600, True)])
def test_a_hold_within_the_soak_is_held_not_stalled(soaked, stalled):
    h = Harness(dict(PLAN, steps=[{"percent": 10, "min_duration_s": 300, "min_samples": 50},
                                  {"percent": 100}]))
    h.verdict()
    h.start()
    h.healthy()
    assert h.tick().kind == "advance"
    h.verdict(passed=False)  # the next step cannot start once the soak is over
    for _ in range(int(soaked / INTERVAL_S)):
        h.tick(INTERVAL_S)
    view = h.control.view()
    assert view.held_since is not None and view.stalled is stalled
