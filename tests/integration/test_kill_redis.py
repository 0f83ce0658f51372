"""`rollout kill` / `unkill` against a real Redis, as an operator runs them: the one kill
(ops.cli.kill) imports nothing heavy, asks without pydantic, writes what `Rollout.kill` writes
through the Redis store, over either transport; the operator guide's `redis-cli` emergency kill
reaches a gateway's StateWatcher and `rollout status` flags it."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from ops import cli
from rollout import Rollout, RolloutState, StateWatcher
from rollout.redis_store import RedisStateStore
from tests.integration.test_cli_redis import ROLLOUT, one_error_line

# the emergency `redis-cli` kill is documented in the operator guide (moved from the README)
README = Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md"
HEAVY = {"pydantic", "pydantic_core", "pydantic_settings", "redis", "opentelemetry", "asyncio",
         "ray", "torch", "numpy", "httpx", "yaml", "starlette", "fastapi"}


def run(url: str, *argv: str, app: str, env: dict | None = None,
        stdin=subprocess.DEVNULL) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`rollout --app APP ARGV...` under `python -X importtime`: the result (stderr without the
    import lines) and the top-level modules it imported."""
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CANARY_")}
    environ.update(REDIS_URL=url, ROLLOUT_ACTOR="alice", CANARY_REDIS_TIMEOUT_S="2")
    environ.update(env or {})
    result = subprocess.run([sys.executable, "-X", "importtime", ROLLOUT, "--app", app, *argv],
                            env=environ, stdin=stdin, capture_output=True, text=True, timeout=60)
    lines = result.stderr.splitlines()
    modules = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines
               if line.startswith("import time:") and "|" in line}
    modules.discard("imported package")  # the header line
    result.stderr = "".join(f"{line}\n" for line in lines if not line.startswith("import time:"))
    return result, modules


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def new_app() -> str:
    return f"kill-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(redis_url):
    opened = []

    def open_(app: str, url: str = redis_url) -> RedisStateStore:
        opened.append(RedisStateStore(url, app, timeout_s=5.0))
        return opened[-1]

    yield open_
    for each in opened:
        each.close()


def test_kill_and_unkill_import_nothing_heavy(redis_url, store):
    app = new_app()
    ok(run(redis_url, "canary", "5", "--reason", "first 5%", app=app)[0])
    killed, modules = run(redis_url, "kill", "--reason", "p99 regression", app=app)
    assert ok(killed) == ("kill switch off -> on, all traffic to baseline (revision 2) by alice: "
                          "p99 regression\n")
    assert not modules & HEAVY, sorted(modules & HEAVY)
    unkilled, modules = run(redis_url, "unkill", "--reason", "fixed", app=app)
    assert ok(unkilled) == "kill switch on -> off, 5% to optimized (revision 3) by alice: fixed\n"
    assert not modules & HEAVY, sorted(modules & HEAVY)
    state = store(app).get()
    assert (state.kill, state.canary_bp, state.revision, state.reason) == (False, 500, 3, "fixed")


STEPS = [("kill", "p99 regression"), ("kill", "again"), ("unkill", "fixed"), ("unkill", "twice")]


def comparable(entry) -> dict:
    doc = entry.model_dump(mode="json", exclude={"id", "ts"})
    for side in ("before", "after"):
        if doc[side]:
            doc[side].pop("updated_at")
    return doc


