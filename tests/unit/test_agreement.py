"""Agreement math: Wilson bounds, margin buckets, cosine statistics, verdict thresholds."""

import math

import pytest

from rollout import Thresholds, judge
from rollout.agreement import (
    MARGIN_EDGES,
    Pair,
    agreement_cs,
    bucket_label,
    bucket_of,
    cs_prior,
    first_bucket_from,
    margins,
    percentile,
    summarize,
    wilson_interval,
)

# Reference values: scipy.stats.binomtest(k, n).proportion_ci(method="wilson"), 95 %.
WILSON = [
    (95, 100, 0.88825, 0.978456),
    (2590, 2600, 0.992934, 0.997909),
    (1, 10, 0.017876, 0.40415),
    (0, 10, 0.0, 0.277533),
    (10, 10, 0.722467, 1.0),
]


@pytest.mark.parametrize(("k", "n", "low", "high"), WILSON)
def test_wilson_interval_matches_the_reference(k, n, low, high):
    got_low, got_high = wilson_interval(k, n)
    assert got_low == pytest.approx(low, abs=1e-6)
    assert got_high == pytest.approx(high, abs=1e-6)


def test_wilson_interval_edges_and_errors():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 10)[0] == 0.0
    # more evidence, tighter bound; a wider confidence, a lower bound
    assert wilson_interval(995, 1000)[0] > wilson_interval(199, 200)[0]
    assert wilson_interval(995, 1000, 0.99)[0] < wilson_interval(995, 1000, 0.95)[0]
    for bad in ((11, 10), (-1, 10)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)
    with pytest.raises(ValueError):
        wilson_interval(1, 2, confidence=1.0)


def test_the_goal_needs_about_2000_inputs():
    """99.5 % agreement proves a lower bound of 99 % only with enough inputs."""
    assert wilson_interval(995, 1000)[0] < 0.99
    assert wilson_interval(2587, 2600)[0] > 0.99  # 99.5 % of the shipped set's size


def test_buckets_cover_every_margin_once():
    assert bucket_of(0.0) == 0
    assert bucket_of(-0.1) == 0
    assert bucket_of(0.004999) == 0
    assert bucket_of(0.005) == 1
    assert bucket_of(0.05) == 4
    assert bucket_of(7.0) == len(MARGIN_EDGES) - 1
    assert bucket_label(0) == "0-0.005"
    assert bucket_label(len(MARGIN_EDGES) - 1) == ">=0.1"
    assert first_bucket_from(0.05) == bucket_of(0.05) == 4  # where confident pairs start
    with pytest.raises(ValueError, match="not a bucket edge"):
        first_bucket_from(0.04)


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 201)]  # 1..200
    assert percentile(values, 1) == 2.0
    assert percentile(values, 50) == 100.0
    assert percentile(values, 100) == 200.0
    assert percentile([0.5], 1) == 0.5
    with pytest.raises(ValueError):
        percentile([], 1)


def test_margins_of_label_scores():
    assert margins([0.1, 0.7, 0.4]) == (1, pytest.approx(0.3))
    assert margins([0.5, 0.5]) == (0, 0.0)  # a tie: the first wins, margin 0
    with pytest.raises(ValueError):
        margins([1.0])


