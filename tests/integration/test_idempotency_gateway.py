"""Idempotency-Key and admission control on the real gateway."""

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ops.load.loadtest import main as loadtest
from rollout.idempotency import IdempotencyRecord


def _post(gw, inputs, key, **headers):
    return gw.client.post("/v1/predict", json={"inputs": inputs},
                          headers={"Idempotency-Key": key, **headers})


def _wait_until_in_progress(gw, key, timeout=10.0):
    """Until the gateway has claimed `key` for a request still being served (bounded)."""
    admin = gw.redis.admin()
    try:
        deadline = time.monotonic() + timeout
        while (raw := admin.get(f"rollout:{gw.settings.app_name}:idem:{key}")) is None:
            assert time.monotonic() < deadline, f"the gateway never claimed {key}"
            time.sleep(0.02)
    finally:
        admin.close()
    assert not IdempotencyRecord.from_json(raw).done, "the slow request was answered at once"


def test_repeated_request_gets_the_same_response_once(gw):
    key = f"idem-{uuid.uuid4().hex}"
    first = _post(gw, ["same input"], key)
    again = _post(gw, ["same input"], key)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()  # same request id, arm, outputs
    assert again.headers["idempotency-status"] == "replayed"
    assert "idempotency-status" not in first.headers


def test_same_key_with_another_body_is_409(gw):
    key = f"idem-{uuid.uuid4().hex}"
    assert _post(gw, ["one"], key).status_code == 200
    reused = _post(gw, ["another"], key)
    assert reused.status_code == 409
    assert reused.json()["error"]["type"] == "idempotency_key_reused"


def test_malformed_key_is_422(gw):
    response = _post(gw, ["x"], "has spaces; and <angle> brackets")
    assert response.status_code == 422 and "Idempotency-Key" in response.json()["error"]["message"]


def test_concurrent_duplicate_is_409_in_progress_and_a_failure_frees_the_key(gw):
    gw.redeploy({"baseline": {"fault_delay_ms": 1500}})
    # the first request after a redeploy can wait seconds for the new replicas (measured: 1.5 s
    # before the gateway saw it), long enough for a duplicate to queue behind the slow request
    # and be answered as its replay: warm the path first
    assert gw.predict(["warm"]).status_code == 200
    key = f"idem-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(_post, gw, ["slow"], key)
        _wait_until_in_progress(gw, key)
        duplicate = _post(gw, ["slow"], key)
        assert duplicate.status_code == 409
        assert duplicate.json()["error"]["type"] == "idempotency_in_progress"
        assert duplicate.headers["retry-after"] == "1"
        assert slow.result().status_code == 200

    gw.redeploy({"baseline": {"fault_error": True}})
    failing = f"idem-{uuid.uuid4().hex}"
    assert _post(gw, ["x"], failing).status_code == 503
    gw.redeploy({})
    retried = _post(gw, ["x"], failing)
    assert retried.status_code == 200 and "idempotency-status" not in retried.headers


def test_overload_is_shed_with_503_and_nothing_is_lost(gw, capsys):
    gw.redeploy({"baseline": {"fault_delay_ms": 200}}, gateway_max_in_flight=4)
    code = loadtest(["--url", gw.url, "--rate", "80", "--requests", "240", "--duration", "10",
                     "--timeout", "20", "--json"])
    import json

    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, report
    assert report["lost"] == 0 and report["other"] == {}
    assert report["ok"] > 0 and report["shed_429_503"] > 0
    assert report["shed_with_retry_after"] == report["shed_429_503"]
    print(f"\n[overload] {report}")