@pytest.mark.parametrize("query", ["", "?retry_on_timeout=true"])  # resp_client, redis-py
def test_the_cli_writes_what_rollout_kill_writes_through_the_store(redis_url, store, query):
    cli_app, library_app = new_app(), new_app()
    library = Rollout(store(library_app))
    for app in (cli_app, library_app):
        ok(run(redis_url, "canary", "20", "--reason", "widen", app=app)[0])
    for command, reason in STEPS:
        result, modules = run(redis_url + query, command, "--reason", reason, app=cli_app)
        assert ok(result)
        assert ("redis" in modules) is bool(query), sorted(modules & HEAVY)
        if command == "kill" or library.state().kill:  # as the CLI: an unkill of nothing is none
            getattr(library, command)(actor="alice", reason=reason)
    ours, theirs = store(cli_app), store(library_app)
    assert [comparable(e) for e in ours.audit()] == [comparable(e) for e in theirs.audit()]
    assert [e.action for e in ours.audit()] == ["canary 0% -> 20%", "kill", "kill", "unkill"]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    raw = client.hget(ours.state_key, "json")
    assert RolloutState.model_validate_json(raw).model_dump_json() == raw  # pydantic's bytes
    assert client.hget(ours.history_key, "3") == ours.state_at(3).model_dump_json()
    entry = client.xrevrange(ours.audit_key, count=1)[0][1]
    assert entry["after"] == raw and float(entry["ts"]) == ours.get().updated_at
    client.close()


def test_unkill_of_a_big_share_asks_without_pydantic(redis_url, store):
    app = new_app()
    ok(run(redis_url, "canary", "60", "--reason", "big", "--yes", app=app)[0])
    ok(run(redis_url, "kill", "--reason", "stop", app=app)[0])
    refused, modules = run(redis_url, "unkill", "--reason", "back", app=app)
    assert refused.returncode == 2 and not modules & HEAVY
    assert "needs confirmation: pass --yes" in one_error_line(refused)
    assert store(app).get().kill is True
    done, modules = run(redis_url, "unkill", "--reason", "back", "--yes", app=app)
    assert ok(done).startswith("kill switch on -> off, 60% to optimized")
    assert not modules & HEAVY and store(app).get().kill is False


def test_unkill_asks_on_a_terminal(redis_url, store, monkeypatch):
    app = new_app()
    ok(run(redis_url, "canary", "60", "--reason", "big", "--yes", app=app)[0])
    ok(run(redis_url, "kill", "--reason", "stop", app=app)[0])
    monkeypatch.setenv("REDIS_URL", redis_url)
    for answer, code in (("n\n", 1), ("y\n", 0)):
        out, err = io.StringIO(), io.StringIO()
        assert cli.main(["--app", app, "--actor", "alice", "unkill", "--reason", "back"],
                        stdin=io.StringIO(answer), stdout=out, stderr=err) == code
        assert "Turn the kill switch off, sending 60% of traffic to optimized" in err.getvalue()
    assert store(app).get().kill is False and len(store(app).audit()) == 3


def test_a_malformed_unrelated_setting_does_not_block_the_kill(redis_url, store):
    app = new_app()
    killed, _ = run(redis_url, "kill", "--reason", "now", app=app,
                    env={"CANARY_MAX_BATCH_SIZE": "zero"})
    assert ok(killed).startswith("kill switch off -> on") and store(app).get().kill
    refused, _ = run(redis_url, "kill", "--reason", "now", app=app,
                     env={"CANARY_REDIS_TIMEOUT_S": "0"})
    assert refused.returncode == 2 and "CANARY_REDIS_TIMEOUT_S" in one_error_line(refused)
    assert len(store(app).audit()) == 1


def test_the_kill_with_tls_and_acl_users(secured):
    app = new_app()
    operator = secured.url_for("operator")
    assert "ssl_ca_certs=" in operator and operator.startswith("rediss://operator:")
    killed, modules = run(operator, "kill", "--reason", "tls", app=app)
    assert ok(killed).startswith("kill switch off -> on") and not modules & HEAVY
    refused, _ = run(secured.url_for("gateway"), "unkill", "--reason", "sneaky", app=app)
    assert refused.returncode == 1 and "refused" in one_error_line(refused)
    states = RedisStateStore(operator, app, timeout_s=5.0)
    try:
        assert states.get().kill is True and [e.actor for e in states.audit()] == ["alice"]
    finally:
        states.close()


