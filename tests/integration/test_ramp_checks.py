"""A ramp's HTTP checks and progress deadline end to end: the controller, as the shipped
`controller` Redis user, ticks on a fake clock against a real Redis, and the real HTTP checker
(serve.control_plane.checks) asks a real local HTTP server."""

from __future__ import annotations

import time
import uuid

import pytest

from rollout import DeploymentReport, FakeClock, Verdict
from rollout.ramp import RampControl, RampController, parse_plan
from rollout.ramp.redis_store import RedisRampStore
from rollout.redis_store import RedisStateStore
from serve.control_plane.checks import HttpChecker
from tests.ramp_harness import PLAN, ScriptedMetrics, stats
from tests.unit.test_ramp_checks import Receiver


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


class Ramp:
    """An operator's and a controller's view of one application's ramp in Redis."""

    def __init__(self, secured, plan: dict):
        app = f"checks-{uuid.uuid4().hex[:8]}"
        self.clock = FakeClock(time.time())
        self.stores = [RedisStateStore(secured.url_for(user), app, timeout_s=5.0)
                       for user in ("operator", "controller")]
        self.stores += [RedisRampStore(secured.url_for(user), app, timeout_s=5.0)
                        for user in ("operator", "controller")]
        self.states, states, self.ramps, ramps = self.stores
        self.report()
        self.states.put_verdict(Verdict(
            baseline_version="b1", optimized_version="o1", passed=True, n=100, agreement=1.0,
            agreement_lower_bound=0.96))
        self.metrics = ScriptedMetrics()
        self.metrics.canary = stats("optimized", 100)
        self.controller = RampController(states, ramps, self.metrics, clock=self.clock,
                                         owner="c1", checker=HttpChecker())
        RampControl(self.states, self.ramps, self.clock).start(
            parse_plan(plan), actor="alice", reason="ramp o1")

    def report(self) -> None:
        self.states.report_deployment(DeploymentReport(
            gateway="gw", baseline_version="b1", optimized_version="o1", ts=self.clock.time()))

    def tick(self, seconds: float = 5.0):
        self.clock.advance(seconds)
        self.report()
        return self.controller.tick()

    def actions(self) -> list[str]:
        return [e.action for e in self.states.audit() if e.actor == "ramp-controller"]

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def ramp(secured):
    opened = []

    def start(plan: dict) -> Ramp:
        opened.append(Ramp(secured, plan))
        return opened[-1]

    yield start
    for each in opened:
        each.close()


def test_a_check_that_turns_from_200_to_500_rolls_the_canary_back(ramp, receiver):
    r = ramp(dict(PLAN, checks=[{"url": receiver.url("/budget"), "name": "budget",
                                 "field": "data.error_rate", "max": 0.01, "timeout_s": 2}]))
    assert r.tick().kind == "advance" and r.states.get().canary_bp == 1000
    held = r.tick()
    assert held.kind == "hold" and [(c.name, c.status, c.value) for c in held.checks] == [
        ("budget", "pass", 0.002)]
    assert receiver.requests == ["/budget"]
    receiver.status = 500
    assert r.tick().kind == "hold"  # one failing evaluation tolerated
    rollback = r.tick()
    assert rollback.kind == "rollback" and r.states.get().canary_bp == 0
    assert "check budget 500 (<= 0.01): fail (HTTP 500, expected 200)" in rollback.reason
    entry = [e for e in r.states.audit() if e.action == "ramp-rollback"][-1]
    assert entry.detail["checks"][0]["status"] == "fail" and entry.detail["checks"][0][
        "value"] == 500.0
    assert r.ramps.get().status == "aborted"
    assert r.actions()[-2:] == ["canary 10% -> 0%", "ramp-rollback"]


def test_a_check_nobody_answers_holds_until_the_deadline_aborts_to_0(ramp, receiver):
    receiver.status, receiver.body = 200, b"<html>maintenance</html>"  # not JSON: wait
    r = ramp(dict(PLAN, progress_deadline_s=60, checks=[
        {"url": receiver.url(), "name": "budget", "field": "data.error_rate", "max": 0.01}]))
    assert r.tick().kind == "advance" and r.states.get().canary_bp == 1000
    for _ in range(18):  # the step's soak (30 s) and 60 s of the deadline
        decision = r.tick()
        assert decision.kind == "hold" and r.states.get().canary_bp == 1000
    assert "check budget - (<= 0.01): wait (the answer is not JSON" in decision.reason
    deadline = r.tick()
    assert deadline.kind == "deadline" and r.states.get().canary_bp == 0
    assert deadline.reason.startswith("deadline: step 1 (10%) could not progress for 65 s: "
                                      "check budget")
    entry = [e for e in r.states.audit() if e.action == "ramp-deadline"][-1]
    assert entry.actor == "ramp-controller" and entry.detail["on_deadline"] == "abort"
    assert entry.reason == deadline.reason
    assert r.ramps.get().status == "aborted"
    assert "canary 10% -> 0%" in r.actions()
    assert r.tick() is None
