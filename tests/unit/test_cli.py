"""The `rollout` CLI against the in-memory store and a fake clock: no Redis, no Ray."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass

import pytest

from ops import cli
from rollout import DeploymentReport, FakeClock, MemoryStateStore, Rollout, StoreUnavailable

START = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@dataclass
class Result:
    code: int
    out: str
    err: str


class Cli:
    """Runs `rollout ...` in process with an injected store, clock and streams."""

    def __init__(self, store=None, clock=None):
        self.store = store or MemoryStateStore()
        self.clock = clock or FakeClock(START)

    def __call__(self, *argv: str, stdin=None, actor: str | None = "alice") -> Result:
        out, err = io.StringIO(), io.StringIO()
        args = (["--actor", actor] if actor else []) + list(argv)
        code = cli.main(args, store=self.store, clock=self.clock, stdin=stdin, stdout=out,
                        stderr=err)
        return Result(code, out.getvalue(), err.getvalue())

    @property
    def state(self):
        return self.store.get()

    def setup(self, *argv: str) -> None:
        """A change made by someone else, assumed to succeed."""
        result = self(*argv, "--yes", actor="setup") if argv[0] != "kill" else self(*argv)
        assert result.code == 0, result.err


@pytest.fixture
def run():
    return Cli()


@pytest.fixture(autouse=True)
def not_a_terminal(monkeypatch):
    """The real stdin is never a terminal here, even under `pytest -s`."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


def one_error_line(result: Result) -> str:
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("rollout: "), result.err
    assert "Traceback" not in result.err
    return lines[0]


# --- status -----------------------------------------------------------------------------------


def test_status_of_a_fresh_store(run):
    result = run("status")
    assert result.code == 0 and result.err == ""
    assert "canary share     0%" in result.out
    assert "kill switch      off" in result.out
    assert "last change      never" in result.out


def test_status_shows_the_last_change_with_time_and_age(run):
    run.setup("canary", "5", "--reason", "first 5%")
    run.clock.advance(200)
    result = run("status")
    assert result.code == 0
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.out.splitlines())
    assert rows["canary share"] == "5%"
    assert rows["effective share"] == "5% of traffic to optimized"
    assert rows["revision"] == "1"
    assert rows["last change"] == "2023-11-14T22:13:20Z (3m 20s ago)"
    assert rows["changed by"] == "setup"
    assert rows["reason"] == "first 5%"


def test_status_with_the_kill_switch_on_shows_nothing_effective(run):
    run.setup("canary", "20", "--reason", "r")
    run.setup("kill", "--reason", "p99 regression")
    out = run("status").out
    assert "kill switch      ON: all traffic to baseline" in out
    assert "effective share  0% of traffic to optimized (kill switch on)" in out
    assert "canary share     20%" in out


def test_status_says_which_gateway_is_stale_and_why_and_what_it_survived(run):
    run.setup("canary", "5", "--reason", "r")
    run.store.report_deployment(DeploymentReport(
        gateway="gw-a", baseline_version="b1", optimized_version="o1", ts=run.clock.time(),
        state_revision=1, stale=True, state_error="READONLY You can't write",
        store_errors={"READONLY": 3, "unavailable": 1}))
    run.store.report_deployment(DeploymentReport(
        gateway="gw-b", baseline_version="b1", optimized_version="o1", ts=run.clock.time(),
        state_revision=7, stale=True))
    out = run("status").out
    assert "stale state: routing all to baseline (READONLY You can't write)" in out
    assert re.search(r"store errors +READONLY 3, unavailable 1", out)
    assert "routed by revision 7, above the store's 1: the store lost writes" in out


def test_a_change_after_the_store_lost_writes_is_numbered_above_them_and_warned(run):
    run.setup("canary", "5", "--reason", "r")
    run.store.report_deployment(DeploymentReport(
        gateway="gw", baseline_version="b1", optimized_version="o1", ts=run.clock.time(),
        state_revision=7))
    result = run("canary", "10", "--reason", "resume", "--yes")
    assert result.code == 0 and run.state.revision == 8
    assert "rollout: warning: the store was at revision 1, behind revision 7" in result.err


