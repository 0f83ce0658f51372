"""The ramp on a real Redis with the shipped ACL users: the `controller` user can run a ramp
(lease, ramp record, evaluations, audited share changes) and nothing more; an operator's ramp
actions reach it; the whole controller loop against Redis, with scripted metrics."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from rollout import DeploymentReport, FakeClock, PermissionDenied, Rollout, SystemClock, Verdict
from rollout.ramp import RampControl, RampController, parse_plan
from rollout.ramp.redis_store import RedisRampStore
from rollout.redis_store import RedisStateStore
from tests.ramp_harness import PLAN, ScriptedMetrics, stats


@pytest.fixture
def app():
    return f"ramp-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def stores(secured, app):
    opened = []

    def open_as(user: str):
        states = RedisStateStore(secured.url_for(user), app, timeout_s=5.0)
        ramps = RedisRampStore(secured.url_for(user), app, timeout_s=5.0)
        opened.extend((states, ramps))
        return states, ramps

    yield open_as
    for store in opened:
        store.close()


def report(states, clock) -> None:
    states.report_deployment(DeploymentReport(
        gateway="gw", baseline_version="b1", optimized_version="o1", ts=clock.time()))


def test_the_controller_user_runs_a_ramp_from_start_to_rollback(stores):
    clock = SystemClock()
    operator_states, operator_ramps = stores("operator")
    gateway_states, _ = stores("gateway")
    states, ramps = stores("controller")
    report(gateway_states, clock)
    operator_states.put_verdict(Verdict(
        baseline_version="b1", optimized_version="o1", passed=True, n=100, agreement=1.0,
        agreement_lower_bound=0.96))
    RampControl(operator_states, operator_ramps, clock).start(
        parse_plan(PLAN), actor="alice", reason="ramp o1")
    metrics = ScriptedMetrics()
    controller = RampController(states, ramps, metrics, clock=clock, owner="c1")
    assert controller.tick().kind == "advance"
    assert operator_states.get().canary_bp == 1000 and ramps.holder() == "c1"
    metrics.canary = stats("optimized", 100, error_rate=1.0)
    assert controller.tick().kind == "hold"
    rollback = controller.tick()
    assert rollback.kind == "rollback" and operator_states.get().canary_bp == 0
    actions = [(e.actor, e.action) for e in operator_states.audit()]
    assert actions == [
        ("alice", "ramp-start"), ("ramp-controller", "canary 0% -> 10%"),
        ("ramp-controller", "ramp-advance"), ("ramp-controller", "ramp-evaluate"),
        ("ramp-controller", "canary 10% -> 0%"), ("ramp-controller", "ramp-rollback")]
    assert operator_ramps.get().status == "aborted"
    assert operator_ramps.last_evaluation()["decision"] == "rollback"


def test_the_controller_user_summarises_a_held_ramp(stores):
    clock = FakeClock(time.time())
    operator_states, operator_ramps = stores("operator")
    states, ramps = stores("controller")
    report(operator_states, clock)
    operator_states.put_verdict(Verdict(
        baseline_version="b1", optimized_version="o1", passed=False, failures=("agreement",),
        n=100, agreement=0.5, agreement_lower_bound=0.4))
    RampControl(operator_states, operator_ramps, clock).start(
        parse_plan(PLAN), actor="alice", reason="ramp o1")
    controller = RampController(states, ramps, ScriptedMetrics(), clock=clock, owner="c1",
                                audit_heartbeat_s=300.0)
    for _ in range(3):
        clock.advance(5)
        report(operator_states, clock)
        assert controller.tick().reason.startswith("hold: the verify verdict failed")
    entries = [e for e in operator_states.audit() if e.actor == "ramp-controller"]
    assert [e.action for e in entries if e.action == "ramp-stalled"] == ["ramp-stalled"]  # once
    entries = [e for e in entries if e.action != "ramp-stalled"]
    assert len(entries) == 1  # the first; the other two are kept as the last one only
    last = operator_ramps.last_evaluation()
    assert last["ts"] == clock.time() and last["held"]["evaluations"] == 3


def test_the_controller_user_may_not_touch_what_is_not_its_own(stores, secured, app):
    states, ramps = stores("controller")
    with pytest.raises(PermissionDenied):
        states.report_deployment(DeploymentReport(
            gateway="fake", baseline_version="b", optimized_version="o", ts=1.0))
    with pytest.raises(PermissionDenied):
        states.put_verdict(Verdict(baseline_version="b", optimized_version="o", passed=True,
                                   n=1, agreement=1.0, agreement_lower_bound=0.5))
    client = redis.Redis.from_url(secured.url_for("controller"), decode_responses=True)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hincrbyfloat(f"rollout:{app}:telemetry:win:optimized:1", "requests", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("elsewhere", "x")
        assert client.hgetall(f"rollout:{app}:telemetry:win:optimized:1") == {}
    finally:
        client.close()


def test_the_gateway_user_can_neither_run_nor_change_a_ramp(stores):
    operator_states, operator_ramps = stores("operator")
    report(operator_states, SystemClock())
    RampControl(operator_states, operator_ramps).start(parse_plan(PLAN), actor="alice",
                                                       reason="ramp", force=True)
    states, ramps = stores("gateway")
    with pytest.raises(PermissionDenied):
        ramps.acquire("gw", 5.0)
    control = RampControl(states, ramps, FakeClock())
    assert control.view().ramp.status == "running"  # it may read the ramp (the dashboard does)
    with pytest.raises(PermissionDenied):
        control.pause(actor="gw", reason="sneaky")
    assert operator_ramps.get().status == "running"


def test_an_operator_abort_reaches_the_controller(stores):
    clock = SystemClock()
    operator_states, operator_ramps = stores("operator")
    states, ramps = stores("controller")
    report(operator_states, clock)
    control = RampControl(operator_states, operator_ramps, clock)
    control.start(parse_plan(PLAN), actor="alice", reason="ramp", force=True)
    controller = RampController(states, ramps, ScriptedMetrics(), clock=clock, owner="c1")
    assert controller.tick().kind == "advance"
    control.abort(actor="alice", reason="stop")
    assert controller.tick() is None
    assert operator_states.get().canary_bp == 0
    assert Rollout(operator_states).state().updated_by == "alice"


def test_the_cli_steers_a_ramp_in_redis(secured, stores, app):
    from tests.integration.test_cli_redis import ok, one_error_line, rollout

    states, _ = stores("operator")
    report(states, SystemClock())
    url = secured.url_for("operator")
    plan = str(Path(__file__).resolve().parents[2] / "ops" / "plans" / "example-ramp.yaml")
    started = ok(rollout(url, "--app", app, "ramp", "start", plan, "--force", "--reason", "go"))
    assert "ramp started (forced): 1% -> 5% -> 25% -> 50% -> 100%" in started
    doc = json.loads(ok(rollout(url, "--app", app, "ramp", "status", "--json")))
    assert doc["ramp"]["status"] == "running" and doc["ramp"]["forced"] is True
    assert doc["controller"] is None  # no application runs here
    text = ok(rollout(url, "--app", app, "ramp", "status"))
    assert "none holds the lease (is the application running?)" in text
    ok(rollout(url, "--app", app, "ramp", "pause", "--reason", "hold on"))
    refused = rollout(secured.url_for("gateway"), "--app", app, "ramp", "resume",
                      "--reason", "sneaky")
    assert refused.returncode == 1 and "refused" in one_error_line(refused)
    ok(rollout(url, "--app", app, "ramp", "abort", "--reason", "stop"))
    actions = [(e.actor, e.action) for e in states.audit()]
    assert actions == [("alice", "ramp-start --force"), ("alice", "ramp-pause"),
                       ("alice", "ramp-abort")]


def test_the_deployment_runs_the_loop_as_the_controller_user_and_reports_a_dead_loop(
        secured, app):
    from rollout import Settings
    from serve.control_plane.controller import RampControllerDeployment

    settings = Settings(redis_url=secured.url_for("gateway"), app_name=app,
                        control_redis_url=secured.url_for("controller"),
                        ramp_interval_s=0.05, ramp_lease_ttl_s=1.0)
    replica = RampControllerDeployment.func_or_class(settings)
    try:
        deadline = time.monotonic() + 10
        while replica.info()["holder"] != replica.controller.owner:
            assert time.monotonic() < deadline, "the loop never took the lease"
            time.sleep(0.02)
        replica.check_health()
        replica.stop.set()
        replica.thread.join(timeout=5)
        with pytest.raises(RuntimeError, match="the ramp controller loop has stopped"):
            replica.check_health()
        assert replica.info()["holder"] is None  # released on the way out
    finally:
        replica.__del__()
