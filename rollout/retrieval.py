"""Retrieval compatibility: do the optimized arm's vectors find the same neighbours as the
baseline's? What users of an embedding model see, which agreement on zero-shot labels and cosine
percentiles miss.

Pure Python, no torch: the neighbour search itself is serve.common.neighbours; this module names the
figures, sums per-query outcomes into them (offline in `rollout verify` and `auto`, online in
the shadow: rollout.shadow) and judges them (rollout.verdict).

Offline, over the judged inputs' baseline vectors (the *index*), every QUERY_EVERY-th judged
input is a query, itself excluded from the index. For each query (`QueryOutcome`):

- `recall_at_10`: the share of the K documents the optimized arm's vector of the query finds
  in the baseline's index that are among the baseline query's K nearest (a canary's queries
  against an index the baseline built);
- `recall_at_10_mixed`: the same share for the baseline query against an index of which every
  MIXED_EVERY-th document was re-embedded by the optimized arm (during a canary, documents
  embedded by both arms land in one index);
- `top1_unchanged`: whether the optimized query's nearest document is the baseline's.

**Ties.** A found document counts as one of the baseline's top K when its *baseline* similarity
to the query is within `tolerance` of the baseline's K-th (`tie_hits`; top-1 likewise, against
the baseline's first): the "epsilon" recall of approximate-nearest-neighbour benchmarks. Where
a set holds paraphrases of a few templates, a query's neighbours lie within a low-precision
arm's rounding of each other and their order is a coin toss, not damage: the strict figures
(tolerance 0) read those swaps as lost neighbours. The gate reads the tie-aware figures; the
strict ones are reported beside them (`strict_*`), and `tied` counts the queries whose 1st or
K-th neighbour has a rival within the tolerance (the (K+1)-th or the 2nd), what makes a slice
fragile. The shadow's online recall (serve.gateway.reservoir) uses the same rule, so offline
and online agree. The tolerance is `verify_retrieval_tolerance`, recorded in a verdict's
thresholds (docs/recipes.md gives the measurements it rests on).

`summarize` averages them over all queries and per slice (rollout.slices keys of the query);
a slice with at least `min_size` queries is *judged*. The gate (`judge`): `recall_at_10` and
`recall_at_10_mixed` overall must reach `min_recall_at_10` (default 0.95: about what an
approximate-nearest-neighbour index itself gives up against exact search), and no judged slice
may be *shown* to fall below it: the upper end of its recall_at_10's 95 % bootstrap interval over
its queries (`slice_interval`) must reach it, as a slice's agreement is judged by its Wilson
upper end (rollout.verdict). A slice of a few dozen queries is small: its point estimate swings
with a handful of queries, so the interval convicts damage rather than proving fidelity.

A set may bring its own relevance labels (serve.common.regression: `query_of`, `relevant`): then
`GroundTruth` reports each arm's recall@10 against them, beside the figures above, not judged.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

K = 10  # neighbours compared
QUERY_EVERY = 5  # offline: every 5th judged input is a query
MIXED_EVERY = 2  # offline: every 2nd document of the mixed index is the optimized arm's
FIGURES = ("recall_at_10", "recall_at_10_mixed", "top1_unchanged")
RESAMPLES = 2_000  # bootstrap resamples of a slice's queries
CONFIDENCE = 0.95


@dataclass(frozen=True)
class QueryOutcome:
    """One query: the shares of its baseline top-K kept (optimized query; baseline query on the
    mixed index), whether its nearest document stayed, and its slices, each at the tolerance;
    the same three strictly (None: as the tie-aware ones, a tolerance of 0); `tied`: its 1st or
    K-th baseline neighbour has a rival within the tolerance."""

    recall_at_10: float
    recall_at_10_mixed: float
    top1_unchanged: bool
    slices: tuple[str, ...] = ()
    strict_recall_at_10: float | None = None
    strict_recall_at_10_mixed: float | None = None
    strict_top1_unchanged: bool | None = None
    tied: bool = False

    def strict(self) -> tuple[float, float, bool]:
        return (self.recall_at_10 if self.strict_recall_at_10 is None
                else self.strict_recall_at_10,
                self.recall_at_10_mixed if self.strict_recall_at_10_mixed is None
                else self.strict_recall_at_10_mixed,
                self.top1_unchanged if self.strict_top1_unchanged is None
                else self.strict_top1_unchanged)


@dataclass(frozen=True)
class RetrievalRow:
    """One slice's figures over its `n` queries; `judged`: n >= the minimum size, and then
    `interval`, the 95 % bootstrap interval of its recall_at_10 (`slice_interval`)."""

    slice: str
    n: int
    recall_at_10: float
    recall_at_10_mixed: float
    top1_unchanged: float
    judged: bool
    strict_recall_at_10: float = 0.0
    strict_top1_unchanged: float = 0.0
    tied: int = 0
    interval: tuple[float, float] | None = None

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["interval"] = list(self.interval) if self.interval else None
        return out


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
    """The figures over every query at `tolerance`, the strict ones beside them, and per slice
    (worst recall first)."""

    queries: int
    documents: int
    recall_at_10: float
    recall_at_10_mixed: float
    top1_unchanged: float
    slices: list[RetrievalRow] = field(default_factory=list)
    ground_truth: GroundTruth | None = None
    tolerance: float = 0.0
    strict_recall_at_10: float = 0.0
    strict_recall_at_10_mixed: float = 0.0
    strict_top1_unchanged: float = 0.0
    tied: int = 0  # queries with a rival within the tolerance at rank 1 or K

    def as_dict(self) -> dict:
        return {"k": K, "queries": self.queries, "documents": self.documents,
                "query_every": QUERY_EVERY, "mixed_every": MIXED_EVERY,
                "tolerance": self.tolerance,
                **{name: getattr(self, name) for name in FIGURES},
                "strict": {name: getattr(self, f"strict_{name}") for name in FIGURES},
                "tied": self.tied,
                "slices": [row.as_dict() for row in self.slices],
                "ground_truth": self.ground_truth.as_dict() if self.ground_truth else None}


def query_positions(n: int) -> list[int]:
    """The positions, among `n` judged inputs, that are queries."""
    return list(range(0, n, QUERY_EVERY))


def overlap(expected: Sequence[int], found: Sequence[int]) -> float:
    """The share of `expected` (a top-K list) that `found` also holds."""
    return len(set(expected) & set(found)) / len(expected) if expected else 1.0


def tie_hits(found_scores: Iterable[float], bar: float, tolerance: float) -> int:
    """How many found documents count as the baseline's (module docstring, ties): those whose
    baseline similarity to the query (`found_scores`) is within `tolerance` of `bar`, the
    baseline's K-th (or, for top-1, its first) similarity."""
    return sum(1 for score in found_scores if float(score) >= float(bar) - tolerance)


