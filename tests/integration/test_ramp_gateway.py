"""The progressive ramp end to end: the `ramp-controller` deployment in the real (shared) Serve
app, real Redis with ACL users, real HTTP traffic. A healthy canary is promoted through a short
plan; a canary made faulty mid-ramp is rolled back by itself, and no request is lost.

Plans here have no agreement gate: the gateway's shadow comparison feeds that gate, and these
tests are about the controller, the error/latency/fallback gates and the rollback path.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

from rollout.ramp import CONTROLLER, parse_plan
from tests.verdicts import passing_verdict

GATES = {"min_samples": 3, "error_rate_delta": 0.05, "timeout_rate": 0.05,
         "fallback_rate": 0.05, "p99_ms": 4000}


@dataclass
class Traffic:
    """A bounded client loop: one request at a time, a new routing key each, every answer
    kept as (completed_at, status, answering arm, fallback)."""

    gw: object
    limit_s: float = 90.0
    answers: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        deadline = time.monotonic() + self.limit_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            key = uuid.uuid4().hex
            try:
                response = self.gw.predict(["ramp traffic"], **{"X-Routing-Key": key})
                body = response.json()
                self.answers.append((time.time(), response.status_code,
                                     response.headers.get("x-canary-arm"),
                                     bool(body.get("fallback"))))
            except Exception as exc:  # a lost request: kept, and the test fails on it
                self.answers.append((time.time(), None, repr(exc), False))
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture
def ramp_env(gw):
    """An operator's ramp control with a passing verdict for the versions served; aborts any
    ramp still active afterwards and restores share, kill switch and faults."""
    control = gw.ramp_control()
    live = control.rollout.live_versions()
    assert len(live) == 1, live
    baseline, optimized = next(iter(live))
    control.states.put_verdict(passing_verdict(baseline, optimized))
    yield control
    ramp = control.ramps.get()
    if ramp is not None and ramp.active:
        control.abort(actor="test", reason="test cleanup")
    if gw.live:
        gw.redeploy({})
    gw.set_state(canary_bp=0)
    control.states.close()
    control.ramps.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_healthy_canary_is_promoted_through_a_short_plan(gw, ramp_env):
    plan = parse_plan({"window_s": 3, "gates": GATES, "steps": [
        {"percent": 10, "min_duration_s": 1, "min_samples": 3},
        {"percent": 50, "min_duration_s": 1, "min_samples": 3},
        {"percent": 100, "min_duration_s": 1, "min_samples": 3}]})
    since = time.time()  # the shared app's audit holds other tests' ramps too
    with Traffic(gw) as traffic:
        started = time.monotonic()
        ramp_env.start(plan, actor="test", reason="healthy ramp")
        ramp = wait_for(lambda: (r := ramp_env.ramps.get()).status != "running" and r, 60,
                        "the ramp to finish")
        took = time.monotonic() - started
    assert ramp.status == "promoted", ramp.reason
    served = gw.served_state()
    assert served["effective_percent"] == 100 or gw.wait_for_revision(
        ramp_env.states.get().revision)["effective_percent"] == 100
    statuses = [status for _, status, _, _ in traffic.answers]
    assert statuses and set(statuses) == {200}, set(statuses)
    entries = [e for e in ramp_env.states.audit() if e.actor == CONTROLLER and e.ts >= since]
    moves = [e.action for e in entries if e.action.startswith("canary")]
    assert moves == ["canary 0% -> 10%", "canary 10% -> 50%", "canary 50% -> 100%"]
    assert entries[-1].action == "ramp-promote"
    assert all(g["status"] == "pass" for g in entries[-1].detail["gates"])
    print(f"\nhealthy ramp 10 -> 50 -> 100 % promoted in {took:.1f} s, "
          f"{len(statuses)} requests, all 200")


def test_a_faulty_canary_is_rolled_back_and_no_request_is_lost(gw, ramp_env):
    plan = parse_plan({"window_s": 3, "gates": GATES, "steps": [
        {"percent": 25, "min_duration_s": 600, "min_samples": 3},
        {"percent": 100}]})
    since = time.time()  # the shared app's audit holds other tests' ramps too
    ramp_env.start(plan, actor="test", reason="faulty ramp")
    wait_for(lambda: gw.served_state()["effective_percent"] == 25, 30, "the 25 % step")
    zero_at: list[float] = []

    def watch():  # when the gateway serves 0 % again
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if gw.served_state()["effective_percent"] == 0:
                zero_at.append(time.time())
                return
            time.sleep(0.01)

    with Traffic(gw) as traffic:
        wait_for(lambda: sum(1 for a in traffic.answers if a[2] == "optimized") >= 5, 30,
                 "healthy canary traffic")
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        injected = time.time()
        gw.redeploy({"optimized": {"fault_error": True}})
        watcher.join(timeout=60)
        time.sleep(0.5)  # a little traffic after the rollback
    assert zero_at, "the gateway never served 0 %"
    ramp = ramp_env.ramps.get()
    assert ramp.status == "aborted" and ramp.reason.startswith("rollback: ")
    assert "error_rate" in ramp.reason or "fallback_rate" in ramp.reason
    state = ramp_env.states.get()
    assert state.canary_bp == 0 and state.updated_by == CONTROLLER

    answers = traffic.answers
    lost = [a for a in answers if a[1] is None]
    assert not lost, lost[:3]
    odd = [(round(t - injected, 2), status, arm) for t, status, arm, _ in answers
           if status != 200]
    # 503 (retry budget spent) and 504 (deadline passed on this loaded machine) are explicit
    # answers, counted below; a lost request (no answer) or a 500 fails the test
    assert {a[1] for a in answers} <= {200, 503, 504}, odd
    first_fallback = min(t for t, status, _, fallback in answers if fallback)
    notes = [e for e in ramp_env.states.audit() if e.actor == CONTROLLER and e.ts >= since
             and e.detail and any(g["status"] == "fail" for g in e.detail.get("gates", []))]
    first_failing = notes[0].ts
    zero = zero_at[0]
    during = [a for a in answers if first_fallback <= a[0] <= zero]
    canary_served = [a for a in during if a[3] or a[2] == "optimized"]
    refused = [a for a in during if a[1] in (503, 504)]
    print(f"\nfault injected at +0.00 s (redeploy issued); first fallback answer "
          f"+{first_fallback - injected:.2f} s; first failing evaluation "
          f"+{first_failing - injected:.2f} s; gateway serving 0 % at +{zero - injected:.2f} s")
    print(f"breach (first fallback) -> 0 % served: {zero - first_fallback:.2f} s; "
          f"first failing evaluation -> 0 % served: {zero - first_failing:.2f} s")
    print(f"requests in between: {len(during)}, routed to the faulty canary: "
          f"{len(canary_served)} (answered by the baseline fallback: "
          f"{sum(1 for a in canary_served if a[3])}), 503/504: {len(refused)}; "
          f"whole run {len(answers)} requests: {len(answers) - len(odd)} x 200, "
          f"{len(odd)} x 503/504, lost 0")
    assert zero >= first_failing
