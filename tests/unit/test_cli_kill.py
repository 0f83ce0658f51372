"""`rollout kill` / `unkill` (ops.cli.kill), piece by piece: the state document
(rollout.killswitch) held to RolloutState, the Redis URLs (rollout.resp_client.parse_url) held
to redis-py's and the transport each gets, and the one command's messages and exit codes for
every way it ends, on a scripted connection. No Redis (tests/integration/test_kill_redis.py runs
it against one; tests/unit/test_kill_settings.py holds its settings to Settings)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
import types

import pydantic
import pytest
import redis.connection

import rollout
from ops import cli
from ops.cli import kill as cli_kill
from rollout import RolloutState
from rollout.control import big_move as rollout_big_move
from rollout.errors import StateUnreadable
from rollout.kill_settings import KillSettings
from rollout.killswitch import QuickSwitch, RedisPyConnection, SwitchState, Unrecognised
from rollout.redis_layout import Keys
from rollout.resp_client import (
    IGNORED_OPTIONS,
    OPTIONS,
    Address,
    AuthError,
    Connection,
    NoPrimary,
    ProtocolError,
    ReplyError,
    Unsupported,
    parse_url,
)
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
    assert list(SwitchState.__dataclass_fields__) == [*RolloutState.model_fields, "extra"]
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


def test_fields_of_a_newer_version_are_kept_by_the_switch():
    doc = dict(json.loads(STATES[1].model_dump_json()), canary_cohort={"region": "eu"}, extra=1)
    switch = SwitchState.from_json(json.dumps(doc))
    assert switch.extra == (("canary_cohort", {"region": "eu"}), ("extra", 1))
    killed = switch.model_copy(update={"kill": True})
    expected = RolloutState.model_validate(doc).model_copy(update={"kill": True})
    assert killed.to_json() == expected.model_dump_json()  # as pydantic writes it, byte for byte
    assert json.loads(killed.to_json())["canary_cohort"] == {"region": "eu"}


def test_a_kill_on_a_state_of_a_newer_version_keeps_its_fields(scripted):
    stored(scripted, canary_bp=2000)
    scripted.state = json.dumps(dict(json.loads(scripted.state), canary_cohort="eu"))
    assert scripted.run("kill")[0] == 0
    written = json.loads(scripted.state)
    assert written["kill"] is True and written["canary_cohort"] == "eu"


def test_a_change_above_what_gateways_saw_says_the_store_went_back(scripted):
    stored(scripted, canary_bp=2000, revision=3)
    scripted.deployed = ['{"gateway": "g1", "state_revision": 9}', '{"state_revision": "x"}',
                         "not json"]
    code, out, err = scripted.run("kill")
    assert code == 0 and "(revision 10)" in out
    assert err.startswith("rollout: warning: the store was at revision 3, behind revision 9")


@pytest.mark.parametrize("change", [
    {"kill": 1}, {"canary_bp": True}, {"canary_bp": "5"}, {"canary_bp": 10_001},
    {"revision": -1}, {"reason": None}, {"updated_at": "now"},
])
def test_a_state_it_does_not_read_exactly_is_read_by_rollout_state(change):
    doc = dict(json.loads(STATES[1].model_dump_json()), **change)
    with pytest.raises(Unrecognised):
        SwitchState.from_json(json.dumps(doc))
    try:
        expected = RolloutState.model_validate(doc)
    except pydantic.ValidationError:
        with pytest.raises(StateUnreadable):
            SwitchState.read(json.dumps(doc))
    else:  # what pydantic accepts, in its canonical form
        assert SwitchState.read(json.dumps(doc)).to_json() == expected.model_dump_json()
    doc = json.loads(STATES[1].model_dump_json())
    del doc["reason"]
    with pytest.raises(Unrecognised):
        SwitchState.from_json(json.dumps(doc))
    assert SwitchState.read(json.dumps(doc)).reason == ""  # pydantic's default


def test_a_stored_state_pydantic_refuses_is_one_line_and_exit_1(scripted):
    scripted.state = '{"canary_bp": "six"}'
    code, out, err = scripted.run("kill")
    assert (code, out) == (1, "") and scripted.writes == []
    assert err.startswith("rollout: error: the stored rollout state cannot be read by this "
                          "version: canary_bp: Input should be a valid integer")


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


# --- the Redis URL and its transport ------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0",
    "redis://localhost",
    "redis://:s3cret@db.internal:6380/4",
    "redis://operator:p%40ss@db:6379/0",
    "redis://db:6379/0?password=q&username=gw",
    "redis://op:pw@db:6379/0?password=ignored",
    "redis://db/notanumber",
    "redis://db:6379/1?db=2",
    "redis://db:6379/0?client_name=ops-kill&socket_timeout=5&socket_connect_timeout=0.5",
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
        client_name=theirs.get("client_name"), read_timeout_s=theirs.get("socket_timeout"),
        connect_timeout_s=theirs.get("socket_connect_timeout"),
    )
    assert ours == expected


def test_every_option_redis_py_parses_is_implemented_ignored_or_sent_to_redis_py():
    parsed = set(redis.connection.URL_QUERY_ARGUMENT_PARSERS)
    assert set(IGNORED_OPTIONS) <= parsed  # pool-only, each with redis-py's own parser
    for name in parsed - OPTIONS - set(IGNORED_OPTIONS) - {"ssl_check_hostname"}:
        with pytest.raises(Unsupported):
            parse_url(f"redis://db:6379/0?{name}=1")
    for name in IGNORED_OPTIONS:
        assert parse_url(f"redis://db:6379/0?{name}=2") == Address(host="db")


@pytest.mark.parametrize("url", [
    "redis://db:6379/0?retry_on_timeout=true",  # redis-py retries a timed-out command
    "redis://db:6379/0?protocol=3",
    "redis://db:6379/0?health_check_interval=often",  # ignored, but redis-py refuses it
    "redis://db:6379/0?socket_timeout=-1",
    "rediss://db:6380/0?ssl_ca_path=/etc/certs",
    "rediss://db:6380/0?ssl_cert_reqs=sometimes",
    "redis://user@db:6379/0",
    "redis://db:notaport/0",
    "redis://db:6379/0?db=x",
    "redis+sentinel://s1:26379/mymaster/0",
    "unix://",
])
def test_urls_with_options_it_does_not_implement_run_over_redis_py(url):
    with pytest.raises(Unsupported):
        parse_url(url)
    if url.startswith(("redis+", "unix://", "redis://db:notaport")):
        return  # a sentinel URL is resp_client's; the others redis-py refuses when it connects
    settings = KillSettings(redis_url=url)
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:  # redis-py refuses it, for the kill as for the gateway
        with pytest.raises(ValueError, match=str(exc)):
            cli_kill.connect(settings)
        return
    with contextlib.closing(cli_kill.connect(settings)) as conn:  # no Redis needed: lazy
        assert isinstance(conn, RedisPyConnection)


def test_the_options_it_implements_reach_the_socket(monkeypatch):
    opened = []

    class Recorded(Connection):
        def __init__(self, address, timeout_s):
            opened.append((address.connect_timeout_s, address.read_timeout_s, timeout_s,
                           address.client_name))
            raise ConnectionRefusedError("recorded")

    monkeypatch.setattr("rollout.resp_client.Connection", Recorded)
    url = f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=0.5&client_name=ops"
    with pytest.raises(ConnectionRefusedError):
        cli_kill.connect(KillSettings(redis_url=url, redis_timeout_s=3.0))
    assert opened == [(0.5, None, 3.0, "ops")]


# --- the one command, on a scripted connection --------------------------------------------------


class Scripted:
    """A connection answering the kill's commands (HGET, HVALS of the gateways' reports, the
    CAS script, WAIT) from a stored state, or raising `error` on a given command; and
    `run(...)`, the command on it."""

    def __init__(self, monkeypatch):
        self.state: str | None = None
        self.revision, self.acknowledged = 0, 0
        self.writes: list[list] = []
        self.deployed: list[str] = []  # the gateways' reports (DeploymentReport JSON)
        self.errors: dict[str, BaseException] = {}
        self.connects = 0
        monkeypatch.setattr(cli_kill, "connect", self._connect)
        monkeypatch.setattr(cli_kill, "RETRY_PAUSE_S", 0.0)
        for name in ("REDIS_URL", "CANARY_REDIS_URL", "CANARY_REDIS_WAIT_REPLICAS"):
            monkeypatch.delenv(name, raising=False)
        self.env = monkeypatch.setenv

    def _connect(self, settings):
        self.connects += 1
        if "connect" in self.errors:
            raise self.errors["connect"]
        return contextlib.nullcontext(self)

    def call(self, *args):
        if args[0] in self.errors:
            raise self.errors[args[0]]
        if args[0] == "HGET":
            return self.state
        if args[0] == "HVALS":
            return self.deployed
        assert args[0] == "WAIT"
        return self.acknowledged

    def script(self, source, keys, args):
        if "script" in self.errors:
            raise self.errors["script"]
        if int(args[0]) != self.revision:
            return [0, self.revision]
        self.writes.append(args)
        self.revision, self.state = int(args[1]), args[2]
        return [1, self.revision]

    def run(self, *argv: str, stdin=None) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--actor", "alice", *argv, "--reason", "r"], stdin=stdin, stdout=out,
                        stderr=err)
        return code, out.getvalue(), err.getvalue()


@pytest.fixture
def scripted(monkeypatch):
    return Scripted(monkeypatch)


def stored(scripted: Scripted, **fields) -> None:
    scripted.revision = fields.setdefault("revision", 1)
    scripted.state = RolloutState(**fields).model_dump_json()


def test_kill_and_unkill_print_one_line_each(scripted):
    stored(scripted, canary_bp=2000)
    assert scripted.run("kill") == (
        0, "kill switch off -> on, all traffic to baseline (revision 2) by alice: r\n", "")
    assert scripted.run("unkill")[:2] == (
        0, "kill switch on -> off, 20% to optimized (revision 3) by alice: r\n")
    assert scripted.run("unkill")[:2] == (
        0, "kill switch already off (revision 3): nothing changed\n")
    actor, action, reason = scripted.writes[0][4:7]
    assert (actor, action, reason) == ("alice", "kill", "r")


def test_unkill_of_a_big_share_asks_on_a_terminal_and_refuses_without_one(scripted):
    stored(scripted, canary_bp=6000, kill=True)
    code, _, err = scripted.run("unkill")
    assert code == 2 and "turning the kill switch off with the canary at 60% needs " \
                         "confirmation: pass --yes" in err
    code, _, err = scripted.run("unkill", stdin=io.StringIO("n\n"))
    assert code == 1 and err.endswith("rollout: aborted: nothing was changed\n")
    assert "Turn the kill switch off, sending 60% of traffic to optimized (revision 1)?" in err
    assert scripted.writes == []
    assert scripted.run("unkill", stdin=io.StringIO("y\n"))[0] == 0
    assert scripted.run("kill", "--yes")[0] == 2  # kill never asks: it has no --yes


@pytest.mark.parametrize("error, message", [
    (ConnectionRefusedError(111, "Connection refused"),
     "rollout: error: cannot reach Redis at redis://op:***@db:6379/0: ConnectionRefusedError: "
     "[Errno 111] Connection refused (check REDIS_URL or --redis-url)"),
    (TimeoutError("timed out"), "rollout: error: cannot reach Redis at redis://op:***@db:6379/0: "
     "TimeoutError: timed out (check REDIS_URL or --redis-url)"),
    (AuthError("WRONGPASS invalid username-password pair or user is disabled."),
     "rollout: error: cannot reach Redis at redis://op:***@db:6379/0: AuthenticationError: "
     "WRONGPASS invalid username-password pair or user is disabled. (check REDIS_URL or "
     "--redis-url)"),
    (ProtocolError("the connection closed mid-reply"), "rollout: error: cannot reach Redis at "
     "redis://op:***@db:6379/0: ProtocolError: the connection closed mid-reply (check "
     "REDIS_URL or --redis-url)"),
])
def test_redis_it_cannot_reach_is_one_line_and_exit_1(scripted, error, message):
    scripted.env("REDIS_URL", "redis://op:s3cret@db:6379/0")
    scripted.errors["connect"] = error
    assert scripted.run("kill") == (1, "", message + "\n")


def test_a_refused_command_is_permission_denied(scripted):
    scripted.env("REDIS_URL", "redis://gw:s3cret@db:6379/0")
    scripted.errors["script"] = ReplyError("NOPERM User gw has no permissions to run the "
                                           "'evalsha' command")
    assert scripted.run("kill") == (1, "", (
        "rollout: error: Redis at redis://gw:***@db:6379/0 refused: User gw has no permissions "
        "to run the 'evalsha' command (this Redis user may not change the rollout; use an "
        "operator's credentials)\n"))


def test_unkill_of_a_state_changed_while_asking_is_a_conflict(scripted):
    stored(scripted, canary_bp=6000, kill=True)

    class Meanwhile(io.StringIO):
        def readline(self, *args):
            scripted.revision += 1  # someone else wrote
            return "y\n"

    code, _, err = scripted.run("unkill", stdin=Meanwhile())
    assert code == 1 and "rollout state changed concurrently: expected revision 1, found 2" in err


def test_a_kill_behind_sentinel_retries_while_redis_fails_over(scripted):
    scripted.env("REDIS_URL", "redis+sentinel://h:1/svc/0")
    scripted.env("CANARY_REDIS_WAIT_REPLICAS", "0")
    failures = [NoPrimary("no primary for svc"), ReplyError("READONLY You can't write")]

    def flaky(*args):
        if failures:
            raise failures.pop(0)
        return None

    scripted.call = flaky
    assert scripted.run("kill")[0] == 0 and scripted.connects == 3


def test_the_kill_budget_runs_from_the_command_not_from_the_import(scripted, monkeypatch):
    """A process that runs many commands (a test run, a drill) imported the module long before:
    the budget still runs from this kill's start."""
    scripted.env("REDIS_URL", "redis+sentinel://h:1/svc/0")
    scripted.env("CANARY_REDIS_WAIT_REPLICAS", "0")
    later = time.monotonic() + 3_600  # an hour after the import
    monkeypatch.setattr(cli_kill, "time", types.SimpleNamespace(monotonic=lambda: later,
                                                                sleep=lambda s: None))
    failures = [NoPrimary("no primary for svc")]

    def flaky(*args):
        if failures:
            raise failures.pop()

    scripted.call = flaky
    assert scripted.run("kill")[0] == 0 and scripted.connects == 2


