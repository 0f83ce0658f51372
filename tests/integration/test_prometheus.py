"""Metrics that add up across gateway replicas, proven with a real Prometheus server (Debian's
`prometheus`): the real Serve app scaled to two gateway replicas, each serving its own metrics
port registered in Redis; Prometheus finds them through `http_sd_configs` on
`/v1/metrics/targets` (the block docs/telemetry.md gives, with 1 s intervals) and a PromQL sum
per arm equals what the test sent."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from serve.ray_env import free_port
from serve.telemetry.metrics_targets import RedisTargetBook, Target, live_targets

JOB = "canary-gateway"
REQUESTS = 60
CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: {job}
    http_sd_configs:
      - url: {gateway}/v1/metrics/targets
        refresh_interval: 1s
"""


class Prometheus:
    """A throwaway `prometheus` on 127.0.0.1: its config, TSDB and log in a temp dir."""

    def __init__(self, gateway_url: str):
        binary = shutil.which("prometheus")
        assert binary, "Debian's prometheus is missing: run ops/setup.sh --tests"
        self.dir = Path(tempfile.mkdtemp(prefix="canary-prometheus-"))
        (self.dir / "prometheus.yml").write_text(CONFIG.format(job=JOB, gateway=gateway_url))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (self.dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=5.0)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client.get("/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start: {self.tail()}")
            time.sleep(0.1)

    def query(self, promql: str) -> list[dict]:
        body = self.client.get("/api/v1/query", params={"query": promql}).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def by(self, promql: str, label: str) -> dict[str, float]:
        return {row["metric"].get(label, ""): float(row["value"][1])
                for row in self.query(promql)}

    def targets(self) -> list[dict]:
        body = self.client.get("/api/v1/targets", params={"state": "active"}).json()
        return [t for t in body["data"]["activeTargets"] if t["labels"]["job"] == JOB]

    def wait(self, what: str, check, timeout: float = 30.0):
        """Until `check()` returns something true (bounded), and that."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus: {what} within {timeout} s; targets: "
                                     f"{self.targets()}; log: {self.tail()}")
            time.sleep(0.2)

    def scraped_since(self, since: float) -> bool:
        """Both replicas' targets were scraped (fully: a second scrape began) after `since`."""
        targets = [t for t in self.targets() if t["health"] == "up"]
        return len(targets) >= 2 and all(
            _rfc3339(t["lastScrape"]) > since + 1.0 for t in targets)

    def tail(self) -> str:
        self.log.flush()
        return (self.dir / "prometheus.log").read_text()[-2000:]

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _rfc3339(stamp: str) -> float:
    """Prometheus' RFC 3339 timestamp (nanoseconds, `Z` or an offset) as epoch seconds."""
    from datetime import datetime

    date, _, rest = stamp.partition(".")
    digits = "".join(c for c in rest if c.isdigit())
    zone = rest[len(digits):] if rest else date[19:]
    whole = datetime.fromisoformat(date[:19] + (zone.replace("Z", "+00:00") or "+00:00"))
    return whole.timestamp() + (float(f"0.{digits}") if digits else 0.0)


@pytest.fixture(scope="module")
def two_gateways(gateway):
    """The session's app with two gateway replicas (one again afterwards)."""
    from ray import serve

    from serve.config import build

    app = build(gateway.settings)
    # what `num_replicas: 2` under the gateway deployment does in a Serve config file
    app._bound_deployment = app._bound_deployment.options(num_replicas=2)
    started = time.monotonic()
    serve.run(app, name="canary", route_prefix="/")
    print(f"\nscaled to two gateway replicas in {time.monotonic() - started:.1f} s")
    gateway.overrides = {"gateway_replicas": 2}  # marks the app as changed for `gw`
    yield gateway
    if gateway.overrides:  # not yet back to one replica (a test failed before it did)
        gateway.redeploy({})


@pytest.fixture
def prometheus(two_gateways):
    server = Prometheus(two_gateways.url)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def discovered(gw, count: int, timeout: float = 45.0) -> list[dict]:
    """`/v1/metrics/targets` once it lists `count` replicas (new replicas register as they
    start; a replaced one may linger until it lapses)."""
    deadline = time.monotonic() + timeout
    while True:
        response = gw.client.get("/v1/metrics/targets")
        assert response.status_code == 200, response.text
        groups = response.json()
        if len(groups) == count:
            return groups
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {count} registered replicas: {groups}")
        time.sleep(0.2)


