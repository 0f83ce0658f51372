"""Retrieval compatibility (rollout.retrieval, serve.common.neighbours) on crafted unit vectors: the
three figures, the slice table, the gate, relevance labels (no model)."""

from __future__ import annotations

import pytest
import torch

from rollout.retrieval import judge, overlap, relevant_recall, summarize
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
        f"slice script:han recall_at_10 {han.recall_at_10:.4f} (4 queries) < 0.95"]
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
