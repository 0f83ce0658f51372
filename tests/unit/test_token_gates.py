"""The ramp's token gates (rollout.ramp.gates `max_kld`, `min_token_agreement`) on the shadow's
counters of scored generated answers (rollout.shadow `token_fields`), with in-memory twins: they
pass, fail and wait on their confidence sequences; a ramp advances on a faithful canary and
rolls back a damaged one; `rollout status` prints the online figures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ops.cli.telemetry import shadow_lines
from rollout.ramp import PlanError, parse_plan
from rollout.ramp.gates import judge_gates
from rollout.shadow import ShadowItem, aggregate_shadow, kld_bin, merge_shadow, token_fields
from rollout.token_fidelity import ResponseFidelity
from tests.ramp_harness import PLAN, ScriptedMetrics, shadow_fed_harness, stats


def answer(kld: float, agreement: float, tokens: int = 20) -> ResponseFidelity:
    same = round(agreement * tokens)
    return ResponseFidelity((kld,) * tokens, (True,) * same + (False,) * (tokens - same), 1.0,
                            1.1, ("script:latin", "length:1-16"))


def judge(answers: int, kld: float, agreement: float, **gates):
    metrics = ScriptedMetrics()
    metrics.canary = stats("optimized", 100)
    metrics.token_counts = (answers, answers * agreement, {kld_bin(kld): answers})
    plan = parse_plan(dict(PLAN, failures_tolerated=0, gates={
        "min_samples": 10, "max_kld": 0.01, "min_token_agreement": 0.9,
        "min_agreement_pairs": 50, **gates}))
    _, results = judge_gates(SimpleNamespace(plan=plan), metrics, 60, 600)
    return {gate.name: gate for gate in results}


def test_the_token_gates_pass_fail_and_wait_on_their_confidence_sequences():
    with pytest.raises(PlanError, match="max_kld"):
        parse_plan({"gates": {"max_kld": 0.5}, "steps": [{"percent": 100}]})
    assert parse_plan({"gates": {"min_token_agreement": 0.95}, "steps": [{"percent": 100}]})
    faithful = judge(400, 0.002, 0.98)
    assert faithful["max_kld"].status == "pass" and faithful["max_kld"].value <= 0.01
    assert faithful["min_token_agreement"].status == "pass"
    assert "over 400 scored answers" in faithful["max_kld"].note
    damaged = judge(60, 0.04, 0.7)
    assert damaged["max_kld"].status == "fail" and damaged["min_token_agreement"].status == "fail"
    undecided = judge(60, 0.01, 0.9)  # at the bars: the sequences cannot say yet
    assert {g.status for g in undecided.values()} == {"wait"}
    few = judge(20, 0.002, 0.99)
    assert few["max_kld"].status == "wait" and "20/50 scored answers" in few["max_kld"].note


def test_a_ramp_advances_on_faithful_answers_and_rolls_back_damaged_ones():
    gates = {"min_samples": 10, "min_agreement_pairs": 50, "max_kld": 0.02,
             "min_token_agreement": 0.8}
    h, metrics = shadow_fed_harness(gates)
    for _ in range(30):
        metrics.hashes.increment(merge_shadow(
            [ShadowItem(h.clock.time(), token_fields(answer(0.002, 0.97)))] * 10, "app"))
        h.clock.advance(1)
    decision = h.tick()
    results = {g.name: g.status for g in decision.gates}
    assert results == {"max_kld": "pass", "min_token_agreement": "pass"}, decision
    assert decision.kind == "advance" and h.share == 5_000
    h, metrics = shadow_fed_harness(gates)
    for _ in range(10):
        metrics.hashes.increment(merge_shadow(
            [ShadowItem(h.clock.time(), token_fields(answer(0.05, 0.6)))] * 10, "app"))
        h.clock.advance(1)
    decision = h.tick()
    assert {g.name: g.status for g in decision.gates} == {"max_kld": "fail",
                                                          "min_token_agreement": "fail"}
    assert decision.kind == "rollback" and h.share == 0


def test_rollout_status_prints_the_online_token_figures():
    fields = [token_fields(answer(0.002, 0.95))] * 30
    text = "\n".join(shadow_lines(aggregate_shadow(fields, 60.0)))
    assert "generated answers scored 30" in text and "KL divergence 0.00200" in text
    assert "top-1 token agreement 95.00%" in text
