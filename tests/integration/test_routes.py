"""Header routes and the operator override end to end: the real app (real Ray Serve, real
Redis with ACL users, real HTTP), routes written by the audited path as an operator does; and
`rollout kill` and the operator guide's redis-cli kill on a state that holds routes."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollout import RolloutState, decide
from tests.integration.test_kill_redis import (
    HEAVY,
    new_app,
    ok,
    readme_kill,
    redis_cli,
    run,
    store,  # noqa: F401  (fixture)
    wait_for_kill,
    watcher,  # noqa: F401  (fixture)
)
from tests.serve_app import OPERATOR_TOKEN

INTERNAL = {"X-User-Group": "internal"}
BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture
def routes(gw):
    """The operator's audited path; every route is removed again afterwards."""
    control = gw.rollout()
    yield control
    state = control.state()
    for route in state.routes:
        state = control.remove_route(route.id, actor="test", reason="test cleanup")[1]
    control.store.close()
    gw.wait_for_revision(state.revision)


def model_calls(gw) -> float:
    """The gateway's model calls so far, all arms and outcomes (GET /metrics)."""
    text = gw.client.get("/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == "canary_model_calls_total")


def answered(response, arm: str, reason: str) -> None:
    assert response.status_code == 200, response.text
    assert (response.json()["arm"], response.json()["routing"]) == (arm, reason)
    assert (response.headers["x-canary-arm"], response.headers["x-canary-reason"]) == (arm, reason)


def test_a_route_sends_its_requests_to_optimized_at_zero_share_until_removed(gw, routes):
    _, state = routes.add_route("X-User-Group", ["internal", "qa"], "optimized", actor="test",
                                reason="QA on the candidate")
    served = gw.wait_for_revision(state.revision)
    assert served["routes"] == [{"id": "r1", "header": "x-user-group",
                                 "values": ["internal", "qa"], "arm": "optimized"}]
    assert served["routes_applied"] is True
    for i in range(10):
        answered(gw.predict([f"qa {i}"], **INTERNAL, **{"X-Routing-Key": f"k{i}"}),
                 "optimized", "route:r1")
    answered(gw.predict(["qa"], **{"x-user-group": "qa", "X-Request-ID": "routed-1"}),
             "optimized", "route:r1")
    telemetry = gw.telemetry()
    try:  # the trace's route span says which route decided
        _, spans = gw.wait_for_trace(telemetry, "routed-1", "route")
    finally:
        telemetry.close()
    route_span = next(span for span in spans if span["name"] == "route")
    assert route_span["attrs"]["canary.reason"] == "route:r1"
    for value in ("Internal", "internal,qa", "other"):  # exact values only
        answered(gw.predict(["x"], **{"X-User-Group": value}), "baseline", "share")
    answered(gw.predict(["no header"]), "baseline", "share")

    # removed: the same requests are routed by the hashed share again, key by key
    _, state = routes.remove_route("r1", actor="test", reason="QA done")
    gw.wait_for_revision(state.revision)
    state = gw.set_state(canary_bp=5_000)
    assert gw.served_state()["routes"] == []
    for i in range(20):
        key = f"after-{i}"
        response = gw.predict(["x"], **INTERNAL, **{"X-Routing-Key": key})
        expected = decide(state, key, salt=gw.settings.routing_salt)
        answered(response, expected.arm.value, expected.reason.value)
    assert [e.action for e in routes.store.audit(last=4)][:2] == ["route-add", "route-remove"]


def test_the_kill_switch_beats_routes_and_overrides(gw, routes):
    routes.add_route("x-user-group", ["internal"], "optimized", actor="test", reason="QA")
    state = gw.set_state(canary_bp=10_000, kill=True)
    assert gw.served_state()["routes_applied"] is False
    answered(gw.predict(["x"], **INTERNAL), "baseline", "kill-switch")
    overridden = gw.predict(["x"], **BEARER, **{"X-Canary-Arm-Override": "optimized"})
    answered(overridden, "baseline", "kill-switch")  # and the response says why
    assert state.kill and gw.served_state()["routing"] == "kill switch on: all baseline"


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token-0123456789", f"Basic {OPERATOR_TOKEN}",
                                  OPERATOR_TOKEN])
def test_a_forged_override_is_403_and_calls_no_model(gw, auth):
    assert gw.predict(["an ordinary request"]).status_code == 200
    before = model_calls(gw)
    assert before > 0  # the counter is there and counts
    headers = {"X-Canary-Arm-Override": "optimized", "X-Request-ID": "forged-1"}
    if auth is not None:
        headers["Authorization"] = auth
    response = gw.predict(["pick my arm"], **headers)
    assert response.status_code == 403
    assert response.json() == {"error": {
        "type": "override_not_allowed", "request_id": "forged-1",
        "message": "X-Canary-Arm-Override needs 'Authorization: Bearer <operator token>'"}}
    assert model_calls(gw) == before