def test_prometheus_sums_per_arm_across_two_gateway_replicas(two_gateways, prometheus):
    gw = two_gateways
    gw.set_state(canary_bp=5_000)  # both arms get traffic
    groups = discovered(gw, 2)
    assert {g["labels"]["app"] for g in groups} == {gw.settings.app_name}
    assert len({g["labels"]["replica"] for g in groups}) == 2
    assert len({g["targets"][0] for g in groups}) == 2

    up = f'count(up{{job="{JOB}"}} == 1)'
    prometheus.wait("both replicas up", lambda: prometheus.by(up, "") == {"": 2.0})
    start = time.time()
    prometheus.wait("a scrape of both replicas", lambda: prometheus.scraped_since(start))
    def requests(label: str) -> dict[str, float]:
        return prometheus.by(f'sum by ({label}) (canary_requests_total{{job="{JOB}"}})', label)

    before, before_replica = requests("arm"), requests("replica")

    def send(i: int) -> tuple[int, str, bool]:
        response = gw.predict([f"text number {i}"], **{"X-Routing-Key": f"user-{i}"})
        body = response.json()
        return response.status_code, body.get("arm", ""), body.get("fallback", True)

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(REQUESTS)))
    sent_s = time.monotonic() - t0
    assert all(status == 200 and not fallback for status, _, fallback in answers), answers
    sent = Counter(arm for _, arm, _ in answers)
    assert set(sent) == {"baseline", "optimized"}, sent

    done = time.time()
    waited = time.monotonic()
    prometheus.wait("a scrape after the requests", lambda: prometheus.scraped_since(done))
    scrape_wait_s = time.monotonic() - waited
    after, after_replica = requests("arm"), requests("replica")
    counted = {arm: after.get(arm, 0) - before.get(arm, 0) for arm in after}
    per_replica = {r: after_replica[r] - before_replica.get(r, 0) for r in after_replica}
    split = prometheus.query(f'sum by (replica, arm) (canary_requests_total{{job="{JOB}"}})')
    print(f"\nsent {dict(sent)} in {sent_s:.2f} s; Prometheus sum by (arm): {counted}; "
          f"by replica: {per_replica}; waited {scrape_wait_s:.2f} s for the scrape; totals by "
          f"replica and arm: {[(r['metric'], r['value'][1]) for r in split]}")
    assert counted == {arm: float(n) for arm, n in sent.items()}
    # both replicas served some of them: the sums above did add two replicas up
    assert len(per_replica) == 2 and all(n > 0 for n in per_replica.values()), per_replica
    assert sum(per_replica.values()) == REQUESTS
    # one replica's /metrics through the proxy still answers (the single-replica way)
    single = gw.client.get("/metrics")
    assert single.status_code == 200 and "canary_requests_total" in single.text


def test_a_replica_that_serve_shuts_down_unregisters(two_gateways):
    """Redeployed with one gateway replica (Serve replaces both): the replicas it stops remove
    their entries in `__del__`, not after CANARY_METRICS_TARGET_TTL_S (30 s; the wait below is
    shorter), and the new one registers."""
    gw = two_gateways
    discovered(gw, 2)
    started = time.monotonic()
    gw.redeploy({})
    [left] = discovered(gw, 1, timeout=10.0)
    print(f"\nredeployed with one gateway replica; one target listed after "
          f"{time.monotonic() - started:.1f} s: {left}")
    assert gw.client.get(f"http://{left['targets'][0]}/metrics").status_code == 200


def test_registrations_in_redis_with_the_gateway_user(gateway):
    """The gateway's least-privilege Redis user may register, list, prune and remove."""
    book = RedisTargetBook(gateway.redis.url_for("gateway"), "prom-itest", key_ttl_s=60)
    try:
        now = time.time()
        book.put(Target("r-live", "10.0.0.1:9000", {"replica": "r-live"}, now + 30))
        book.put(Target("r-gone", "10.0.0.2:9000", {"replica": "r-gone"}, now - 1))
        assert [t.replica for t in live_targets(book, now)] == ["r-live"]
        book.prune(["r-gone"])
        assert set(book.entries()) == {"r-live"}
        book.remove("r-live")
        assert book.entries() == {}
    finally:
        book.close()
    client = gateway.redis.client()
    try:
        book = RedisTargetBook(gateway.redis.url_for("gateway"), "prom-itest", key_ttl_s=60)
        book.put(Target("r", "h:1", {}, time.time() + 30))
        book.close()
        assert 0 < client.ttl("rollout:prom-itest:telemetry:targets") <= 60  # gone with its writers
        client.delete("rollout:prom-itest:telemetry:targets")
    finally:
        client.close()
