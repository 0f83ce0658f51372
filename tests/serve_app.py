"""A real, small Ray Serve application for integration tests: local Ray, the tiny encoder on
both arms, its own Redis server, HTTP on a free loopback port."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rollout import Rollout, RolloutState, Settings, Traces, Windows, open_store, open_telemetry
from serve import ray_env
from tests.servers import RedisServer, free_port
from tests.thread_clients import ThreadClients
from tests.tiny_model import make_tiny_encoder

APP = "canary-itest"
OPERATOR_TOKEN = "itest-operator-token-0123456789"  # the dashboard's actions (Bearer)
STARTS = 3  # tries to start the app when a port it picked was taken meanwhile


@dataclass
class GatewayApp:
    settings: Settings
    redis: RedisServer
    url: str
    clients: ThreadClients  # one client per thread: tests send from thread pools
    live: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    name: str = "canary"  # the Serve application
    route_prefix: str = "/"

    @property
    def client(self) -> httpx.Client:
        """This thread's client to the gateway (tests.thread_clients)."""
        return self.clients.get()

    @property
    def operator(self) -> Settings:
        """The settings with the operator's Redis user (the gateway's may read only its part)."""
        return self.settings.model_copy(update={"redis_url": self.redis.url})

    def reset(self) -> GatewayApp:
        """Rollout at 0 %, kill switch off, no faults or overrides, Redis running."""
        if self.redis.proc is None:
            self.redis.start()
        if self.live or self.overrides:
            self.redeploy({})
        self.set_state(canary_bp=0, kill=False)
        return self

    def rollout(self) -> Rollout:
        """Audited changes, as an operator."""
        return Rollout(open_store(self.operator))

    def ramp_control(self):
        """The operator's ramp actions (close `.states` and `.ramps` after use)."""
        from rollout.ramp import RampControl, open_ramp_store

        return RampControl(open_store(self.operator), open_ramp_store(self.operator))

    def served_state(self) -> dict:
        return self.client.get("/v1/rollout").json()

    def wait_for_revision(self, revision: int, timeout: float = 10.0) -> dict:
        """Until the gateway's cached state has reached `revision` (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            served = self.served_state()
            if served["state"]["revision"] >= revision and not served["stale"]:
                return served
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway never reached revision {revision}: {served}")
            time.sleep(0.05)

    def set_state(self, *, canary_bp: int, kill: bool = False) -> RolloutState:
        """Write the share and kill switch through the audited path and wait until served."""
        control = self.rollout()
        _, state = control.set_canary(canary_bp, actor="test", reason="test setup")
        state = (control.kill if kill else control.unkill)(actor="test", reason="test setup")[1]
        control.store.close()
        self.wait_for_revision(state.revision)
        return state

    def redeploy(self, live: dict[str, dict], **settings) -> None:
        """Apply new per-arm live settings (faults, batching) without restarting model replicas;
        `settings` overrides (e.g. gateway_max_in_flight) replace the gateway replica."""
        from ray import serve

        from serve.config import build

        self.live = live
        self.overrides = settings
        serve.run(build(self.settings.model_copy(update=settings), live), name=self.name,
                  route_prefix=self.route_prefix)

    def predict(self, inputs, **headers) -> httpx.Response:
        return self.client.post("/v1/predict", json={"inputs": inputs}, headers=headers)

    def telemetry(self):
        """The telemetry store in Redis, read as an operator (close it after use)."""
        return open_telemetry(self.operator, self.operator)

    def windows(self, store) -> Windows:
        return Windows(store, self.settings.app_name)

    def wait_for_trace(self, store, request_id: str, *names: str, timeout: float = 15.0):
        """The trace of `request_id` once it holds spans with all `names` (bounded wait:
        spans reach Redis from two processes through their sinks)."""
        traces = Traces(store)
        deadline = time.monotonic() + timeout
        while True:
            found = traces.by_request(request_id)
            if found and set(names) <= {span["name"] for span in found[1]}:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"trace of {request_id} never had {names}: {found}")
            time.sleep(0.05)


def start_gateway(tmp: Path, **overrides) -> GatewayApp:
    import ray
    from ray import serve

    from serve.config import build

    # Production-like Redis: TLS only, ACL users; the gateway connects as its read-mostly user.
    redis = RedisServer(acl=True, tls=True).start()
    model = make_tiny_encoder(tmp / "tiny-encoder")
    port = free_port()
    settings = Settings(**{
        "redis_url": redis.url_for("gateway"), "app_name": APP, "model_path": str(model),
        "state_poll_s": 0.2, "state_staleness_s": 1.5, "request_timeout_s": 5.0, "max_items": 8,
        "max_item_chars": 200, "max_total_chars": 800, "gateway_num_cpus": 0.1,
        "model_num_cpus": 0.1, "max_batch_size": 8, "batch_wait_ms": 2.0, "torch_threads": 1,
        # a deployment per arm; tests/integration/test_colocated.py runs the other topology
        "topology": "remote",
        # a named recipe: `auto` would measure its candidates at start (serve.recipes.auto.choose)
        "optimized_recipe": "bf16",
        "telemetry_flush_s": 0.05, "device_hour_price": 3.6,
        "trace_sample_ratio": 1.0,  # tests read the traces of ordinary requests
        # the ramp controller runs in the app as the `controller` Redis user, evaluating often;
        # dashboard actions use the same control connection, with the operator token
        "control_redis_url": redis.url_for("controller"), "ramp_interval_s": 0.25,
        "ramp_lease_ttl_s": 2.0, "operator_token": OPERATOR_TOKEN,
        # no shadow calls unless a test asks (redeploy(..., shadow_share=1.0)): tests that count
        # model calls or batch sizes must not see them
        "shadow_share": 0.0,
        "grpc_port": free_port(),  # the OIP over gRPC (protocols.oip_grpc), its own port
        **overrides,
    })
    for attempt in range(1, STARTS + 1):
        ray_env.apply(throwaway=True)  # the production ingress (HAProxy, throughput mode)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build(settings), name="canary", route_prefix="/")
            break
        except Exception as exc:
            # a port picked free can be taken before HAProxy binds it: start again on others
            if "Address already in use" not in str(exc) or attempt == STARTS:
                ray.shutdown()
                redis.cleanup()  # nothing of a failed start stays behind
                raise
            serve.shutdown()
            ray.shutdown()
            port = free_port()
    url = f"http://127.0.0.1:{port}"
    return GatewayApp(settings, redis, url, ThreadClients(url, timeout=30.0))


def start_beside(shared: GatewayApp, name: str, **update) -> GatewayApp:
    """The app with `update` to its settings, as a second Serve application beside `shared`
    in its Ray instance, on its Redis under an app name of its own, served under the route
    prefix `/<name>`."""
    from ray import serve

    from serve.config import build

    settings = shared.settings.model_copy(update={
        "app_name": f"{APP}-{name}", "grpc_port": 0, **update})
    prefix = f"/{name}"
    serve.run(build(settings), name=name, route_prefix=prefix)
    url = shared.url + prefix
    return GatewayApp(settings, shared.redis, url, ThreadClients(url, timeout=30.0),
                      name=name, route_prefix=prefix)


def start_colocated(shared: GatewayApp, name: str = "colocated") -> GatewayApp:
    """The same app in the colocated topology (both models in the gateway's replica)."""
    return start_beside(shared, name, topology="colocated")


def stop_beside(app: GatewayApp) -> None:
    from ray import serve

    app.clients.close()
    serve.delete(app.name)


def stop_gateway(app: GatewayApp) -> None:
    import ray
    from ray import serve

    app.clients.close()
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
        app.redis.cleanup()