@pytest.fixture
def watcher(redis_url):
    """A gateway's cached state for a fresh application: pub/sub, with a poll too slow to
    matter (a kill must arrive by notification)."""
    watchers = []

    def start(app: str) -> StateWatcher:
        watchers.append(StateWatcher(RedisStateStore(redis_url, app, timeout_s=5.0),
                                     poll_s=30.0, staleness_s=60.0))
        watchers[-1].start()
        time.sleep(0.2)  # subscribed
        return watchers[-1]

    yield start
    for each in watchers:
        # Its poll is 30 s: don't wait for the thread's wait to end; closing the store ends it.
        each.stop(timeout=0)
        each.store.close()


def wait_for_kill(watcher: StateWatcher, revision: int, timeout: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        state = watcher.view().state
        if state.kill and state.revision == revision:
            return time.monotonic() - started
        time.sleep(0.01)
    raise AssertionError(f"the watcher never saw the kill: {watcher.view()}")


def test_a_gateway_hears_the_kill(redis_url, watcher):
    app = new_app()
    seen = watcher(app)
    ok(run(redis_url, "kill", "--reason", "now", app=app)[0])
    assert wait_for_kill(seen, 1) < 2.0


def readme_kill(app: str) -> str:
    """The README's emergency `redis-cli` command line, for application `app`."""
    lines = [line for line in README.read_text().splitlines()
             if line.startswith('redis-cli -u "$REDIS_URL"') and " EVAL " in line]
    assert len(lines) == 1, lines
    assert lines[0].count("rollout:default:") == 2
    return lines[0].replace("rollout:default:", f"rollout:{app}:")


def redis_cli(command: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], env=dict(os.environ, REDIS_URL=url),
                          capture_output=True, text=True, timeout=30)


def test_the_readme_redis_cli_kill_reaches_the_gateway_and_is_flagged(redis_url, watcher, store):
    app = new_app()
    ok(run(redis_url, "canary", "5", "--reason", "first 5%", app=app)[0])
    seen = watcher(app)
    flipped = redis_cli(readme_kill(app), redis_url)
    assert flipped.returncode == 0 and flipped.stdout.strip() == "2", flipped
    assert wait_for_kill(seen, 2) < 2.0
    state = store(app).get()
    assert (state.canary_bp, state.updated_by, state.reason) == (
        500, "redis-cli", "emergency: p99 regression")
    assert abs(state.updated_at - time.time()) < 60
    assert [e.action for e in store(app).audit()] == ["canary 0% -> 5%"]  # what it skips
    doc, _ = run(redis_url, "status", "--json", app=app)
    assert '"audited": false' in ok(doc)
    human = ok(run(redis_url, "status", app=app)[0])
    assert re.search(r"^UNAUDITED +revision 2 \(kill switch on\) was written outside", human,
                     re.MULTILINE), human
    recorded, modules = run(redis_url, "kill", "--reason", "record the emergency kill", app=app)
    assert ok(recorded).startswith("kill switch on (it was already on)")
    assert "pydantic" not in modules  # the kill reads the state the script wrote
    assert '"audited": true' in ok(run(redis_url, "status", "--json", app=app)[0])
    entry = store(app).audit()[-1]
    assert (entry.action, entry.before.updated_by, entry.revision) == ("kill", "redis-cli", 3)


def test_the_readme_redis_cli_kill_runs_as_the_acl_operator_over_tls(secured):
    app = new_app()
    ca = secured.dir / "ca.crt"
    command = readme_kill(app).replace('-u "$REDIS_URL"',
                                       f'--tls --cacert {ca} -u "$REDIS_URL"')
    url = secured.url_for("operator").split("?")[0]
    assert redis_cli(command, url).stdout.strip().startswith("no rollout state")
    states = RedisStateStore(secured.url_for("operator"), app, timeout_s=5.0)
    try:
        ok(run(secured.url_for("operator"), "canary", "5", "--reason", "r", app=app)[0])
        flipped = redis_cli(command, url)
        assert flipped.stdout.strip() == "2", flipped
        assert states.get().kill is True
        gateway = redis_cli(command, secured.url_for("gateway").split("?")[0])
        assert "NOPERM" in gateway.stdout + gateway.stderr and states.get().revision == 2
    finally:
        states.close()
