import pytest

from tests.servers import RedisServer


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer().start()
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


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    """The real Serve app (tiny encoder on both arms), shared by the gateway tests."""
    from tests.serve_app import start_gateway, stop_gateway

    app = start_gateway(tmp_path_factory.mktemp("gateway"))
    yield app
    stop_gateway(app)


@pytest.fixture
def gw(gateway):
    """The gateway with the rollout reset to 0 %, kill switch off, no faults, Redis running."""
    if gateway.redis.proc is None:
        gateway.redis.start()
    if gateway.live or gateway.overrides:
        gateway.redeploy({})
    gateway.set_state(canary_bp=0, kill=False)
    return gateway
