"""Sticky bucket assignment and the routing decision (rollout.policy)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout import BUCKETS, Arm, Reason, RolloutState, Route, bucket_of, decide

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


# --- header routes and the operator override ----------------------------------------------------

INTERNAL = {"x-user-group": "internal"}
TO_OPTIMIZED = Route(id="r1", header="x-user-group", values=("internal", "qa"), arm="optimized")
TO_BASELINE = Route(id="r2", header="x-tenant", values=("acme",), arm="baseline")


def routed(bp: int = 0, *, kill: bool = False, routes=(TO_OPTIMIZED, TO_BASELINE),
           **fields) -> RolloutState:
    return RolloutState(canary_bp=bp, kill=kill, revision=1, routes=routes, **fields)


def test_a_route_sends_its_requests_to_its_arm_whatever_the_share():
    for key in KEYS_2K[:200]:
        to_optimized = decide(routed(0), key, headers=INTERNAL)
        assert (to_optimized.arm, to_optimized.reason, to_optimized.route) == (
            Arm.OPTIMIZED, Reason.ROUTE, "r1")
        assert to_optimized.label == "route:r1" and to_optimized.bucket == bucket_of(key)
        pinned = decide(routed(BUCKETS), key, headers={"x-tenant": "acme"})
        assert (pinned.arm, pinned.label) == (Arm.BASELINE, "route:r2")


def test_the_first_matching_route_in_id_order_wins():
    first = Route(id="r2", header="x-tenant", values=("acme",), arm="optimized")
    later = Route(id="r10", header="x-user-group", values=("internal",), arm="baseline")
    both = {"x-tenant": "acme", "x-user-group": "internal"}
    assert decide(routed(routes=(first, later)), "k", headers=both).label == "route:r2"
    assert decide(routed(routes=(first, later)), "k", headers=INTERNAL).label == "route:r10"


def test_a_route_to_optimized_is_not_bound_to_the_shares_version():
    """The version binding is the share's: an operator's route names the arm, not a share."""
    state = routed(10_000, optimized_version="int8-old")
    assert decide(state, "k", serving="int8-new", headers=INTERNAL).arm is Arm.OPTIMIZED
    assert decide(state, "k", serving="int8-new").reason is Reason.VERSION_MISMATCH


@pytest.mark.parametrize("override, expected", [("optimized", Arm.OPTIMIZED),
                                                ("baseline", Arm.BASELINE)])
def test_an_authorised_override_beats_routes_and_share(override, expected):
    request = {"x-canary-arm-override": override, "x-user-group": "internal",
               "x-tenant": "acme"}
    for bp in (0, BUCKETS):
        decision = decide(routed(bp), "k", headers=request, override_allowed=True)
        assert (decision.arm, decision.reason, decision.label) == (expected, Reason.OVERRIDE,
                                                                   "override")


def test_an_override_that_is_not_authorised_or_names_no_arm_is_ignored():
    """The gateway refuses both before routing (403 / 400); routing itself never trusts them."""
    request = {"x-canary-arm-override": "optimized", "x-user-group": "internal"}
    assert decide(routed(0), "k", headers=request).label == "route:r1"
    assert decide(routed(0), "k", headers={"x-canary-arm-override": "optimized"}).label == "share"
    nonsense = {"x-canary-arm-override": "nonsense"}
    assert decide(routed(0), "k", headers=nonsense, override_allowed=True).label == "share"


@pytest.mark.parametrize("request_headers, allowed", [
    ({"x-canary-arm-override": "optimized"}, True), (INTERNAL, False),
])
def test_the_kill_switch_and_the_fail_safe_beat_routes_and_overrides(request_headers, allowed):
    killed = decide(routed(BUCKETS, kill=True), "k", headers=request_headers,
                    override_allowed=allowed, stale=True)
    assert (killed.arm, killed.label) == (Arm.BASELINE, "kill-switch")
    stale = decide(routed(BUCKETS), "k", headers=request_headers, override_allowed=allowed,
                   stale=True)
    assert (stale.arm, stale.label) == (Arm.BASELINE, "stale-state")


_values = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
_routes = st.lists(
    st.tuples(st.sampled_from(["x-user-group", "x-tenant", "x-beta"]),
              st.lists(_values, min_size=1, max_size=4, unique=True),
              st.sampled_from(["baseline", "optimized"])),
    max_size=6,
)


def _table(specs) -> tuple[Route, ...]:
    routes, taken = [], set()
    for header, values, arm in specs:
        values = [v for v in values if (header, v) not in taken]
        if values:
            taken.update((header, v) for v in values)
            routes.append(Route(id=f"r{len(routes) + 1}", header=header, values=tuple(values),
                                arm=arm))
    return tuple(routes)


@settings(max_examples=60, deadline=None)
@given(specs=_routes, low=st.integers(0, BUCKETS), high=st.integers(0, BUCKETS),
       keys=st.lists(st.text(min_size=0, max_size=20), min_size=1, max_size=60),
       header=st.sampled_from(["x-user-group", "x-tenant", "x-other"]), value=_values)
def test_requests_no_route_matches_keep_sticky_monotone_hashed_arms(specs, low, high, keys,
                                                                   header, value):
    """Routes change no unmatched request's arm: for every key, with routes or without, the
    decision is the hashed one, so stickiness and monotone widening hold as before."""
    low, high = sorted((low, high))
    routes = _table(specs)
    request = {header: value}
    if any(route.matches(request) for route in routes):
        request = {"x-unrouted": value}
    for key in keys + KEYS_2K[:100]:
        plain = [decide(state(bp), key) for bp in (low, high)]
        with_routes = [decide(routed(bp, routes=routes), key, headers=request)
                       for bp in (low, high)]
        assert with_routes == plain  # same arm, bucket and reason as without routes
        if with_routes[0].arm is Arm.OPTIMIZED:  # widening never moves a key back
            assert with_routes[1].arm is Arm.OPTIMIZED
