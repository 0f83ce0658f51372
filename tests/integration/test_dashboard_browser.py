"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright (never a
downloaded browser), against the session gateway on loopback."""

from __future__ import annotations

import re
import shutil
from contextlib import contextmanager

import pytest
from playwright.sync_api import expect

from tests.serve_app import OPERATOR_TOKEN

# Chromium as the machine's closed network needs it: no background connections, no sandbox
# (tests run as root), a fresh profile per launch.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    assert executable, "Debian's chromium is missing: run ops/setup.sh"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, gw):
    """A fresh page on the dashboard, recording console errors and uncaught exceptions."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    tab.errors = []
    tab.on("console", lambda msg: tab.errors.append(msg.text) if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    tab.goto(gw.url + "/dashboard")
    expect(tab.locator("#live")).to_have_text("live")
    yield tab
    context.close()


def chart_points(tab, metric: str) -> int:
    return int(tab.get_attribute(f'[data-chart="{metric}"]', "data-points") or 0)


def test_page_loads_without_errors_and_charts_draw_after_traffic(gw, page):
    gw.set_state(canary_bp=5_000)
    arms = {gw.predict([f"chart {i}"], **{"X-Routing-Key": f"user-{i}"}).headers["x-canary-arm"]
            for i in range(12)}
    assert arms == {"baseline", "optimized"}
    # the charts refresh every 5 s: wait for one that has both arms' latest requests
    expect(page.locator('[data-chart="p99_ms"] path')).to_have_count(2, timeout=20_000)
    for metric in ("request_rate", "error_rate", "timeout_rate", "p50_ms", "p99_ms",
                   "queue_mean", "batch_mean", "cost_per_1k"):
        assert page.locator(f'[data-chart="{metric}"] svg').count() == 1
        assert chart_points(page, metric) >= 2, metric
    expect(page.locator("#share")).to_have_text("50 %")  # the status refreshes every 2 s
    assert "baseline" in page.text_content("#arms") and "optimized" in page.text_content("#arms")
    assert "test setup" in page.text_content("#audit")
    assert page.text_content("#ramp-state") in ("none", "promoted", "aborted")  # none active
    # the test app shadows nothing unless a test asks: the panel says so
    expect(page.locator("#agreement-body")).to_have_text(
        re.compile(r"^no shadow comparisons in the last 5 min"))
    # one trace's waterfall
    page.wait_for_selector("#traces tr.clickable")
    page.click("#traces tr.clickable")
    page.wait_for_selector("#waterfall .row")
    names = page.locator("#waterfall .name").all_text_contents()
    assert "POST /v1/predict" in names and "model.call" in names
    assert page.errors == []


def test_kill_button_with_the_token_flips_routing_and_is_audited(gw, page):
    gw.set_state(canary_bp=10_000)
    expect(page.locator("#share")).to_have_text("100 %")
    assert gw.predict(["before"]).headers["x-canary-arm"] == "optimized"
    page.fill("#token", OPERATOR_TOKEN)
    page.fill("#actor", "browser test")
    page.fill("#reason", "kill drill from the page")
    page.click("#kill-button")
    expect(page.locator("#action-result")).to_have_text(re.compile(r"^kill switch on"))
    state = gw.rollout().state()
    assert state.kill and state.updated_by.startswith("dashboard:browser test@")
    gw.wait_for_revision(state.revision)
    assert gw.client.get("/v1/rollout").json()["effective_percent"] == 0
    assert gw.predict(["after"]).headers["x-canary-arm"] == "baseline"
    expect(page.locator("#audit")).to_contain_text("kill drill from the page")
    expect(page.locator("#kill")).to_have_text("ON")
    # unkill sends 100 % back to the canary: the page asks first
    page.fill("#reason", "drill over")
    page.click("#unkill-button")
    page.wait_for_selector("#confirm:not([hidden])")
    assert "100%" in page.text_content("#confirm-question")
    assert gw.rollout().state().kill is True
    page.click("#confirm-yes")
    expect(page.locator("#action-result")).to_have_text(re.compile(r"^kill switch off"))
    assert gw.rollout().state().kill is False
    # the browser logs the asked-to-confirm reply (428) as a failed load; nothing else
    assert [e for e in page.errors if "status of 428" not in e] == []


def test_actions_without_the_token_are_refused(gw, page):
    before = gw.rollout().state().revision
    page.fill("#reason", "no token given")
    page.click("#kill-button")
    expect(page.locator("#action-result")).to_contain_text("refused (401)")
    assert gw.rollout().state().revision == before


def test_the_ramp_panel_shows_steps_and_gates_and_steers_the_ramp(gw, dashboard_ramp, page):
    expect(page.locator("#ramp-state")).to_have_text("running")
    expect(page.locator("#ramp-steps tr")).to_have_count(3)  # a header and two steps
    expect(page.locator("#ramp-steps")).to_contain_text("◀ current")
    expect(page.locator("#ramp-gates")).to_contain_text("p99_ms")
    expect(page.locator("#ramp-gates")).to_contain_text("4000")
    page.fill("#token", OPERATOR_TOKEN)
    page.fill("#reason", "hold while we look")
    page.click("#ramp-pause")
    expect(page.locator("#action-result")).to_have_text(re.compile(r"^ramp paused"))
    expect(page.locator("#ramp-state")).to_have_text("paused")
    assert dashboard_ramp.ramps.get().status == "paused"
    page.fill("#reason", "stop the ramp")
    page.click("#ramp-abort")
    expect(page.locator("#action-result")).to_have_text(re.compile(r"^ramp aborted"))
    assert dashboard_ramp.ramps.get().status == "aborted" and gw.rollout().state().canary_bp == 0
    expect(page.locator("#audit")).to_contain_text("stop the ramp")
    assert page.errors == []


def test_online_agreement_shows_with_its_confidence_band(gw, browser):
    gw.redeploy({}, shadow_share=1.0)  # the gw fixture restores the settings for later tests
    for i in range(8):
        assert gw.predict([f"agreement {i}"]).status_code == 200
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(gw.url + "/dashboard")
        expect(tab.locator("#agreement-body")).to_contain_text("shadow pairs agree",
                                                               timeout=20_000)
        expect(tab.locator("#agreement-body .band .range")).to_have_count(1)
    finally:
        context.close()


def test_a_gateway_without_a_token_is_read_only(gw, browser):
    gw.redeploy({}, operator_token=None)  # the gw fixture restores the token for later tests
    reply = gw.client.post("/v1/rollout/kill", json={"reason": "try"},
                           headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert reply.status_code == 403 and reply.json()["error"]["type"] == "read_only"
    assert gw.client.get("/v1/status").json()["actions"] is False
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(gw.url + "/dashboard")
        expect(tab.locator("#live")).to_have_text("live", timeout=TIMEOUT_MS)
        assert tab.text_content("#actions-mode").startswith("Read-only")
        for button in ("#set-share", "#kill-button", "#unkill-button"):
            assert tab.is_disabled(button)
    finally:
        context.close()


@contextmanager
def dashboard_at(browser, gw, width: int):
    """The dashboard in a fresh context `width` px wide, once it is live."""
    context = browser.new_context(viewport={"width": width, "height": 1000})
    try:
        tab = context.new_page()
        tab.set_default_timeout(TIMEOUT_MS)
        tab.goto(gw.url + "/dashboard")
        expect(tab.locator("#live")).to_have_text("live")
        yield tab
    finally:
        context.close()


# what a ramp evaluation writes: long, with an unbroken token that must wrap, not widen the page
LONG_REASON = ("hold: step 1 of 2 (10 %), 212 s of 600 s soak; " + "; ".join(
    f"gate {name} {value} <= {limit} pass (n=812 over the step, window 300 s)"
    for name, value, limit in [("p99_ms", 412.5, 4000), ("error_rate_delta", 0.001, 0.05),
                               ("timeout_rate_delta", 0.0, 0.02), ("confident_flip_rate", 0, 0.01)]
) + "; checks https://health.internal.example/" + "x" * 90 + " answered 200") * 2

# every panel, its width against what it holds; the page against the window; the audit rows
LAYOUT = """() => ({
  page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
  panels: [...document.querySelectorAll("main > .panel")].map(p =>
    [p.id || p.querySelector("h2").textContent.trim(), p.scrollWidth, p.clientWidth]),
  tables: [...document.querySelectorAll("main table")].filter(t => t.offsetParent).map(t =>
    [t.id, t.getBoundingClientRect().right, t.closest(".panel").getBoundingClientRect().right]),
})"""
AUDIT_ROW_MAX_PX = 48  # two lines of reason (~40 px); the long reason unclamped is 6 lines or more


@pytest.mark.parametrize("width", [1280, 1920])
def test_tables_fit_their_panels_and_audit_rows_stay_compact(gw, browser, width):
    gw.set_state(canary_bp=5_000)
    control = gw.rollout()
    _, state = control.set_canary(5_100, actor="ramp", reason=LONG_REASON)
    control.store.close()
    gw.wait_for_revision(state.revision)
    for i in range(8):
        gw.predict([f"layout {i}"], **{"X-Routing-Key": f"user-{i}"})
    with dashboard_at(browser, gw, width) as tab:
        expect(tab.locator("#audit")).to_contain_text(LONG_REASON[:40])
        expect(tab.locator("#arms")).to_contain_text("optimized", timeout=20_000)
        layout = tab.evaluate(LAYOUT)
        scroll, client = layout["page"]
        assert scroll <= client, f"the page is {scroll} px wide in a {client} px window"
        overflowing = [p for p in layout["panels"] if p[1] > p[2] + 1]
        assert overflowing == [], f"panels whose content is wider than they are: {overflowing}"
        assert {"arms", "gateways", "audit"} <= {t[0] for t in layout["tables"]}
        clipped = [t for t in layout["tables"] if t[1] > t[2] + 1]
        assert clipped == [], f"tables past their panel's right edge: {clipped}"

        long_row = tab.locator("#audit tr", has_text=LONG_REASON[:40]).first
        assert long_row.bounding_box()["height"] <= AUDIT_ROW_MAX_PX
        reason = long_row.locator("td.reason .clamp")
        assert reason.get_attribute("title") == LONG_REASON  # the full text on hover
        reason.click()  # and on click, kept across the 2 s refreshes
        expect(reason).to_have_class(re.compile(r"\bopen\b"))
        assert long_row.bounding_box()["height"] > 2 * AUDIT_ROW_MAX_PX
        tab.wait_for_timeout(2_500)
        assert "open" in tab.locator("#audit tr", has_text=LONG_REASON[:40]).first.locator(
            ".clamp").get_attribute("class")


def test_cost_chart_says_no_price_is_set_under_default_settings(gw, browser):
    """Without CANARY_DEVICE_HOUR_PRICE (the default, 0) every cost reads 0: the chart says so
    instead of drawing a flat 0, and the traffic table's cost column shows CPU seconds."""
    gw.redeploy({}, device_hour_price=0.0)  # the gw fixture restores the price for later tests
    assert gw.client.get("/v1/series?last_s=300&step_s=5").json()["device_hour_price"] == 0
    for i in range(6):
        assert gw.predict([f"unpriced {i}"]).status_code == 200
    with dashboard_at(browser, gw, 1280) as tab:
        cost = tab.locator('[data-chart="cost_per_1k"]')
        expect(cost).to_contain_text("no device price set: CANARY_DEVICE_HOUR_PRICE")
        assert cost.locator("path").count() == 0 and chart_points(tab, "cost_per_1k") == 0
        # the other charts draw as usual
        expect(tab.locator('[data-chart="request_rate"] path')).not_to_have_count(0,
                                                                               timeout=20_000)
        # the cost column shows the arm's CPU seconds per 1,000 inputs instead, never 0
        expect(tab.locator("#arms")).to_contain_text("cpu-s")
        cell = tab.locator("#arms td", has_text="cpu-s").first
        assert cell.get_attribute("title") == "no device price set: CANARY_DEVICE_HOUR_PRICE"
        assert float(cell.text_content().split()[0]) > 0
        expect(tab.locator("#arms")).to_contain_text("realized speedup (baseline ÷ optimized")
