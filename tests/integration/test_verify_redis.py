"""`rollout verify` stores its verdict in a real Redis, against the two versions."""

from __future__ import annotations

import io
import json

import pytest

from ops import cli
from rollout.redis_store import RedisStateStore
from serve.common.regression import load_set
from tests.tiny_model import make_tiny_encoder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny"))


def test_verdict_is_stored_in_redis(redis_url, tiny, monkeypatch):
    monkeypatch.setenv("CANARY_MODEL_PATH", str(tiny))
    monkeypatch.setenv("CANARY_VERIFY_BATCH_SIZES", "2")
    monkeypatch.setenv("CANARY_VERIFY_SPEED_BATCH", "2")
    monkeypatch.setenv("CANARY_VERIFY_SPEED_INPUTS", "4")
    out, err = io.StringIO(), io.StringIO()

    code = cli.main(["--redis-url", redis_url, "--app", "verify-test", "--actor", "ci",
                     "verify", "--recipe", "bf16", "--limit", "12", "--json", "--quiet"],
                    stdout=out, stderr=err)

    assert code in (0, 1), err.getvalue()  # 12 inputs cannot prove a 99 % lower bound
    doc = json.loads(out.getvalue())
    assert doc["stored"] is True
    store = RedisStateStore(redis_url, "verify-test")
    try:
        verdict = store.get_verdict(doc["baseline_version"], doc["optimized_version"])
        assert verdict is not None
        assert verdict.passed == doc["passed"] == (code == 0)
        held_out = len(load_set().limited(12).held_out())  # judged: the held-out split
        assert verdict.agreement == doc["agreement"] and verdict.n == held_out == 3
        assert verdict.split == "held-out" and verdict.thresholds is not None
        assert verdict.by == "ci" and verdict.recipe == "bf16"
        assert store.get_verdict(doc["optimized_version"], doc["baseline_version"]) is None
        raw = store._client.hgetall("rollout:verify-test:verdicts")
        assert list(raw) == [json.dumps([doc["baseline_version"], doc["optimized_version"]])]
    finally:
        store.close()
