"""The dashboard's ramp panel without HTTP (serve.dashboard.ramp), on the in-memory stores."""

from __future__ import annotations

import json

import pytest

from rollout import DeploymentReport, FakeClock, MemoryStateStore, StoreUnavailable
from rollout.ramp import MemoryRampStore, RampControl, parse_plan
from serve.dashboard.errors import ControlUnavailable, InvalidInput, NotFound, RampNotPossible
from serve.dashboard.ramp import ramp_action, ramp_status

START = 1_700_000_000.0
PLAN = {"gates": {"p99_ms": 500}, "steps": [{"percent": 5}, {"percent": 100, "approval": True}]}


@pytest.fixture
def control():
    clock = FakeClock(START)
    states = MemoryStateStore()
    states.report_deployment(DeploymentReport(gateway="g", baseline_version="b",
                                              optimized_version="o", ts=START))
    return RampControl(states, MemoryRampStore(states, clock), clock)


def act(control, action, **fields):
    return ramp_action(control, action, json.dumps(fields).encode(), "10.0.0.2")


def test_no_ramp_is_reported_inactive_and_actions_on_it_conflict(control):
    assert ramp_status(control) == {"active": False, "ramp": None, "time_in_step_s": None,
                                    "controller": None, "last_evaluation": None}
    with pytest.raises(RampNotPossible):
        act(control, "pause", reason="nothing to pause")


def test_actions_steer_the_ramp_under_the_dashboard_actor(control):
    control.start(parse_plan(PLAN), actor="alice", reason="go", force=True)
    assert ramp_status(control)["active"] is True
    assert act(control, "pause", reason="look", actor="bob")["ramp"]["status"] == "paused"
    with pytest.raises(RampNotPossible):
        act(control, "pause", reason="again")
    assert act(control, "approve", reason="ok")["ramp"]["approved"] == [1]
    assert act(control, "resume", reason="on")["ramp"]["status"] == "running"
    assert act(control, "abort", reason="stop")["ramp"]["status"] == "aborted"
    audit = control.states.audit()
    assert audit[-1].actor == "dashboard:10.0.0.2"
    assert any(e.actor == "dashboard:bob@10.0.0.2" and e.action == "ramp-pause" for e in audit)
    assert ramp_status(control)["active"] is False


@pytest.mark.parametrize("fields", [{}, {"reason": " "}, {"reason": "x", "confirm": True},
                                    {"reason": "x", "expected_revision": 3},
                                    {"reason": "x", "plan": "all"}])
def test_bad_bodies_are_invalid(control, fields):
    control.start(parse_plan(PLAN), actor="alice", reason="go", force=True)
    with pytest.raises(InvalidInput):
        act(control, "pause", **fields)
    assert control.ramps.get().status == "running"


def test_unknown_actions_and_unreachable_stores(control):
    with pytest.raises(NotFound):
        act(control, "promote", reason="x")

    class Down(MemoryRampStore):
        def get(self):
            raise StoreUnavailable("down")

    down = RampControl(control.states, Down(control.states), control.clock)
    with pytest.raises(ControlUnavailable):
        ramp_status(down)
    with pytest.raises(ControlUnavailable):
        act(down, "abort", reason="x")
