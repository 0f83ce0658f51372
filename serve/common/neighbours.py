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
    tie_hits,
    tied,
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
             slices: Sequence[tuple[str, ...]], tolerance: float = 0.0) -> list[QueryOutcome]:
    """One outcome per query (rollout.retrieval) over the rows of `base` and `optimized`, the
    same inputs in the same order, at `tolerance` and strictly; `slices[i]`: input i's slice
    keys."""
    queries = query_positions(len(base))
    if len(base) < 2:
        return []
    scores = base[queries].float() @ base.float().T  # the baseline's similarities
    scores[torch.arange(len(queries)), torch.tensor(queries)] = float("-inf")  # not itself
    ranked = scores.topk(min(K + 1, len(base) - 1), dim=-1)
    k = min(K, len(base) - 1)
    found = top_k(base, optimized[queries], exclude=queries)
    mixed = top_k(_mixed(base, optimized), base[queries], exclude=queries)
    result = []
    for j, q in enumerate(queries):
        row, best = scores[j], ranked.values[j].tolist()
        expected = ranked.indices[j, :k].tolist()
        kept, mixed_kept = row[found[j]].tolist(), row[mixed[j]].tolist()
        result.append(QueryOutcome(
            tie_hits(kept, best[k - 1], tolerance) / k,
            tie_hits(mixed_kept, best[k - 1], tolerance) / k,
            tie_hits(kept[:1], best[0], tolerance) == 1, tuple(slices[q]),
            overlap(expected, found[j]), overlap(expected, mixed[j]),
            expected[:1] == found[j][:1], tied(best, tolerance, k)))
    return result


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
                 *, min_size: int, tolerance: float = 0.0,
                 relevance: Mapping[int, Sequence[int]] | None = None) -> Retrieval | None:
    """The offline figures (rollout.retrieval.summarize) of two arms' unit vectors of the same
    judged inputs, at `tolerance`; None with fewer than two inputs."""
    truth = ground_truth(base, optimized, relevance) if relevance else None
    return summarize(outcomes(base, optimized, slices, tolerance), documents=len(base),
                     min_size=min_size, tolerance=tolerance, ground_truth=truth)