def test_a_kill_behind_sentinel_gives_up_at_once_on_a_refused_password(scripted):
    scripted.env("REDIS_URL", "redis+sentinel://:pw@h:1/svc/0")
    scripted.errors["connect"] = AuthError("WRONGPASS invalid username-password pair")
    code, _, err = scripted.run("kill")
    assert code == 1 and scripted.connects == 1 and "AuthenticationError" in err


def test_a_kill_behind_sentinel_stops_when_its_budget_is_spent(scripted):
    scripted.env("REDIS_URL", "redis+sentinel://h:1/svc/0")
    scripted.env("CANARY_KILL_RETRY_S", "0")
    scripted.errors["connect"] = NoPrimary("no primary for svc: sentinel h:1: refused")
    code, _, err = scripted.run("kill")
    assert code == 1 and scripted.connects == 1
    assert "cannot reach Redis at redis+sentinel://h:1/svc/0: NoPrimary: no primary" in err


def test_one_redis_and_unkill_are_tried_once(scripted):
    scripted.errors["connect"] = ConnectionRefusedError()
    assert scripted.run("kill")[0] == 1 and scripted.connects == 1
    scripted.env("REDIS_URL", "redis+sentinel://h:1/svc/0")
    assert scripted.run("unkill")[0] == 1 and scripted.connects == 2


