"""The Redis state store: the shared contract on a real redis-server, plus what only Redis has
(key layout, the change channel, an unreachable or password-protected server)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from rollout import Rollout, RolloutState, StoreUnavailable
from rollout.redis_store import RedisStateStore, redact_url
from tests.servers import RedisServer
from tests.store_contract import StoreContract, write


def unique_app() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def app() -> str:
    return unique_app()


class TestRedisStateStore(StoreContract):
    @pytest.fixture
    def store(self, redis_url, app):
        store = RedisStateStore(redis_url, app, timeout_s=5.0)
        yield store
        store.close()


@pytest.fixture
def store(redis_url, app):
    store = RedisStateStore(redis_url, app, timeout_s=5.0)
    yield store
    store.close()


@pytest.fixture
def client(redis_server, redis_url):
    client = redis_server.client()
    yield client
    client.close()


# --- key layout --------------------------------------------------------------------------------


def test_keys_live_under_the_application_namespace(store, client, app):
    first = write(store, canary_bp=500)
    second = write(store, kill=True)

    prefix = f"rollout:{app}:"
    assert set(client.keys("*")) == {prefix + "state", prefix + "history", prefix + "audit"}

    assert client.type(prefix + "state") == "hash"
    state = client.hgetall(prefix + "state")
    assert state["revision"] == "2"
    assert RolloutState.model_validate_json(state["json"]) == second

    assert client.type(prefix + "history") == "hash"
    history = client.hgetall(prefix + "history")
    assert set(history) == {"1", "2"}
    assert RolloutState.model_validate_json(history["1"]) == first

    assert client.type(prefix + "audit") == "stream"
    rows = client.xrange(prefix + "audit")
    assert len(rows) == 2
    _, fields = rows[1]
    assert fields["actor"] == "tester"
    assert fields["revision"] == "2"
    assert RolloutState.model_validate(json.loads(fields["before"])) == first
    assert RolloutState.model_validate_json(fields["after"]) == second
    assert float(fields["ts"]) == second.updated_at


def test_every_change_is_published_on_the_change_channel(store, client, app):
    pubsub = client.pubsub()
    pubsub.subscribe(f"rollout:{app}:changes")
    try:
        # Once confirmed, the subscription sees every later publish.
        assert pubsub.get_message(timeout=5.0)["type"] == "subscribe"
        write(store, canary_bp=1)
        message = pubsub.get_message(timeout=5.0)
    finally:
        pubsub.close()

    assert message is not None
    assert message["channel"] == f"rollout:{app}:changes"
    assert message["data"] == "1"  # the new revision


def test_applications_do_not_share_state(redis_url, store):
    other = RedisStateStore(redis_url, unique_app())
    try:
        write(store, canary_bp=2_500)

        assert other.get() == RolloutState()
        assert other.audit() == []
        assert store.get().canary_bp == 2_500
    finally:
        other.close()


def test_a_state_written_by_one_client_is_read_by_another(redis_url, store, app):
    Rollout(store).set_canary(1_000, actor="alice", reason="ten percent")
    reader = RedisStateStore(redis_url, app)
    try:
        assert reader.get() == store.get()
        assert [e.reason for e in reader.audit()] == ["ten percent"]
    finally:
        reader.close()


# --- an unreachable server -----------------------------------------------------------------------


@pytest.fixture
def private_server():
    """A server of this test's own, which the test may stop."""
    server = RedisServer().start()
    yield server
    server.cleanup()


def assert_unavailable(info: pytest.ExceptionInfo, server: RedisServer) -> None:
    exc = info.value
    assert isinstance(exc, StoreUnavailable)
    assert not isinstance(exc, redis.RedisError)  # callers never see the client's exceptions
    assert exc.__cause__ is None
    assert exc.__suppress_context__
    assert str(server.port) in str(exc)