def test_status_json(run):
    run.setup("canary", "0.25", "--reason", "smoke")
    run.setup("kill", "--reason", "stop")
    result = run("status", "--json")
    assert result.code == 0
    doc = json.loads(result.out)
    assert doc["canary_bp"] == 25 and doc["canary_percent"] == 0.25
    assert doc["kill"] is True and doc["effective_percent"] == 0
    assert doc["revision"] == 2 and doc["updated_by"] == "alice" and doc["reason"] == "stop"
    assert {"baseline_version", "optimized_version", "updated_at"} <= doc.keys()


class WrittenAround(MemoryStateStore):
    """A store whose current state was written around the audited path (as the README's
    redis-cli emergency kill does): `changes` applied, no history, no audit entry."""

    def __init__(self, **changes):
        super().__init__()
        self.changes = changes

    def get(self):
        state = super().get()
        if not self.changes:
            return state
        return state.model_copy(update=dict(self.changes, updated_by="redis-cli"))


def test_status_flags_a_kill_switch_without_its_audit_entry():
    run = Cli(WrittenAround())
    run.setup("canary", "5", "--reason", "first 5%")
    assert json.loads(run("status", "--json").out)["audited"] is True
    assert "UNAUDITED" not in run("status").out
    run.store.changes = {"kill": True, "revision": 2}  # the emergency kill: revision bumped
    doc = json.loads(run("status", "--json").out)
    assert doc["audited"] is False and doc["kill"] is True
    row = next(line for line in run("status").out.splitlines() if line.startswith("UNAUDITED"))
    assert "revision 2 (kill switch on) was written outside `rollout` and has no audit entry" \
           in row and "record why with `rollout kill --reason TEXT`" in row
    run.store.changes = {"canary_bp": 9000}  # a hand edit at the same revision
    assert json.loads(run("status", "--json").out)["audited"] is False
    assert "revision 1 was written outside `rollout`" in run("status").out


# --- canary -----------------------------------------------------------------------------------


def test_canary_change_is_audited_with_actor_and_reason(run):
    result = run("canary", "5", "--reason", "first 5%")
    assert result.code == 0, result.err
    assert result.out == "canary 0% -> 5% (revision 1) by alice: first 5%\n"
    assert run.state.canary_bp == 500
    [entry] = run.store.audit()
    assert (entry.actor, entry.reason, entry.revision) == ("alice", "first 5%", 1)
    assert entry.action == "canary 0% -> 5%"
    assert entry.ts == START


def test_percent_sign_is_accepted(run):
    assert run("canary", "7.5%", "--reason", "r").code == 0
    assert run.state.canary_bp == 750


@pytest.mark.parametrize("argv", [
    ["canary", "5"],
    ["canary", "5", "--reason", ""],
    ["canary", "5", "--reason", "   "],
    ["canary", "5", "--reason", "two\nlines"],
    ["kill"],
    ["unkill"],
    ["revert", "1"],
])
def test_changes_need_a_reason(run, argv):
    result = run(*argv)
    assert result.code == 2
    assert "reason" in one_error_line(result)
    assert run.store.audit() == []


@pytest.mark.parametrize("pct", ["101", "100.01", "0.001", "abc", "-5", "", "5.5.5", "nan", "1e2"])
def test_invalid_percent_is_refused_and_nothing_written(run, pct):
    result = run("canary", pct, "--reason", "r", "--yes")
    assert result.code == 2
    line = one_error_line(result)
    assert line.startswith("rollout: error: ")
    assert "PCT" in line or "canary share" in line
    assert run.store.audit() == [] and run.state.revision == 0


def test_same_share_is_a_no_op(run):
    run.setup("canary", "5", "--reason", "r")
    result = run("canary", "5", "--reason", "again")
    assert result.code == 0
    assert "already at 5%" in result.out
    assert run.state.revision == 1


