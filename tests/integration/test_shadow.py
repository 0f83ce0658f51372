"""Online shadow agreement on the real Serve app: shadowed requests are compared and recorded
(pairs, agreement by margin, cosine, a `shadow` span), a killed canary is never shadowed, shadow
work past its bound is shed, and a slow shadowed arm does not hold up any client response."""

from __future__ import annotations

import io
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from ops import cli

WINDOW = 600  # seconds: the whole test, with room to spare


def shadow_stats(gw):
    store = gw.telemetry()
    try:
        return gw.windows(store).shadow(WINDOW)
    finally:
        store.close()


def wait_for(gw, condition, what: str, timeout: float = 20.0):
    """Shadow statistics once `condition(stats)` holds (bounded: shadow calls run after the
    responses, and their counters reach Redis through the gateway's sink)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = shadow_stats(gw)
        if condition(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"shadow statistics never showed {what}: {stats}")
        time.sleep(0.1)


def total(stats) -> int:
    return stats.calls + stats.shed + stats.errors


def server_total_ms(response) -> float:
    timing = dict(part.strip().split(";dur=") for part in
                  response.headers["server-timing"].split(",") if ";dur=" in part)
    return float(timing["total"])


def test_shadowed_requests_record_agreement_and_cosine_but_never_while_killed(gw):
    gw.redeploy({}, shadow_share=1.0)
    before = shadow_stats(gw)
    store = gw.telemetry()
    try:
        optimized_calls = gw.windows(store).arm("optimized", WINDOW).calls
        texts = ["the match went to extra time", "parliament passed the budget"]
        for i in range(3):
            response = gw.predict(texts, **{"X-Request-ID": f"shadow-classify-{i}"})
            assert response.status_code == 200 and response.json()["arm"] == "baseline"
        for i in range(2):
            response = gw.client.post("/v1/predict", json={"inputs": texts, "task": "embed"},
                                      headers={"X-Request-ID": f"shadow-embed-{i}"})
            assert response.status_code == 200
        stats = wait_for(gw, lambda s: total(s) >= total(before) + 5, "5 more shadow calls")
        assert stats.calls - before.calls == 5 and stats.errors == before.errors
        assert stats.pairs - before.pairs == 6  # 3 classify requests x 2 inputs
        assert stats.cosine_n - before.cosine_n == 4
        assert sum(pairs for _, pairs in stats.by_margin.values()) == stats.pairs
        assert 0 <= stats.lower_bound <= stats.agreement <= 1
        assert stats.cosine_mean > 0.9 and stats.cosine_p1 <= stats.cosine_mean
        # shadow calls are not model calls of any request: the arm windows did not count them
        assert gw.windows(store).arm("optimized", WINDOW).calls == optimized_calls
        _, spans = gw.wait_for_trace(store, "shadow-classify-0", "POST /v1/predict", "shadow")
        shadow = next(span for span in spans if span["name"] == "shadow")
        root = next(span for span in spans if span["name"] == "POST /v1/predict")
        assert shadow["parent_id"] == root["span_id"]
        assert shadow["attrs"]["canary.arm"] == "optimized"
        assert shadow["attrs"]["canary.shadow.of"] == "baseline"
        assert shadow["attrs"]["canary.shadow.outcome"] == "ok"
        assert shadow["attrs"]["canary.shadow.pairs"] == 2
        assert isinstance(shadow["attrs"]["canary.shadow.agreed"], bool)
        assert shadow["attrs"]["canary.shadow.margin"] >= 0
        _, spans = gw.wait_for_trace(store, "shadow-embed-0", "POST /v1/predict", "shadow")
        cosine = next(s for s in spans if s["name"] == "shadow")["attrs"]["canary.shadow.cosine"]
        assert 0.9 < cosine <= 1.0
    finally:
        store.close()
    samples = _scrape(gw)  # this gateway replica's counters since the redeploy
    assert samples.get(("canary_shadow_calls_total", "optimized", "ok"), 0) == 5
    assert sum(v for k, v in samples.items() if k[0] == "canary_shadow_pairs_total") == 6
    assert samples.get(("canary_shadow_cosine_count", "optimized", None), 0) == 4
    out = _status_json(gw)
    assert out["traffic"]["shadow"]["pairs"] >= 6
    assert out["traffic"]["shadow"]["lower_bound"] is not None

    # a killed canary is never shadowed (same deployment, to spare a redeploy)
    gw.set_state(canary_bp=0, kill=True)
    before = shadow_stats(gw)
    for i in range(4):
        assert gw.predict([f"killed {i}"]).status_code == 200
    gw.set_state(canary_bp=0, kill=False)
    assert gw.predict(["alive again"]).status_code == 200
    stats = wait_for(gw, lambda s: total(s) > total(before), "the shadow call after unkill")
    # the four requests answered while the kill switch was on started no shadow call
    assert total(stats) == total(before) + 1


def test_a_slow_shadowed_arm_neither_delays_responses_nor_escapes_the_bound(gw):
    """The optimized model takes 1.5 s per batch, shadow concurrency is 1: each response must
    come back long before 1.5 s (it never waits for its shadow call), and the requests whose
    shadow would exceed the bound are shed, not queued."""
    delay_ms = 1_500
    gw.redeploy({"optimized": {"fault_delay_ms": delay_ms}}, shadow_share=1.0,
                shadow_max_concurrency=1)
    before = shadow_stats(gw)
    totals, elapsed = [], []
    for i in range(4):
        sent = time.monotonic()
        response = gw.predict([f"slow shadow {i}"])
        elapsed.append(time.monotonic() - sent)
        assert response.status_code == 200 and response.json()["arm"] == "baseline"
        totals.append(server_total_ms(response))
    # structural, not a timing ratio: a response that waited for its shadow call would take
    # at least the injected delay
    assert max(totals) < delay_ms, totals
    assert max(elapsed) < delay_ms / 1000, elapsed
    stats = wait_for(gw, lambda s: total(s) >= total(before) + 4, "4 shadow outcomes")
    # the first shadow call was still waiting for the slow arm when the others were offered
    assert stats.shed - before.shed >= 1
    assert stats.calls - before.calls >= 1
    assert total(stats) == total(before) + 4


def _scrape(gw) -> dict[tuple, float]:
    """GET /metrics as {(sample name, arm, outcome): value}, summed over other labels."""
    response = gw.client.get("/metrics")
    assert response.status_code == 200
    samples: dict[tuple, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("arm"), sample.labels.get("outcome"))
            samples[key] = samples.get(key, 0.0) + sample.value
    return samples


def _status_json(gw) -> dict:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--redis-url", gw.redis.url, "--app", gw.settings.app_name, "status",
                     "--json", "--window", str(WINDOW)], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_a_failure_while_starting_a_shadow_never_fails_the_answered_request(caplog):
    """No Serve app needed: the gateway's guard around the shadow offer, on a bare instance."""
    from serve.gateway.deployment import Gateway
    from serve.telemetry.observe import NULL_OBSERVATION

    class BrokenWatcher:
        def view(self):
            raise RuntimeError("watcher broke")

        def stop(self, timeout=None):
            pass

    cls = Gateway.func_or_class
    gateway = cls.__new__(cls)
    gateway.watcher = BrokenWatcher()
    gateway._offer_shadow(NULL_OBSERVATION, {"arm": "baseline"}, ["x"], "classify")
    assert "starting a shadow comparison failed" in caplog.text