def tied(ranked: Sequence[float], tolerance: float, k: int = K) -> bool:
    """Whether a query's baseline similarities, best first (at least k + 1 of them when there
    are), have a rival within `tolerance` of the 1st or of the k-th."""
    if len(ranked) < 2:
        return False
    top = ranked[0] - ranked[1] <= tolerance
    return top or (len(ranked) > k and ranked[k - 1] - ranked[k] <= tolerance)


def _means(outcomes: Sequence[QueryOutcome]) -> tuple[float, ...]:
    n = len(outcomes)
    strict = [o.strict() for o in outcomes]
    return (sum(o.recall_at_10 for o in outcomes) / n,
            sum(o.recall_at_10_mixed for o in outcomes) / n,
            sum(o.top1_unchanged for o in outcomes) / n,
            sum(s[0] for s in strict) / n, sum(s[1] for s in strict) / n,
            sum(s[2] for s in strict) / n)


def slice_interval(values: Sequence[float], *, resamples: int = RESAMPLES,
                   confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (per-query figures in [0, 1]):
    the queries resampled with replacement `resamples` times, with a fixed seed so that a
    report reads the same on every run."""
    if not values:
        return 0.0, 1.0
    if min(values) == max(values):
        return values[0], values[0]
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    return means[int(tail * (resamples - 1))], means[int(round((1 - tail) * (resamples - 1)))]


def _row(key: str, group: Sequence[QueryOutcome], min_size: int) -> RetrievalRow:
    recall, mixed, top1, strict_recall, _, strict_top1 = _means(group)
    judged = len(group) >= min_size
    interval = slice_interval([o.recall_at_10 for o in group]) if judged else None
    return RetrievalRow(key, len(group), recall, mixed, top1, judged, strict_recall,
                        strict_top1, sum(o.tied for o in group), interval)


def summarize(outcomes: Sequence[QueryOutcome], *, documents: int, min_size: int,
              tolerance: float = 0.0, ground_truth: GroundTruth | None = None
              ) -> Retrieval | None:
    """The figures of `outcomes` (None without a query), measured at `tolerance`, and their
    slice table, judged rows first, each group by recall_at_10 ascending then by name."""
    if not outcomes:
        return None
    by_slice: dict[str, list[QueryOutcome]] = {}
    for outcome in outcomes:
        for key in outcome.slices:
            by_slice.setdefault(key, []).append(outcome)
    rows = [_row(key, group, min_size) for key, group in by_slice.items()]
    rows.sort(key=lambda r: (not r.judged, r.recall_at_10, r.slice))
    recall, mixed, top1, strict_recall, strict_mixed, strict_top1 = _means(outcomes)
    return Retrieval(len(outcomes), documents, recall, mixed, top1, rows, ground_truth,
                     tolerance, strict_recall, strict_mixed, strict_top1,
                     sum(o.tied for o in outcomes))


def judge(minimum: float, retrieval: Retrieval | None) -> list[str]:
    """Every retrieval figure below `minimum` (module docstring), as short sentences; nothing
    when there is no retrieval (a classifier)."""
    if retrieval is None:
        return []
    failures = [f"{name} {getattr(retrieval, name):.4f} < {minimum:g}"
                for name in ("recall_at_10", "recall_at_10_mixed")
                if getattr(retrieval, name) < minimum]
    failures += [f"slice {row.slice} recall_at_10 {row.recall_at_10:.4f} ({row.n} queries, "
                 f"95% upper bound {row.interval[1]:.4f}) < {minimum:g}"
                 for row in retrieval.slices
                 if row.judged and row.interval is not None and row.interval[1] < minimum]
    return failures


def relevant_recall(found: Iterable[int], relevant: Sequence[int]) -> float:
    """Recall@K against relevance labels: the relevant documents among `found`, out of as many
    as K lets one find."""
    relevant_set = set(relevant)
    return len(relevant_set & set(found)) / min(K, len(relevant_set))
