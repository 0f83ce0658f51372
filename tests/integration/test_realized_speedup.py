"""Realized efficiency end to end: the replicas of the real (shared) Serve app
measure the CPU seconds of their forwards, the gateway files them per arm, `rollout status`
reads them back, and a ramp whose `realized_speedup` gate sees an optimized arm made slower on
purpose (`fault_cpu_ms`: every forward spins that much CPU first) rolls back by itself."""

from __future__ import annotations

import time

from rollout.ramp import CONTROLLER, parse_plan
from rollout.status import read_status
from tests.integration.test_ramp_gateway import Traffic, ramp_env, wait_for  # noqa: F401

BURN_MS = 40  # per forward of the optimized arm; a tiny-encoder forward takes a few ms


def test_a_canary_slowed_on_purpose_fails_realized_speedup_and_is_rolled_back(gw, ramp_env):  # noqa: F811
    gw.redeploy({"optimized": {"fault_cpu_ms": BURN_MS}})
    plan = parse_plan({"window_s": 10, "failures_tolerated": 0,
                       "gates": {"min_samples": 8, "realized_speedup": 0.8},
                       "steps": [{"percent": 50, "min_duration_s": 600, "min_samples": 8},
                                 {"percent": 100}]})
    since = time.time()
    ramp_env.start(plan, actor="test", reason="slow canary")
    with Traffic(gw, limit_s=60) as traffic:
        ramp = wait_for(lambda: (r := ramp_env.ramps.get()).status != "running" and r, 60,
                        "the ramp to end")
    assert ramp.status == "aborted" and ramp.reason.startswith("rollback: "), ramp.reason
    assert "realized_speedup" in ramp.reason
    state = ramp_env.states.get()
    assert state.canary_bp == 0 and state.updated_by == CONTROLLER
    [entry] = [e for e in ramp_env.states.audit()
               if e.actor == CONTROLLER and e.ts >= since and e.action == "ramp-rollback"]
    gate = next(g for g in entry.detail["gates"] if g["name"] == "realized_speedup")
    assert gate["status"] == "fail" and gate["value"] < 0.8
    assert {a[1] for a in traffic.answers} == {200}

    def measured():  # the seconds since the fault only (earlier tests' traffic shares the
        telemetry = gw.telemetry()  # windows), once the sinks have flushed them
        try:
            status = read_status(ramp_env.states, telemetry, app=gw.settings.app_name,
                                 window_s=int(time.time() - since) + 1)
        finally:
            telemetry.close()
        return status if status.traffic["optimized"].cpu_per_1k is not None else None

    status = wait_for(measured, 20, "the optimized arm's CPU seconds")
    arms, efficiency = status.traffic, status.efficiency
    baseline, optimized = arms["baseline"].cpu_per_1k, arms["optimized"].cpu_per_1k
    assert optimized >= BURN_MS  # >= 40 ms of CPU per single-input request: 40 s per 1,000
    assert 0 < baseline < optimized / 2
    assert efficiency.upper < 0.8 and arms["optimized"].cpu.device == "cpu"
    print(f"\nCPU s per 1,000 inputs: baseline {baseline:.2f}, optimized {optimized:.2f} "
          f"(+{BURN_MS} ms burnt per forward); realized speedup {efficiency.text()}; "
          f"rolled back: {ramp.reason}")
