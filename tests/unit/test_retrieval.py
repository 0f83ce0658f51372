"""Retrieval compatibility (rollout.retrieval, serve.common.neighbours) on crafted unit vectors: the
three figures, strict and with ties, the slice table and its intervals, the gate, relevance
labels (no model)."""

from __future__ import annotations

import pytest
import torch

from rollout.retrieval import (
    QueryOutcome,
    judge,
    overlap,
    relevant_recall,
    slice_interval,
    summarize,
    tie_hits,
    tied,
)
from rollout.verdict import Thresholds, looser
from serve.common.neighbours import ground_truth, retrieval_of, top_k


def vectors(n: int, dims: int = 16, seed: int = 0) -> torch.Tensor:
    rows = torch.randn(n, dims, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.normalize(rows, dim=-1)


def slices(n: int, odd: range) -> list[tuple[str, ...]]:
    return [("script:han",) if i in odd else ("script:latin",) for i in range(n)]


def test_top_k_excludes_the_query_itself_and_finds_the_nearest():
    index = torch.eye(4)
    queries = torch.tensor([[1.0, 0.9, 0.0, 0.0]])
    assert top_k(index, queries, k=2) == [[0, 1]]
    assert top_k(index, queries, k=2, exclude=[0])[0][0] == 1  # itself excluded
    assert len(top_k(index, queries, k=10, exclude=[0])[0]) == 3  # fewer rows than k


def test_the_same_vectors_keep_every_neighbour():
    base = vectors(200)
    found = retrieval_of(base, base.clone(), slices(200, range(0)), min_size=10)

    assert found.queries == 40 and found.documents == 200
    assert (found.recall_at_10, found.recall_at_10_mixed, found.top1_unchanged) == (1.0, 1.0,
                                                                                     1.0)
    assert judge(0.95, found) == []


def test_one_slice_with_swapped_vectors_fails_the_gate_on_its_slice_alone():
    """The last 20 of 400 inputs trade vectors among themselves: overall recall stays above
    0.95, their slice's collapses, and the gate names that slice."""
    base = vectors(400)
    optimized = base.clone()
    odd = range(380, 400)
    optimized[list(odd)] = base[[*odd[1:], odd[0]]]
    found = retrieval_of(base, optimized, slices(400, odd), min_size=4)
    han = next(row for row in found.slices if row.slice == "script:han")

    assert found.recall_at_10 > 0.95 and found.recall_at_10_mixed > 0.95
    assert han.n == 4 and han.judged and han.recall_at_10 < 0.2 and han.top1_unchanged == 0.0
    assert found.slices[0] is han  # worst first
    assert judge(0.95, found) == [
        f"slice script:han recall_at_10 {han.recall_at_10:.4f} (4 queries, 95% upper bound "
        f"{han.interval[1]:.4f}) < 0.95"]
    assert judge(0.95, None) == []  # a classifier: nothing to judge


def test_noise_lowers_all_three_figures_and_the_overall_gate_names_them():
    base = vectors(300)
    noisy = torch.nn.functional.normalize(base + 0.6 * vectors(300, seed=1), dim=-1)
    found = retrieval_of(base, noisy, slices(300, range(0)), min_size=1000)

    assert found.recall_at_10 < 0.95 and found.recall_at_10_mixed < 1.0
    assert found.top1_unchanged < 1.0
    assert judge(0.95, found)[0].startswith("recall_at_10 ")
    assert not any(row.judged for row in found.slices)  # under the minimum size


def test_relevance_labels_give_recall_against_them():
    docs = torch.eye(12)
    base = torch.cat([docs, torch.nn.functional.normalize(docs[3] + docs[4], dim=0)[None]])
    truth = ground_truth(base, base.clone(), {12: [3, 4]})

    assert (truth.queries, truth.baseline_recall_at_10, truth.optimized_recall_at_10) == (1, 1.0,
                                                                                          1.0)
    assert ground_truth(base, base, {12: [12]}) is None  # a query is no document
    assert relevant_recall([1, 2, 3], [3, 9]) == 0.5
    assert overlap([1, 2], [2, 5]) == 0.5


def test_summarize_without_queries_and_the_threshold_recorded():
    assert summarize([], documents=0, min_size=1) is None
    assert looser(Thresholds(min_recall_at_10=0.9), Thresholds()) == ["min_recall_at_10 0.9 < 0.95"]
    with pytest.raises(ValueError):
        Thresholds(min_recall_at_10=1.5)


def near_duplicates(groups: int, size: int, spread: float, dims: int = 32) -> torch.Tensor:
    """`groups` templates with `size` paraphrases each: unit vectors within about `spread` of
    their template's (cosines to each other above 1 - spread)."""
    centres = vectors(groups, dims, seed=7).repeat_interleave(size, dim=0)
    return torch.nn.functional.normalize(centres + spread * vectors(groups * size, dims, seed=8),
                                         dim=-1)


def test_a_neighbour_within_the_tolerance_of_the_kth_counts_as_kept():
    assert tie_hits([0.91, 0.899, 0.80], bar=0.90, tolerance=0.0) == 1
    assert tie_hits([0.91, 0.899, 0.80], bar=0.90, tolerance=0.002) == 2
    assert tied([0.95, 0.949, 0.5], tolerance=0.002, k=2)  # a rival for the first place
    assert tied([0.95, 0.90, 0.899], tolerance=0.002, k=2)  # ... and for the k-th
    assert not tied([0.95, 0.90, 0.80], tolerance=0.002, k=2)


def test_rounding_that_reorders_near_duplicates_loses_nothing_at_the_tolerance():
    """Paraphrases of a few templates (neighbours within ~0.003 of each other), answered by an
    arm whose vectors move by less than that: the strict figures read the reordering as lost
    neighbours, the tie-aware ones do not; most queries are tied."""
    base = near_duplicates(20, 25, spread=0.01)
    rounded = torch.nn.functional.normalize(base + 0.002 * vectors(500, 32, seed=9), dim=-1)
    strict = retrieval_of(base, rounded, slices(500, range(0)), min_size=10)
    ties = retrieval_of(base, rounded, slices(500, range(0)), min_size=10, tolerance=0.005)

    assert strict.recall_at_10 < 0.95 and strict.top1_unchanged < 0.9  # order is a coin toss
    assert ((rounded @ base.T) - (base @ base.T)).abs().max() < 0.005
    assert (ties.recall_at_10, ties.recall_at_10_mixed, ties.top1_unchanged) == (1.0, 1.0, 1.0)
    assert (ties.strict_recall_at_10, ties.strict_top1_unchanged) == (strict.recall_at_10,
                                                                      strict.top1_unchanged)
    assert ties.tolerance == 0.005 and ties.tied > ties.queries // 2 and strict.tied == 0
    assert judge(0.95, ties) == [] and judge(0.95, strict)


def test_damage_beyond_the_tolerance_still_fails_with_ties_counted():
    base = near_duplicates(20, 25, spread=0.5)  # paraphrases, not copies: a graded order
    damaged = torch.nn.functional.normalize(base + 0.3 * vectors(500, 32, seed=10), dim=-1)
    found = retrieval_of(base, damaged, slices(500, range(0)), min_size=10, tolerance=0.005)

    assert found.recall_at_10 < 0.95 and judge(0.95, found)[0].startswith("recall_at_10 ")


def test_a_slice_is_judged_by_the_upper_end_of_its_bootstrap_interval():
    """Two judged slices of 40 queries: one loses a neighbour on a few queries (point 0.94,
    interval reaching above 0.95: not shown to be damaged), one loses three in ten on every
    query (interval far below): only the second fails."""
    few = [QueryOutcome(0.4 if i < 4 else 1.0, 1.0, True, ("length:1-16",)) for i in range(40)]
    every = [QueryOutcome(0.7, 1.0, True, ("label:sports",)) for _ in range(40)]
    found = summarize(few + every, documents=400, min_size=30)
    rows = {row.slice: row for row in found.slices}

    short, sports = rows["length:1-16"], rows["label:sports"]
    assert short.recall_at_10 == pytest.approx(0.94) and short.interval[1] >= 0.95
    assert short.interval[0] < 0.94 < short.interval[1]
    assert sports.interval == (pytest.approx(0.7), pytest.approx(0.7))
    assert judge(0.95, found) == [
        "recall_at_10 0.8200 < 0.95",
        "slice label:sports recall_at_10 0.7000 (40 queries, 95% upper bound 0.7000) < 0.95"]


def test_the_bootstrap_interval_is_the_same_on_every_run_and_narrows_with_queries():
    values = [1.0] * 30 + [0.6] * 6
    assert slice_interval(values) == slice_interval(values)  # a fixed seed
    wide, narrow = slice_interval(values), slice_interval(values * 10)
    assert wide[0] < narrow[0] <= sum(values) / len(values) <= narrow[1] < wide[1]
    assert slice_interval([]) == (0.0, 1.0) and slice_interval([0.9, 0.9]) == (0.9, 0.9)


def test_an_unjudged_slice_has_no_interval_and_the_report_dict_holds_both_figures():
    outcomes = [QueryOutcome(1.0, 1.0, True, ("script:han",), 0.8, 0.9, False, True)] * 3
    found = summarize(outcomes, documents=30, min_size=10, tolerance=0.005)
    doc = found.as_dict()

    assert doc["tolerance"] == 0.005 and doc["tied"] == 3
    assert doc["strict"] == {"recall_at_10": pytest.approx(0.8),
                             "recall_at_10_mixed": pytest.approx(0.9), "top1_unchanged": 0.0}
    assert doc["slices"][0]["interval"] is None and not doc["slices"][0]["judged"]
    assert doc["slices"][0]["strict_recall_at_10"] == pytest.approx(0.8)