def test_summarize_counts_agreement_flips_buckets_cosine_and_accuracy():
    pairs = [Pair(0, 0, 0.2, 0.19, cosine=0.999, truth=0, index=i) for i in range(96)]
    pairs += [
        Pair(1, 2, 0.001, 0.002, cosine=0.95, truth=1, index=96),  # near the boundary
        Pair(2, 1, 0.03, 0.01, cosine=0.90, truth=1, index=97),  # a flip, still a near tie
        Pair(0, 0, 0.004, 0.003, cosine=0.998, index=98),
        Pair(0, 0, 0.012, 0.02, cosine=0.997, index=99),
    ]
    s = summarize(pairs)
    assert (s.n, s.agree, s.agreement) == (100, 98, 0.98)
    assert (s.lower_bound, s.upper_bound) == wilson_interval(98, 100)
    assert [p.index for p in s.flips] == [97, 96]  # largest baseline margin first
    by_label = {b.label: (b.n, b.agree) for b in s.buckets}
    assert by_label == {"0-0.005": (2, 1), "0.005-0.01": (0, 0), "0.01-0.02": (1, 1),
                        "0.02-0.05": (1, 0), "0.05-0.1": (0, 0), ">=0.1": (96, 96)}
    assert sum(b.n for b in s.buckets) == s.n
    assert s.buckets[1].agreement is None
    assert s.cosine.min == 0.90
    assert s.cosine.p1 == 0.90  # nearest rank: the 1st of 100 sorted values
    expected_mean = (96 * 0.999 + 0.95 + 0.90 + 0.998 + 0.997) / 100
    assert math.isclose(s.cosine.mean, expected_mean)
    assert s.accuracy == {"n": 98, "baseline": 97 / 98, "optimized": 97 / 98}
    assert s.accuracy_drop == 0.0
    assert s.confident == [] and s.min_margin == 0.05  # both flips sit below 0.05


def test_a_flip_is_confident_from_exactly_the_minimum_margin():
    pairs = [
        Pair(0, 1, 0.05, 0.01, index=0),  # exactly at the edge: confident
        Pair(0, 1, 0.0499999, 0.01, index=1),  # just below: a near tie
        Pair(2, 3, 0.6, 0.2, index=2),
        Pair(1, 1, 0.9, 0.9, index=3),  # agrees, however confident
        Pair(1, 2, 0.001, 0.0, index=4),
    ]
    s = summarize(pairs)
    assert [p.index for p in s.confident] == [2, 0]  # largest baseline margin first
    assert [p.index for p in s.flips] == [2, 0, 1, 4]
    s = summarize(pairs, min_margin=0.1)
    assert [p.index for p in s.confident] == [2] and s.min_margin == 0.1
    assert summarize(pairs, min_margin=0.0).confident == summarize(pairs).flips  # every flip


def test_accuracy_drop_is_baseline_minus_optimized_on_labelled_pairs_only():
    pairs = [Pair(0, 0, 0.3, 0.3, truth=0, index=i) for i in range(7)]  # both right
    pairs += [Pair(0, 1, 0.3, 0.1, truth=0, index=7),  # optimized wrong
              Pair(0, 1, 0.3, 0.1, truth=0, index=8),  # optimized wrong
              Pair(2, 1, 0.01, 0.01, truth=1, index=9),  # baseline wrong, optimized right
              Pair(0, 1, 0.3, 0.1, index=10)]  # unlabelled: no part of accuracy
    s = summarize(pairs)
    assert s.accuracy == {"n": 10, "baseline": 0.9, "optimized": 0.8}
    assert s.accuracy_drop == pytest.approx(0.1)
    assert summarize([Pair(0, 1, 0.3, 0.1)]).accuracy_drop is None


def test_summarize_without_cosine_or_labels():
    s = summarize([Pair(0, 0, 0.1, 0.1), Pair(1, 1, 0.1, 0.1)])
    assert s.cosine is None and s.accuracy is None and s.flips == []
    assert s.agreement == 1.0 and s.upper_bound == 1.0
    empty = summarize([])
    assert (empty.n, empty.agreement, empty.lower_bound) == (0, 0.0, 0.0)


def test_judge_lists_every_missed_threshold():
    rules = Thresholds(min_agreement=0.995, min_lower_bound=0.99, min_speedup=1.8,
                       min_cosine_p1=0.99)
    assert judge(rules, agreement=0.996, lower_bound=0.992, speedup=2.0, cosine_p1=0.995) == []
    failures = judge(rules, agreement=0.99, lower_bound=0.98, speedup=1.2, cosine_p1=0.9)
    assert len(failures) == 4
    assert failures[0].startswith("agreement 0.9900 < 0.995")
    assert "speedup 1.20x < 1.8x" in failures
    # an unmeasured speed (verify --no-speed) or cosine (a classifier) is not judged
    assert judge(rules, agreement=1.0, lower_bound=0.995, speedup=None, cosine_p1=None) == []


