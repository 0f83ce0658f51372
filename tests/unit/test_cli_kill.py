"""The kill switch's fast path, piece by piece, held to the full path it stands in for: the state
document (rollout.killswitch), the settings (ops.cli.kill.target_from), the Redis URL
(rollout.resp_client.parse_url) and when it steps aside. No Redis
(tests/integration/test_kill_redis.py runs it against one)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys

import pytest
import redis.connection

import rollout
from ops import cli
from ops.cli import kill as cli_kill
from ops.cli.kill import DEFAULT_APP, DEFAULT_REDIS_URL, DEFAULT_TIMEOUT_S, Target, target_from
from rollout import RolloutState, Settings
from rollout.control import big_move as rollout_big_move
from rollout.killswitch import SwitchState, Unrecognised
from rollout.resp_client import Address, Unsupported, parse_url
from rollout.share import big_move
from tests.servers import free_port

STATES = [
    RolloutState(),
    RolloutState(canary_bp=500, kill=True, baseline_version="fp32-aaaa",
                 optimized_version="bf16-bbbb", revision=7, updated_at=1_700_000_000.123456,
                 updated_by="alice@ops", reason="p99 regression"),
    RolloutState(canary_bp=10_000, revision=1, updated_at=1_700_000_001.0, updated_by="bøb",
                 reason='quotes " and \\ and ünïcode ✓ / slash'),
]


# --- the state document -------------------------------------------------------------------------


def test_the_switch_state_has_the_rollout_states_fields_in_its_order():
    assert list(SwitchState.__dataclass_fields__) == list(RolloutState.model_fields)
    assert json.loads(SwitchState().to_json()) == RolloutState().model_dump(mode="json")


@pytest.mark.parametrize("state", STATES)
def test_the_switch_state_reads_and_writes_what_pydantic_writes(state):
    raw = state.model_dump_json()
    switch = SwitchState.from_json(raw)
    assert switch.to_json() == raw  # byte for byte: key order, floats, escapes, UTF-8
    assert RolloutState.model_validate_json(switch.to_json()) == state
    assert switch.effective_bp == state.effective_bp
    killed = switch.model_copy(update={"kill": True})
    assert killed.to_json() == state.model_copy(update={"kill": True}).model_dump_json()


@pytest.mark.parametrize("change", [
    {"extra": 1}, {"kill": 1}, {"canary_bp": True}, {"canary_bp": "5"}, {"canary_bp": 10_001},
    {"revision": -1}, {"reason": None}, {"updated_at": "now"},
])
def test_a_state_it_does_not_recognise_is_left_to_the_full_path(change):
    doc = dict(json.loads(STATES[1].model_dump_json()), **change)
    with pytest.raises(Unrecognised):
        SwitchState.from_json(json.dumps(doc))
    doc = json.loads(STATES[1].model_dump_json())
    del doc["reason"]
    with pytest.raises(Unrecognised):
        SwitchState.from_json(json.dumps(doc))


def test_a_whole_second_timestamp_as_cjson_writes_it_is_read():
    doc = dict(json.loads(STATES[1].model_dump_json()), updated_at=1_700_000_000)
    state = SwitchState.from_json(json.dumps(doc, separators=(",", ":")))
    assert state.updated_at == 1_700_000_000.0 and isinstance(state.updated_at, float)


@pytest.mark.parametrize("bp", [0, 1, 2_500, 4_999, 5_000, 7_500, 10_000])
def test_big_move_judges_both_kinds_of_state_alike(bp):
    for kill in (False, True):
        pydantic_state = RolloutState(canary_bp=bp, kill=kill)
        switch = SwitchState(canary_bp=bp, kill=kill)
        for update in ({"kill": not kill}, {"canary_bp": 10_000 - bp}):
            assert big_move(switch, switch.model_copy(update=update)) == rollout_big_move(
                pydantic_state, pydantic_state.model_copy(update=update))


# --- the settings -------------------------------------------------------------------------------


def args(**given) -> argparse.Namespace:
    return argparse.Namespace(command="kill", **given)


def test_the_defaults_are_the_settings_defaults(monkeypatch):
    for name in ("REDIS_URL", "CANARY_REDIS_URL", "CANARY_APP_NAME", "CANARY_REDIS_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert (settings.redis_url, settings.app_name, settings.redis_timeout_s) == (
        DEFAULT_REDIS_URL, DEFAULT_APP, DEFAULT_TIMEOUT_S)


@pytest.mark.parametrize("env, flags", [
    ({}, {}),
    ({"REDIS_URL": "redis://a:6379/1"}, {}),
    ({"CANARY_REDIS_URL": "redis://b:6379/2"}, {}),
    ({"REDIS_URL": "redis://a:6379/1", "CANARY_REDIS_URL": "redis://b:6379/2"}, {}),
    ({"redis_url": "rediss://u:p@c:6380/0", "canary_app_name": "search"}, {}),
    ({"CANARY_APP_NAME": "search", "CANARY_REDIS_TIMEOUT_S": "0.5"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "30"}, {"app": "other"}),
    ({"REDIS_URL": "redis://a:6379/1"}, {"redis_url": "unix:///run/redis.sock?db=3"}),
])
def test_the_settings_are_read_as_settings_reads_them(monkeypatch, env, flags):
    for name in ("REDIS_URL", "CANARY_REDIS_URL", "CANARY_APP_NAME", "CANARY_REDIS_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    overrides = {"app_name" if k == "app" else k: v for k, v in flags.items()}
    settings = Settings(**overrides)
    assert target_from(args(**flags), env) == Target(
        settings.redis_url, settings.app_name, settings.redis_timeout_s)


@pytest.mark.parametrize("env, flags", [
    ({"CANARY_MAX_BATCH_SIZE": "0"}, {}),  # a setting the full path validates (exit 2)
    ({"canary_request_log": "true"}, {}),  # even a valid one
    ({"CANARY_REDIS_TIMEOUT_S": "0"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "31"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": " 2"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "2e0"}, {}),
    ({"REDIS_URL": "http://db:6379"}, {}),
    ({}, {"redis_url": "nope"}),
    ({}, {"app": "two words"}),
    ({"CANARY_APP_NAME": "x" * 65}, {}),
    ({"REDIS_URL": "redis://a", "redis_url": "redis://b"}, {}),  # Settings picks one of two
])
def test_settings_it_cannot_read_exactly_leave_the_command_to_the_full_path(env, flags):
    assert target_from(args(**flags), env) is None


# --- the Redis URL ------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0",
    "redis://localhost",
    "redis://:s3cret@db.internal:6380/4",
    "redis://operator:p%40ss@db:6379/0",
    "redis://db:6379/0?password=q&username=gw",
    "redis://op:pw@db:6379/0?password=ignored",
    "redis://db/notanumber",
    "redis://db:6379/1?db=2",
    "rediss://operator:pw@db:6380/0?ssl_ca_certs=/etc/ca.crt&ssl_cert_reqs=required",
    "rediss://db:6380/0?ssl_cert_reqs=none",
    "rediss://db:6380/0?ssl_check_hostname=false&ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
    "unix:///run/redis.sock?db=3&password=pw",
])
def test_urls_are_read_as_redis_py_reads_them(url):
    theirs = redis.connection.parse_url(url)
    ours = parse_url(url)
    kind = theirs.pop("connection_class", None)
    tls = kind is redis.connection.SSLConnection
    unix = kind is redis.connection.UnixDomainSocketConnection
    expected = Address(
        tls=tls, host=theirs.get("host", "localhost"), port=theirs.get("port", 6379),
        path=theirs.get("path") if unix else None, db=theirs.get("db", 0),
        username=theirs.get("username"), password=theirs.get("password"),
        cert_reqs=theirs.get("ssl_cert_reqs", "required") if tls else "required",
        ca_certs=theirs.get("ssl_ca_certs"), certfile=theirs.get("ssl_certfile"),
        keyfile=theirs.get("ssl_keyfile"),
        check_hostname=theirs.get("ssl_check_hostname", True) if tls else True,
    )
    assert ours == expected


@pytest.mark.parametrize("url", [
    "redis://db:6379/0?socket_timeout=5",  # would override the CLI's timeout
    "rediss://db:6380/0?ssl_ca_path=/etc/certs",
    "rediss://db:6380/0?ssl_cert_reqs=sometimes",
    "redis://user@db:6379/0",
    "redis://db:notaport/0",
    "redis://db:6379/0?db=x",
    "redis+sentinel://s1:26379/mymaster/0",
    "unix://",
])
def test_urls_with_options_it_does_not_implement_are_left_to_redis_py(url):
    with pytest.raises(Unsupported):
        parse_url(url)


# --- stepping aside -----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["kill"],  # no reason: the full path's usage error
    ["kill", "--reason", " "],
    ["kill", "--help"],
    ["status"],
    ["canary", "5", "--reason", "kill"],
    ["--bogus", "kill", "--reason", "r"],
])
def test_what_is_not_a_valid_kill_is_left_to_the_full_path(argv, capsys):
    out, err = io.StringIO(), io.StringIO()
    assert cli_kill.quick(argv, stdout=out, stderr=err, environ={}) is None
    assert out.getvalue() == err.getvalue() == "" and capsys.readouterr() == ("", "")


def test_an_unreachable_redis_is_reported_by_the_full_path(monkeypatch):
    url = f"redis://127.0.0.1:{free_port()}/0"
    out, err = io.StringIO(), io.StringIO()
    assert cli_kill.quick(["kill", "--reason", "r"], stdout=out, stderr=err,
                           environ={"REDIS_URL": url}) is None
    assert out.getvalue() == err.getvalue() == ""
    for name in ("CANARY_APP_NAME", "CANARY_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("CANARY_REDIS_TIMEOUT_S", "1")
    code = cli.main(["kill", "--reason", "r"], stdout=out, stderr=err)
    assert code == 1 and out.getvalue() == ""
    assert err.getvalue().startswith("rollout: error: cannot reach Redis at redis://127.0.0.1")


# --- what it imports ----------------------------------------------------------------------------


def test_the_cli_and_the_kill_switch_import_neither_pydantic_nor_redis_py():
    code = ("import sys; import ops.cli, rollout.killswitch, rollout.resp_client, rollout.share; "
            "heavy = {'pydantic', 'pydantic_settings', 'redis', 'opentelemetry', 'asyncio', "
            "'yaml', 'numpy', 'torch', 'ray', 'httpx'}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_lazy_package_exports_what_it_lists():
    assert set(rollout.__all__) == set(rollout._WHERE) | {"open_store", "open_telemetry"}
    for name in rollout.__all__:
        assert getattr(rollout, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rollout.nope  # noqa: B018
