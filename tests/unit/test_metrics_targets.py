"""Per-replica metrics endpoints and their service discovery (serve.telemetry.metrics_targets), on
the in-memory book and a fake clock; the endpoint's HTTP server is real (loopback). The Grafana
dashboard's queries are checked to add replicas up by arm. Redis and Prometheus themselves:
tests/integration/test_prometheus.py."""

from __future__ import annotations

import json
import logging
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from rollout import Settings
from rollout.clock import FakeClock
from rollout.errors import StoreUnavailable
from rollout.redis_layout import Keys
from rollout.settings import StateSettings, TelemetrySettings
from serve.telemetry.metrics_targets import (
    MemoryTargetBook,
    MetricsServer,
    ReplicaEndpoint,
    Target,
    TargetsUnavailable,
    address,
    discovery,
    lapsed,
    live_targets,
    read_discovery,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana-dashboard.json"
SETTINGS = Settings(app_name="shop", metrics_host="127.0.0.1", metrics_target_ttl_s=30)


@pytest.fixture
def registry():
    registry = CollectorRegistry()
    Counter("canary_requests", "requests", ["arm"], registry=registry).labels("baseline").inc(3)
    return registry


@pytest.fixture
def clock():
    return FakeClock(1_700_000_000.0)


@pytest.fixture
def endpoints():
    opened = []
    yield opened
    for endpoint in opened:
        endpoint.close()


def open_endpoint(registry, book, clock, endpoints, replica="r1", settings=SETTINGS,
                  node_ip="10.0.0.7"):
    endpoint = ReplicaEndpoint.open(settings, settings, registry, book, replica=replica,
                                    node_ip=node_ip, clock=clock)
    if endpoint is not None:
        endpoints.append(endpoint)
    return endpoint


def scrape(target: str) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
        return response.read().decode()


def test_a_replica_serves_its_registry_and_registers_it(registry, clock, endpoints):
    book = MemoryTargetBook()
    endpoint = open_endpoint(registry, book, clock, endpoints)
    [target] = live_targets(book, clock.time())
    assert target.address == f"127.0.0.1:{endpoint.server.port}"
    assert target.labels == {"app": "shop", "node": "10.0.0.7", "replica": "r1"}
    assert target.expires == clock.time() + 30
    assert 'canary_requests_total{arm="baseline"} 3.0' in scrape(target.address)
    assert discovery(live_targets(book, clock.time())) == [
        {"targets": [target.address], "labels": target.labels}]


def test_a_registration_lapses_unless_refreshed(registry, clock, endpoints):
    book = MemoryTargetBook()
    endpoint = open_endpoint(registry, book, clock, endpoints)
    clock.advance(29)
    endpoint.refresh()
    clock.advance(29)
    assert [t.replica for t in live_targets(book, clock.time())] == ["r1"]
    clock.advance(2)  # 31 s after the last refresh: a replica that died silently
    assert live_targets(book, clock.time()) == []


def test_a_refresh_prunes_other_replicas_lapsed_entries_only(registry, clock, endpoints):
    book = MemoryTargetBook()
    book.put(Target("dead", "10.0.0.9:9000", {"replica": "dead"}, expires=clock.time() - 1))
    book.put(Target("alive", "10.0.0.8:9000", {"replica": "alive"}, expires=clock.time() + 5))
    book.data["future"] = '{"format": 2}'  # a newer version's entry: left to its writer
    open_endpoint(registry, book, clock, endpoints)
    assert set(book.data) == {"alive", "future", "r1"}
    assert lapsed(book.entries(), clock.time() + 10) == ["alive"]


def test_closing_unregisters_and_stops_serving(registry, clock, endpoints):
    book = MemoryTargetBook()
    endpoint = open_endpoint(registry, book, clock, endpoints)
    where = endpoint.target.address
    endpoint.close()
    assert book.data == {}
    with pytest.raises(OSError):
        scrape(where)
    endpoint.close()  # idempotent (Serve may call __del__ more than once)
    endpoint.refresh()  # a heartbeat after shutdown registers nothing
    assert book.data == {}


def test_discovery_lists_one_group_per_replica_in_replica_order():
    targets = [Target("b", "h2:2", {"replica": "b"}, 9.0),
               Target("a", "h1:1", {"replica": "a"}, 9.0)]
    assert discovery(targets) == [{"targets": ["h1:1"], "labels": {"replica": "a"}},
                                  {"targets": ["h2:2"], "labels": {"replica": "b"}}]
    assert discovery([]) == []


def test_binding_every_interface_registers_the_node_ip(registry, clock, endpoints):
    book = MemoryTargetBook()
    settings = SETTINGS.model_copy(update={"metrics_host": "0.0.0.0"})
    endpoint = open_endpoint(registry, book, clock, endpoints, settings=settings,
                             node_ip="127.0.0.1")
    assert endpoint.target.address == f"127.0.0.1:{endpoint.server.port}"
    assert "canary_requests_total" in scrape(endpoint.target.address)


def test_an_empty_host_binds_and_registers_the_node_ip(registry, clock, endpoints):
    settings = SETTINGS.model_copy(update={"metrics_host": ""})
    endpoint = open_endpoint(registry, MemoryTargetBook(), clock, endpoints, settings=settings,
                             node_ip="127.0.0.1")
    assert endpoint.target.address.startswith("127.0.0.1:")


def test_a_fixed_port_taken_moves_to_the_next_free_one(registry, clock, endpoints):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if port > 65_000:
            pytest.skip("the ephemeral port is at the top of the range")
        settings = SETTINGS.model_copy(update={"metrics_port": port})
        endpoint = open_endpoint(registry, MemoryTargetBook(), clock, endpoints,
                                 settings=settings)
        assert port < endpoint.server.port < port + 100


def test_no_free_port_means_no_endpoint_and_a_warning(registry, caplog):
    with pytest.raises(OSError, match="no free port for the metrics endpoint"):
        MetricsServer(registry, "203.0.113.1", 0)  # TEST-NET-3: not an address of this host
    caplog.set_level(logging.WARNING)
    settings = SETTINGS.model_copy(update={"metrics_host": "203.0.113.1"})
    assert ReplicaEndpoint.open(settings, settings, registry, MemoryTargetBook(), replica="r",
                                node_ip="x") is None
    assert "GET /metrics still answers" in caplog.text


def test_disabled_or_without_a_registry_nothing_is_served(registry):
    off = SETTINGS.model_copy(update={"metrics_targets": False})
    book = MemoryTargetBook()
    assert ReplicaEndpoint.open(off, off, registry, book, replica="r", node_ip="x") is None
    assert ReplicaEndpoint.open(SETTINGS, SETTINGS, None, book, replica="r", node_ip="x") is None
    assert book.data == {}


class DownBook(MemoryTargetBook):
    def _down(self, *args):
        raise StoreUnavailable("cannot reach Redis at redis://127.0.0.1:1/0")

    put = remove = entries = prune = _down


def test_redis_trouble_is_logged_never_raised(registry, clock, endpoints, caplog):
    caplog.set_level(logging.WARNING)
    endpoint = open_endpoint(registry, DownBook(), clock, endpoints)
    assert endpoint is not None  # serving its port all the same
    endpoint.refresh()
    assert "metrics target not registered" in caplog.text
    endpoint.close()
    assert "it lapses by itself" in caplog.text
    with pytest.raises(TargetsUnavailable, match="cannot reach Redis") as raised:
        read_discovery(DownBook(), clock.time())
    assert raised.value.status == 503


def test_unreadable_entries_are_skipped():
    book = MemoryTargetBook()
    book.data.update({"x": "not json", "y": '{"replica": "y"}', "z": "[]"})
    book.put(Target("ok", "h:1", {}, expires=10.0))
    assert [t.replica for t in live_targets(book, 5.0)] == ["ok"]
    assert Target.from_json(Target("ok", "h:1", {"a": "b"}, 10.0).to_json()) == Target(
        "ok", "h:1", {"a": "b"}, 10.0)


def test_ipv6_hosts_are_bracketed_and_the_key_is_under_telemetry():
    assert address("::1", 9000) == "[::1]:9000"
    assert address("10.0.0.1", 9000) == "10.0.0.1:9000"
    assert Keys("shop").metrics_targets == "rollout:shop:telemetry:targets"


def test_the_registry_carries_the_replica_as_service_instance_id():
    from serve.telemetry.otel import Telemetry

    telemetry = Telemetry(StateSettings(), TelemetrySettings(telemetry_redis=False),
                          "canary-gateway", prometheus=True, instance="abc123", environ={})
    try:
        assert telemetry.registry is not None
        telemetry.meter.create_counter("canary.requests").add(1, {"arm": "baseline"})
        assert 'service_instance_id="abc123"' in telemetry.prometheus_text().decode()
    finally:
        telemetry.shutdown()
    off = TelemetrySettings(telemetry_enabled=False)
    assert Telemetry(StateSettings(), off, "g", prometheus=True).registry is None


def test_the_targets_route_is_declared_in_openapi():
    from serve.gateway.deployment import api

    api.openapi_schema = None
    document = json.loads(json.dumps(api.openapi()))
    api.openapi_schema = None
    responses = document["paths"]["/v1/metrics/targets"]["get"]["responses"]
    schema = responses["200"]["content"]["application/json"]["schema"]
    assert schema["items"]["$ref"] == "#/components/schemas/TargetGroup"
    assert responses["503"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorBody")
    assert "`store_unavailable`" in responses["503"]["description"]


# --- the Grafana dashboard adds replicas up ---------------------------------------------------

AGGREGATION = re.compile(r"\b(sum|count|min|max|avg|group)\s*(?:by\s*\(([^)]*)\)\s*)?\(")
ARMLESS = {"canary_telemetry_dropped_total"}  # per sink and reason, not per arm
PER_REPLICA = {"instance", "replica", "node", "pod"}


def replica_problems(expr: str) -> list[str]:
    """Why `expr` does not add replicas up by arm: a canary metric outside an aggregation
    `by (arm, ...)` (`by (arm, le, ...)` for a histogram's buckets), or grouped by a label that
    tells replicas apart."""
    problems, stack, i = [], [], 0
    while i < len(expr):
        match = AGGREGATION.match(expr, i)
        if match and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] == "_")):
            labels = {label.strip() for label in (match.group(2) or "").split(",") if label}
            if labels & PER_REPLICA:
                problems.append(f"groups by {sorted(labels & PER_REPLICA)}")
            stack.append(labels)
            i = match.end()
            continue
        metric = re.match(r"canary_\w+", expr[i:])
        if metric and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] == "_")):
            name = metric.group(0)
            need = set() if name in ARMLESS else {"arm"}
            if name.endswith("_bucket"):
                need.add("le")
            if not any(need <= labels and labels for labels in stack):
                problems.append(f"{name} not summed by {sorted(need) or 'its labels'}")
            i += len(name)
            continue
        if expr[i] == "(":
            stack.append(set())  # a function's or a group's parenthesis: no aggregation
        elif expr[i] == ")" and stack:
            stack.pop()
        i += 1
    return problems


