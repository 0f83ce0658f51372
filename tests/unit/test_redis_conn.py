"""The Redis URL forms (rollout.redis_conn): the sentinel form parsed, malformed ones refused
clearly, passwords never shown; the replica acknowledgement's error path; how the kill's
client (rollout.resp_client) finds the primary and what it retries. No Redis
(tests/integration/test_sentinel.py runs them against real sentinels)."""

from __future__ import annotations

import socket
import threading

import pytest
from pydantic import ValidationError

from ops.cli.errors import exit_for
from rollout import Settings
from rollout.errors import NotAcknowledged, answer_for
from rollout.kill_settings import KillSettings
from rollout.redis_conn import (
    Acknowledgement,
    SentinelURL,
    acknowledgement_for,
    check_url,
    durable_script,
    open_client,
    parse_sentinel_url,
    redact_url,
    wrote_first,
)
from rollout.resp_client import NoPrimary, ReplyError, connect, retryable
from serve.dashboard.errors import dashboard_error

SECRET = "p4ss/w@rd?"


@pytest.mark.parametrize("url, parsed", [
    ("redis+sentinel://h1:26379/mymaster/0",
     SentinelURL((("h1", 26379),), "mymaster", 0)),
    ("redis+sentinel://:pw@h1:1,h2:2,[::1]:3/svc/7",
     SentinelURL((("h1", 1), ("h2", 2), ("::1", 3)), "svc", 7, None, "pw")),
    ("redis+sentinel://operator:change-me@10.0.0.1:26380,10.0.0.2/canary/2",
     SentinelURL((("10.0.0.1", 26380), ("10.0.0.2", 26379)), "canary", 2, "operator",
                 "change-me")),
    ("redis+sentinel://h/svc", SentinelURL((("h", 26379),), "svc", 0)),
    ("rediss+sentinel://u:pw@h:1/svc/0?ssl_ca_certs=/ca.crt&ssl_cert_reqs=required",
     SentinelURL((("h", 1),), "svc", 0, "u", "pw", True,
                 (("ssl_ca_certs", "/ca.crt"), ("ssl_cert_reqs", "required")))),
])
def test_the_sentinel_form_is_parsed(url, parsed):
    assert parse_sentinel_url(url) == parsed
    assert check_url(url) == url
    assert Settings(redis_url=url).redis_url == url


def test_a_password_may_hold_url_characters():
    parsed = parse_sentinel_url(f"redis+sentinel://u:{SECRET.replace('?', '%3F')}@h:1/svc/0")
    assert parsed.password == SECRET and parsed.sentinels == (("h", 1),)