@pytest.mark.parametrize("start, target", [("0", "60"), ("0", "100"), ("60", "5"), ("95", "100")])
def test_big_move_without_yes_is_refused_when_not_interactive(run, start, target):
    if start != "0":
        run.setup("canary", start, "--reason", "start")
    revision = run.state.revision
    result = run("canary", target, "--reason", "big")
    assert result.code == 2
    line = one_error_line(result)
    assert "--yes" in line and "needs confirmation" in line
    assert run.state.revision == revision


@pytest.mark.parametrize("target", ["60", "100"])
def test_big_move_with_yes_succeeds(run, target):
    result = run("canary", target, "--reason", "big", "--yes")
    assert result.code == 0, result.err
    assert run.state.canary_bp == int(target) * 100


def test_small_move_does_not_ask(run):
    stdin = io.StringIO("n\n")
    result = run("canary", "49.99", "--reason", "r", stdin=stdin)
    assert result.code == 0 and result.err == ""
    assert stdin.read() == "n\n"  # untouched


@pytest.mark.parametrize("answer", ["y\n", "Y\n", "yes\n"])
def test_interactive_yes_proceeds(run, answer):
    result = run("canary", "60", "--reason", "big", stdin=io.StringIO(answer))
    assert result.code == 0, result.err
    assert "Move canary from 0% to 60%" in result.err and "[y/N]" in result.err
    assert run.state.canary_bp == 6000


@pytest.mark.parametrize("answer", ["n\n", "\n", "", "maybe\n"])
def test_interactive_no_aborts_and_writes_nothing(run, answer):
    result = run("canary", "100", "--reason", "big", stdin=io.StringIO(answer))
    assert result.code == 1
    assert "Move canary from 0% to 100%" in result.err
    assert result.err.strip().splitlines()[-1] == "rollout: aborted: nothing was changed"
    assert run.state.revision == 0 and run.store.audit() == []


def test_canary_while_killed_warns_but_changes_the_share(run):
    run.setup("kill", "--reason", "stop")
    result = run("canary", "10", "--reason", "next step")
    assert result.code == 0
    assert "kill switch is on" in result.err and "rollout unkill" in result.err
    assert run.state.canary_bp == 1000 and run.state.kill and run.state.effective_bp == 0


# --- kill / unkill ----------------------------------------------------------------------------


def test_kill_and_unkill(run):
    run.setup("canary", "20", "--reason", "r")
    result = run("kill", "--reason", "p99 regression")
    assert result.code == 0
    assert result.out == ("kill switch off -> on, all traffic to baseline (revision 2) "
                          "by alice: p99 regression\n")
    assert run.state.kill and run.state.canary_bp == 2000
    result = run("unkill", "--reason", "fixed")
    assert result.code == 0, result.err
    assert result.out == "kill switch on -> off, 20% to optimized (revision 3) by alice: fixed\n"
    assert not run.state.kill
    assert [e.action for e in run.store.audit()] == ["canary 0% -> 20%", "kill", "unkill"]


def test_kill_never_asks_and_always_records(run):
    run.setup("canary", "100", "--reason", "r")
    assert run("kill", "--reason", "one").code == 0
    result = run("kill", "--reason", "two")
    assert result.code == 0 and "already on" in result.out
    assert run.state.revision == 3


def test_unkill_when_off_is_a_no_op(run):
    result = run("unkill", "--reason", "r")
    assert result.code == 0 and "already off" in result.out
    assert run.state.revision == 0


@pytest.mark.parametrize("share", ["50", "100"])
def test_unkill_of_a_big_share_needs_confirmation(run, share):
    run.setup("canary", share, "--reason", "r")
    run.setup("kill", "--reason", "stop")
    result = run("unkill", "--reason", "go")
    assert result.code == 2 and "--yes" in one_error_line(result)
    assert run.state.kill
    result = run("unkill", "--reason", "go", stdin=io.StringIO("n\n"))
    assert result.code == 1 and f"sending {share}% of traffic to optimized" in result.err
    assert run.state.kill
    assert run("unkill", "--reason", "go", stdin=io.StringIO("y\n")).code == 0
    assert not run.state.kill