@pytest.mark.parametrize(("expr", "problem"), [
    ("rate(canary_requests_total[1m])", "canary_requests_total not summed by ['arm']"),
    ("sum(rate(canary_requests_total[1m]))", "not summed by ['arm']"),
    ("sum by (arm, instance) (rate(canary_requests_total[1m]))", "groups by ['instance']"),
    ("histogram_quantile(0.9, sum by (arm) (rate(canary_request_duration_milliseconds_bucket"
     "[1m])))", "not summed by ['arm', 'le']"),
    ("sum by (arm) (rate(canary_cost_total[1m])) / rate(canary_model_calls_total[1m])",
     "canary_model_calls_total not summed"),
    ("rate(canary_telemetry_dropped_total[1m])", "not summed by its labels"),
])
def test_the_check_finds_queries_that_do_not_add_replicas_up(expr, problem):
    assert any(problem in found for found in replica_problems(expr)), replica_problems(expr)


def dashboard_exprs() -> list[tuple[str, str]]:
    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in panels(dashboard["panels"])
            for target in panel.get("targets", [])]


def test_every_dashboard_query_sums_over_replicas_by_arm():
    exprs = dashboard_exprs()
    assert len(exprs) > 10
    for title, expr in exprs:
        assert not replica_problems(expr), f"{title}: {expr}: {replica_problems(expr)}"
    assert any("up{" in expr and "canary-gateway" in expr for _, expr in exprs)
