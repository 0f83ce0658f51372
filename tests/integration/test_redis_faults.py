"""A Redis that answers with an error, against the real gateway: a demoted primary (READONLY),
a full memory (OOM under `noeviction`), failed snapshots (MISCONF), a busy script (BUSY), a key
of the wrong type, a paused Redis (`CLIENT PAUSE`), a state from a newer writer, a revision that
goes backwards, a client that leaves during its idempotency claim.

During each fault every request is answered (200, or 503 with Retry-After), none with a 500
and none after its deadline; once healed, the gateway follows the next state change within
2 s; the kill lands whatever Redis answers."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
import uuid

import httpx
import pytest
import redis

from rollout.redis_layout import Keys
from tests.integration.test_cli_redis import ROLLOUT
from tests.servers import free_port

FOLLOW_S = 2.0  # a healed gateway follows the next change within this
KILL_S = 1.0  # and a kill within this


def traffic(gw, n: int = 12, *, keyed: bool = True) -> list[int]:
    """`n` requests, each with a fresh Idempotency-Key (`keyed`): their statuses, after
    checking that none is a 500, a 503 says when to retry, and none outlived its deadline."""
    statuses = []
    for i in range(n):
        headers = {"X-Routing-Key": f"fault-{i}"}
        if keyed:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        started = time.monotonic()
        response = gw.predict([f"fault traffic {i}"], **headers)
        assert time.monotonic() - started < gw.settings.request_timeout_s + 1.0
        assert response.status_code in (200, 503), response.text
        if response.status_code == 503:
            assert "Retry-After" in response.headers
        statuses.append(response.status_code)
    return statuses


def arms(gw, n: int = 20) -> set[str]:
    return {gw.predict(["which arm"], **{"X-Routing-Key": f"arm-{i}"}).headers["X-Canary-Arm"]
            for i in range(n)}


def follows_next_change(gw, bp: int = 10_000) -> float:
    """Change the share as an operator; seconds until the gateway serves the new revision."""
    control = gw.rollout()
    try:
        _, after = control.set_canary(bp, actor="test", reason="after the fault")
    finally:
        control.store.close()
    started = time.monotonic()
    while True:
        served = gw.served_state()
        if served["state"]["revision"] >= after.revision and not served["stale"]:
            return time.monotonic() - started
        assert time.monotonic() - started < FOLLOW_S, f"never followed: {served}"
        time.sleep(0.02)


def routes_baseline_within(gw, seconds: float) -> None:
    started = time.monotonic()
    while arms(gw, 10) != {"baseline"}:
        assert time.monotonic() - started < seconds, "the canary kept its traffic"
        time.sleep(0.02)


def rollout_cli(gw, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env.update(REDIS_URL=gw.redis.url, CANARY_APP_NAME=gw.settings.app_name,
               ROLLOUT_ACTOR="oncall", CANARY_REDIS_TIMEOUT_S="2")
    return subprocess.run([ROLLOUT, *argv], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def admin(gw):
    client = gw.redis.admin()
    yield client
    client.close()


@contextlib.contextmanager
def fault(gw, inject, heal):
    """The fault injected for the block; healed however the block ends."""
    gw.set_state(canary_bp=10_000)
    inject()
    try:
        yield
    finally:
        heal()


def test_readonly_primary(gw, admin):
    with fault(gw, lambda: admin.execute_command("REPLICAOF", "127.0.0.1", free_port()),
               lambda: admin.execute_command("REPLICAOF", "NO", "ONE")):
        assert set(traffic(gw)) == {200}
        skipped = gw.served_state()["idempotency_skipped"]
        assert skipped.get("READONLY", 0) > 0, skipped
    assert follows_next_change(gw, 0) < FOLLOW_S


def _fill_memory(admin) -> None:
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", str(max(used // 2, 1024 * 1024)))


def test_full_memory_serves_everything_and_the_kill_still_lands(gw, admin):
    with fault(gw, lambda: _fill_memory(admin),
               lambda: admin.config_set("maxmemory", "0")):
        assert set(traffic(gw)) == {200}
        assert gw.served_state()["idempotency_skipped"].get("OOM", 0) > 0
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("filler", "x")  # Redis really refuses writes
        killed = rollout_cli(gw, "kill", "--reason", "memory full")
        assert killed.returncode == 0, killed.stderr
        routes_baseline_within(gw, KILL_S)
    assert follows_next_change(gw, 0) < FOLLOW_S


def test_failed_snapshots_misconf(gw, admin):
    gone = tempfile.mkdtemp(prefix="canary-misconf-")

    def inject():
        admin.config_set("stop-writes-on-bgsave-error", "yes")
        admin.config_set("save", "3600 1")  # the refusal applies where snapshots are on
        admin.config_set("dir", gone)
        os.rmdir(gone)  # the snapshot's temp file cannot be created: BGSAVE fails
        admin.bgsave()
        deadline = time.monotonic() + 10
        while admin.info("persistence")["rdb_last_bgsave_status"] != "err":
            assert time.monotonic() < deadline, "BGSAVE never failed"
            time.sleep(0.05)

    def heal():
        admin.config_set("stop-writes-on-bgsave-error", "no")
        admin.config_set("save", "")
        admin.config_set("dir", str(gw.redis.dir))

    with fault(gw, inject, heal):
        assert set(traffic(gw)) == {200}
        assert gw.served_state()["idempotency_skipped"].get("MISCONF", 0) > 0
    assert follows_next_change(gw, 0) < FOLLOW_S


def test_a_busy_script(gw, admin):
    looping = threading.Thread(target=_run_busy_script, args=(gw,), daemon=True)

    def inject():
        admin.config_set("busy-reply-threshold", "100")
        looping.start()
        time.sleep(0.3)  # past the threshold: every other client now gets BUSY

    def heal():
        with contextlib.suppress(redis.ResponseError):  # it may have been killed already
            gw.redis.admin().script_kill()
        looping.join(10)
        admin.config_set("busy-reply-threshold", "5000")

    with fault(gw, inject, heal):
        assert set(traffic(gw)) == {200}
        time.sleep(gw.settings.state_staleness_s + 0.5)
        served = gw.served_state()
        assert served["stale"] and served["store_errors"].get("BUSY", 0) > 0, served
        assert arms(gw, 10) == {"baseline"}
    assert follows_next_change(gw, 0) < FOLLOW_S


def _run_busy_script(gw) -> None:
    client = gw.redis.admin()
    with contextlib.suppress(redis.ResponseError):  # "Script killed by user"
        client.eval("local i = 0 while true do i = i + 1 end", 0)
    client.close()


def test_a_state_key_of_the_wrong_type(gw, admin):
    key = Keys(gw.settings.app_name).state
    saved = {}

    def inject():
        saved.update(admin.hgetall(key))
        admin.delete(key)
        admin.set(key, "not a hash")

    def heal():
        admin.delete(key)
        admin.hset(key, mapping=saved)

    with fault(gw, inject, heal):
        assert set(traffic(gw, 6)) == {200}
        deadline = time.monotonic() + 5
        while "WRONGTYPE" not in gw.served_state()["store_errors"]:
            assert time.monotonic() < deadline, gw.served_state()
            time.sleep(0.05)
    assert follows_next_change(gw, 0) < FOLLOW_S


def test_a_paused_redis(gw, admin):
    with fault(gw, lambda: admin.execute_command("CLIENT", "PAUSE", 2500, "ALL"),
               lambda: admin.execute_command("CLIENT", "UNPAUSE")):
        assert set(traffic(gw, 4)) == {200}  # each claim waits at most the socket timeout
    assert follows_next_change(gw, 0) < FOLLOW_S


def _write_raw(admin, gw, doc: dict) -> None:
    """Store `doc` as the state, as another writer would, and notify the gateways."""
    keys = Keys(gw.settings.app_name)
    admin.hset(keys.state, mapping={"revision": doc["revision"], "json": json.dumps(doc)})
    admin.publish(keys.changes, doc["revision"])


def test_a_state_from_a_newer_writer_is_followed_and_kept(gw, admin):
    state = gw.set_state(canary_bp=10_000)
    doc = {**state.model_dump(mode="json"), "kill": True, "revision": state.revision + 1,
           "canary_cohort": {"region": "eu"}}
    _write_raw(admin, gw, doc)
    routes_baseline_within(gw, KILL_S)
    for argv in (("unkill", "--yes"), ("canary", "50", "--yes"), ("kill",)):
        result = rollout_cli(gw, *argv, "--reason", "mixed versions")
        assert result.returncode == 0, result.stderr
        stored = json.loads(admin.hget(Keys(gw.settings.app_name).state, "json"))
        assert stored["canary_cohort"] == {"region": "eu"}, argv
    assert follows_next_change(gw, 0) < FOLLOW_S


def test_a_revision_that_goes_back_after_a_kill_brings_no_canary_traffic(gw, admin):
    state = gw.set_state(canary_bp=10_000, kill=True)
    lost = {**state.model_dump(mode="json"), "kill": False, "revision": state.revision - 1}
    _write_raw(admin, gw, lost)  # a failover to a replica that missed the kill
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert arms(gw, 5) == {"baseline"}
    served = gw.served_state()
    assert served["stale"] and "behind revision" in served["store_error"]
    status = rollout_cli(gw, "status")
    assert status.returncode == 0 and "the store lost writes" in status.stdout
    again = rollout_cli(gw, "kill", "--reason", "the failover lost the kill")
    assert again.returncode == 0, again.stderr
    assert "rollout: warning: the store was at revision" in again.stderr
    served = gw.wait_for_revision(state.revision + 1, timeout=FOLLOW_S)  # numbered above
    assert served["state"]["kill"] and arms(gw, 5) == {"baseline"}
    resumed = rollout_cli(gw, "unkill", "--yes", "--reason", "resume")
    assert resumed.returncode == 0, resumed.stderr
    deadline = time.monotonic() + FOLLOW_S
    while arms(gw, 10) != {"optimized"}:
        assert time.monotonic() < deadline, gw.served_state()
        time.sleep(0.02)


def test_a_client_that_leaves_during_its_claim_leaves_no_pending_record(gw, admin):
    gw.set_state(canary_bp=0)
    key = uuid.uuid4().hex
    record = Keys(gw.settings.app_name).prefix + "idem:" + key
    admin.execute_command("CLIENT", "PAUSE", 1500, "WRITE")  # the claim's SET NX waits
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{gw.url}/v1/predict", json={"inputs": ["leaving"]},
                       headers={"Idempotency-Key": key}, timeout=0.5)
    finally:
        time.sleep(1.2)  # the pause ends by itself: the claim lands after the client left
    # the request was either abandoned (its landed claim released) or, where the gateway did
    # not see the client go in time, answered and stored: never left pending
    deadline = time.monotonic() + 3.0
    while (raw := admin.get(record)) is not None and not json.loads(raw)["done"]:
        assert time.monotonic() < deadline, raw
        time.sleep(0.05)
    retry = gw.predict(["leaving"], **{"Idempotency-Key": key})
    assert retry.status_code == 200  # not 409 in progress
