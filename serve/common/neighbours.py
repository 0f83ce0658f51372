"""Nearest neighbours by exact search over unit vectors (cosine = dot product), for retrieval
compatibility (rollout.retrieval: what the figures mean and how they are judged).

`retrieval_of` runs the offline comparison (`rollout verify`, `auto`): the judged inputs'
baseline vectors are the index, every QUERY_EVERY-th input a query, itself excluded. Exact
search: the index is a few thousand vectors, one matrix product. The gateway's shadow, which
loads no torch, searches its reservoir the same way with numpy (serve.gateway.reservoir).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rollout.retrieval import (
    MIXED_EVERY,
    GroundTruth,
    K,
    QueryOutcome,
    Retrieval,
    overlap,
    query_positions,
    relevant_recall,
    summarize,
)


def top_k(index: torch.Tensor, queries: torch.Tensor, k: int = K,
          exclude: Sequence[int] | None = None) -> list[list[int]]:
    """Each query's `k` nearest rows of `index` (positions, nearest first); `exclude[j]`: a
    position query j may not find (itself), or -1. Fewer rows than `k`: all of them."""
    scores = queries.float() @ index.float().T
    if exclude is not None:
        rows = torch.arange(len(exclude))
        keep = torch.tensor(exclude) >= 0
        scores[rows[keep], torch.tensor(exclude)[keep]] = float("-inf")
    found = min(k, index.shape[0] - (1 if exclude is not None else 0))
    return scores.topk(max(found, 0), dim=-1).indices.tolist()


def _mixed(base: torch.Tensor, optimized: torch.Tensor) -> torch.Tensor:
    """The baseline's index with every MIXED_EVERY-th document re-embedded by the optimized
    arm."""
    mixed = base.clone()
    mixed[::MIXED_EVERY] = optimized[::MIXED_EVERY]
    return mixed


def outcomes(base: torch.Tensor, optimized: torch.Tensor,
             slices: Sequence[tuple[str, ...]]) -> list[QueryOutcome]:
    """One outcome per query (rollout.retrieval) over the rows of `base` and `optimized`, the
    same inputs in the same order; `slices[i]`: input i's slice keys."""
    queries = query_positions(len(base))
    if len(base) < 2:
        return []
    expected = top_k(base, base[queries], exclude=queries)
    found = top_k(base, optimized[queries], exclude=queries)
    mixed = top_k(_mixed(base, optimized), base[queries], exclude=queries)
    return [QueryOutcome(overlap(e, f), overlap(e, m), e[:1] == f[:1], tuple(slices[q]))
            for q, e, f, m in zip(queries, expected, found, mixed, strict=True)]


def ground_truth(base: torch.Tensor, optimized: torch.Tensor,
                 relevance: Mapping[int, Sequence[int]]) -> GroundTruth | None:
    """Recall@K of both arms' queries against relevance labels: `relevance` maps a query's
    position to its relevant documents' positions; the index is every position that is not a
    query. None when no query has a relevant document in it."""
    documents = [i for i in range(len(base)) if i not in relevance]
    where = {position: j for j, position in enumerate(documents)}
    asked = {q: [where[d] for d in docs if d in where] for q, docs in relevance.items()}
    asked = {q: docs for q, docs in asked.items() if docs}
    if not asked:
        return None
    positions = list(asked)
    recalls = []
    for arm in (base, optimized):
        found = top_k(base[documents], arm[positions])
        recalls.append(sum(relevant_recall(f, asked[q]) for q, f in zip(positions, found,
                                                                         strict=True))
                       / len(positions))
    return GroundTruth(len(positions), *recalls)


def retrieval_of(base: torch.Tensor, optimized: torch.Tensor, slices: Sequence[tuple[str, ...]],
                 *, min_size: int, relevance: Mapping[int, Sequence[int]] | None = None
                 ) -> Retrieval | None:
    """The offline figures (rollout.retrieval.summarize) of two arms' unit vectors of the same
    judged inputs; None with fewer than two inputs."""
    truth = ground_truth(base, optimized, relevance) if relevance else None
    return summarize(outcomes(base, optimized, slices), documents=len(base), min_size=min_size,
                     ground_truth=truth)