def test_unkill_of_a_small_share_does_not_ask(run):
    run.setup("canary", "49", "--reason", "r")
    run.setup("kill", "--reason", "stop")
    assert run("unkill", "--reason", "go").code == 0
    assert not run.state.kill


# --- audit ------------------------------------------------------------------------------------


def test_audit_table(run):
    assert run("audit").out == "no changes recorded\n"
    run.setup("canary", "5", "--reason", "first 5%")
    run.clock.advance(60)
    assert run("kill", "--reason", "p99 regression").code == 0
    lines = run("audit").out.splitlines()
    assert lines[0].split() == ["ID", "TIME", "ACTOR", "ACTION", "REVISION", "REASON"]
    assert "2023-11-14T22:13:20Z" in lines[1] and "setup" in lines[1] and "first 5%" in lines[1]
    assert "2023-11-14T22:14:20Z" in lines[2] and "alice" in lines[2]
    assert lines[2].endswith("2         p99 regression")
    assert len(run("audit", "--last", "1").out.splitlines()) == 2


def test_audit_json(run):
    run.setup("canary", "5", "--reason", "first")
    run.setup("kill", "--reason", "second")
    entries = json.loads(run("audit", "--json").out)
    assert [(e["revision"], e["reason"], e["actor"]) for e in entries] == [
        (1, "first", "setup"), (2, "second", "alice")]
    assert entries[0]["before"] is None and entries[0]["after"]["canary_bp"] == 500
    [last] = json.loads(run("audit", "--json", "--last", "1").out)
    assert last["action"] == "kill"


@pytest.mark.parametrize("n", ["0", "-1", "x"])
def test_audit_last_must_be_positive(run, n):
    assert run("audit", "--last", n).code == 2


def test_audit_escapes_control_characters_from_the_store(run):
    Rollout(run.store, run.clock).set_canary(5, actor="mallory\x1b[2J", reason="a\nb")
    out = run("audit").out
    assert "\x1b" not in out and "\\x1b[2J" in out and "a | b" in out
    assert len(out.splitlines()) == 2


# --- revert -----------------------------------------------------------------------------------


def test_revert_restores_share_and_kill_switch(run):
    run.setup("canary", "5", "--reason", "r1")
    run.setup("canary", "20", "--reason", "r2")
    run.setup("kill", "--reason", "r3")
    result = run("revert", "1", "--reason", "back to 5")
    assert result.code == 0, result.err
    assert result.out == ("revert to revision 1: canary 20% -> 5%, kill switch on -> off "
                          "(revision 4) by alice: back to 5\n")
    assert (run.state.canary_bp, run.state.kill, run.state.revision) == (500, False, 4)
    assert run.store.audit()[-1].action == "revert to revision 1"


def test_revert_with_a_big_jump_asks(run):
    run.setup("canary", "60", "--reason", "r1")
    run.setup("canary", "1", "--reason", "r2")
    result = run("revert", "1", "--reason", "again")
    assert result.code == 2 and "--yes" in one_error_line(result)
    assert "canary 1% -> 60%" in result.err
    result = run("revert", "1", "--reason", "again", stdin=io.StringIO("n\n"))
    assert result.code == 1 and "Revert to revision 1 (canary 1% -> 60%" in result.err
    assert run.state.revision == 2
    assert run("revert", "1", "--reason", "again", "--yes").code == 0
    assert run.state.canary_bp == 6000


def test_revert_that_lifts_the_kill_switch_on_a_big_share_asks(run):
    run.setup("canary", "80", "--reason", "r1")
    run.setup("kill", "--reason", "r2")
    assert run("revert", "1", "--reason", "lift").code == 2
    assert run.state.kill


def test_revert_to_an_unknown_revision(run):
    result = run("revert", "9", "--reason", "r")
    assert result.code == 2 and "revision 9" in one_error_line(result)
    assert run("revert", "0", "--reason", "r").code == 2


