"""Metrics that add up across gateway replicas: each replica's own Prometheus endpoint, and the
service discovery that lists them all.

`GET /metrics` on the Serve port reaches whichever gateway replica the proxy picks, and each
replica counts only what it served: with several replicas a scrape sees a different replica's
counters each time. So, as Ray does for its own metrics (one endpoint per node, listed for
Prometheus' file discovery) and as OpenTelemetry's Prometheus exporter expects (one scrape
target per process, `service.instance.id` apart), every gateway replica:

- serves its registry on a port of its own (`ReplicaEndpoint`: prometheus_client's server in a
  daemon thread, on `metrics_host` and `metrics_port`, started in the replica's constructor and
  stopped when Serve shuts the replica down);
- registers that address with its labels (`app`, `node`, `replica`) in Redis
  (`TargetBook`: the hash `rollout:<app>:telemetry:targets`, replica id -> `Target` JSON), and
  refreshes it from the gateway's state watcher heartbeat (every 10 s); an entry not refreshed
  within `metrics_target_ttl_s` is no longer listed (and is pruned by the next refresh);
- removes it when it shuts down.

`GET /v1/metrics/targets` answers the live registrations in the format of Prometheus'
`http_sd_configs` (`discovery`), one target group per replica, so Prometheus scrapes every
replica and `sum by (arm) (...)` adds them up; a replica that restarts is a new series, so
`rate()` handles its counters starting again from zero.

Expiry is judged on wall clocks (the writer's plus the TTL, against the reader's): nodes'
clocks must agree to within a few seconds (NTP), far below the TTL. Nothing here may fail or
slow a request: registration errors are logged and retried at the next heartbeat.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from pydantic import BaseModel, Field

from rollout.clock import Clock, SystemClock
from rollout.errors import RolloutError
from rollout.redis_conn import open_client
from rollout.redis_layout import Keys
from rollout.redis_store import call_redis
from rollout.settings import StateSettings, TelemetrySettings
from serve.common.errors import GatewayError

log = logging.getLogger("canary.metrics_targets")

PORT_TRIES = 100  # ports tried upward from a fixed `metrics_port`
ANY_ADDRESS = ("0.0.0.0", "::")


class TargetsUnavailable(GatewayError):
    """the registrations could not be read from Redis (Prometheus keeps its last list)"""

    status, type, retry_after = 503, "store_unavailable", 5


class TargetGroup(BaseModel):
    """One target group of Prometheus' HTTP service discovery: here, one gateway replica."""

    targets: list[str] = Field(description="`host:port` of the replica's own metrics endpoint")
    labels: dict[str, str] = Field(description="labels Prometheus adds to every series scraped "
                                   "from it: `app`, `node`, `replica`")


@dataclass(frozen=True)
class Target:
    """What one replica registers: where to scrape it, its labels, and when that lapses."""

    replica: str
    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)
    expires: float = 0.0  # wall-clock seconds

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> Target | None:
        """The target, or None for an entry this version cannot read (left for expiry)."""
        try:
            data = json.loads(raw)
            return cls(replica=str(data["replica"]), address=str(data["address"]),
                       labels={str(k): str(v) for k, v in dict(data["labels"]).items()},
                       expires=float(data["expires"]))
        except (ValueError, TypeError, KeyError):
            return None


