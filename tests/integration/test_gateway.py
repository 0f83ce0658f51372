"""The gateway end to end: real Ray Serve, real Redis, real HTTP."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rollout import decide


def _arms(gw, keys, workers=16):
    def one(key):
        for _ in range(20):  # shed under load (503 + Retry-After): retried, as a client would
            response = gw.predict(["route me"], **{"X-Routing-Key": key})
            if response.status_code != 503 or "retry-after" not in response.headers:
                break
            time.sleep(0.05)
        assert response.status_code == 200, response.text
        return key, response.json()["arm"]

    with ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(one, keys))


def test_predict_answers_with_contract_fields_and_headers(gw):
    response = gw.predict(
        ["The new GPU doubles inference speed", "A draw"], **{"X-Request-ID": "req-42"}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["request_id"] == "req-42"
    assert body["arm"] == "baseline" and body["fallback"] is False
    assert body["model_version"].startswith("fp32-")
    assert len(body["outputs"]) == 2
    for output in body["outputs"]:
        assert output["label"] in gw.settings.labels
        assert set(output["scores"]) == set(gw.settings.labels)
    assert response.headers["x-request-id"] == "req-42"
    assert response.headers["x-canary-arm"] == "baseline"
    timing = response.headers["server-timing"]
    for stage in ("preprocess", "queue", "model", "postprocess", "gateway", "total"):
        assert f"{stage};dur=" in timing
    assert 'batch;desc="requests=' in timing


def test_embed_returns_unit_vectors(gw):
    response = gw.client.post("/v1/predict", json={"inputs": ["a", "b c"], "task": "embed"})
    assert response.status_code == 200
    vectors = [out["embedding"] for out in response.json()["outputs"]]
    assert len(vectors) == 2 and len(vectors[0]) == 32
    assert abs(sum(v * v for v in vectors[0]) - 1.0) < 1e-3


def test_share_zero_sends_everything_to_baseline(gw):
    arms = _arms(gw, [f"zero-{i}" for i in range(200)])
    assert set(arms.values()) == {"baseline"}


def test_share_hundred_sends_everything_to_optimized(gw):
    gw.set_state(canary_bp=10_000)
    response = gw.predict(["x"])
    assert response.json()["model_version"] == gw.served_state()["serving"]["optimized"]
    assert response.json()["model_version"].startswith("bf16-")  # tests.serve_app pins it
    arms = _arms(gw, [f"all-{i}" for i in range(200)])
    assert set(arms.values()) == {"optimized"}


def test_quarter_share_over_2000_distinct_keys(gw):
    state = gw.set_state(canary_bp=2_500)
    keys = [f"user-{i}" for i in range(2_000)]
    arms = _arms(gw, keys, workers=32)
    share = sum(arm == "optimized" for arm in arms.values()) / len(keys)
    assert 0.22 <= share <= 0.28, share
    # and each key went exactly where the policy says it should
    for key, arm in arms.items():
        assert decide(state, key, salt=gw.settings.routing_salt).arm.value == arm


def test_more_threads_than_keepalive_slots_keep_their_connections(gw, caplog):
    """A burst from more threads than an httpx pool keeps alive (20): a pool shared by them
    closes and reopens about one connection per request, and closes some just handed to
    another thread under it (EBADF, tests.thread_clients). Each thread's own client keeps
    one connection throughout; HAProxy closing an idle one meanwhile costs a reconnect."""
    workers, keys = 32, [f"burst-{i}" for i in range(640)]
    with caplog.at_level(logging.DEBUG, logger="httpcore.connection"):
        arms = _arms(gw, keys, workers=workers)  # every key answered 200
    connects = [r for r in caplog.records if r.getMessage().startswith("connect_tcp.started")]
    assert len(arms) == len(keys)
    assert len(connects) <= 2 * workers, f"{len(connects)} connections for {len(keys)} requests"


def test_sticky_and_monotone_widening(gw):
    keys = [f"sticky-{i}" for i in range(300)]
    gw.set_state(canary_bp=1_000)
    first = _arms(gw, keys)
    assert _arms(gw, keys) == first  # same share, same arms
    gw.set_state(canary_bp=3_000)
    wider = _arms(gw, keys)
    canaries_before = {k for k, arm in first.items() if arm == "optimized"}
    canaries_after = {k for k, arm in wider.items() if arm == "optimized"}
    assert canaries_before and canaries_before < canaries_after


def test_kill_switch_beats_share_and_unkill_restores(gw):
    gw.set_state(canary_bp=10_000, kill=True)
    assert set(_arms(gw, [f"k-{i}" for i in range(100)]).values()) == {"baseline"}
    served = gw.served_state()
    assert served["state"]["kill"] is True and served["effective_percent"] == 0
    gw.set_state(canary_bp=10_000, kill=False)
    assert set(_arms(gw, [f"k-{i}" for i in range(100)]).values()) == {"optimized"}


def test_redis_outage_fails_safe_to_baseline_and_recovers(gw):
    gw.set_state(canary_bp=10_000)
    gw.redis.stop()
    try:
        # Serving goes on throughout; once the cached state is stale everything is baseline.
        deadline = time.monotonic() + 15
        while not gw.served_state()["stale"]:
            assert gw.predict(["during outage"]).status_code == 200
            assert time.monotonic() < deadline, "gateway never noticed the outage"
            time.sleep(0.1)
        served = gw.served_state()
        assert served["store_error"] and "cannot reach Redis" in served["store_error"]
        assert served["effective_percent"] == 0
        assert set(_arms(gw, [f"out-{i}" for i in range(50)]).values()) == {"baseline"}
    finally:
        gw.redis.start()  # same port, empty database
    # Back, but behind the revision routed by (it lost its data): still all baseline, since
    # the lost state may have held a kill, until a change numbered above what the gateway saw.
    events = _reported_events(gw, "went back from revision")
    assert any("store restarted without its data" in e for e in events)
    served = gw.served_state()
    assert served["stale"] and "behind revision" in served["store_error"]
    assert set(_arms(gw, [f"back-{i}" for i in range(20)]).values()) == {"baseline"}
    gw.set_state(canary_bp=10_000)  # numbered above the gateway's report: followed
    served = gw.served_state()
    assert served["store_error"] is None
    assert set(_arms(gw, [f"back-{i}" for i in range(50)]).values()) == {"optimized"}


def _reported_events(gw, fragment: str, timeout: float = 20.0) -> list[str]:
    """The events gateways reported to operators, once one contains `fragment` (bounded)."""
    control = gw.rollout()
    deadline = time.monotonic() + timeout
    while True:
        events = [e for r in control.store.deployments() for e in r.events]
        if any(fragment in e for e in events):
            return events
        assert time.monotonic() < deadline, f"no reported event with {fragment!r}: {events}"
        time.sleep(0.2)


def test_redis_paused_serving_goes_on_fails_safe_and_recovers(gw):
    gw.set_state(canary_bp=10_000)
    gw.redis.pause()
    try:
        deadline = time.monotonic() + 20
        while not gw.served_state()["stale"]:
            started = time.monotonic()
            assert gw.predict(["while paused"]).status_code == 200
            assert time.monotonic() - started < 2.0  # Redis is never on the request path
            assert time.monotonic() < deadline, "gateway never noticed the pause"
        assert set(_arms(gw, [f"p-{i}" for i in range(30)]).values()) == {"baseline"}
    finally:
        gw.redis.resume()
    deadline = time.monotonic() + 20
    while gw.served_state()["stale"]:
        assert time.monotonic() < deadline, "gateway never recovered from the pause"
        time.sleep(0.1)
    assert set(_arms(gw, [f"p-{i}" for i in range(30)]).values()) == {"optimized"}
    events = _reported_events(gw, "routed all to baseline meanwhile")
    assert any("store reachable again" in e for e in events)


def test_failed_canary_falls_back_to_baseline(gw):
    gw.redeploy({"optimized": {"fault_error": True}})
    gw.set_state(canary_bp=10_000)
    response = gw.predict(["will fall back"])
    assert response.status_code == 200
    body = response.json()
    assert body["fallback"] is True and body["arm"] == "baseline"
    assert response.headers["x-canary-arm"] == "baseline"


def test_failed_baseline_is_not_retried_on_canary(gw):
    gw.redeploy({"baseline": {"fault_error": True}})
    response = gw.predict(["baseline is broken"])
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert error["type"] == "model_unavailable" and "baseline" in error["message"]


def test_model_timeout_is_504(gw):
    gw.redeploy({"baseline": {"fault_delay_ms": 8_000}})
    started = time.monotonic()
    response = gw.predict(["too slow"])
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout"
    assert time.monotonic() - started < gw.settings.request_timeout_s + 2


def test_a_canary_that_cannot_answer_within_its_share_gives_the_request_to_baseline(gw):
    from tests.integration.test_gateway_telemetry import delta, scrape

    gw.redeploy({"optimized": {"fault_delay_ms": 400}})
    gw.set_state(canary_bp=10_000)
    for i in range(3):  # the optimized arm's forwards are measured: ~0.4 s each
        assert gw.predict(["warm"], **{"X-Routing-Key": f"w-{i}"}).json()["arm"] == "optimized"
    before = scrape(gw)
    # a 600 ms deadline: the canary's share (0.5) is 300 ms, less than its forward takes
    response = gw.predict(["short deadline"], **{"X-Routing-Key": "late",
                                                 "X-Request-Timeout-Ms": "600"})
    assert response.status_code == 200, response.text
    assert response.json()["arm"] == "baseline" and response.json()["fallback"] is True
    after = scrape(gw)
    calls = "canary_model_calls_total"
    assert delta(before, after, calls, arm="optimized", outcome="timeout") == 0  # never tried
    assert delta(before, after, calls, arm="baseline", outcome="ok") == 1


def test_a_fallback_that_cannot_answer_in_the_time_left_is_shed_not_timed_out(gw):
    gw.redeploy({"baseline": {"fault_delay_ms": 500}, "optimized": {"fault_error": True}})
    for _ in range(3):  # the baseline's forwards are measured: ~0.5 s each
        assert gw.predict(["warm"]).status_code == 200
    gw.set_state(canary_bp=10_000)
    # the canary fails at once; 400 ms is too little for the baseline's retry
    response = gw.predict(["short deadline"], **{"X-Routing-Key": "late",
                                                 "X-Request-Timeout-Ms": "400"})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "overloaded"
    assert "Retry-After" in response.headers


def test_batching_limits_change_live(gw):
    gw.redeploy({"baseline": {"max_batch_size": 1}})
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: gw.predict([f"t{i}"]), range(16)))
    assert all(r.status_code == 200 for r in responses)
    assert all('requests=1 ' in r.headers["server-timing"] for r in responses)


def _shared(response) -> int:
    return int(re.search(r"call=(\d+)", response.headers["server-timing"]).group(1))


def test_concurrent_requests_share_model_calls_and_each_gets_its_own_answer(gw):
    texts = [f"request number {i} about {topic}" for i, topic in
             enumerate(["football", "elections", "markets", "vaccines", "films", "chips"])]
    alone = {t: gw.predict([t]).json()["outputs"][0] for t in texts}
    # one call open per arm, each batch slowed: requests arriving meanwhile wait and go together
    gw.redeploy({"baseline": {"fault_delay_ms": 300}}, gateway_coalesce_calls=1)
    with ThreadPoolExecutor(len(texts)) as pool:
        responses = list(pool.map(lambda t: gw.predict([t]), texts))
    assert [r.status_code for r in responses] == [200] * len(texts)
    assert max(_shared(r) for r in responses) > 1
    for text, response in zip(texts, responses, strict=True):
        got = response.json()["outputs"][0]
        assert got["label"] == alone[text]["label"]
        assert got["scores"] == pytest.approx(alone[text]["scores"], abs=1e-4)


def test_without_coalescing_every_request_is_its_own_model_call(gw):
    gw.redeploy({"baseline": {"fault_delay_ms": 300}}, gateway_coalesce_calls=0)
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda i: gw.predict([f"t{i}"]), range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    assert [_shared(r) for r in responses] == [1] * 6
    assert max(int(re.search(r"requests=(\d+)", r.headers["server-timing"]).group(1))
               for r in responses) > 1  # the model replica still batches them


BAD_422 = [
    b'{"inputs": [',
    b"[]",
    b'"just a string"',
    b"{}",
    b'{"inputs": []}',
    b'{"inputs": [""]}',
    b'{"inputs": ["ok", "   "]}',
    b'{"inputs": [1, 2]}',
    b'{"inputs": "not a list"}',
    b'{"inputs": [["nested"]]}',
    b'{"inputs": [null]}',
    b'{"inputs": ["a"], "task": "translate"}',
    b'{"inputs": ["a"], "extra": true}',
    b"\xff\xfe not utf-8",
    b"",
]


@pytest.mark.parametrize("body", BAD_422)
def test_bad_input_is_422_with_json_error(gw, body):
    response = gw.client.post(
        "/v1/predict", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_input" and error["message"] and error["request_id"]


@pytest.mark.parametrize(
    "inputs",
    [
        ["x"] * 9,  # more items than max_items=8
        ["y" * 201],  # one item over max_item_chars=200
        ["z" * 199] * 5,  # total over max_total_chars=800
    ],
    ids=["items", "item-chars", "total-chars"],
)
def test_over_limits_is_413(gw, inputs):
    response = gw.predict(inputs)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "input_too_large"


def test_huge_body_is_413_without_parsing(gw):
    body = json.dumps({"inputs": ["w" * 1_000_000]}).encode()
    response = gw.client.post("/v1/predict", content=body)
    assert response.status_code == 413


def test_malformed_request_id_is_replaced_not_echoed(gw):
    response = gw.predict(["x"], **{"X-Request-ID": "bad id <script>"})
    assert response.status_code == 200
    rid = response.json()["request_id"]
    assert rid != "bad id <script>" and rid.isalnum()
    assert rid in response.headers.get_list("x-request-id")


def test_service_endpoints(gw):
    assert gw.client.get("/healthz").json() == {"status": "ok"}
    ready = gw.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["models"] == {"baseline": True, "optimized": True}
    served = gw.served_state()
    assert served["serving"]["baseline"] == served["state"]["baseline_version"]
    assert served["serving"]["optimized"] == served["state"]["optimized_version"]
    missing = gw.client.get("/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    wrong = gw.client.get("/v1/predict")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "method_not_allowed"


def test_gateway_reports_what_it_serves_and_the_share_is_bound_to_it(gw):
    control = gw.rollout()
    served = gw.served_state()
    reports = control.store.deployments()
    assert {r.optimized_version for r in reports} == {served["serving"]["optimized"]}
    _, state = control.set_canary(500, actor="test", reason="bind")
    assert state.optimized_version == served["serving"]["optimized"]


def test_share_set_for_another_optimized_version_routes_nothing(gw):
    control = gw.rollout()
    before = control.state()
    bound_elsewhere = before.model_copy(update=dict(
        revision=before.revision + 1, canary_bp=10_000,
        optimized_version="int8-dynamic-0ld0ld0ld0ld",
    ))
    control.store.compare_and_set(before, bound_elsewhere, actor="test", action="canary",
                                  reason="a share approved for an older model")
    served = gw.wait_for_revision(bound_elsewhere.revision)
    assert served["effective_percent"] == 0
    assert "another optimized version" in served["routing"]
    assert set(_arms(gw, [f"v-{i}" for i in range(50)]).values()) == {"baseline"}
    gw.set_state(canary_bp=10_000)  # a new share binds the version gateways serve now
    assert set(_arms(gw, [f"v-{i}" for i in range(50)]).values()) == {"optimized"}


def test_out_of_memory_splits_batches_and_an_input_that_never_fits_is_413(gw):
    gw.redeploy({"baseline": {"fault_oom_tokens": 48}})
    # many short inputs at once: forwards over 48 padded tokens fail and are split until they fit
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: gw.predict([f"short {i}", f"tiny {i}"]), range(16)))
    assert [r.status_code for r in responses] == [200] * 16
    # one input longer than 48 tokens cannot fit even alone: the request fails, naming it
    long_text = " ".join(["a"] * 60)  # 62 tokens in 119 characters
    response = gw.predict(["fits", long_text])
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["type"] == "input_too_large" and "[1]" in error["message"]
    assert "out of memory" in error["message"]
    assert gw.predict(["still serving"]).status_code == 200  # the replica did not crash


def test_retry_budget_stops_a_sick_canary_from_doubling_the_load(gw):
    gw.redeploy({"optimized": {"fault_error": True}}, retry_budget_ratio=0.0,
                retry_budget_min_per_s=0.1)  # one retry per 10 s window
    gw.set_state(canary_bp=10_000)
    responses = [gw.predict([f"sick {i}"]) for i in range(4)]
    assert responses[0].status_code == 200 and responses[0].json()["fallback"] is True
    for response in responses[1:]:
        assert response.status_code == 503
        assert "retry budget" in response.json()["error"]["message"]


def _threads(arm: str) -> int:
    from ray import serve

    return serve.get_deployment_handle(arm, app_name="canary").info.remote().result()["threads"]


def _threads_become(expected: dict[str, int], timeout: float = 15.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while (found := {arm: _threads(arm) for arm in expected}) != expected:
        assert time.monotonic() < deadline, f"threads {found}, expected {expected}"
        time.sleep(0.2)
    return found


def _pid(arm: str) -> int:
    from ray import serve

    return serve.get_deployment_handle(arm, app_name="canary").info.remote().result()["pid"]


def test_a_redeploy_of_live_settings_alone_reconfigures_the_models_in_place(gw):
    """A fault switched on and off again is a reconfiguration of the running model replicas (no
    model reloaded); a changed setting they are built with replaces them."""
    pids = {arm: _pid(arm) for arm in ("baseline", "optimized")}
    gw.redeploy({"baseline": {"fault_error": True}})
    assert gw.predict(["the fault is on"]).status_code == 503
    gw.redeploy({})
    assert gw.predict(["a"]).status_code == 200
    assert {arm: _pid(arm) for arm in pids} == pids
    gw.redeploy({}, max_batch_tokens=gw.settings.max_batch_tokens + 1)
    assert not {_pid(arm) for arm in pids} & set(pids.values())


def test_model_threads_follow_the_share_and_the_kill_switch(gw):
    """serve.replica.thread_share in the real app: each model replica watches the rollout state."""
    import os

    cores = os.cpu_count()
    if cores < 2:
        pytest.skip("one core: both arms keep their one thread")
    gw.redeploy({}, torch_threads=0)  # threads follow the share unless pinned
    _threads_become({"baseline": cores, "optimized": 1})  # 0 %
    gw.set_state(canary_bp=10_000)
    _threads_become({"baseline": 1, "optimized": cores})  # promoted
    assert gw.predict(["still answers after the resize"]).status_code == 200
    gw.set_state(canary_bp=10_000, kill=True)
    _threads_become({"baseline": cores, "optimized": 1})  # the kill switch beats the share