def test_an_override_with_the_operator_token_picks_the_arm(gw):
    for arm in ("optimized", "baseline"):
        response = gw.predict(["pinned"], **BEARER, **{"X-Canary-Arm-Override": arm})
        answered(response, arm, "override")
        served = gw.served_state()["serving"][arm]
        assert response.json()["model_version"] == served
    before = model_calls(gw)
    bad = gw.predict(["x"], **BEARER, **{"X-Canary-Arm-Override": "canary"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_override"
    assert "baseline or optimized" in bad.json()["error"]["message"]
    assert model_calls(gw) == before


def test_a_gateway_without_an_operator_token_honours_no_override(gw):
    gw.redeploy({}, operator_token=None)  # the gw fixture restores the token for later tests
    response = gw.predict(["x"], **BEARER, **{"X-Canary-Arm-Override": "optimized"})
    assert response.status_code == 403
    assert "no operator token" in response.json()["error"]["message"]


# --- `rollout kill` and the operator guide's redis-cli kill keep the routes ------------------


def test_the_cli_kill_keeps_the_routes(redis_url, store):  # noqa: F811
    app = new_app()
    ok(run(redis_url, "route", "add", "--header", "X-User-Group=internal,qa", "--arm",
           "optimized", "--reason", 'QA "v2" ✓', app=app)[0])
    before = store(app).get()
    killed, modules = run(redis_url, "kill", "--reason", "p99", app=app)
    assert ok(killed).startswith("kill switch off -> on") and not modules & HEAVY
    unkilled, modules = run(redis_url, "unkill", "--reason", "fixed", app=app)
    assert ok(unkilled).startswith("kill switch on -> off") and not modules & HEAVY
    after = store(app).get()
    assert after.revision == 3 and after.routes == before.routes and len(after.routes) == 1
    listed = ok(run(redis_url, "route", "list", app=app)[0])
    assert listed.splitlines()[1].startswith("r1  x-user-group  internal,qa  optimized")


@pytest.mark.parametrize("with_routes", [False, True])
def test_the_readme_redis_cli_kill_keeps_the_routes(redis_url, store, watcher, with_routes):  # noqa: F811
    app = new_app()
    if with_routes:
        ok(run(redis_url, "route", "add", "--header", "x-tenant=acme", "--arm", "baseline",
               "--reason", "pinned", app=app)[0])
    else:
        ok(run(redis_url, "canary", "5", "--reason", "first", app=app)[0])
    before = store(app).get()
    seen = watcher(app)
    flipped = redis_cli(readme_kill(app), redis_url)
    assert flipped.returncode == 0 and flipped.stdout.strip() == "2", flipped
    wait_for_kill(seen, 2)
    state: RolloutState = store(app).get()  # read back through pydantic (cjson rewrote it)
    assert state.kill and [r.id for r in state.routes] == [r.id for r in before.routes]
    assert [(r.header, r.values, r.arm) for r in state.routes] == [
        (r.header, r.values, r.arm) for r in before.routes]
    unkilled, modules = run(redis_url, "unkill", "--reason", "recorded", app=app)
    assert ok(unkilled) and store(app).get().routes == state.routes


# --- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_lists_adds_and_removes_routes(gw, routes, dashboard_page):
    from playwright.sync_api import expect

    page = dashboard_page
    table = page.locator("#routes")
    expect(table).to_contain_text("none: every request is routed by the share")
    routes.add_route("x-user-group", ["internal", "qa"], "optimized", actor="test",
                     reason="QA on the candidate")
    expect(table.locator("tr").nth(1)).to_contain_text("r1x-user-groupinternal, qaoptimized")
    expect(table).to_contain_text("QA on the candidate")
    expect(table).to_contain_text("applied")

    page.fill("#token", OPERATOR_TOKEN)
    page.fill("#reason", "pin acme")
    page.fill("#route-header", "X-Tenant=acme, globex")
    page.select_option("#route-arm", "baseline")
    page.click("#route-add")
    expect(page.locator("#action-result")).to_have_text(
        "route r2: x-tenant = acme|globex -> baseline added")
    expect(table.locator("tr").nth(2)).to_contain_text("r2x-tenantacme, globexbaseline")
    page.fill("#reason", "QA done")
    page.fill("#route-id", "r1")
    page.click("#route-remove")
    expect(page.locator("#action-result")).to_contain_text("route r1: x-user-group")
    expect(table).not_to_contain_text("x-user-group")
    entry = routes.store.audit(last=1)[0]
    assert (entry.action, entry.reason) == ("route-remove", "QA done")
    assert entry.actor.startswith("dashboard:")
    assert page.errors == []


def test_route_actions_over_http_need_the_token_and_name_bad_fields(gw, routes):
    def post(kind, body, headers=BEARER):
        return gw.client.post(f"/v1/rollout/{kind}", json=body, headers=headers)

    body = {"header": "x-user-group", "values": ["internal"], "arm": "optimized",
            "reason": "QA"}
    assert post("route-add", body, headers={}).status_code == 401
    assert routes.state().routes == ()
    bad = post("route-add", dict(body, header="authorization"))
    assert bad.status_code == 422 and "cannot be routed on" in bad.json()["error"]["message"]
    added = post("route-add", body)
    assert added.status_code == 200 and added.json()["state"]["routes"][0]["id"] == "r1"
    unknown = post("route-remove", {"id": "r5", "reason": "x"})
    assert unknown.status_code == 422 and "no route 'r5'" in unknown.json()["error"]["message"]


@pytest.fixture
def dashboard_page(gw):
    """The dashboard in Debian's headless Chromium (as tests/integration/test_dashboard_browser)."""
    import shutil

    from playwright.sync_api import expect, sync_playwright

    from tests.integration.test_dashboard_browser import FLAGS, TIMEOUT_MS

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    assert executable, "Debian's chromium is missing: run ops/setup.sh"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        tab = browser.new_page()
        tab.set_default_timeout(TIMEOUT_MS)
        tab.errors = []
        tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))
        tab.goto(gw.url + "/dashboard")
        expect(tab.locator("#live")).to_have_text("live")
        yield tab
        browser.close()