def test_a_write_too_few_replicas_acknowledge_is_reported_once(scripted):
    scripted.env("REDIS_URL", "redis+sentinel://h:1/svc/0")
    scripted.env("CANARY_REDIS_WAIT_REPLICAS", "2")
    scripted.env("CANARY_REDIS_WAIT_TIMEOUT_MS", "10")
    scripted.env("CANARY_KILL_RETRY_S", "0.3")
    scripted.acknowledged = 1
    code, out, err = scripted.run("kill")
    assert (code, out) == (1, "") and len(scripted.writes) == 1  # asked again, written once
    assert err.startswith("rollout: error: revision 1 (kill) was written to the Redis primary, "
                          "but 1 of the 2 replica(s) required acknowledged it within 10 ms")


def test_an_interrupted_kill_is_exit_130(scripted):
    scripted.errors["connect"] = KeyboardInterrupt()
    assert scripted.run("kill") == (130, "", "\nrollout: interrupted\n")


def test_a_closed_stdout_is_not_a_redis_failure(scripted):
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError()

    stored(scripted)
    code = cli.main(["--actor", "a", "kill", "--reason", "r"], stdout=Closed(),
                    stderr=io.StringIO())
    assert code == 1 and len(scripted.writes) == 1 and scripted.connects == 1