def test_revert_to_the_current_settings_is_a_no_op(run):
    run.setup("canary", "5", "--reason", "r1")
    result = run("revert", "1", "--reason", "r")
    assert result.code == 0 and "nothing to revert" in result.out
    assert run.state.revision == 1


def _report(run, optimized):
    run.store.report_deployment(DeploymentReport(
        gateway="gw", baseline_version="b1", optimized_version=optimized, ts=run.clock.time()))


def test_revert_refused_for_another_optimized_model(run):
    _report(run, "o1")
    run.setup("canary", "5", "--reason", "r")  # revision 1, bound to o1
    run.setup("canary", "0", "--reason", "r")  # revision 2
    _report(run, "o2")
    result = run("revert", "1", "--reason", "r")
    assert result.code == 2 and "o2" in one_error_line(result)
    assert run.state.revision == 2


# --- concurrent changes -----------------------------------------------------------------------


class RacingStore(MemoryStateStore):
    """Someone else writes just before our compare-and-set."""

    def __init__(self):
        super().__init__()
        self.race = False

    def compare_and_set(self, before, after, *, actor, action, reason):
        if self.race:
            self.race = False
            Rollout(self, FakeClock()).set_canary(100, actor="bob", reason="meanwhile")
        return super().compare_and_set(before, after, actor=actor, action=action, reason=reason)


def test_conflict_between_read_and_write_is_reported():
    run = Cli(RacingStore())
    run.store.race = True
    result = run("canary", "5", "--reason", "mine")
    assert result.code == 1
    line = one_error_line(result)
    assert "changed concurrently" in line and "nothing was changed" in line
    assert run.state.canary_bp == 100 and run.state.updated_by == "bob"


class ChangeWhileAsking(io.StringIO):
    """Answers the prompt, but only after someone else changed the state."""

    def __init__(self, store, answer="y\n"):
        super().__init__(answer)
        self.store = store

    def readline(self, *args):
        Rollout(self.store, FakeClock()).set_canary(300, actor="bob", reason="meanwhile")
        return super().readline(*args)


@pytest.mark.parametrize("argv", [["canary", "60"], ["revert", "1"]])
def test_change_while_confirming_is_a_conflict(run, argv):
    run.setup("canary", "70", "--reason", "r1")
    run.setup("canary", "10", "--reason", "r2")
    result = run(*argv, "--reason", "mine", stdin=ChangeWhileAsking(run.store))
    assert result.code == 1
    assert "changed concurrently" in result.err.splitlines()[-1]
    assert run.state.canary_bp == 300 and run.state.revision == 3


def test_unkill_is_pinned_to_the_confirmed_revision(run):
    run.setup("canary", "60", "--reason", "r1")
    run.setup("kill", "--reason", "stop")
    result = run("unkill", "--reason", "go", stdin=ChangeWhileAsking(run.store))
    assert result.code == 1
    assert "changed concurrently" in result.err.splitlines()[-1]
    assert run.state.kill and run.state.canary_bp == 300


# --- errors, settings, actor, help ------------------------------------------------------------


class DownStore(MemoryStateStore):
    def get(self):
        raise StoreUnavailable("cannot reach Redis at redis://***@db:6379/0: ConnectionError")


def test_store_unavailable_is_one_line_and_exit_1():
    result = Cli(DownStore())("status")
    assert result.code == 1
    assert one_error_line(result).startswith("rollout: error: cannot reach Redis")


class BrokenStore(MemoryStateStore):
    def audit(self, last=None):
        raise TypeError("bad\nreply")


def test_unexpected_errors_are_still_one_line():
    result = Cli(BrokenStore())("audit")
    assert result.code == 1
    assert "unexpected TypeError" in one_error_line(result)


class InterruptedInput(io.StringIO):
    def readline(self, *args):
        raise KeyboardInterrupt