@pytest.mark.parametrize("url, says", [
    ("redis+sentinel://h:26379", "no service name"),
    ("redis+sentinel://h:26379/", "no service name"),
    ("redis+sentinel://h:26379//0", "no service name"),
    ("redis+sentinel://h:port/svc/0", "bad port 'port'"),
    ("redis+sentinel://h:0/svc/0", "bad port '0'"),
    ("redis+sentinel://h:70000/svc/0", "bad port '70000'"),
    ("redis+sentinel://h:1,/svc/0", "empty sentinel address"),
    ("redis+sentinel://:1/svc/0", "no host"),
    ("redis+sentinel://h:1/svc/x", "bad db 'x'"),
    ("redis+sentinel://h:1/svc/-1", "bad db '-1'"),
    ("redis+sentinel://h:1/svc/0/extra", "nothing after the db"),
    ("redis+sentinel://h:1/s%20vc/0", "service name"),
    ("redis+sentinel://h:1/svc/0?ssl_ca_certs=/ca", "needs rediss+sentinel://"),
    ("redis+sentinel://h:1/svc/0?socket_timeout=1", "unknown option 'socket_timeout'"),
    ("rediss+sentinel://h:1/svc/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
    (f"redis+sentinel://alice@{'h'}:1/svc/0", "without a password"),
    (f"redis+sentinel://u:{SECRET.replace('?', '%3F')}@h:bad/svc/0", "bad port 'bad'"),
    (f"redis+sentinel://u:{SECRET}@h:1/svc/0", "no service name"),  # a raw ? ends the path
])
def test_a_malformed_sentinel_url_says_what_is_wrong_and_never_the_password(url, says):
    with pytest.raises(ValueError) as raised:
        parse_sentinel_url(url)
    assert says in str(raised.value) and SECRET not in str(raised.value)
    with pytest.raises(ValidationError):
        Settings(redis_url=url)


@pytest.mark.parametrize("url", ["http://h", "sentinel://h:1/svc/0", "h:6379", ""])
def test_other_schemes_are_refused(url):
    with pytest.raises(ValueError, match="redis\\+sentinel://"):
        check_url(url)


@pytest.mark.parametrize("url, shown", [
    (f"redis+sentinel://u:{SECRET}@h1:1,h2:2/svc/0", "redis+sentinel://u:***@h1:1,h2:2/svc/0"),
    (f"rediss+sentinel://:{SECRET}@h:1/svc/0?ssl_ca_certs=/ca",
     "rediss+sentinel://***@h:1/svc/0?ssl_ca_certs=/ca"),
    ("redis+sentinel://h:1/svc/0", "redis+sentinel://h:1/svc/0"),
    (f"redis://:{SECRET}@h:6379/0", "redis://***@h:6379/0"),
])
def test_urls_are_redacted(url, shown):
    assert redact_url(url) == shown and SECRET not in redact_url(url)


def test_the_sentinel_client_is_a_master_for_the_service_with_the_same_timeouts():
    client = open_client("redis+sentinel://u:pw@h1:1,h2:2/svc/3", timeout_s=1.5,
                         health_check_interval=30)
    try:
        pool = client.connection_pool
        assert pool.service_name == "svc" and pool.is_master
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "u", "pw")
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 1.5
        sentinels = pool.sentinel_manager.sentinels
        assert [(s.get_connection_kwargs()["host"], s.get_connection_kwargs()["port"])
                for s in sentinels] == [("h1", 1), ("h2", 2)]
        assert "password" not in sentinels[0].get_connection_kwargs() or (
            sentinels[0].get_connection_kwargs()["password"] is None)
    finally:
        client.close()


def test_a_plain_url_builds_the_client_it_always_did():
    client = open_client("redis://:pw@h:6380/2", timeout_s=2.0)
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == (
            "h", 6380, 2, "pw")
        assert kwargs["socket_timeout"] == 2.0
    finally:
        client.close()


# --- the replica acknowledgement ------------------------------------------------------------


@pytest.mark.parametrize("url, setting, replicas", [
    ("redis://h:6379/0", None, 0), ("unix:///s.sock", None, 0),
    ("redis+sentinel://h:1/svc/0", None, 1), ("rediss+sentinel://h:1/svc/0", None, 1),
    ("redis://h:6379/0", 2, 2), ("redis+sentinel://h:1/svc/0", 0, 0),
])
def test_the_default_acknowledgement_follows_the_url(url, setting, replicas):
    assert acknowledgement_for(url, setting, 500) == Acknowledgement(replicas, 500)
    settings = Settings(redis_url=url, redis_wait_replicas=setting, redis_wait_timeout_ms=500)
    assert settings.acknowledgement() == Acknowledgement(replicas, 500)


class FakePipe:
    def __init__(self, replies):
        self.queued, self.replies = [], replies

    def execute_command(self, *args):
        self.queued.append(args)

    def execute(self):
        return self.replies


class FakeClient:
    def __init__(self, replies):
        self.pipe = FakePipe(replies)

    def pipeline(self, transaction):
        assert transaction is False
        return self.pipe


class FakeScript:
    script = "return 1"

    def __init__(self):
        self.calls = []

    def __call__(self, *, keys, args):
        self.calls.append((keys, args))
        return [1, 2]


