"""Online retrieval compatibility: the shadow's reservoir (serve.gateway.reservoir), its counters
(rollout.shadow), the ramp's `min_recall_at_10` gate (rollout.ramp.gates) and `rollout status`'s
line, with in-memory twins (no Ray, no Redis)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ops.cli.telemetry import shadow_lines
from rollout.agreement import agreement_cs
from rollout.ramp import PlanError, parse_plan
from rollout.ramp.gates import judge_gates
from rollout.shadow import PairOutcome, aggregate_shadow, shadow_fields
from serve.gateway.reservoir import Reservoir
from tests.ramp_harness import PLAN, ScriptedMetrics, shadow_fed_harness, stats


def unit_rows(n: int, seed: int, dims: int = 16) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, dims))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_reservoir_keeps_the_last_vectors_and_compares_once_it_holds_ten():
    reservoir = Reservoir(50)
    first = unit_rows(8, 0)
    assert reservoir.neighbours(first, first) == [None] * 8  # fewer than 10 held
    more = unit_rows(100, 1)
    assert reservoir.neighbours(more[:4], more[:4]) == [None] * 4  # 8 held before
    shared = reservoir.neighbours(more[4:], more[4:])  # identical answers share all 10
    assert shared == [10] * 96 and len(reservoir) == 50 and reservoir.count == 108
    assert np.allclose(reservoir.rows[reservoir.count % 50 - 1], more[-1])  # a ring


def test_perturbed_vectors_share_fewer_neighbours_and_a_mismatch_is_not_compared():
    reservoir = Reservoir(2000)
    reservoir.neighbours(unit_rows(2000, 2), unit_rows(2000, 2))
    queries = unit_rows(200, 3)
    noisy = queries + 0.5 * unit_rows(200, 4)
    shared = reservoir.neighbours(queries, noisy)
    assert all(0 <= n <= 10 for n in shared) and sum(shared) / 2000 < 0.8
    assert reservoir.neighbours(unit_rows(2, 5), unit_rows(2, 5, dims=8)) == [None, None]
    assert Reservoir(0).neighbours(queries, queries) == [None] * 200  # off


def test_online_ties_count_as_shared_as_verify_counts_them_offline():
    """Paraphrases of a few templates in the reservoir, an arm that moves each vector by less
    than the tolerance: strictly the reordered neighbours read as lost, with the tolerance
    (rollout.retrieval's rule, as verify applies it) every pair shares all 10; damage among
    vectors whose order is graded still loses them."""
    centres = np.repeat(unit_rows(20, 6, dims=32), 50, axis=0)
    docs = centres + 0.01 * unit_rows(1000, 7, dims=32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[::10] + 0.002 * unit_rows(100, 8, dims=32)
    rounded = queries + 0.002 * unit_rows(100, 9, dims=32)
    shared = {}
    for tolerance in (0.0, 0.005):
        reservoir = Reservoir(1000, tolerance)
        reservoir.neighbours(docs, docs)
        shared[tolerance] = reservoir.neighbours(queries, rounded)
    assert sum(shared[0.0]) < 0.95 * 1000 and shared[0.005] == [10] * 100
    assert all(type(n) is int for n in shared[0.0])  # counters serialize them as JSON
    reservoir = Reservoir(2000, 0.005)  # vectors spread over the sphere: a graded order
    reservoir.neighbours(unit_rows(2000, 2), unit_rows(2000, 2))
    queries = unit_rows(200, 3)
    assert sum(reservoir.neighbours(queries, queries + 0.5 * unit_rows(200, 4))) / 2000 < 0.8


def test_counters_add_up_to_recall_at_10_and_old_hashes_read_none():
    pairs = [PairOutcome(cosine=0.99, neighbours=9)] * 30 + [PairOutcome(cosine=0.99)] * 5
    stats_ = aggregate_shadow([shadow_fields(pairs, calls=1)] * 2, 60.0)
    assert (stats_.recall_queries, stats_.recall_hits) == (60, 540)
    assert stats_.recall_at_10 == 0.9 and stats_.as_dict()["recall_at_10"] == 0.9
    assert aggregate_shadow([{"cos_n": 3, "cos_sum": 2.9}], 60.0).recall_at_10 is None
    text = "\n".join(shadow_lines(stats_))
    assert "recall@10 90.00% of the baseline's top-10 neighbours in the reservoir (n=60" in text


def recall_plan(**gates):
    return parse_plan(dict(PLAN, failures_tolerated=0, gates={
        "min_samples": 10, "min_recall_at_10": 0.95, "min_agreement_pairs": 100, **gates}))


def judge(pairs: int, hits: int, **gates):
    metrics = ScriptedMetrics()
    metrics.canary = stats("optimized", 100)
    metrics.recall_pairs, metrics.recall_hits = pairs, hits
    _, results = judge_gates(SimpleNamespace(plan=recall_plan(**gates)), metrics, 60, 600)
    [gate] = [g for g in results if g.name == "min_recall_at_10"]
    return gate


def test_the_gate_passes_fails_and_waits_on_its_confidence_sequence():
    assert parse_plan({"gates": {"min_recall_at_10": 0.9}, "steps": [{"percent": 100}]})
    with pytest.raises(PlanError, match="min_recall_at_10"):
        recall_plan(min_recall_at_10=1.2)
    passing = judge(2000, 19_900)  # 99.5 %
    assert passing.status == "pass" and passing.value == pytest.approx(
        agreement_cs(1990, 2000, 0.95)[0])
    assert "over 2000 embed pairs" in passing.note
    assert judge(2000, 16_000).status == "fail"  # 80 %
    assert judge(150, 1_425).status == "wait"  # 95 % on 150 pairs: undecided
    few = judge(40, 400)
    assert few.status == "wait" and "40/100 embed pairs" in few.note


def test_a_ramp_with_the_gate_rolls_back_a_canary_whose_neighbours_drift():
    h, metrics = shadow_fed_harness({"min_samples": 10, "min_agreement_pairs": 100,
                                     "min_recall_at_10": 0.95})
    for _ in range(20):
        metrics.file(h.clock.time(), [PairOutcome(cosine=0.97, neighbours=7)] * 20)
        h.clock.advance(1)
    decision = h.tick()
    [gate] = [g for g in decision.gates if g.name == "min_recall_at_10"]
    assert gate.status == "fail" and gate.value < 0.95
    assert decision.kind == "rollback" and h.share == 0