def test_ctrl_c_exits_130_without_writing(run):
    result = run("canary", "100", "--reason", "r", stdin=InterruptedInput())
    assert result.code == 130
    assert result.err.strip().splitlines()[-1] == "rollout: interrupted"
    assert run.state.revision == 0


@pytest.mark.parametrize("argv, setting", [
    (["--redis-url", "http://:hunter2@db:6379", "status"], "REDIS_URL"),
    (["status", "--redis-url", "nope"], "REDIS_URL"),
    (["--app", "two words", "status"], "CANARY_APP_NAME"),
])
def test_bad_settings_name_the_setting(argv, setting):
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(argv, stdout=out, stderr=err) == 2
    line = err.getvalue().strip()
    assert line.startswith("rollout: error: invalid setting") and setting in line
    assert "hunter2" not in line and "\n" not in line


def test_bad_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("CANARY_MAX_BATCH_SIZE", "0")
    err = io.StringIO()
    assert cli.main(["status"], stdout=io.StringIO(), stderr=err) == 2
    assert "CANARY_MAX_BATCH_SIZE" in err.getvalue()


def test_actor_from_the_environment(run, monkeypatch):
    monkeypatch.setenv("ROLLOUT_ACTOR", "deploy-bot")
    assert run("canary", "1", "--reason", "r", actor=None).code == 0
    assert run.store.audit()[-1].actor == "deploy-bot"


def test_default_actor_is_user_at_host(run, monkeypatch):
    monkeypatch.delenv("ROLLOUT_ACTOR", raising=False)
    monkeypatch.setenv("USER", "carol")
    monkeypatch.setenv("LOGNAME", "carol")
    monkeypatch.setattr("socket.gethostname", lambda: "ops-box")
    assert run("canary", "1", "--reason", "r", actor=None).code == 0
    assert run.store.audit()[-1].actor == "carol@ops-box"


def test_global_options_also_after_the_command(run):
    assert run("canary", "1", "--reason", "r", "--actor", "dave").code == 0
    assert run.store.audit()[-1].actor == "dave"


@pytest.mark.parametrize("command", [[], ["status"], ["canary"], ["kill"], ["unkill"], ["audit"],
                                     ["revert"]])
def test_help_for_every_command(run, command):
    result = run(*command, "--help", actor=None)
    assert result.code == 0 and result.err == ""
    assert result.out.startswith(f"usage: rollout {' '.join(command)}".rstrip())
    assert "examples:" in result.out
    assert run.state.revision == 0


def test_no_command_is_a_usage_error(run):
    result = run(actor=None)
    assert result.code == 2 and "COMMAND" in one_error_line(result)


# --- header routes ----------------------------------------------------------------------------


def test_route_add_list_remove_are_audited(run):
    result = run("route", "add", "--header", "X-User-Group=internal,qa", "--arm", "optimized",
                 "--reason", "QA on v2")
    assert result.code == 0, result.err
    assert result.out == ("route r1: x-user-group = internal|qa -> optimized added (revision 1) "
                          "by alice: QA on v2\n")
    assert run("route", "add", "--header", "x-tenant=acme", "--arm", "baseline",
               "--reason", "pinned").code == 0
    listed = run("route", "list")
    assert listed.code == 0
    assert listed.out.splitlines() == [
        "ID  HEADER        VALUES       ARM        ADDED                 BY     REASON",
        "r1  x-user-group  internal,qa  optimized  2023-11-14T22:13:20Z  alice  QA on v2",
        "r2  x-tenant      acme         baseline   2023-11-14T22:13:20Z  alice  pinned",
    ]
    doc = json.loads(run("route", "list", "--json").out)
    assert [(r["id"], r["header"], r["values"], r["arm"]) for r in doc] == [
        ("r1", "x-user-group", ["internal", "qa"], "optimized"),
        ("r2", "x-tenant", ["acme"], "baseline")]
    removed = run("route", "remove", "r1", "--reason", "QA done")
    assert removed.code == 0
    assert removed.out.startswith("route r1: x-user-group = internal|qa -> optimized removed "
                                  "(revision 3) by alice: QA done")
    assert [e.action for e in run.store.audit()] == ["route-add", "route-add", "route-remove"]
    assert [r.id for r in run.state.routes] == ["r2"]


