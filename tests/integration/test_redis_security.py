"""Redis with TLS and least-privilege ACL users (ops/redis-users.acl)."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from rollout import DeploymentReport, PermissionDenied, Rollout, StoreUnavailable, Traces
from rollout.redis_store import RedisStateStore
from rollout.telemetry.redis_store import RedisTelemetry
from tests.servers import ACL_PASSWORDS


@pytest.fixture
def app():
    return f"sec-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def stores(secured, app):
    operator = RedisStateStore(secured.url, app)
    gateway = RedisStateStore(secured.url_for("gateway"), app)
    yield operator, gateway
    operator.close()
    gateway.close()


def test_operator_changes_the_state_over_tls(stores):
    operator, _ = stores
    _, state = Rollout(operator).set_canary(500, actor="alice", reason="first 5%")
    assert operator.get() == state
    assert operator.audit()[-1].actor == "alice"


def test_gateway_reads_subscribes_and_reports_but_cannot_change_anything(stores, secured, app):
    operator, gateway = stores
    Rollout(operator).set_canary(500, actor="alice", reason="five")
    subscription = gateway.subscribe()
    try:
        assert gateway.get().canary_bp == 500
        assert gateway.state_at(1).canary_bp == 500
        gateway.report_deployment(
            DeploymentReport(gateway="gw", baseline_version="b", optimized_version="o", ts=1.0)
        )
        assert [r.gateway for r in operator.deployments()] == ["gw"]
        with pytest.raises(PermissionDenied, match="no permissions"):
            Rollout(gateway).set_canary(10_000, actor="gw", reason="sneaky")
        with pytest.raises(PermissionDenied):
            Rollout(gateway).kill(actor="gw", reason="not allowed either")
        Rollout(operator).kill(actor="alice", reason="drill")
        assert subscription.wait(2.0) is True
    finally:
        subscription.close()
    raw = redis.Redis.from_url(secured.url_for("gateway"))
    for attempt in (
        lambda: raw.xadd(f"rollout:{app}:audit", {"forged": "entry"}),
        lambda: raw.hset(f"rollout:{app}:state", "json", "{}"),
        lambda: raw.delete(f"rollout:{app}:audit"),
        lambda: raw.flushall(),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    raw.close()
    assert operator.get().kill is True and len(operator.audit()) == 2


def test_gateway_reads_what_the_dashboard_shows_but_still_writes_no_audit(stores, secured, app):
    """The dashboard reads with the gateway's user: the audit stream (newest entries) and recent
    traces; it still may not write the audit stream or read all of it in one go."""
    operator, gateway = stores
    Rollout(operator).set_canary(100, actor="alice", reason="one")
    Rollout(operator).kill(actor="bob", reason="two")
    assert [e.actor for e in gateway.audit(last=1)] == ["bob"]
    writer = RedisTelemetry(secured.url_for("gateway"), app)
    span = {"trace_id": "a" * 32, "span_id": "b" * 16, "parent_id": None, "name": "root",
            "service": "canary-gateway", "start": 1.0, "end": 2.0, "status": "ok", "error": None,
            "attrs": {"canary.request_id": "r1"}}
    writer.write([span])
    [summary] = Traces(writer).recent(5)
    assert summary.trace_id == "a" * 32 and Traces(writer).get("a" * 32)[0]["name"] == "root"
    writer.close()
    raw = redis.Redis.from_url(secured.url_for("gateway"))
    try:
        for attempt in (
            lambda: raw.xadd(f"rollout:{app}:audit", {"forged": "entry"}),
            lambda: raw.xtrim(f"rollout:{app}:audit", maxlen=0),
            lambda: raw.xrange(f"rollout:{app}:audit"),
            lambda: raw.lrange(f"rollout:{app}:elsewhere", 0, -1),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        raw.close()
    assert len(operator.audit()) == 2


def test_plain_connection_to_a_tls_server_is_unavailable_without_secrets(secured):
    url = f"redis://operator:{ACL_PASSWORDS['operator']}@127.0.0.1:{secured.port}/0"
    store = RedisStateStore(url, "sec", timeout_s=1.0)
    with pytest.raises(StoreUnavailable) as info:
        store.get()
    assert ACL_PASSWORDS["operator"] not in str(info.value)


def test_cli_with_gateway_credentials_is_refused_cleanly(secured):
    rollout_bin = Path(sys.executable).parent / "rollout"
    env = dict(os.environ, REDIS_URL=secured.url_for("gateway"))
    result = subprocess.run(
        [str(rollout_bin), "canary", "5", "--reason", "try"], env=env,
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert "may not change the rollout" in result.stderr
    assert "Traceback" not in result.stderr
    assert ACL_PASSWORDS["gateway"] not in result.stderr + result.stdout
    status = subprocess.run(
        [str(rollout_bin), "status", "--json"], env=env, capture_output=True, text=True,
        timeout=30,
    )
    assert status.returncode == 0  # reading is allowed
