"""Paired baseline/optimized comparison: agreement, its confidence bound, flips, margins, cosine.

Pure Python, no torch: the offline gate (`rollout verify`) and the gateway's online shadow
comparison feed it the same per-input pairs and read the same numbers.

A *pair* is one input answered by both arms: each arm's top-1 label index and its *margin* (top-1
score minus top-2 score: how far the input sits from that arm's decision boundary), the cosine
between the two arms' embeddings, and optionally the input's true label.

- **Agreement** is the share of pairs whose top-1 labels match. Its confidence interval is
  Wilson's score interval, which stays inside [0, 1] and is honest at 100 % and for small n
  (the normal approximation claims certainty after 20 agreeing pairs). `lower_bound` is the
  lower end of the two-sided interval at `confidence` (default 95 %): conservative, it is also a
  one-sided bound at 97.5 %.
- **Margin buckets** group pairs by the *baseline's* margin, so one sees that flips sit at the
  decision boundary (small margins) and not in the confident bulk, where they would mean damage.
- **Confident flips** are the flips whose *baseline* margin is at least `min_margin` (default
  `CONFIDENT_MARGIN`, 0.05, a bucket edge): the baseline was sure, the optimized arm answered
  otherwise. That is damage; a flip below it is an input on which fp32 itself is close to a coin
  toss, which no reduced precision can be expected to keep. A margin of exactly `min_margin`
  counts as confident.
- **Online agreement, looked at again and again** (the ramp's `agreement_lower_bound` gate) is
  judged with `agreement_cs`, an anytime-valid confidence sequence: a Wilson bound recomputed at
  every look would, over hundreds of looks, pass a canary whose true agreement is below the
  threshold far more often than 5 % of the time. See `agreement_cs` for the formula.
- **Accuracy drop** is the baseline's accuracy minus the optimized arm's, on labelled pairs.
- **Cosine** is summarised by mean, 1st percentile (nearest rank) and minimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

MARGIN_EDGES = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1)  # bucket i holds edges[i] <= margin < edges[i+1]
CONFIDENT_MARGIN = 0.05  # a flip at a baseline margin >= this is a confident flip (an edge above)
CS_ALPHA = 0.05  # agreement_cs: the chance, over all looks at once, that the truth leaves it
CS_PRIOR_WEIGHT = 50.0  # agreement_cs: a + b of the mixing Beta(a, b) (a pseudo-sample size)


def z_for(confidence: float) -> float:
    """The two-sided normal quantile: 1.96 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie strictly between 0 and 1")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0.0, 1.0) when n == 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    z = z_for(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    if successes == n:  # exact at the edges, free of float round-off
        high = 1.0
    if successes == 0:
        low = 0.0
    return low, high