def _call(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def test_no_replicas_required_runs_the_script_as_before():
    client, script = FakeClient([]), FakeScript()
    assert durable_script(client, _call, Acknowledgement(0), script, ["k"], ["a"], "w") == [1, 2]
    assert script.calls == [(["k"], ["a"])] and client.pipe.queued == []


def test_the_write_and_its_wait_go_on_one_connection():
    client, script = FakeClient([[1, 7], 1]), FakeScript()
    reply = durable_script(client, _call, Acknowledgement(1, 250), script, ["k1", "k2"], ["a"],
                           "revision 7 (kill)")
    assert reply == [1, 7] and script.calls == []
    assert client.pipe.queued == [("EVAL", "return 1", 2, "k1", "k2", "a"), ("WAIT", 1, 250)]


def test_too_few_replicas_is_not_acknowledged_with_a_clear_message():
    client = FakeClient([[1, 7], 1])
    with pytest.raises(NotAcknowledged) as raised:
        durable_script(client, _call, Acknowledgement(2, 250), FakeScript(), ["k"], [],
                       "revision 7 (kill)")
    message = str(raised.value)
    assert message.startswith("revision 7 (kill) was written to the Redis primary, but 1 of "
                               "the 2 replica(s) required acknowledged it within 250 ms")
    assert "may or may not survive a failover" in message
    code, line, _ = exit_for(raised.value)
    assert code == 1 and line == f"error: {message}"
    assert answer_for(NotAcknowledged).http_status == 503
    answered = dashboard_error(raised.value, message)  # the dashboard's action error
    assert answered.status == 503 and str(answered) == message
    assert answered.type == "not_acknowledged"  # not the store being unreachable


def test_a_refused_compare_and_set_is_a_conflict_not_an_unacknowledged_write():
    client = FakeClient([[0, 9], 0])  # the script wrote nothing; no replica needed to ack
    reply = durable_script(client, _call, Acknowledgement(1, 250), FakeScript(), ["k"], [],
                           "revision 7 (canary)", wrote=wrote_first)
    assert reply == [0, 9]
    with pytest.raises(NotAcknowledged):
        durable_script(FakeClient([[1, 7], 0]), _call, Acknowledgement(1, 250), FakeScript(),
                       ["k"], [], "revision 7 (canary)", wrote=wrote_first)


# --- the kill's client behind Sentinel ------------------------------------------------------


def _sentinel_answering(reply: bytes) -> int:
    """A one-shot fake sentinel on a free port answering every command with `reply`."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(reply)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def test_sentinels_are_asked_in_order_and_an_unknown_service_is_no_primary():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = closed.getsockname()[1]
    closed.close()
    port = _sentinel_answering(b"*-1\r\n")  # nil: no such service
    with pytest.raises(NoPrimary) as raised:
        connect(f"redis+sentinel://:{SECRET.replace('?', '%3F')}@127.0.0.1:{dead},"
                f"127.0.0.1:{port}/svc/0", 1.0)
    message = str(raised.value)
    assert f"sentinel 127.0.0.1:{dead}: ConnectionRefusedError" in message
    assert f"sentinel 127.0.0.1:{port} knows no service 'svc'" in message
    assert SECRET not in message and retryable(raised.value)


@pytest.mark.parametrize("error, retry", [
    (ReplyError("READONLY You can't write against a read only replica."), True),
    (ReplyError("LOADING Redis is loading the dataset in memory"), True),
    (ReplyError("NOPERM this user has no permissions"), False),
    (ReplyError("WRONGPASS invalid username-password pair"), False),
    (ConnectionRefusedError(), True), (TimeoutError(), True), (ValueError("x"), False),
])
def test_what_the_kill_retries_across_a_failover(error, retry):
    assert retryable(error) is retry


def test_the_wait_for_replicas_ends_inside_the_socket_timeout():
    url = "redis+sentinel://h:1/svc/0"
    assert acknowledgement_for(url, None, 1000, 2.0) == Acknowledgement(1, 1000)
    assert acknowledgement_for(url, None, 5000, 2.0) == Acknowledgement(1, 1750)
    assert acknowledgement_for(url, None, 1000, 0.1) == Acknowledgement(1, 1)
    assert KillSettings(redis_url=url, redis_timeout_s=1.0).acknowledgement().timeout_ms == 750
    assert Settings(redis_url=url, redis_timeout_s=1.0).acknowledgement().timeout_ms == 750
