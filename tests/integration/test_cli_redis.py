"""The installed `rollout` console script against a real Redis, as an operator runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import RedisServer, free_port


def _script() -> str:
    beside = Path(sys.executable).parent / "rollout"
    found = str(beside) if beside.exists() else shutil.which("rollout")
    if found is None:
        pytest.fail("the `rollout` console script is not installed (pip install -e .)")
    return found


ROLLOUT = _script()


def rollout(redis_url: str, *argv: str, actor: str = "alice") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env.update(REDIS_URL=redis_url, ROLLOUT_ACTOR=actor, CANARY_REDIS_TIMEOUT_S="1")
    return subprocess.run([ROLLOUT, *argv], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def status(redis_url: str, *argv: str) -> dict:
    return json.loads(ok(rollout(redis_url, *argv, "status", "--json")))


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rollout: error: ")
    return lines[0]


def test_operator_session(redis_url):
    assert status(redis_url)["revision"] == 0

    out = ok(rollout(redis_url, "canary", "5", "--reason", "first 5%"))
    assert out == "canary 0% -> 5% (revision 1) by alice: first 5%\n"
    doc = status(redis_url)
    assert (doc["canary_bp"], doc["canary_percent"], doc["effective_percent"]) == (500, 5.0, 5.0)
    assert (doc["updated_by"], doc["reason"], doc["revision"]) == ("alice", "first 5%", 1)

    ok(rollout(redis_url, "canary", "20", "--reason", "widen", actor="bob"))
    ok(rollout(redis_url, "kill", "--reason", "p99 regression"))
    doc = status(redis_url)
    assert doc["kill"] is True and doc["effective_percent"] == 0 and doc["canary_bp"] == 2000

    ok(rollout(redis_url, "unkill", "--reason", "fixed"))
    assert status(redis_url)["kill"] is False

    out = ok(rollout(redis_url, "revert", "1", "--reason", "back to 5"))
    assert out.startswith("revert to revision 1: canary 20% -> 5%")
    doc = status(redis_url)
    assert (doc["canary_bp"], doc["kill"], doc["revision"]) == (500, False, 5)

    human = ok(rollout(redis_url, "status"))
    assert "canary share     5%" in human and "redis://127.0.0.1" in human

    table = ok(rollout(redis_url, "audit")).splitlines()
    assert len(table) == 6 and table[0].split()[:2] == ["ID", "TIME"]
    assert "bob" in table[2] and "widen" in table[2]
    entries = json.loads(ok(rollout(redis_url, "audit", "--json")))
    assert [e["action"] for e in entries] == [
        "canary 0% -> 5%", "canary 5% -> 20%", "kill", "unkill", "revert to revision 1"]
    assert [e["actor"] for e in entries] == ["alice", "bob", "alice", "alice", "alice"]
    assert len(json.loads(ok(rollout(redis_url, "audit", "--json", "--last", "2")))) == 2


def test_big_move_needs_yes_from_a_script(redis_url):
    result = rollout(redis_url, "canary", "100", "--reason", "promote")
    assert result.returncode == 2 and "--yes" in one_error_line(result)
    assert status(redis_url)["revision"] == 0
    ok(rollout(redis_url, "canary", "100", "--reason", "promote", "--yes"))
    assert status(redis_url)["canary_bp"] == 10_000


def test_apps_are_separate_namespaces(redis_url):
    ok(rollout(redis_url, "--app", "search", "canary", "5", "--reason", "r"))
    assert status(redis_url, "--app", "search")["canary_bp"] == 500
    assert status(redis_url)["revision"] == 0


def test_invalid_input_writes_nothing(redis_url):
    bad = (["canary", "101", "--reason", "r"], ["canary", "5"], ["revert", "9", "--reason", "r"])
    for argv in bad:
        result = rollout(redis_url, *argv)
        assert result.returncode == 2
        one_error_line(result)
    assert status(redis_url)["revision"] == 0


def test_unreachable_redis_is_one_line_and_exit_1():
    url = f"redis://127.0.0.1:{free_port()}/0"
    for argv in (["status"], ["canary", "5", "--reason", "r"], ["kill", "--reason", "r"]):
        result = rollout(url, *argv)
        assert result.returncode == 1
        assert "cannot reach Redis" in one_error_line(result)


@pytest.fixture(scope="module")
def locked_redis():
    server = RedisServer(password="right-pw-7d1c").start()
    yield server
    server.cleanup()


@pytest.mark.parametrize("auth", [":wrong-pw-93fa@", "admin:wrong-pw-93fa@", ""])
def test_wrong_password_never_shows_it(locked_redis, auth):
    url = f"redis://{auth}127.0.0.1:{locked_redis.port}/0"
    result = rollout(url, "status")
    assert result.returncode == 1
    line = one_error_line(result)
    assert "cannot reach Redis" in line
    assert "wrong-pw-93fa" not in result.stdout + result.stderr


def test_right_password_works(locked_redis):
    assert status(locked_redis.url)["revision"] == 0


def test_cli_imports_no_heavy_frameworks():
    code = ("import ops.cli, sys; "
            "print([m for m in ('ray', 'torch', 'transformers', 'fastapi') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"
