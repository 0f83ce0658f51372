"""The shadow scores generated answers by their tokens (serve.gateway.shadow `offer_tokens`), on a
real Serve application beside the session's: the small LM as baseline, its int8 recipe as the
canary. At canary 0 % the baseline answers the regression prompts greedily and the optimized
replica scores each answer teacher-forced: the online KL divergence and top-1 token agreement
fall within `rollout verify`'s offline intervals for the same prompts; the figures reach the
windows (`rollout status`), Prometheus and the dashboard (in Chromium); a killed canary is never
scored."""

from __future__ import annotations

import io
import json
import time

import pytest

from ops import cli
from tests.integration.test_dashboard_browser import TIMEOUT_MS
from tests.integration.test_dashboard_browser import browser as browser  # the fixture

NAME = "lmshadow"
TOKENS = 16
PROMPTS = 60


@pytest.fixture(scope="module")
def app(gateway, small_lm):
    from tests.serve_app import start_beside, stop_beside

    app = start_beside(gateway, NAME, model_path=str(small_lm),
                       optimized_recipe="int8-dynamic-per-channel", shadow_share=1.0,
                       shadow_timeout_s=10.0, stream_timeout_s=30.0, max_batch_size=8)
    yield app
    stop_beside(app)


@pytest.fixture(scope="module")
def offline(small_lm):
    """`rollout verify --json` on the int8 recipe: PROMPTS prompts, TOKENS tokens each."""
    env = {"CANARY_MODEL_PATH": str(small_lm),
           "CANARY_OPTIMIZED_RECIPE": "int8-dynamic-per-channel",
           "CANARY_VERIFY_PROMPTS": str(PROMPTS),
           "CANARY_VERIFY_CONTINUATION_TOKENS": str(TOKENS)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["verify", "--quiet", "--json", "--no-store", "--no-speed"],
                        stdout=out, stderr=err)
    assert code in (0, 1), err.getvalue()
    return json.loads(out.getvalue())


def shadow(app, last_s: int = 120):
    store = app.telemetry()
    try:
        return app.windows(store).shadow(last_s)
    finally:
        store.close()


def wait_for(app, condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        stats = shadow(app)
        if condition(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"shadow statistics never showed {what}: {stats}")
        time.sleep(0.2)


def complete(app, prompt, **headers):
    name = app.client.get("/v1/models").json()["data"][0]["id"]
    response = app.client.post("/v1/completions", json={
        "model": name, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0},
        headers=headers)
    assert response.status_code == 200, response.text
    return response


def test_online_token_fidelity_falls_within_the_offline_intervals(app, offline):
    app.reset()
    before = shadow(app)
    for response in offline["responses"]:
        answered = complete(app, response["prompt_ids"])
        assert answered.headers["x-canary-arm"] == "baseline"
    n = len(offline["responses"])
    stats = wait_for(app, lambda s: s.token_responses >= before.token_responses + n,
                     f"{n} more scored answers")
    scored = stats.token_responses - before.token_responses
    kld = (stats.token_kld_sum - before.token_kld_sum) / scored
    agreement = (stats.token_agree_sum - before.token_agree_sum) / scored
    low, high = offline["kld_interval"]
    assert low <= kld <= high, (kld, offline["kld_interval"], offline["kld"])
    low, high = offline["agreement_interval"]
    assert low <= agreement <= high, (agreement, offline["agreement_interval"])
    assert stats.token_tokens - before.token_tokens <= n * TOKENS
    assert any(key.startswith("script:") for key in stats.token_slices)
    text = app.client.get("/metrics").text
    assert "canary_shadow_kld" in text and "canary_shadow_token_agreement" in text


def test_a_killed_canary_is_never_scored(app):
    app.reset()
    app.set_state(canary_bp=0, kill=True)
    before = shadow(app)
    for _ in range(3):
        complete(app, "The hospital reviewed the")
    time.sleep(1.5)  # what would have been scored has reached the windows by now
    assert shadow(app).token_responses == before.token_responses  # unsafe: not scored
    app.reset()
    complete(app, "The hospital reviewed the")
    wait_for(app, lambda s: s.token_responses > before.token_responses, "the next one scored")


def test_the_dashboard_shows_the_generation_table_and_the_scored_answers(app, browser):
    from playwright.sync_api import expect

    app.reset()
    for i in range(3):
        complete(app, f"Yesterday the council {i}")
    wait_for(app, lambda s: s.token_responses >= 3, "three scored answers")
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(app.url + "/dashboard")  # behind the app's route prefix: its own API
        expect(page.locator("#generation")).to_be_visible()
        table = page.text_content("#generation")
        assert "tokens/s" in table and "baseline" in table, table
        expect(page.locator("#token-fidelity")).to_contain_text("generated answers: ")
        text = page.text_content("#token-fidelity")
        assert "scored" in text and "KL divergence" in text and "top-1 token agreement" in text
        expect(page.locator("#token-slices")).to_contain_text("script:")
        assert errors == []
    finally:
        context.close()