def cs_prior(centre: float, weight: float = CS_PRIOR_WEIGHT) -> tuple[float, float]:
    """The mixing Beta(a, b) of `agreement_cs`: mean `centre`, a + b = `weight`; each of a, b is
    at least 0.5 so that a centre of 0 or 1 still gives a proper prior."""
    if not 0 <= centre <= 1 or weight <= 0:
        raise ValueError("need 0 <= centre <= 1 and weight > 0")
    return max(0.5, centre * weight), max(0.5, (1 - centre) * weight)


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def agreement_cs(agreed: int, n: int, centre: float, *, alpha: float = CS_ALPHA,
                 weight: float = CS_PRIOR_WEIGHT) -> tuple[float, float]:
    """A (1 - alpha) confidence *sequence* for a Bernoulli mean: (lower, upper) after `agreed`
    successes in `n` trials, valid at every n at once, however often it is looked at.

    Beta-binomial conjugate mixture (Robbins 1970, "Statistical methods related to the law of
    the iterated logarithm", Ann. Math. Statist. 41; Lai 1976, "On confidence sequences", Ann.
    Statist. 4; Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric,
    nonasymptotic confidence sequences", Ann. Statist. 49, conjugate mixtures). With S successes and
    F = n - S failures of i.i.d. Bernoulli(p) trials and a mixing prior Beta(a, b),

        M_n(p) = B(a + S, b + F) / (B(a, b) * p^S * (1 - p)^F)

    is the likelihood ratio of the Beta-mixed alternative against p: a nonnegative martingale
    with M_0 = 1 when p is the true mean, so Ville's inequality gives
    P(exists n: M_n(p) >= 1/alpha) <= alpha. The confidence sequence is

        C_n = {p : S log p + F log(1 - p) > log B(a + S, b + F) - log B(a, b) - log(1/alpha)},

    an interval (the left side is concave in p and C_n always holds S/n), whose ends are found
    by Newton's method from outside (`_end`), so rounding can only widen it. The true p lies
    in every C_n with probability >= 1 - alpha, so each end alone is a one-sided bound at
    >= 1 - alpha over all looks: a gate that passes when `lower >= threshold` passes a canary
    whose true agreement is below the threshold with probability <= alpha, and one that fails
    when `upper < threshold` fails a canary at or above it with probability <= alpha.

    The prior only decides where the sequence is tightest; any fixed prior is valid. `centre`
    (the gate's threshold) and `weight` (a + b, default 50: Beta(49, 1) for a threshold of 0.98)
    put its mass where the decision is made. It needs no order of the trials, only the counts,
    which is what the per-second shadow counters keep. (0.0, 1.0) when n == 0.
    """
    if not 0 <= agreed <= n:
        raise ValueError(f"need 0 <= agreed <= n, got {agreed} of {n}")
    if not 0 < alpha < 1:
        raise ValueError("alpha must lie strictly between 0 and 1")
    if n == 0:
        return 0.0, 1.0
    a, b = cs_prior(centre, weight)
    failed = n - agreed
    floor = _log_beta(a + agreed, b + failed) - _log_beta(a, b) + math.log(alpha)
    if failed == 0:  # S log p > floor: p > exp(floor / n) (widened by float round-off)
        return max(0.0, math.exp(floor / n) - 1e-12), 1.0
    if agreed == 0:
        return 0.0, min(1.0, -math.expm1(floor / n) + 1e-12)
    mean = agreed / n
    return _end(agreed, n, floor, mean, -1.0), _end(agreed, n, floor, mean, 1.0)


def _end(agreed: int, n: int, floor: float, mean: float, side: float) -> float:
    """One end of C_n (0 < agreed < n), by Newton's method in the log-odds t of p, where the
    log-likelihood g(t) = S t - n log(1 + e^t) is concave: started outside C_n, every Newton
    step lands outside it too (a tangent of a concave function lies above it), so the
    iterates close in on the end monotonically from outside and any of them is a safe bound."""

    def g(t: float) -> float:
        return agreed * t - n * _softplus(t) - floor

    centre = math.log(mean / (1 - mean))
    step = 3 / math.sqrt(n * mean * (1 - mean))
    t = centre + side * step
    while g(t) >= 0:  # not yet outside: look twice as far
        step *= 2
        t = centre + side * step
    for _ in range(100):
        value = g(t)
        slope = agreed - n / (1 + math.exp(-t))  # n (mean - p): never 0 outside C_n
        nxt = t - value / slope
        if value > -1e-9 or abs(nxt - t) < 1e-12:
            break
        t = nxt
    return min(1.0, max(0.0, 1 / (1 + math.exp(-t)) + side * 1e-12))  # float round-off: widen


def _softplus(t: float) -> float:
    """log(1 + e^t), without overflow."""
    return t + math.log1p(math.exp(-t)) if t > 0 else math.log1p(math.exp(t))


def bucket_label(index: int, edges: tuple[float, ...] = MARGIN_EDGES) -> str:
    low = edges[index]
    return f"{low:g}-{edges[index + 1]:g}" if index + 1 < len(edges) else f">={low:g}"


def bucket_of(margin: float, edges: tuple[float, ...] = MARGIN_EDGES) -> int:
    """Index of the bucket holding `margin` (margins below edges[0] fall into bucket 0)."""
    index = 0
    for i, edge in enumerate(edges):
        if margin >= edge:
            index = i
    return index


