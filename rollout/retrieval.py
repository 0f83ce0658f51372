"""Retrieval compatibility: do the optimized arm's vectors find the same neighbours as the
baseline's? What users of an embedding model see, which agreement on zero-shot labels and cosine
percentiles miss.

Pure Python, no torch: the neighbour search itself is serve.common.neighbours; this module names the
figures, sums per-query outcomes into them (offline in `rollout verify` and `auto`, online in
the shadow: rollout.shadow) and judges them (rollout.verdict).

Offline, over the judged inputs' baseline vectors (the *index*), every QUERY_EVERY-th judged
input is a query, itself excluded from the index. For each query (`QueryOutcome`):

- `recall_at_10`: the share of the baseline query's K nearest documents that the optimized
  arm's vector of the same query also finds in the baseline's index (a canary's queries
  against an index the baseline built);
- `recall_at_10_mixed`: the same share for the baseline query against an index of which every
  MIXED_EVERY-th document was re-embedded by the optimized arm (during a canary, documents
  embedded by both arms land in one index);
- `top1_unchanged`: whether the optimized query's nearest document is the baseline's.

`summarize` averages them over all queries and per slice (rollout.slices keys of the query);
a slice with at least `min_size` queries is *judged*. The gate (`judge`):
`recall_at_10` and `recall_at_10_mixed` overall, and `recall_at_10` of every judged slice, must
reach `min_recall_at_10` (default 0.95: about what an approximate-nearest-neighbour index itself
gives up against exact search). A point estimate: a slice's queries each average ten
neighbours, so its figure is far steadier than a slice's agreement.

A set may bring its own relevance labels (serve.common.regression: `query_of`, `relevant`): then
`GroundTruth` reports each arm's recall@10 against them, beside the figures above, not judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

K = 10  # neighbours compared
QUERY_EVERY = 5  # offline: every 5th judged input is a query
MIXED_EVERY = 2  # offline: every 2nd document of the mixed index is the optimized arm's
FIGURES = ("recall_at_10", "recall_at_10_mixed", "top1_unchanged")


@dataclass(frozen=True)
class QueryOutcome:
    """One query: the shares of its baseline top-K kept (optimized query; baseline query on the
    mixed index), whether its nearest document stayed, and its slices."""

    recall_at_10: float
    recall_at_10_mixed: float
    top1_unchanged: bool
    slices: tuple[str, ...] = ()


@dataclass(frozen=True)
class RetrievalRow:
    """One slice's figures over its `n` queries; `judged`: n >= the minimum size."""

    slice: str
    n: int
    recall_at_10: float
    recall_at_10_mixed: float
    top1_unchanged: float
    judged: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GroundTruth:
    """Recall@10 against a set's own relevance labels: baseline and optimized queries, each
    against the baseline's index of the non-query inputs."""

    queries: int
    baseline_recall_at_10: float
    optimized_recall_at_10: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Retrieval:
    """The figures over every query, and per slice (worst recall first)."""

    queries: int
    documents: int
    recall_at_10: float
    recall_at_10_mixed: float
    top1_unchanged: float
    slices: list[RetrievalRow] = field(default_factory=list)
    ground_truth: GroundTruth | None = None

    def as_dict(self) -> dict:
        return {"k": K, "queries": self.queries, "documents": self.documents,
                "query_every": QUERY_EVERY, "mixed_every": MIXED_EVERY,
                **{name: getattr(self, name) for name in FIGURES},
                "slices": [row.as_dict() for row in self.slices],
                "ground_truth": self.ground_truth.as_dict() if self.ground_truth else None}


def query_positions(n: int) -> list[int]:
    """The positions, among `n` judged inputs, that are queries."""
    return list(range(0, n, QUERY_EVERY))


def overlap(expected: Sequence[int], found: Sequence[int]) -> float:
    """The share of `expected` (a top-K list) that `found` also holds."""
    return len(set(expected) & set(found)) / len(expected) if expected else 1.0


def _means(outcomes: Sequence[QueryOutcome]) -> tuple[float, float, float]:
    n = len(outcomes)
    return (sum(o.recall_at_10 for o in outcomes) / n,
            sum(o.recall_at_10_mixed for o in outcomes) / n,
            sum(o.top1_unchanged for o in outcomes) / n)


def summarize(outcomes: Sequence[QueryOutcome], *, documents: int, min_size: int,
              ground_truth: GroundTruth | None = None) -> Retrieval | None:
    """The figures of `outcomes` (None without a query) and their slice table, judged rows
    first, each group by recall_at_10 ascending then by name."""
    if not outcomes:
        return None
    by_slice: dict[str, list[QueryOutcome]] = {}
    for outcome in outcomes:
        for key in outcome.slices:
            by_slice.setdefault(key, []).append(outcome)
    rows = [RetrievalRow(key, len(group), *_means(group), len(group) >= min_size)
            for key, group in by_slice.items()]
    rows.sort(key=lambda r: (not r.judged, r.recall_at_10, r.slice))
    return Retrieval(len(outcomes), documents, *_means(outcomes), rows, ground_truth)


def judge(minimum: float, retrieval: Retrieval | None) -> list[str]:
    """Every retrieval figure below `minimum` (module docstring), as short sentences; nothing
    when there is no retrieval (a classifier)."""
    if retrieval is None:
        return []
    failures = [f"{name} {getattr(retrieval, name):.4f} < {minimum:g}"
                for name in ("recall_at_10", "recall_at_10_mixed")
                if getattr(retrieval, name) < minimum]
    failures += [f"slice {row.slice} recall_at_10 {row.recall_at_10:.4f} ({row.n} queries) < "
                 f"{minimum:g}" for row in retrieval.slices
                 if row.judged and row.recall_at_10 < minimum]
    return failures


def relevant_recall(found: Iterable[int], relevant: Sequence[int]) -> float:
    """Recall@K against relevance labels: the relevant documents among `found`, out of as many
    as K lets one find."""
    relevant_set = set(relevant)
    return len(relevant_set & set(found)) / min(K, len(relevant_set))