def test_route_list_without_routes_and_status_with_them(run):
    assert run("route", "list").out == (
        "no header routes: every request is routed by the hashed share\n")
    assert "route r" not in run("status").out
    assert run("route", "add", "--header", "x-user-group=internal", "--arm", "optimized",
               "--reason", "QA").code == 0
    status = run("status").out
    assert "route r1         x-user-group = internal -> optimized (QA)\n" in status
    assert json.loads(run("status", "--json").out)["routes"][0]["id"] == "r1"


@pytest.mark.parametrize("header, arm, reason, message", [
    ("x-user-group", "optimized", "QA", "NAME=VALUE"),
    ("authorization=Bearer x", "optimized", "QA", "cannot be routed on"),
    ("x-canary-arm-override=optimized", "optimized", "QA", "cannot be routed on"),
    ("x user=1", "optimized", "QA", "not a valid HTTP header name"),
    ("x-user-group=a,,b", "optimized", "QA", "1..256 characters"),
    ("x-user-group=" + ",".join(f"v{i}" for i in range(33)), "baseline", "QA",
     "at most 32 header values"),
    ("x-user-group=internal", "canary", "QA", "invalid choice"),
    ("x-user-group=internal", "optimized", " ", "reason must not be empty"),
    ("x-user-group=internal", "optimized", None, "--reason"),
    (None, "optimized", "QA", "--header"),
])
def test_route_add_refuses_bad_input_in_one_line_and_writes_nothing(run, header, arm, reason,
                                                                    message):
    argv = ([] if header is None else ["--header", header]) + ["--arm", arm]
    argv += [] if reason is None else ["--reason", reason]
    result = run("route", "add", *argv)
    assert result.code == 2
    assert message in one_error_line(result)
    assert run.state.revision == 0


def test_route_add_of_a_value_routed_already_and_remove_of_an_unknown_id(run):
    assert run("route", "add", "--header", "x-user-group=internal", "--arm", "optimized",
               "--reason", "QA").code == 0
    again = run("route", "add", "--header", "X-User-Group=internal", "--arm", "baseline",
                "--reason", "again")
    assert again.code == 2
    assert one_error_line(again) == ("rollout: error: x-user-group: internal is already routed "
                                     "by r1 (to optimized): remove it first")
    unknown = run("route", "remove", "r9", "--reason", "oops")
    assert unknown.code == 2
    assert one_error_line(unknown) == "rollout: error: no route 'r9' (routes: r1)"
    assert run.state.revision == 1


def test_route_add_while_killed_warns(run):
    run.setup("kill", "--reason", "stop")
    result = run("route", "add", "--header", "x-user-group=internal", "--arm", "optimized",
                 "--reason", "QA")
    assert result.code == 0 and "kill switch is on" in result.err


@pytest.mark.parametrize("command", [["route"], ["route", "add"], ["route", "list"],
                                     ["route", "remove"]])
def test_help_for_every_route_command(run, command):
    result = run(*command, "--help", actor=None)
    assert result.code == 0 and result.err == ""
    assert result.out.startswith(f"usage: rollout {' '.join(command)}")
    assert "examples:" in result.out and "rollout route" in result.out


def test_revert_restores_the_routes_of_the_revision(run):
    assert run("route", "add", "--header", "x-user-group=internal", "--arm", "optimized",
               "--reason", "QA").code == 0
    assert run("route", "remove", "r1", "--reason", "done").code == 0
    result = run("revert", "1", "--reason", "QA again")
    assert result.code == 0, result.err
    assert result.out.startswith("revert to revision 1: routes none -> r1 (revision 3)")
    assert [r.id for r in run.state.routes] == ["r1"]
    same = run("revert", "1", "--reason", "twice")
    assert "nothing to revert" in same.out and "routes of revision 1" in same.out
