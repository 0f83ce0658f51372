"""Sticky bucket assignment and the routing decision (rollout.policy)."""

from __future__ import annotations

import math

import pytest

from rollout import BUCKETS, Arm, Reason, RolloutState, bucket_of, decide

KEYS_2K = [f"user-{i}" for i in range(2_000)]
KEYS_10K = [f"req-{i:05d}" for i in range(10_000)]


def state(bp: int, *, kill: bool = False) -> RolloutState:
    return RolloutState(canary_bp=bp, kill=kill, revision=1)


def canary_keys(keys: list[str], bp: int, salt: str = "") -> set[str]:
    current = state(bp)
    return {k for k in keys if decide(current, k, salt=salt).arm is Arm.OPTIMIZED}


# --- buckets ------------------------------------------------------------------------------------


def test_bucket_is_deterministic_and_in_range():
    for key in KEYS_2K + ["", "ü-ñíçødé", "x" * 10_000]:
        bucket = bucket_of(key)
        assert 0 <= bucket < BUCKETS
        assert bucket_of(key) == bucket
        assert bucket_of(key, "salt") == bucket_of(key, "salt")


def test_buckets_are_spread_over_the_whole_range():
    buckets = [bucket_of(k) for k in KEYS_10K]

    # 10,000 keys into 10 deciles of 1,000 buckets: each decile gets 1,000 ± 5 sigma (~95).
    deciles = [0] * 10
    for bucket in buckets:
        deciles[bucket // 1_000] += 1
    assert all(850 <= count <= 1_150 for count in deciles), deciles
    assert len(set(buckets)) > 6_000  # ~6,321 distinct expected; a weak hash collapses far lower


# --- canary fraction ----------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [KEYS_2K, KEYS_10K], ids=["2k", "10k"])
def test_a_quarter_share_sends_a_quarter_of_keys_to_the_canary(keys):
    fraction = len(canary_keys(keys, 2_500)) / len(keys)

    assert 0.22 <= fraction <= 0.28


@pytest.mark.parametrize("bp", [100, 1_000, 2_500, 5_000])
def test_canary_fraction_is_within_binomial_bounds(bp):
    n, p = len(KEYS_10K), bp / BUCKETS
    sigma = math.sqrt(n * p * (1 - p))

    count = len(canary_keys(KEYS_10K, bp))

    assert abs(count - n * p) <= 5 * sigma, (count, n * p, sigma)


def test_zero_and_full_shares_are_exact():
    assert canary_keys(KEYS_2K, 0) == set()
    assert canary_keys(KEYS_2K, BUCKETS) == set(KEYS_2K)


def test_the_smallest_share_sends_exactly_the_keys_in_bucket_0():
    keys = [f"k{i}" for i in range(50_000)]
    in_bucket_0 = {k for k in keys if bucket_of(k) == 0}
    assert len(in_bucket_0) >= 1  # ~5 expected among 50,000 keys

    assert canary_keys(keys, 1) == in_bucket_0


# --- invariants -------------------------------------------------------------------------------


def test_widening_only_adds_keys():
    """Every key on the canary at share s is still on it at every larger share."""
    shares = [0, 1, 2, 10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 7_500, 9_999, 10_000]
    sets = [canary_keys(KEYS_2K, bp) for bp in shares]

    for smaller, larger in zip(sets, sets[1:], strict=False):
        assert smaller <= larger
    for i, smaller in enumerate(sets):
        for larger in sets[i + 1 :]:
            assert smaller <= larger


def test_a_key_is_optimized_exactly_from_its_bucket_upwards():
    for key in KEYS_2K[:200]:
        bucket = bucket_of(key)
        assert decide(state(bucket), key).arm is Arm.BASELINE
        assert decide(state(bucket + 1), key).arm is Arm.OPTIMIZED


def test_assignment_is_sticky():
    current = state(1_000)
    first = [decide(current, k) for k in KEYS_2K]

    again = [decide(current.model_copy(update=dict(revision=7)), k) for k in KEYS_2K]

    assert again == first


def test_decision_reports_bucket_and_reason():
    key = KEYS_2K[0]
    bucket = bucket_of(key)

    inside = decide(state(bucket + 1), key)
    outside = decide(state(bucket), key)

    assert (inside.arm, inside.bucket, inside.reason) == (Arm.OPTIMIZED, bucket, Reason.CANARY)
    assert (outside.arm, outside.bucket, outside.reason) == (Arm.BASELINE, bucket, Reason.SHARE)


# --- fail-safe -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bp", [1, 2_500, BUCKETS])
def test_kill_switch_beats_the_share(bp):
    killed = state(bp, kill=True)

    decisions = [decide(killed, k) for k in KEYS_2K]

    assert {d.arm for d in decisions} == {Arm.BASELINE}
    assert {d.reason for d in decisions} == {Reason.KILL_SWITCH}


def test_kill_switch_is_reported_even_when_the_state_is_stale():
    decision = decide(state(BUCKETS, kill=True), "k", stale=True)

    assert (decision.arm, decision.reason) == (Arm.BASELINE, Reason.KILL_SWITCH)


@pytest.mark.parametrize("bp", [1, 2_500, BUCKETS])
def test_stale_state_routes_everything_to_baseline(bp):
    decisions = [decide(state(bp), k, stale=True) for k in KEYS_2K]

    assert {d.arm for d in decisions} == {Arm.BASELINE}
    assert {d.reason for d in decisions} == {Reason.STALE_STATE}


# --- salt -------------------------------------------------------------------------------------


def test_salt_changes_the_assignment_but_not_the_fraction():
    unsalted = canary_keys(KEYS_10K, 2_500)
    salted = canary_keys(KEYS_10K, 2_500, salt="experiment-2")

    assert 2_200 <= len(salted) <= 2_800
    # Independent assignments overlap on about a quarter of a quarter (625 keys).
    assert len(unsalted & salted) < 1_000
    moved = sum(bucket_of(k) != bucket_of(k, "experiment-2") for k in KEYS_2K)
    assert moved > 0.99 * len(KEYS_2K)


def test_a_share_set_for_another_optimized_version_routes_nothing():
    from rollout import Reason, effective_bp

    state = RolloutState(canary_bp=10_000, optimized_version="int8-old")
    decision = decide(state, "k", serving="int8-new")
    assert decision.arm.value == "baseline" and decision.reason is Reason.VERSION_MISMATCH
    assert effective_bp(state, serving="int8-new") == (0, Reason.VERSION_MISMATCH)
    assert decide(state, "k", serving="int8-old").arm.value == "optimized"
    unbound = RolloutState(canary_bp=10_000)  # no version recorded: not bound to one
    assert decide(unbound, "k", serving="int8-new").arm.value == "optimized"
    killed = RolloutState(canary_bp=10_000, kill=True, optimized_version="int8-old")
    assert effective_bp(killed, serving="int8-new") == (0, Reason.KILL_SWITCH)