def first_bucket_from(margin: float, edges: tuple[float, ...] = MARGIN_EDGES) -> int:
    """Index of the first bucket whose pairs all have a margin >= `margin`, which must be one of
    the edges (bucket counts cannot be split inside a bucket)."""
    if margin not in edges:
        raise ValueError(f"margin {margin:g} is not a bucket edge {edges}: pick one of them")
    return edges.index(margin)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Pair:
    baseline: int
    optimized: int
    baseline_margin: float
    optimized_margin: float
    cosine: float | None = None
    truth: int | None = None
    index: int = -1  # position in the regression set, to name flipped inputs

    @property
    def agrees(self) -> bool:
        return self.baseline == self.optimized


@dataclass(frozen=True)
class Bucket:
    label: str
    n: int
    agree: int

    @property
    def agreement(self) -> float | None:
        return self.agree / self.n if self.n else None


@dataclass(frozen=True)
class CosineStats:
    mean: float
    p1: float
    min: float


@dataclass
class Summary:
    n: int
    agree: int
    agreement: float
    lower_bound: float
    upper_bound: float
    buckets: list[Bucket]
    flips: list[Pair]
    cosine: CosineStats | None
    accuracy: dict[str, float] | None = field(default=None)  # {"baseline", "optimized", "n"}
    confident: list[Pair] = field(default_factory=list)  # flips at baseline margin >= min_margin
    min_margin: float = CONFIDENT_MARGIN

    @property
    def accuracy_drop(self) -> float | None:
        """Baseline accuracy minus optimized accuracy on the labelled pairs (negative: the
        optimized arm is right more often); None without labelled pairs."""
        if not self.accuracy:
            return None
        return self.accuracy["baseline"] - self.accuracy["optimized"]


def summarize(pairs: list[Pair], *, confidence: float = 0.95,
              edges: tuple[float, ...] = MARGIN_EDGES,
              min_margin: float = CONFIDENT_MARGIN) -> Summary:
    """Every agreement figure of a list of pairs; `min_margin` draws the confident flips."""
    n = len(pairs)
    agree = sum(p.agrees for p in pairs)
    low, high = wilson_interval(agree, n, confidence)
    counts = [[0, 0] for _ in edges]
    for p in pairs:
        cell = counts[bucket_of(p.baseline_margin, edges)]
        cell[0] += 1
        cell[1] += p.agrees
    buckets = [Bucket(bucket_label(i, edges), c[0], c[1]) for i, c in enumerate(counts)]
    # cosines of unit vectors held to [-1, 1]: a dot product rounds past them by an ulp
    cosines = [max(-1.0, min(1.0, p.cosine)) for p in pairs if p.cosine is not None]
    cosine = None
    if cosines:
        cosine = CosineStats(sum(cosines) / len(cosines), percentile(cosines, 1), min(cosines))
    labelled = [p for p in pairs if p.truth is not None]
    accuracy = None
    if labelled:
        accuracy = {
            "n": len(labelled),
            "baseline": sum(p.baseline == p.truth for p in labelled) / len(labelled),
            "optimized": sum(p.optimized == p.truth for p in labelled) / len(labelled),
        }
    flips = sorted((p for p in pairs if not p.agrees), key=lambda p: -p.baseline_margin)
    confident = [p for p in flips if p.baseline_margin >= min_margin]
    return Summary(n, agree, agree / n if n else 0.0, low, high, buckets, flips, cosine, accuracy,
                   confident, min_margin)


def margins(scores: list[float]) -> tuple[int, float]:
    """(top-1 index, top-1 minus top-2 score) of one input's label scores."""
    if len(scores) < 2:
        raise ValueError("need at least two label scores")
    best = max(range(len(scores)), key=scores.__getitem__)
    runner_up = max(s for i, s in enumerate(scores) if i != best)
    return best, scores[best] - runner_up
