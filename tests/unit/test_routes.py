"""Header routes (rollout.header_routes): the Route model's checks, adding and removing routes
through the audited path on the in-memory store, what `rollout kill`'s QuickSwitch does with them,
and the gateway's override authorisation (serve.gateway.override). No Redis, no Ray."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr, ValidationError

from rollout import (
    FakeClock,
    InvalidChange,
    MemoryStateStore,
    RevisionConflict,
    Rollout,
    RolloutState,
    Route,
)
from rollout.header_routes import MAX_ROUTES, MAX_VALUES, parse_header
from rollout.killswitch import SwitchState
from serve.common.errors import InvalidOverride, OverrideNotAllowed
from serve.gateway.override import override_allowed

TOKEN = "operator-token-0123456789"


def route(**given) -> Route:
    fields = dict(id="r1", header="x-user-group", values=("internal",), arm="optimized")
    return Route(**dict(fields, **given))


@pytest.fixture
def rollout() -> Rollout:
    return Rollout(MemoryStateStore(), FakeClock(1_700_000_000.0))


def add(rollout: Rollout, header="X-User-Group", values=("internal",), arm="optimized", **kw):
    return rollout.add_route(header, values, arm, actor=kw.pop("actor", "alice"),
                             reason=kw.pop("reason", "QA"), **kw)


# --- the model --------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [
    "", "x user", "x:group", "x-group\n", "ü-group", "x" * 65, "X-User-Group",
    "authorization", "cookie", "x-canary-arm-override", "connection", "transfer-encoding",
    "proxy-authorization", "upgrade", "te", "keep-alive",
])
def test_a_route_refuses_a_bad_or_forbidden_header(header):
    with pytest.raises(ValidationError, match="header"):
        route(header=header)


@pytest.mark.parametrize("values", [
    (), ("",), (" internal",), ("internal ",), ("a\tb",), ("x" * 257,), ("ünï",),
    ("a", "a"), tuple(f"v{i}" for i in range(MAX_VALUES + 1)),
])
def test_a_route_refuses_bad_values(values):
    with pytest.raises(ValidationError, match="values"):
        route(values=values)


@pytest.mark.parametrize("given", [
    {"arm": "canary"}, {"arm": "Optimized"}, {"id": "1"}, {"id": "r0"}, {"id": "rx"},
])
def test_a_route_refuses_a_bad_arm_id_or_field(given):
    with pytest.raises(ValidationError):
        route(**given)


def test_a_route_matches_exact_values_of_its_header_only():
    r = route(values=("internal", "qa"))
    assert r.matches({"x-user-group": "internal"}) and r.matches({"x-user-group": "qa"})
    assert not r.matches({"x-user-group": "Internal"})
    assert not r.matches({"x-user-group": "internal,qa"})
    assert not r.matches({"x-other": "internal"}) and not r.matches({})


def test_a_state_refuses_routes_that_break_its_invariants():
    one, two = route(), route(id="r2", header="x-tenant", values=("acme",))
    assert RolloutState(routes=(one, two)).routes == (one, two)
    with pytest.raises(ValidationError, match="ascending"):
        RolloutState(routes=(two, one))
    with pytest.raises(ValidationError, match="unique"):
        RolloutState(routes=(one, one))
    with pytest.raises(ValidationError, match="routed twice"):
        RolloutState(routes=(one, route(id="r2", values=("qa", "internal"))))
    many = tuple(route(id=f"r{i + 1}", values=(f"v{i}",)) for i in range(MAX_ROUTES + 1))
    with pytest.raises(ValidationError, match=f"at most {MAX_ROUTES}"):
        RolloutState(routes=many)


def test_a_state_written_by_luas_cjson_without_routes_reads_as_no_routes():
    doc = dict(json.loads(RolloutState(revision=3).model_dump_json()), routes={})
    assert RolloutState.model_validate_json(json.dumps(doc)).routes == ()
    assert RolloutState.model_validate({**doc, "routes": {}}).routes == ()


@pytest.mark.parametrize("spec, expected", [
    ("X-User-Group=internal", ("x-user-group", ("internal",))),
    ("x-tenant = acme, globex", ("x-tenant", ("acme", "globex"))),
])
def test_parse_header(spec, expected):
    assert parse_header(spec) == expected


def test_parse_header_needs_an_equals_sign():
    with pytest.raises(InvalidChange, match="NAME=VALUE"):
        parse_header("x-tenant")


# --- adding and removing, audited ---------------------------------------------------------------


def test_add_and_remove_are_audited_and_ids_are_the_next_number(rollout):
    before, after = add(rollout, values=["internal", "qa"])
    assert before.revision == 0 and after.revision == 1
    assert after.routes == (Route(id="r1", header="x-user-group", values=("internal", "qa"),
                                  arm="optimized", reason="QA", created_by="alice",
                                  created_at=1_700_000_000.0),)
    _, after = add(rollout, header="x-tenant", values=["acme"], arm="baseline", reason="pin")
    assert [r.id for r in after.routes] == ["r1", "r2"]
    _, after = rollout.remove_route("r1", actor="bob", reason="QA done")
    assert [r.id for r in after.routes] == ["r2"]
    _, after = add(rollout, header="x-beta", values=["1"])
    assert [r.id for r in after.routes] == ["r2", "r3"]  # in id order, never reusing r2's
    entries = rollout.store.audit()
    assert [e.action for e in entries] == ["route-add", "route-add", "route-remove", "route-add"]
    assert (entries[2].actor, entries[2].reason) == ("bob", "QA done")
    assert [r.id for r in entries[2].before.routes] == ["r1", "r2"]


@pytest.mark.parametrize("change, message", [
    (dict(header="cookie"), "cannot be routed on"),
    (dict(header="x y"), "not a valid HTTP header name"),
    (dict(values=[]), "1..32 header values"),
    (dict(values=["a"] * 2), "each header value once"),
    (dict(values=[" a"]), "leading or trailing"),
    (dict(arm="canary"), "baseline or optimized"),
    (dict(reason=" "), "reason"),
    (dict(actor=""), "actor"),
])
def test_a_bad_route_is_refused_and_nothing_is_written(rollout, change, message):
    with pytest.raises(InvalidChange, match=message):
        add(rollout, **change)
    assert rollout.state().revision == 0 and rollout.store.audit() == []


def test_a_header_value_routed_already_is_refused_naming_the_route(rollout):
    add(rollout, values=["internal", "qa"])
    with pytest.raises(InvalidChange, match="qa is already routed by r1"):
        add(rollout, header="X-USER-GROUP", values=["qa"], arm="baseline")
    add(rollout, header="x-tenant", values=["qa"])  # another header may carry the same value
    assert len(rollout.state().routes) == 2


def test_at_most_32_routes(rollout):
    for i in range(MAX_ROUTES):
        add(rollout, values=[f"group-{i}"])
    with pytest.raises(InvalidChange, match="already 32 routes"):
        add(rollout, values=["one-more"])
    assert len(rollout.state().routes) == MAX_ROUTES


def test_removing_an_unknown_route_names_the_known_ones(rollout):
    add(rollout)
    with pytest.raises(InvalidChange, match=r"no route 'r7' \(routes: r1\)"):
        rollout.remove_route("r7", actor="alice", reason="oops")
    assert rollout.state().revision == 1


def test_a_route_change_on_a_moved_state_is_a_conflict(rollout):
    add(rollout)
    rollout.set_canary(500, actor="bob", reason="meanwhile")
    with pytest.raises(RevisionConflict):
        add(rollout, header="x-tenant", expected_revision=1)
    with pytest.raises(RevisionConflict):
        rollout.remove_route("r1", actor="alice", reason="done", expected_revision=1)
    assert [r.id for r in rollout.state().routes] == ["r1"] and rollout.state().revision == 2


def test_the_store_refuses_a_write_that_lost_the_race(rollout):
    """The compare-and-set itself fences a route change computed on an old revision."""
    before = rollout.state()
    add(rollout)
    stale_write = before.model_copy(update={"revision": 1, "routes": ()})
    with pytest.raises(RevisionConflict):
        rollout.store.compare_and_set(before, stale_write, actor="x", action="route-remove",
                                      reason="late")
    assert [r.id for r in rollout.state().routes] == ["r1"]


def test_other_changes_keep_the_routes_and_revert_restores_them(rollout):
    _, with_route = add(rollout)
    rollout.set_canary(500, actor="a", reason="5%")
    rollout.kill(actor="a", reason="stop")
    _, killed = rollout.unkill(actor="a", reason="go")
    assert killed.routes == with_route.routes
    rollout.remove_route("r1", actor="a", reason="done")
    _, reverted = rollout.revert(with_route.revision, actor="a", reason="back")
    assert reverted.routes == with_route.routes and reverted.canary_bp == 0


# --- `rollout kill`'s QuickSwitch ----------------------------------------------------------------


def test_the_fast_kill_path_keeps_the_routes_byte_for_byte(rollout):
    add(rollout, values=["internal", "qa"])
    _, state = add(rollout, header="x-tenant", values=["acme"], arm="baseline",
                   reason='quotes " and ünïcode ✓')
    raw = state.model_dump_json()
    switch = SwitchState.from_json(raw)
    assert switch.to_json() == raw
    killed = switch.model_copy(update={"kill": True, "revision": state.revision + 1})
    read_back = RolloutState.model_validate_json(killed.to_json())
    assert read_back.routes == state.routes and read_back.kill


def test_the_fast_kill_path_reads_a_cjson_empty_list_and_an_old_state():
    doc = json.loads(RolloutState(revision=2).model_dump_json())
    assert SwitchState.from_json(json.dumps(dict(doc, routes={}))).routes == ()
    del doc["routes"]  # written before routes existed
    switch = SwitchState.from_json(json.dumps(doc))
    assert switch.routes == () and json.loads(switch.to_json())["routes"] == []


# --- the override's authorisation (serve.gateway.override)
# ----------------------------------------------


def headers(**given) -> dict[str, str]:
    return {name.replace("_", "-"): value for name, value in given.items()}


def test_no_override_header_needs_nothing():
    assert override_allowed(None, {}) is False
    assert override_allowed(SecretStr(TOKEN), headers(authorization="Bearer nope")) is False


@pytest.mark.parametrize("auth", [None, "", "Bearer", "Bearer wrong-token-0123456789",
                                  f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN])
def test_an_override_without_the_token_is_403(auth):
    given = headers(x_canary_arm_override="optimized")
    if auth is not None:
        given["authorization"] = auth
    with pytest.raises(OverrideNotAllowed, match="Authorization: Bearer"):
        override_allowed(SecretStr(TOKEN), given)


def test_a_gateway_without_a_token_honours_no_override():
    given = headers(x_canary_arm_override="optimized", authorization=f"Bearer {TOKEN}")
    with pytest.raises(OverrideNotAllowed, match="no operator token"):
        override_allowed(None, given)


@pytest.mark.parametrize("value", ["optimized", "baseline", " Optimized "])
def test_an_override_with_the_token_is_honoured(value):
    given = headers(x_canary_arm_override=value, authorization=f"bearer {TOKEN}")
    assert override_allowed(SecretStr(TOKEN), given) is True


@pytest.mark.parametrize("value", ["canary", "", "1"])
def test_an_override_naming_no_arm_is_400_with_the_token_and_403_without(value):
    given = headers(x_canary_arm_override=value, authorization=f"Bearer {TOKEN}")
    with pytest.raises(InvalidOverride, match="baseline or optimized"):
        override_allowed(SecretStr(TOKEN), given)
    with pytest.raises(OverrideNotAllowed):
        override_allowed(SecretStr(TOKEN), headers(x_canary_arm_override=value))


# --- the dashboard's route actions (serve.dashboard.actions) ------------------------------------


def action(rollout: Rollout, kind: str, **fields) -> dict:
    from serve.dashboard.actions import Actions

    return Actions(rollout).run(kind, json.dumps(fields).encode(), "10.0.0.7")


def test_the_dashboard_adds_and_removes_routes_audited_as_the_page(rollout):
    added = action(rollout, "route-add", header="X-User-Group", values=["internal"],
                   arm="optimized", reason="QA", actor="carol", expected_revision=0)
    assert added["changed"] is True
    assert added["message"] == "route r1: x-user-group = internal -> optimized added"
    assert added["state"]["routes"][0]["created_by"] == "dashboard:carol@10.0.0.7"
    removed = action(rollout, "route-remove", id="r1", reason="done")
    assert removed["message"] == "route r1: x-user-group = internal -> optimized removed"
    assert [(e.action, e.actor) for e in rollout.store.audit()] == [
        ("route-add", "dashboard:carol@10.0.0.7"), ("route-remove", "dashboard:10.0.0.7")]


@pytest.mark.parametrize("kind, fields, message", [
    ("route-add", dict(header="cookie", values=["a"], arm="optimized"), "cannot be routed on"),
    ("route-add", dict(header="x-a", values=[], arm="optimized"), "values"),
    ("route-add", dict(header="x-a", values=["a"], arm="canary"), "baseline or optimized"),
    ("route-add", dict(header="x-a", values="a", arm="optimized"), "values"),
    ("route-add", dict(values=["a"], arm="optimized"), "header"),
    ("route-remove", dict(id="r9"), "no route 'r9'"),
    ("route-remove", dict(), "id"),
])
def test_a_bad_route_action_is_invalid_input_naming_the_field(rollout, kind, fields, message):
    from serve.dashboard.errors import InvalidInput

    with pytest.raises(InvalidInput, match=message):
        action(rollout, kind, reason="r", **fields)
    assert rollout.state().revision == 0


def test_a_route_action_on_a_moved_state_is_a_conflict(rollout):
    from serve.dashboard.errors import Conflict

    rollout.set_canary(100, actor="bob", reason="meanwhile")
    with pytest.raises(Conflict):
        action(rollout, "route-add", header="x-a", values=["a"], arm="optimized", reason="r",
               expected_revision=0)
    assert rollout.state().routes == ()