# --- the anytime-valid confidence sequence (the ramp's agreement gate) -------------------------


def _cs_by_bisection(agreed: int, n: int, centre: float) -> tuple[float, float]:
    """The set {p : M_n(p) < 20} of agreement_cs's docstring, by a slow bisection of its own."""
    a, b = cs_prior(centre)
    failed = n - agreed
    log_beta = lambda x, y: math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)  # noqa: E731
    floor = log_beta(a + agreed, b + failed) - log_beta(a, b) - math.log(20)

    def inside(p: float) -> bool:
        if p in (0.0, 1.0):
            return (agreed if p == 0 else failed) == 0 and floor < 0
        return agreed * math.log(p) + failed * math.log1p(-p) > floor

    def edge(outside: float, within: float) -> float:
        for _ in range(200):
            mid = (outside + within) / 2
            outside, within = (outside, mid) if inside(mid) else (mid, within)
        return outside

    return edge(0.0, agreed / n), edge(1.0, agreed / n)


@pytest.mark.parametrize(("agreed", "n", "centre"), [
    (995, 1000, 0.98), (0, 10, 0.98), (10, 10, 0.98), (4900, 5000, 0.98), (1, 2, 0.5),
    (999_000, 1_000_000, 0.999), (3, 50, 0.0), (50, 50, 1.0), (1, 1, 0.98), (0, 1, 0.98),
])
def test_the_confidence_sequence_is_the_mixture_set_rounded_outwards(agreed, n, centre):
    lower, upper = agreement_cs(agreed, n, centre)
    want_lower, want_upper = _cs_by_bisection(agreed, n, centre)
    assert want_lower - 1e-9 <= lower <= want_lower  # never inside the set
    assert want_upper <= upper <= want_upper + 1e-9


def test_the_confidence_sequence_is_wider_than_one_wilson_interval_and_shrinks():
    """Valid at every look at once costs width: wider than Wilson at one n, still tightening."""
    lower, upper = agreement_cs(995, 1000, 0.98)
    wilson_low, wilson_high = wilson_interval(995, 1000)
    assert lower < wilson_low and upper > wilson_high
    assert lower == pytest.approx(0.985, abs=5e-4)  # passes 0.98 at 1,000 pairs of 99.5 %
    assert agreement_cs(9950, 10_000, 0.98)[0] > lower
    assert agreement_cs(0, 0, 0.98) == (0.0, 1.0)
    assert agreement_cs(10, 10, 0.98)[1] == 1.0 and agreement_cs(0, 10, 0.98)[0] == 0.0
    assert agreement_cs(995, 1000, 0.98, alpha=0.01)[0] < lower


def test_the_confidence_sequence_refuses_impossible_counts():
    for bad in ((11, 10), (-1, 10)):
        with pytest.raises(ValueError, match="agreed <= n"):
            agreement_cs(*bad, 0.98)
    with pytest.raises(ValueError, match="alpha"):
        agreement_cs(1, 2, 0.98, alpha=1.0)
    with pytest.raises(ValueError, match="centre"):
        agreement_cs(1, 2, 1.5)


def test_the_mixing_prior_is_centred_on_the_threshold():
    assert cs_prior(0.98) == pytest.approx((49.0, 1.0))
    assert cs_prior(1.0) == (50.0, 0.5) and cs_prior(0.0) == (0.5, 50.0)
    with pytest.raises(ValueError):
        cs_prior(0.5, weight=0)


def test_cosines_rounded_past_the_unit_interval_count_as_its_edges():
    """A dot product of unit vectors, one negated (an arm that flips every embedding), rounds
    to a hair below -1: a gate of `cosine p1 >= -1` must not fail on that ulp."""
    pairs = [Pair(0, 0, 0.2, 0.19, cosine=-1.0000001, index=i) for i in range(50)]
    pairs.append(Pair(0, 0, 0.2, 0.19, cosine=1.0000001, index=50))
    stats = summarize(pairs).cosine
    assert stats.p1 == stats.min == -1.0
    assert -1.0 <= stats.mean < -0.9