def test_the_switch_on_a_store_is_rollouts(monkeypatch):
    """What tests inject (ops.cli.main(store=...)): the same handlers on Rollout, whose kill is
    QuickSwitch's (rollout.change)."""
    assert QuickSwitch.kill is rollout.Rollout.kill and QuickSwitch.unkill is rollout.Rollout.unkill
    assert Keys("a").state == "rollout:a:state"


# --- usage --------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, code", [
    (["kill"], 2), (["kill", "--reason", " "], 2), (["--bogus", "kill", "--reason", "r"], 2),
    (["kill", "--reason", "r", "--yes"], 2), (["kill", "--help"], 0), (["unkill", "--help"], 0),
])
def test_usage_errors_and_help_never_reach_redis(argv, code, capsys, monkeypatch):
    monkeypatch.setattr(cli_kill, "connect", lambda settings: pytest.fail("reached Redis"))
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(argv, stdout=out, stderr=err) == code
    if code:
        assert err.getvalue().startswith("rollout: error: ") and out.getvalue() == ""
    else:
        assert out.getvalue().startswith(f"usage: rollout {argv[0]}") and err.getvalue() == ""


# --- what it imports ----------------------------------------------------------------------------


def test_the_cli_and_the_kill_switch_import_neither_pydantic_nor_redis_py():
    code = ("import sys; import ops.cli, ops.cli.kill, rollout.killswitch, rollout.resp_client, "
            "rollout.kill_settings, rollout.change, rollout.share; "
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
