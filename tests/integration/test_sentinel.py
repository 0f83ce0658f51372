"""Redis with failover: a real primary, two real replicas and three real sentinels
(`redis-server --sentinel`, Debian's redis-server), everything through a
`redis+sentinel://:password@s1,s2,s3/canary/0` URL.

- the stores work through the sentinel URL (the state store passes the shared contract), every
  durable write is acknowledged by a replica (`WAIT`), and one that cannot be (more replicas
  required than exist) fails with the clear error within its bound, in the library and the CLI;
- the primary is killed (SIGKILL) in the middle of a burst of share changes, with a `rollout
  kill` issued right after it: every change that was acknowledged is on the new primary, with
  its audit entry; a compare-and-set on a stale revision is still refused; the kill lands once
  Sentinel promotes a replica (the failover window is printed);
- a gateway's state watcher (rollout.watcher, in-process; the real Serve app through a
  failover is tests/integration/test_sentinel_gateway.py) routes through the failover: never
  an error, the optimized arm only when the state it holds allows it, and the kill reaches it;
- TLS (`rediss+sentinel://`): a TLS-only primary, replica and sentinel, through the store, the
  kill and `rollout status`.

The failover is tuned short (down-after 1 s, failover-timeout 3 s); the file takes ~25 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from rollout import Rollout, RolloutState, StateWatcher, decide
from rollout.errors import NotAcknowledged, RevisionConflict, RolloutError
from rollout.idempotency import IdempotencyRecord, RedisIdempotencyStore
from rollout.ramp.redis_store import RedisRampStore
from rollout.redis_conn import Acknowledgement
from rollout.redis_store import RedisStateStore
from rollout.telemetry.redis_store import RedisTelemetry
from serve.ray_env import free_port
from tests.integration.test_cli_redis import ROLLOUT, one_error_line
from tests.integration.test_kill_redis import HEAVY, run
from tests.servers import make_certs
from tests.store_contract import StoreContract

SERVICE = "canary"
PASSWORD = "s3ntinel-secret"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class Node:
    """One redis-server process (a data node or a sentinel) on 127.0.0.1."""

    def __init__(self, where: Path, name: str, tls: Path | None = None):
        self.port = free_port()
        self.dir = where / name
        self.dir.mkdir()
        self.tls = tls  # the folder of the CA and server certificate: TLS only
        self.proc: subprocess.Popen | None = None

    def listen(self) -> list[str]:
        """redis-server options: where to listen (TLS only, when the group speaks TLS)."""
        if self.tls is None:
            return ["--port", str(self.port)]
        return ["--port", "0", "--tls-port", str(self.port), "--tls-replication", "yes",
                "--tls-cert-file", str(self.tls / "server.crt"),
                "--tls-key-file", str(self.tls / "server.key"),
                "--tls-ca-cert-file", str(self.tls / "ca.crt"), "--tls-auth-clients", "no"]

    def start(self, *args: str) -> Node:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not found: install Debian's redis-server (ops/setup.sh)")
        self.proc = subprocess.Popen([binary, *args], cwd=self.dir, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def client(self, password: str | None = PASSWORD) -> redis.Redis:
        tls = {} if self.tls is None else {"ssl": True,
                                           "ssl_ca_certs": str(self.tls / "ca.crt")}
        return redis.Redis(port=self.port, password=password, decode_responses=True,
                           socket_timeout=2, socket_connect_timeout=2, **tls)


class SentinelGroup:
    """A primary, replicas and sentinels monitoring them as `canary` (quorum 2)."""

    def __init__(self, replicas: int = 2, sentinels: int = 3, *, tls: bool = False):
        self.where = Path(tempfile.mkdtemp(prefix="canary-sentinel-"))
        self.tls = self.where if tls else None
        if tls:
            make_certs(self.where)
        self.data = [Node(self.where, f"redis{i}", self.tls) for i in range(1 + replicas)]
        self.sentinels = [Node(self.where, f"sentinel{i}", self.tls) for i in range(sentinels)]
        self.dead_sentinel_port = free_port()  # listed first in the URL, never started

    def url(self, password: str = PASSWORD) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in
                         [self.dead_sentinel_port, *(s.port for s in self.sentinels)])
        if self.tls is None:
            return f"redis+sentinel://:{password}@{hosts}/{SERVICE}/0"
        return (f"rediss+sentinel://:{password}@{hosts}/{SERVICE}/0"
                f"?ssl_ca_certs={self.tls / 'ca.crt'}&ssl_cert_reqs=required")

    def start(self) -> SentinelGroup:
        primary = self.data[0]
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                  "--requirepass", PASSWORD, "--masterauth", PASSWORD]
        primary.start(*primary.listen(), *common)
        for node in self.data[1:]:
            node.start(*node.listen(), *common, "--replicaof", "127.0.0.1", str(primary.port))
        # sentinels read the replicas from the primary's INFO (every 10 s once started): start
        # them once the replicas are attached, so that the first INFO lists them
        self.wait_until(lambda: self._replicas_attached(), 30, "the replicas never synced")
        for node in self.sentinels:
            conf = node.dir / "sentinel.conf"
            listen = node.listen()
            conf.write_text(
                "".join(f"{name[2:]} {value}\n" for name, value in zip(
                    listen[::2], listen[1::2], strict=True))
                + f"bind 127.0.0.1\ndir {node.dir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} "
                f"{len(self.sentinels) // 2 + 1}\n"
                f"sentinel auth-pass {SERVICE} {PASSWORD}\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 2\n")
            node.start(str(conf), "--sentinel")
        self.wait_until(lambda: all(self._sees_all(s) for s in self.sentinels), 30,
                        "the sentinels never saw every replica and each other")
        return self

    def _replicas_attached(self) -> bool:
        client = self.data[0].client()
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        online = [value for key, value in info.items()
                  if key.startswith("slave") and isinstance(value, dict)
                  and value.get("state") == "online"]
        return len(online) == len(self.data) - 1

    def _sees_all(self, sentinel: Node) -> bool:
        try:
            info = sentinel.client(None).sentinel_master(SERVICE)
        except redis.RedisError:
            return False
        return (info["num-slaves"] == len(self.data) - 1
                and info["num-other-sentinels"] == len(self.sentinels) - 1)

    def primary_port(self) -> int | None:
        """The primary's port, as the first sentinel that answers names it."""
        for sentinel in self.sentinels:
            try:
                return int(sentinel.client(None).sentinel_get_master_addr_by_name(SERVICE)[1])
            except (redis.RedisError, TypeError):
                continue
        return None

    def primary_has_a_replica(self) -> bool:
        """Whether the primary has a replica that acknowledges writes (`WAIT 1`)."""
        port = self.primary_port()
        if port is None:
            return False
        client = self.node(port).client()
        try:
            return client.execute_command("WAIT", 1, 200) >= 1
        except redis.RedisError:
            return False
        finally:
            client.close()

    def node(self, port: int) -> Node:
        return next(node for node in self.data if node.port == port)

    @staticmethod
    def wait_until(check, timeout: float, what: str) -> float:
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                raise AssertionError(what)
            time.sleep(0.05)
        return time.monotonic() - started

    def cleanup(self) -> None:
        for node in [*self.sentinels, *self.data]:
            node.kill()
        shutil.rmtree(self.where, ignore_errors=True)