def address(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def discovery(targets: Iterable[Target]) -> list[dict]:
    """Prometheus `http_sd_configs` JSON: one group per replica, ordered by replica id."""
    return [{"targets": [t.address], "labels": dict(t.labels)}
            for t in sorted(targets, key=lambda t: t.replica)]


class TargetBook(Protocol):
    """Where replicas register their targets: Redis (`RedisTargetBook`) or memory (tests)."""

    def put(self, target: Target) -> None: ...

    def remove(self, replica: str) -> None: ...

    def entries(self) -> dict[str, str]: ...  # replica -> raw Target JSON, expired ones too

    def prune(self, replicas: Iterable[str]) -> None: ...


def live_targets(book: TargetBook, now: float) -> list[Target]:
    """The registrations not yet expired at `now`."""
    targets = (Target.from_json(raw) for raw in book.entries().values())
    return [t for t in targets if t is not None and t.expires > now]


class MemoryTargetBook:
    """The in-memory twin of the Redis book (no key expiry), for unit tests."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def put(self, target: Target) -> None:
        self.data[target.replica] = target.to_json()

    def remove(self, replica: str) -> None:
        self.data.pop(replica, None)

    def entries(self) -> dict[str, str]:
        return dict(self.data)

    def prune(self, replicas: Iterable[str]) -> None:
        for replica in replicas:
            self.data.pop(replica, None)


class RedisTargetBook:
    """The hash `rollout:<app>:telemetry:targets` (Keys.metrics_targets): replica id -> Target
    JSON. Every write also pushes the hash's own expiry out to `key_ttl_s`, so it vanishes
    once no replica is left to refresh it. Redis trouble raises RolloutError."""

    def __init__(self, url: str, app: str, *, timeout_s: float = 2.0, key_ttl_s: float = 60.0):
        self.url, self.key, self.key_ttl_s = url, Keys(app).metrics_targets, max(int(key_ttl_s), 1)
        self._client = open_client(url, timeout_s=timeout_s)  # one Redis, or Sentinel's primary

    def _call(self, fn, *args):
        return call_redis(self.url, fn, *args)

    def put(self, target: Target) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.hset(self.key, target.replica, target.to_json())
        pipe.expire(self.key, self.key_ttl_s)
        self._call(pipe.execute)

    def remove(self, replica: str) -> None:
        self._call(self._client.hdel, self.key, replica)

    def entries(self) -> dict[str, str]:
        return self._call(self._client.hgetall, self.key)

    def prune(self, replicas: Iterable[str]) -> None:
        replicas = list(replicas)
        if replicas:
            self._call(self._client.hdel, self.key, *replicas)

    def close(self) -> None:
        self._client.close()


class MetricsServer:
    """A registry served over HTTP on its own port (prometheus_client's WSGI server, in a
    daemon thread): `port` 0 takes an ephemeral one, else the first free of `port` and the
    next PORT_TRIES - 1. Raises OSError when none is free."""

    def __init__(self, registry, host: str, port: int):
        from prometheus_client import start_http_server

        last: OSError | None = None
        candidates = [0] if port == 0 else range(port, min(port + PORT_TRIES, 65_536))
        for candidate in candidates:
            try:
                self._server, self._thread = start_http_server(candidate, host, registry)
                break
            except OSError as exc:
                last = exc
        else:
            raise OSError(f"no free port for the metrics endpoint on {host or '*'} in "
                          f"{port}-{port + PORT_TRIES - 1}: {last}")
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)


class ReplicaEndpoint:
    """One gateway replica's metrics endpoint and its registration.

    `open` starts the server and registers it; `refresh` (the watcher's heartbeat) registers
    it again and prunes the lapsed entries of others; `close` unregisters and stops the server.
    None of them raises for Redis trouble (logged; the next refresh tries again).
    """

    def __init__(self, server: MetricsServer, book: TargetBook, target: Target, ttl_s: float,
                 clock: Clock | None = None):
        self.server, self.book, self.ttl_s = server, book, ttl_s
        self.clock = clock or SystemClock()
        self.target = target
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, state: StateSettings, settings: TelemetrySettings, registry, book: TargetBook,
             *, replica: str, node_ip: str, clock: Clock | None = None) -> ReplicaEndpoint | None:
        """Serve `registry` on the host and port `settings` configure and register it under
        `replica`, labelled with `state`'s application; None when disabled (`metrics_targets`
        off, telemetry off) or the port cannot be bound (logged: `GET /metrics` still works)."""
        if not settings.metrics_targets or registry is None:
            return None
        bind = settings.metrics_host or node_ip
        try:
            server = MetricsServer(registry, bind, settings.metrics_port)
        except OSError as exc:
            log.warning("no per-replica metrics endpoint (GET /metrics still answers): %s", exc)
            return None
        host = node_ip if bind in ANY_ADDRESS else bind
        labels = {"app": state.app_name, "node": node_ip, "replica": replica}
        target = Target(replica=replica, address=address(host, server.port), labels=labels)
        endpoint = cls(server, book, target, settings.metrics_target_ttl_s, clock)
        endpoint.refresh()
        return endpoint

    def refresh(self) -> None:
        """Register again with a fresh expiry; drop others' lapsed entries."""
        with self._lock:
            if self._closed:
                return
            now = self.clock.time()
            self.target = replace(self.target, expires=now + self.ttl_s)
            try:
                self.book.put(self.target)
                self.book.prune(lapsed(self.book.entries(), now))
            except RolloutError as exc:
                log.warning("metrics target not registered (retried in 10 s): %s", exc)

    def close(self) -> None:
        """Unregister, then stop serving. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.book.remove(self.target.replica)
            except RolloutError as exc:
                log.warning("metrics target not unregistered (it lapses by itself): %s", exc)
        self.server.close()


def lapsed(entries: Mapping[str, str], now: float) -> list[str]:
    """The replicas whose entries expired before `now` (an entry this version cannot read,
    from a newer one during an upgrade, is left to its writer)."""
    out = []
    for replica, raw in entries.items():
        target = Target.from_json(raw)
        if target is not None and target.expires <= now:
            out.append(replica)
    return out


def read_discovery(book: TargetBook, now: float) -> list[dict]:
    """What `GET /v1/metrics/targets` answers: the live registrations as http_sd JSON.
    Raises TargetsUnavailable when Redis cannot be read."""
    try:
        return discovery(live_targets(book, now))
    except RolloutError as exc:
        raise TargetsUnavailable(f"cannot read the metrics targets: {exc}") from None


def replica_identity() -> tuple[str, str]:
    """The calling Serve replica's id and its node's IP as Ray knows it (outside a replica,
    e.g. a test driver: the process id)."""
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        replica = serve.get_replica_context().replica_id.unique_id
    except RayServeException:
        replica = f"pid-{os.getpid()}"
    return replica, ray.util.get_node_ip_address()
