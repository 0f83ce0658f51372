"""The ramp's `worst_slice_agreement` gate (rollout.ramp.gates): each slice's anytime-valid
confidence sequence at a Bonferroni share of the error rate; pass, fail and wait; and a ramp
rolled back for one broken script while the overall agreement looks fine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollout.agreement import CS_ALPHA, agreement_cs
from rollout.ramp import PlanError, parse_plan
from rollout.ramp.gates import MAX_JUDGED_SLICES, judge_gates
from rollout.shadow import PairOutcome
from tests.ramp_harness import (
    PLAN,
    Harness,
    ScriptedMetrics,
    ShadowFedMetrics,
    shadow_fed_harness,
    stats,
)

ALPHA = CS_ALPHA / MAX_JUDGED_SLICES


def slice_plan(**gates):
    return parse_plan(dict(PLAN, failures_tolerated=0, gates={
        "min_samples": 10, "worst_slice_agreement": 0.9, "min_slice_pairs": 50, **gates}))


def judge(counts: dict[str, tuple[int, int]], **gates):
    metrics = ScriptedMetrics()
    metrics.canary = stats("optimized", 100)
    metrics.slice_counts = counts
    _, results = judge_gates(SimpleNamespace(plan=slice_plan(**gates)), metrics, 60, 600)
    [gate] = [g for g in results if g.name == "worst_slice_agreement"]
    return gate


def test_the_plan_takes_the_gate_alone_and_refuses_bad_values():
    plan = slice_plan()
    assert plan.gates.worst_slice_agreement == 0.9 and plan.gates.min_slice_pairs == 50
    only = parse_plan({"gates": {"worst_slice_agreement": 0.95}, "steps": [{"percent": 100}]})
    assert only.gates.min_slice_pairs == 50
    with pytest.raises(PlanError, match="worst_slice_agreement"):
        slice_plan(worst_slice_agreement=1.5)
    with pytest.raises(PlanError, match="min_slice_pairs"):
        slice_plan(min_slice_pairs=0)


def test_it_passes_when_every_judged_slice_reaches_the_threshold():
    counts = {"script:latin": (2_000, 1_990), "script:han": (800, 792), "length:1-16": (10, 0)}
    gate = judge(counts)
    assert gate.status == "pass"
    assert gate.value == pytest.approx(agreement_cs(792, 800, 0.9, alpha=ALPHA)[0])
    assert gate.note.startswith("worst slice script:han: anytime CS [")
    assert "2 slices judged" in gate.note  # the small slice is shown elsewhere, not judged


def test_it_fails_on_one_broken_slice_among_good_ones():
    counts = {"script:latin": (5_000, 5_000), "script:han": (60, 0), "length:17-64": (5_060, 5_000)}
    gate = judge(counts)
    assert gate.status == "fail"
    assert "worst slice script:han" in gate.note
    assert gate.value == pytest.approx(agreement_cs(0, 60, 0.9, alpha=ALPHA)[0])


def test_it_waits_while_a_slice_is_undecided_or_none_is_big_enough():
    assert judge({"script:latin": (5_000, 5_000), "script:han": (60, 55)}).status == "wait"
    gate = judge({"script:latin": (49, 49)})
    assert gate.status == "wait" and gate.value is None
    assert gate.note.startswith("no slice has 50 shadow pairs")
    assert judge({"script:latin": (49, 49)}, min_slice_pairs=40).note.startswith(
        "worst slice script:latin")


def test_the_error_rate_is_split_across_the_slices():
    """A slice whose own 95 % sequence would already fail is still undecided at alpha / 64."""
    agreed, pairs = 78, 100
    assert agreement_cs(agreed, pairs, 0.9)[1] < 0.9  # one slice, full alpha: fail
    assert agreement_cs(agreed, pairs, 0.9, alpha=ALPHA)[1] >= 0.9
    assert judge({"script:han": (pairs, agreed)}).status == "wait"
    many = {f"header:t{i}": (100, 100) for i in range(MAX_JUDGED_SLICES + 3)}
    gate = judge(many, min_slice_pairs=100)
    assert f"{MAX_JUDGED_SLICES} slices judged" in gate.note
    assert "(3 smaller slices not judged)" in gate.note


def fed_harness(**gates) -> tuple[Harness, ShadowFedMetrics]:
    return shadow_fed_harness({"min_samples": 10, "min_agreement_pairs": 100,
                               "min_slice_pairs": 50, **gates})


def file_broken_han(h: Harness, metrics: ShadowFedMetrics) -> None:
    """2 % of the traffic is Chinese, and every Chinese input flips (98 % agree overall)."""
    for _ in range(30):
        pairs = [PairOutcome(True, 0.3, slices=("script:latin", "length:1-16"))] * 98
        pairs += [PairOutcome(False, 0.3, slices=("script:han", "length:1-16"))] * 2
        metrics.file(h.clock.time(), pairs)
        h.clock.advance(1)


def test_a_ramp_with_the_slice_gate_rolls_back_what_the_overall_gate_lets_through():
    h, metrics = fed_harness(agreement_lower_bound=0.95, worst_slice_agreement=0.9)
    file_broken_han(h, metrics)
    decision = h.tick()
    gates = {g.name: g for g in decision.gates}
    assert gates["agreement_lower_bound"].status == "pass"  # 2,940 / 3,000 agree
    assert gates["worst_slice_agreement"].status == "fail"
    assert "script:han" in gates["worst_slice_agreement"].note
    assert decision.kind == "rollback" and h.share == 0

    plain, metrics = fed_harness(agreement_lower_bound=0.95)
    file_broken_han(plain, metrics)
    assert plain.tick().kind != "rollback" and plain.share > 0


def test_the_gate_carries_its_slice_table_worst_first_and_the_cli_shows_ten():
    from ops.cli.slices import gate_slice_lines, status_slice_lines
    from rollout.slices import slice_table

    counts = {f"header:t{i:02d}": (100, 100 - i) for i in range(14)}
    counts["script:kana"] = (10, 0)
    gate = judge(counts)
    assert [r["slice"] for r in gate.rows[:2]] == ["header:t13", "header:t12"]
    assert gate.rows[-1] == {"slice": "script:kana", "pairs": 10, "agreed": 0, "agreement": 0.0,
                             "lower": None, "upper": None, "judged": False}
    lines = gate_slice_lines(gate.rows)
    assert lines[0].startswith("slices (worst_slice_agreement") and "header:t13" in lines[2]
    assert len(lines) == 1 + 1 + 10 + 1 and "5 more slice(s)" in lines[-1]
    rows = slice_table({key: (n, a, 0) for key, (n, a) in counts.items()}, 50)
    status = status_slice_lines(rows, 50)
    assert "header:t13" in status[2] and "small" not in status[2]
    assert "5 more" in status[-1] and status_slice_lines([], 50) == []


def test_rollout_status_shows_and_returns_the_slice_table():
    from ops.cli.telemetry import shadow_lines
    from rollout.shadow import aggregate_shadow, shadow_fields

    pairs = [PairOutcome(True, 0.3, slices=("script:latin",))] * 60
    pairs += [PairOutcome(False, 0.3, slices=("script:han",))] * 60
    stats = aggregate_shadow([shadow_fields(pairs, calls=1)], 60.0)
    text = "\n".join(shadow_lines(stats))
    assert "by slice, worst first" in text
    assert text.index("script:han") < text.index("script:latin")
    doc = stats.as_dict()
    assert [r["slice"] for r in doc["slice_table"]] == ["script:han", "script:latin"]
    assert doc["slice_table"][0]["confident_flips"] == 60 and doc["slices"]["script:han"] == [
        60, 0, 60]