@pytest.fixture(scope="module")
def group():
    started = time.monotonic()
    group = SentinelGroup().start()
    print(f"\nsentinel group up in {time.monotonic() - started:.1f} s")
    yield group
    group.cleanup()


@pytest.fixture(scope="module")
def tls_group():
    """TLS only: a primary, one replica and one sentinel (quorum 1), no failover."""
    group = SentinelGroup(replicas=1, sentinels=1, tls=True).start()
    yield group
    group.cleanup()


def new_app() -> str:
    return f"sentinel-{uuid.uuid4().hex[:10]}"


def env_for(url: str, **settings: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CANARY_")}
    environ.update(REDIS_URL=url, ROLLOUT_ACTOR="alice", CANARY_REDIS_TIMEOUT_S="1", **settings)
    return environ


def cli(url: str, *argv: str, **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run([ROLLOUT, *argv], env=env_for(url, **settings),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90)


# --- through the sentinel URL, before any failover ------------------------------------------------


class TestSentinelStateStore(StoreContract):
    """The shared contract, through Sentinel, every write acknowledged by a replica."""

    @pytest.fixture
    def store(self, group):
        store = RedisStateStore(group.url(), new_app(), timeout_s=5.0,
                                ack=Acknowledgement(1, 2000))
        yield store
        store.close()


def test_every_store_works_through_the_sentinel_url(group):
    app, url = new_app(), group.url()
    ack = Acknowledgement(2, 2000)  # both replicas
    states = RedisStateStore(url, app, timeout_s=5.0, ack=ack)
    ramps = RedisRampStore(url, app, timeout_s=5.0, ack=ack)
    telemetry = RedisTelemetry(url, app, timeout_s=5.0)
    idempotency = RedisIdempotencyStore(url, app, ttl_s=60, pending_ttl_s=10, timeout_s=5.0)
    try:
        _, after = Rollout(states).set_canary(500, actor="alice", reason="through sentinel")
        states.note(ts=time.time(), actor="alice", action="note", reason="a note")
        ramps.record(ts=time.time(), actor="ramp", action="evaluate", reason="r", detail={})
        assert idempotency.claim("k1", "fp") is None
        assert idempotency.claim("k1", "fp") == IdempotencyRecord("fp", False)
        telemetry.write([])
        # acknowledged by both replicas: each has the state and the three audit entries already
        for replica in group.data[1:]:
            client = replica.client()
            assert client.hget(states.state_key, "json") == after.model_dump_json()
            assert client.xlen(states.audit_key) == 3
            client.close()
    finally:
        for each in (states, ramps, telemetry, idempotency):
            each.close()


def test_a_write_too_few_replicas_acknowledge_fails_clearly_within_its_bound(group):
    app = new_app()
    states = RedisStateStore(group.url(), app, timeout_s=5.0, ack=Acknowledgement(3, 300))
    try:
        started = time.monotonic()
        with pytest.raises(NotAcknowledged) as raised:
            Rollout(states).set_canary(500, actor="alice", reason="three replicas wanted")
        elapsed = time.monotonic() - started
        print(f"\nWAIT 3 300 with two replicas: NotAcknowledged after {elapsed * 1000:.0f} ms")
        assert elapsed < 10  # the WAIT bound, not a hang (generous: a loaded CI machine)
        message = str(raised.value)
        assert "2 of the 3 replica(s)" in message and "within 300 ms" in message
        assert "may or may not survive a failover" in message
        assert states.get().canary_bp == 500  # in effect on the primary, as the message says
    finally:
        states.close()


def test_the_cli_reports_an_unacknowledged_change_and_exits_1(group):
    app, url = new_app(), group.url()
    # the kill asks again until its retry budget is spent (a new primary may get its replica
    # back): one second of it here
    short = {"CANARY_REDIS_WAIT_REPLICAS": "3", "CANARY_REDIS_WAIT_TIMEOUT_MS": "200",
             "CANARY_KILL_RETRY_S": "1"}
    for argv in (("canary", "5", "--reason", "r"), ("kill", "--reason", "r")):
        result = cli(url, "--app", app, *argv, **short)
        assert result.returncode == 1, result
        line = one_error_line(result)
        assert "of the 3 replica(s) required acknowledged it within 200 ms" in line, line
        assert "may or may not survive a failover" in line and PASSWORD not in line
    states = RedisStateStore(url, app)
    try:  # each written once, never twice
        assert [e.action for e in states.audit()] == ["canary 0% -> 5%", "kill"]
    finally:
        states.close()


def test_the_fast_kill_through_sentinel_imports_nothing_heavy(group):
    app, url = new_app(), group.url()
    assert cli(url, "--app", app, "canary", "5", "--reason", "r").returncode == 0
    killed, modules = run(url, "kill", "--reason", "via sentinel", app=app)
    assert killed.returncode == 0, killed.stderr
    assert killed.stdout.startswith("kill switch off -> on") and not modules & HEAVY
    unkilled, modules = run(url, "unkill", "--reason", "back", app=app)
    assert unkilled.returncode == 0 and not modules & HEAVY, unkilled.stderr


def test_a_malformed_sentinel_url_is_a_usage_error_without_the_password(group):
    bad = group.url().replace(f"/{SERVICE}/0", "")
    for argv in (("status",), ("kill", "--reason", "r")):
        result = cli(bad, *argv)
        assert result.returncode == 2
        line = one_error_line(result)
        assert "no service name" in line and PASSWORD not in line


def test_a_wrong_password_is_refused_through_sentinel_without_echoing_it(group):
    started = time.monotonic()
    result = cli(group.url(password="wrong-secret"), "--app", new_app(), "kill", "--reason", "r")
    print(f"\na wrong password: refused after {time.monotonic() - started:.2f} s")
    assert result.returncode == 1
    assert time.monotonic() - started < 25  # not retried for the kill's 30 s budget
    line = one_error_line(result)
    assert "wrong-secret" not in line and "***" in line, line


def test_tls_through_sentinel_for_the_stores_and_the_fast_kill(tls_group):
    app, url = new_app(), tls_group.url()
    assert url.startswith("rediss+sentinel://") and "ssl_ca_certs=" in url
    states = RedisStateStore(url, app, timeout_s=5.0, ack=Acknowledgement(1, 2000))
    try:
        Rollout(states).set_canary(500, actor="alice", reason="over TLS")
        killed, modules = run(url, "kill", "--reason", "tls", app=app)
        assert killed.returncode == 0, killed.stderr
        assert killed.stdout.startswith("kill switch off -> on") and not modules & HEAVY
        status = cli(url, "--app", app, "status", "--json")
        assert status.returncode == 0 and '"kill": true' in status.stdout, status
        replica = tls_group.data[1].client()  # acknowledged: the replica has the kill already
        assert RolloutState.model_validate_json(replica.hget(states.state_key, "json")).kill
        replica.close()
    finally:
        states.close()


# --- the failover ------------------------------------------------------------------------------


@dataclass
class Failover:
    """What happened around one failover of the primary (the `failover` fixture)."""

    app: str
    acked: list[RolloutState] = field(default_factory=list)  # changes reported done
    failed: list[str] = field(default_factory=list)  # errors of changes not reported done
    killed_at: float = 0.0  # monotonic: the primary got SIGKILL
    kill_result: subprocess.CompletedProcess | None = None
    kill_done_after_s: float = 0.0
    decisions: int = 0
    routing_errors: list[str] = field(default_factory=list)
    unsafe_routes: list[str] = field(default_factory=list)
    max_age_s: float = 0.0
    stale_seen: bool = False
    watcher_saw_kill_after_s: float | None = None


def _burst(rollout: Rollout, record: Failover, stop: threading.Event) -> None:
    """Share changes one after another, as fast as they are acknowledged."""
    i = 0
    while not stop.is_set():
        i += 1
        try:
            _, after = rollout.set_canary(100 + i % 50, actor="burst", reason=f"step {i}")
            record.acked.append(after)
        except RolloutError as exc:  # unreachable, unacknowledged or lost to the kill: not done
            record.failed.append(type(exc).__name__)
            time.sleep(0.05)


def _route(watcher: StateWatcher, record: Failover, stop: threading.Event) -> None:
    """A gateway's routing decisions on its cached state, as requests arrive."""
    while not stop.is_set():
        try:
            view = watcher.view()
            decision = decide(view.state, f"user-{record.decisions}", stale=view.stale)
        except Exception as exc:  # noqa: BLE001 - any error is a failed request here
            record.routing_errors.append(repr(exc))
            continue
        record.decisions += 1
        record.max_age_s = max(record.max_age_s, view.age_s)
        record.stale_seen |= view.stale
        if decision.arm == "optimized" and (view.stale or view.state.kill):
            record.unsafe_routes.append(f"{view}")
        if view.state.kill and record.watcher_saw_kill_after_s is None and record.killed_at:
            record.watcher_saw_kill_after_s = time.monotonic() - record.killed_at
        time.sleep(0.002)


@pytest.fixture(scope="module")
def failover(group):
    """Kill the primary during a burst of share changes, with a watcher routing and a
    `rollout kill` issued right after the primary died."""
    record = Failover(app=new_app())
    url = group.url()
    states = RedisStateStore(url, record.app, timeout_s=1.0, ack=Acknowledgement(1, 1000))
    watched = RedisStateStore(url, record.app, timeout_s=1.0)
    watcher = StateWatcher(watched, poll_s=0.5, staleness_s=5.0)
    watcher.start()
    stop = threading.Event()
    threads = [threading.Thread(target=_burst, args=(Rollout(states), record, stop)),
               threading.Thread(target=_route, args=(watcher, record, stop))]
    old = group.node(group.primary_port())
    try:
        for thread in threads:
            thread.start()
        group.wait_until(lambda: len(record.acked) >= 20, 30, "the burst never got going")
        old.kill()
        record.killed_at = time.monotonic()
        before_kill = len(record.acked)
        record.kill_result = subprocess.run(
            [ROLLOUT, "--app", record.app, "kill", "--reason", "primary lost"],
            env=env_for(url), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=90)
        record.kill_done_after_s = time.monotonic() - record.killed_at
        group.wait_until(lambda: group.primary_port() not in (None, old.port), 30,
                         "no replica promoted")
        group.wait_until(lambda: len(record.acked) >= before_kill + 10, 30,
                         "no change acknowledged after the failover")
        group.wait_until(lambda: watcher.view().state.kill, 30, "the watcher never saw the kill")
        time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        watcher.stop()
        watched.close()
        states.close()
    print(f"\nfailover window: primary killed -> `rollout kill` (started at once) done, exit "
          f"{record.kill_result.returncode}, after {record.kill_done_after_s:.2f} s; the "
          f"watcher routed by the kill after {record.watcher_saw_kill_after_s:.2f} s")
    print(f"burst: {len(record.acked)} changes acknowledged, {len(record.failed)} not "
          f"({sorted(set(record.failed))}); routing: {record.decisions} decisions, "
          f"oldest cached state {record.max_age_s:.2f} s, stale seen: {record.stale_seen}")
    return record


def test_the_kill_issued_while_the_primary_is_down_lands_after_the_promotion(group, failover):
    result = failover.kill_result
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("kill switch off -> on"), result.stdout
    states = RedisStateStore(group.url(), failover.app, timeout_s=5.0)
    try:
        state = states.get()
        assert state.kill is True
        kills = [e for e in states.audit() if e.action == "kill"]
        assert len(kills) == 1 and kills[0].reason == "primary lost"
    finally:
        states.close()


def test_no_acknowledged_change_or_audit_entry_is_lost(group, failover):
    assert failover.acked, "nothing was acknowledged"
    states = RedisStateStore(group.url(), failover.app, timeout_s=5.0)
    try:
        audited = {e.revision: e for e in states.audit() if e.actor == "burst"}
        for after in failover.acked:
            assert states.state_at(after.revision) == after
            entry = audited[after.revision]
            assert entry.after == after and entry.reason == after.reason
        revisions = [e.revision for e in states.audit()]
        assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    finally:
        states.close()


def test_a_stale_revision_is_still_refused_after_the_failover(group, failover):
    states = RedisStateStore(group.url(), failover.app, timeout_s=5.0,
                             ack=Acknowledgement(1, 2000))
    try:
        waited = group.wait_until(group.primary_has_a_replica, 30,
                                  "the new primary never got its replica")
        print(f"\nthe new primary had a replica again {waited:.2f} s later")
        stale = failover.acked[0]
        current = states.get()
        assert current.revision > stale.revision
        with pytest.raises(RevisionConflict):
            states.compare_and_set(
                stale, stale.model_copy(update={"revision": stale.revision + 1,
                                                "canary_bp": 10_000}),
                actor="mallory", action="stale", reason="stale write")
        assert states.get() == current
        # and a fresh one goes through, acknowledged by the remaining replica
        _, after = Rollout(states).set_canary(42, actor="alice", reason="after the failover")
        assert states.get() == after
    finally:
        states.close()


def test_the_watcher_routed_through_the_failover_within_its_fail_safe(failover):
    assert failover.decisions > 100
    assert not failover.routing_errors, failover.routing_errors[:3]
    assert not failover.unsafe_routes, failover.unsafe_routes[:3]
    assert failover.watcher_saw_kill_after_s is not None, "the kill never reached the watcher"
