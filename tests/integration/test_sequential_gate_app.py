"""The agreement gate end to end: the real Serve app shadows every request
(`shadow_share` 1.0), its shadow counters reach the real Redis, and the `ramp-controller`
deployment judges its anytime-valid confidence sequence over each step's pairs: a canary that
agrees is promoted, one whose every label is rotated (a live `fault_rotate_labels`) is rolled
back by the agreement gate, with no request lost."""

from __future__ import annotations

import re
import time

import pytest

from rollout.ramp import CONTROLLER, parse_plan
from tests.integration.test_ramp_gateway import Traffic, wait_for
from tests.verdicts import passing_verdict

GATES = {"min_samples": 3, "agreement_lower_bound": 0.5, "min_agreement_pairs": 20}


@pytest.fixture
def shadow_ramp(gw):
    """Returns start(live overrides): redeploys with every request shadowed, stores a passing
    verdict for the versions then served, and gives the operator's ramp control; afterwards
    aborts any active ramp and puts share and settings back."""
    opened = []

    def start(live: dict):
        gw.redeploy(live, shadow_share=1.0)
        control = gw.ramp_control()
        opened.append(control)
        live_versions = wait_for(lambda: (v := control.rollout.live_versions()) and
                                 len(v) == 1 and v, 30, "one pair of versions")
        baseline, optimized = next(iter(live_versions))
        control.states.put_verdict(passing_verdict(baseline, optimized))
        return control

    yield start
    for control in opened:
        ramp = control.ramps.get()
        if ramp is not None and ramp.active:
            control.abort(actor="test", reason="test cleanup")
        control.states.close()
        control.ramps.close()
    gw.redeploy({})
    gw.set_state(canary_bp=0)


def agreement_gate(entry) -> dict:
    [gate] = [g for g in entry.detail["gates"] if g["name"] == "agreement_lower_bound"]
    return gate


def counted(note: str) -> tuple[int, int]:
    agreed, pairs = re.search(r"of (\d+)/(\d+) agreed", note).groups()
    return int(agreed), int(pairs)


def test_an_agreeing_canary_is_promoted_on_the_step_long_confidence_sequence(gw, shadow_ramp):
    control = shadow_ramp({})
    plan = parse_plan({"window_s": 3, "gates": GATES, "steps": [
        {"percent": 10, "min_duration_s": 1, "min_samples": 3},
        {"percent": 100, "min_duration_s": 1, "min_samples": 3}]})
    since = time.time()
    with Traffic(gw) as traffic:
        control.start(plan, actor="test", reason="agreeing canary")
        ramp = wait_for(lambda: (r := control.ramps.get()).status != "running" and r, 80,
                        "the ramp to finish")
    assert ramp.status == "promoted", ramp.reason
    assert {status for _, status, _, _ in traffic.answers} == {200}
    entries = [e for e in control.states.audit() if e.actor == CONTROLLER and e.ts >= since]
    judged = [e for e in entries if e.action in ("ramp-advance", "ramp-promote")
              and e.detail["gates"]]  # the first advance (to 10 %) comes before any gate
    assert [e.action for e in judged] == ["ramp-advance", "ramp-promote"]
    for entry in judged:
        gate = agreement_gate(entry)
        agreed, pairs = counted(gate["note"])
        assert gate["status"] == "pass" and gate["value"] >= 0.5 and pairs >= 20
        assert gate["note"].startswith("anytime 95% CS [") and "in the step's" in gate["note"]
    print(f"\nagreeing canary promoted on the CS gate: {len(traffic.answers)} requests; "
          f"the last step passed at {agreed}/{pairs} agreeing shadow pairs")


def test_a_canary_that_disagrees_is_rolled_back_by_the_agreement_gate(gw, shadow_ramp):
    control = shadow_ramp({"optimized": {"fault_rotate_labels": True}})
    plan = parse_plan({"window_s": 3, "gates": GATES, "failures_tolerated": 0, "steps": [
        {"percent": 25, "min_duration_s": 600, "min_samples": 3}, {"percent": 100}]})
    since = time.time()
    with Traffic(gw) as traffic:
        control.start(plan, actor="test", reason="disagreeing canary")
        ramp = wait_for(lambda: (r := control.ramps.get()).status != "running" and r, 80,
                        "the rollback")
    assert ramp.status == "aborted" and ramp.reason.startswith("rollback: agreement_lower_bound")
    assert gw.wait_for_revision(control.states.get().revision)["effective_percent"] == 0
    assert {status for _, status, _, _ in traffic.answers} == {200}
    rollback = next(e for e in control.states.audit()
                    if e.actor == CONTROLLER and e.ts >= since and e.action == "ramp-rollback")
    gate = agreement_gate(rollback)
    agreed, pairs = counted(gate["note"])
    assert gate["status"] == "fail" and pairs >= 20 and agreed / pairs < 0.5
    upper = float(re.search(r"CS \[[\d.]+, ([\d.]+)\]", gate["note"]).group(1))
    assert upper < 0.5  # rolled back because the band lies wholly below the threshold
