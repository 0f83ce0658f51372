import pytest

from tests.servers import RedisServer


# package scope: torn down after the tier's last test, so that neither this Redis nor the Ray
# cluster behind `gateway` lives on (and costs CPU) through the unit tier after it
@pytest.fixture(scope="package")
def redis_server():
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def secured():
    """A production-like Redis of the module's own: TLS only, the ACL users of
    ops/redis-users.acl."""
    server = RedisServer(acl=True, tls=True).start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server):
    """A clean database on the shared server for each test."""
    if redis_server.proc is None:
        redis_server.start()
    client = redis_server.client()
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(scope="package")
def gateway(tmp_path_factory):
    """The real Serve app (tiny encoder on both arms), shared by the gateway tests."""
    from tests.serve_app import start_gateway, stop_gateway

    app = start_gateway(tmp_path_factory.mktemp("gateway"))
    yield app
    stop_gateway(app)


@pytest.fixture
def gw(gateway):
    """The gateway with the rollout reset to 0 %, kill switch off, no faults, Redis running."""
    return gateway.reset()


DASHBOARD_RAMP_PLAN = {
    "window_s": 5, "gates": {"min_samples": 2, "error_rate_delta": 0.05, "p99_ms": 4000},
    "steps": [{"percent": 10, "min_duration_s": 600, "min_samples": 2},
              {"percent": 100, "min_duration_s": 600, "approval": True}],
}


@pytest.fixture
def dashboard_ramp(gw):
    """A forced ramp holding at its first step (10 %, a long soak) until the test steers it;
    aborted afterwards if still active, share back to 0."""
    from rollout.ramp import parse_plan

    control = gw.ramp_control()
    previous = control.ramps.get()
    if previous is not None and previous.active:
        control.abort(actor="test", reason="test setup")
    control.start(parse_plan(DASHBOARD_RAMP_PLAN), actor="test", reason="dashboard ramp test",
                  force=True)
    yield control
    current = control.ramps.get()
    if current is not None and current.active:
        control.abort(actor="test", reason="test cleanup")
    gw.set_state(canary_bp=0)
    control.states.close()
    control.ramps.close()