def test_stopped_server_raises_store_unavailable(private_server, app):
    store = RedisStateStore(private_server.url, app, timeout_s=1.0)
    try:
        write(store, canary_bp=100)
        before = store.get()
        private_server.stop()

        with pytest.raises(StoreUnavailable) as info:
            store.get()
        assert_unavailable(info, private_server)

        after = before.model_copy(update=dict(revision=2, canary_bp=200))
        with pytest.raises(StoreUnavailable) as info:
            store.compare_and_set(before, after, actor="a", action="x", reason="y")
        assert_unavailable(info, private_server)

        with pytest.raises(StoreUnavailable) as info:
            store.subscribe()
        assert_unavailable(info, private_server)

        for call in (store.ping, store.audit, lambda: store.state_at(1)):
            with pytest.raises(StoreUnavailable) as info:
                call()
            assert_unavailable(info, private_server)
    finally:
        store.close()


def test_open_subscription_raises_store_unavailable_when_the_server_stops(private_server, app):
    store = RedisStateStore(private_server.url, app, timeout_s=1.0)
    subscription = store.subscribe()
    try:
        private_server.stop()
        with pytest.raises(StoreUnavailable) as info:
            # A dead connection is reported by the first wait, or at the latest by the next one.
            for _ in range(2):
                subscription.wait(timeout=1.0)
        assert_unavailable(info, private_server)
    finally:
        subscription.close()
        store.close()


def test_the_same_store_works_again_once_the_server_is_back(private_server, app):
    store = RedisStateStore(private_server.url, app, timeout_s=1.0)
    try:
        store.ping()
        private_server.stop()
        with pytest.raises(StoreUnavailable):
            store.get()

        private_server.start()  # same port, empty: nothing is persisted in tests

        assert store.get() == RolloutState()
        assert write(store, canary_bp=3).revision == 1
    finally:
        store.close()


# --- passwords ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:s3cret@db.internal:6379/0", "redis://***@db.internal:6379/0"),
        ("redis://ops:s3cret@db.internal:6379/0", "redis://ops:***@db.internal:6379/0"),
        ("rediss://ops:s3cret@db.internal:6380/1", "rediss://ops:***@db.internal:6380/1"),
        ("redis://:s3c@ret@db.internal:6379/0", "redis://***@db.internal:6379/0"),
        ("redis://db.internal:6379/0?password=s3cret", "redis://db.internal:6379/0?password=***"),
        ("unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=***"),
        ("redis://db.internal:6379/0", "redis://db.internal:6379/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_redact_url_hides_the_password(url, expected):
    redacted = redact_url(url)

    assert redacted == expected
    assert "s3cret" not in redacted
    assert "s3c" not in redacted


PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def password_server():
    server = RedisServer(password=PASSWORD).start()
    yield server
    server.cleanup()


def test_password_protected_server_works_with_the_right_password(password_server):
    assert PASSWORD in password_server.url
    store = RedisStateStore(password_server.url, unique_app())
    try:
        Rollout(store).set_canary(500, actor="alice", reason="first 5%")

        assert store.get().canary_bp == 500
        subscription = store.subscribe()
        subscription.close()
    finally:
        store.close()


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_wrong_or_missing_password_raises_store_unavailable_without_leaking(
    password_server, password
):
    auth = f":{password}@" if password else ""
    url = f"redis://{auth}127.0.0.1:{password_server.port}/0"
    store = RedisStateStore(url, unique_app())
    try:
        state = RolloutState()
        calls = {
            "get": store.get,
            "compare_and_set": lambda: store.compare_and_set(
                state, state.model_copy(update=dict(revision=1)), actor="a", action="x",
                reason="y",
            ),
            "subscribe": store.subscribe,
        }
        for name, call in calls.items():
            with pytest.raises(StoreUnavailable) as info:
                call()
            message = str(info.value)
            assert not isinstance(info.value, redis.RedisError), name
            assert "Authentication" in message, name
            assert PASSWORD not in message, name
            if password:
                assert password not in message, name
                assert "***" in message, name
    finally:
        store.close()
