"""The rollout state model and the percentage <-> basis point conversions (rollout.state)."""

from __future__ import annotations

import pydantic
import pytest

from rollout import BUCKETS, InvalidChange, RolloutState, format_bp, parse_percent

# --- parse_percent ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bp"),
    [
        ("5", 500),
        ("0.01", 1),
        ("0.1", 10),
        ("0.25", 25),
        ("2.5", 250),
        ("12.34", 1_234),
        ("99.99", 9_999),
        ("100", 10_000),
        ("100.00", 10_000),
        ("0", 0),
        ("0.00", 0),
        (" 5 ", 500),
        ("05", 500),
    ],
)
def test_parse_percent_accepts_shares_with_at_most_two_decimals(text, bp):
    assert parse_percent(text) == bp


@pytest.mark.parametrize(
    ("value", "bp"),
    [(2.5, 250), (0.01, 1), (100.0, 10_000), (0.0, 0), (5.0, 500), (0.1 + 0.2, 30), (33.33, 3_333)],
)
def test_parse_percent_accepts_floats_without_float_noise(value, bp):
    assert parse_percent(value) == bp


@pytest.mark.parametrize(
    "text",
    [
        "101", "100.01", "1000", "-1", "-0.01", "0.001", "2.555", "abc", "nan", "inf", "",
        " ", "1e2", "5%", "1,5", ".5", "5.", "+5",
    ],
)
def test_parse_percent_rejects_malformed_or_out_of_range_shares(text):
    with pytest.raises(InvalidChange):
        parse_percent(text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 100.5, 0.001, 1e-9])
def test_parse_percent_rejects_bad_floats(value):
    with pytest.raises(InvalidChange):
        parse_percent(value)


def test_invalid_change_is_a_value_error():
    with pytest.raises(ValueError, match="0.01"):
        parse_percent("0.001")


# --- format_bp -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bp", "text"),
    [
        (0, "0%"), (1, "0.01%"), (10, "0.1%"), (25, "0.25%"), (100, "1%"), (250, "2.5%"),
        (500, "5%"), (1_000, "10%"), (1_234, "12.34%"), (9_999, "99.99%"), (10_000, "100%"),
    ],
)
def test_format_bp(bp, text):
    assert format_bp(bp) == text


def test_every_share_survives_a_round_trip():
    for bp in range(BUCKETS + 1):
        assert parse_percent(format_bp(bp).removesuffix("%")) == bp


# --- RolloutState ------------------------------------------------------------------------------


def test_default_state_routes_nothing_to_the_canary():
    state = RolloutState()

    assert (state.canary_bp, state.kill, state.revision) == (0, False, 0)
    assert state.effective_bp == 0


@pytest.mark.parametrize("bp", [0, 1, 5_000, BUCKETS])
def test_state_accepts_shares_within_bounds(bp):
    assert RolloutState(canary_bp=bp).canary_bp == bp


@pytest.mark.parametrize(
    ("field", "value"), [("canary_bp", BUCKETS + 1), ("canary_bp", -1), ("revision", -1)]
)
def test_state_rejects_out_of_bounds_fields(field, value):
    with pytest.raises(pydantic.ValidationError) as info:
        RolloutState(**{field: value})

    assert info.value.errors()[0]["loc"] == (field,)


def test_fields_of_a_newer_version_are_read_and_written_back():
    doc = {"canary_bp": 500, "kill": True, "revision": 3, "canary_cohort": {"region": "eu"},
           "routes": [{"id": "r1", "header": "x-team", "values": ["qa"], "arm": "optimized",
                       "ttl_s": 60}]}
    state = RolloutState.model_validate(doc)

    assert state.kill and state.effective_bp == 0
    assert state.model_extra == {"canary_cohort": {"region": "eu"}}
    assert state.routes[0].model_extra == {"ttl_s": 60}
    again = RolloutState.model_validate_json(
        state.model_copy(update={"kill": False}).model_dump_json())
    assert again.model_extra == state.model_extra and not again.kill
    assert again.routes[0].model_extra == {"ttl_s": 60}


def test_state_is_immutable():
    state = RolloutState(canary_bp=100)

    with pytest.raises(pydantic.ValidationError):
        state.canary_bp = 200
    assert state.canary_bp == 100


def test_canary_percent():
    assert RolloutState(canary_bp=1).canary_percent == 0.01
    assert RolloutState(canary_bp=2_550).canary_percent == 25.5


def test_effective_share_is_zero_while_the_kill_switch_is_on():
    assert RolloutState(canary_bp=2_500).effective_bp == 2_500
    assert RolloutState(canary_bp=2_500, kill=True).effective_bp == 0
    assert RolloutState(canary_bp=BUCKETS, kill=True).effective_bp == 0
    # The share itself is kept, so unkilling restores it.
    assert RolloutState(canary_bp=2_500, kill=True).canary_bp == 2_500


def test_state_survives_a_json_round_trip():
    state = RolloutState(
        canary_bp=1, kill=True, baseline_version="b1", optimized_version="o1", revision=3,
        updated_at=1_700_000_000.125, updated_by="alice", reason="because",
    )

    assert RolloutState.model_validate_json(state.model_dump_json()) == state
