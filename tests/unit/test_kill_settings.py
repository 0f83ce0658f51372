"""The kill's settings (rollout.kill_settings) held to the settings object: from the same
environment and flags, `rollout kill` and `Settings()` read the same values, and refuse the
same bad values with the same message (exit 2, naming the variable, before Redis is reached);
the kill reads only its own six, so a malformed unrelated setting never blocks it. No Redis."""

from __future__ import annotations

import argparse
import io
import itertools
import os
import re
from typing import Annotated

import pytest
from pydantic import Field, TypeAdapter, ValidationError

from ops import cli
from ops.cli.args import settings_from
from ops.cli.errors import UsageError
from ops.cli.kill import settings_for
from rollout.kill_settings import NUMBERS, KillSettings
from tests.servers import free_port

FIELDS = ("redis_url", "app_name", "redis_timeout_s", "redis_wait_replicas",
          "redis_wait_timeout_ms", "kill_retry_s")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("CANARY_") or name.upper() == "REDIS_URL":
            monkeypatch.delenv(name)


def both(flags: dict) -> tuple[object, object]:
    """What Settings and the kill make of the environment and `flags`: the six values, or the
    usage error's message."""
    args = argparse.Namespace(command="kill", **flags)
    answers = []
    for read in (settings_from, lambda a: settings_for(a, os.environ)):
        try:
            settings = read(args)
        except UsageError as exc:
            answers.append(str(exc))
        else:
            answers.append(tuple(getattr(settings, name) for name in FIELDS))
    return answers[0], answers[1]


def test_the_defaults_are_written_once_and_read_alike():
    settings, kill = both({})
    assert settings == kill == tuple(getattr(KillSettings(), name) for name in FIELDS)


@pytest.mark.parametrize("env, flags", [
    ({"REDIS_URL": "redis://a:6379/1"}, {}),
    ({"CANARY_REDIS_URL": "redis://b:6379/2"}, {}),
    ({"REDIS_URL": "redis://a:6379/1", "CANARY_REDIS_URL": "redis://b:6379/2"}, {}),
    ({"redis_url": "rediss://u:p@c:6380/0", "canary_app_name": "search"}, {}),
    ({"REDIS_URL": "redis://a", "redis_url": "redis://b"}, {}),  # two spellings: the later
    ({"CANARY_APP_NAME": "search", "CANARY_REDIS_TIMEOUT_S": "0.5"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "30"}, {"app": "other"}),
    ({"REDIS_URL": "redis://a:6379/1"}, {"redis_url": "unix:///run/redis.sock?db=3"}),
    ({"REDIS_URL": "redis+sentinel://:pw@h1:1,h2:2/svc/0"}, {}),
    ({"REDIS_URL": "rediss+sentinel://u:pw@h:1/svc/0?ssl_ca_certs=/ca",
      "CANARY_REDIS_WAIT_REPLICAS": "2", "CANARY_REDIS_WAIT_TIMEOUT_MS": "300",
      "CANARY_KILL_RETRY_S": "7.5"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": " 2e0 ", "CANARY_KILL_RETRY_S": "1_0",
      "CANARY_REDIS_WAIT_REPLICAS": "+3", "CANARY_REDIS_WAIT_TIMEOUT_MS": "1000.0"}, {}),
    # bad values: the same message, every bad one named, never the URL's password
    ({"CANARY_REDIS_TIMEOUT_S": "0"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "31", "CANARY_KILL_RETRY_S": "-1"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "nan"}, {}),
    ({"CANARY_REDIS_TIMEOUT_S": "two"}, {}),
    ({"CANARY_REDIS_WAIT_REPLICAS": "17"}, {}),
    ({"CANARY_REDIS_WAIT_REPLICAS": ""}, {}),
    ({"CANARY_REDIS_WAIT_REPLICAS": "1.5"}, {}),
    ({"CANARY_REDIS_WAIT_TIMEOUT_MS": "0"}, {}),
    ({"CANARY_KILL_RETRY_S": "601"}, {}),
    ({"REDIS_URL": "http://db:6379"}, {}),
    ({"REDIS_URL": "redis+sentinel://:s3cret@h:1"}, {}),
    ({}, {"redis_url": "nope"}),
    ({}, {"app": "two words"}),
    ({"CANARY_APP_NAME": "x" * 65, "CANARY_REDIS_TIMEOUT_S": "0"}, {}),
])
def test_the_kill_reads_what_settings_read(monkeypatch, env, flags):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings, kill = both(flags)
    assert kill == settings
    assert "s3cret" not in str(kill)


def test_numbers_are_parsed_as_pydantic_parses_them():
    """Every string of up to four characters from a number's alphabet, through each number
    setting's spec and through pydantic with the same bounds: the same value or the same
    message. Pydantic reads a few strings only an accident writes (`0-0`, `0__7`: its leading
    zeros are dropped before the sign) where the kill refuses them: never the other way."""
    alphabet = ["0", "1", "5", ".", "_", "e", "+", "-", " ", "i", "n", "f", "a", "\xa0"]
    for name, spec in NUMBERS.items():
        kind = spec.kind | None if spec.default is None else spec.kind
        theirs = TypeAdapter(Annotated[kind, Field(**spec.bounds)])
        for size in range(5):
            for text in map("".join, itertools.product(alphabet, repeat=size)):
                try:
                    expected = ("ok", theirs.validate_python(text))
                except ValidationError as exc:
                    expected = ("error", exc.errors()[0]["msg"])
                try:
                    got = ("ok", spec.parse(text))
                except ValueError as exc:
                    got = ("error", str(exc))
                if got != expected:  # only pydantic's leading-zero quirk, refused here
                    quirk = spec.kind is int and re.match(r"\s*[+-]?0+[-_]", text)
                    assert got[0] == "error" and quirk, (name, text, expected, got)


def run_kill(monkeypatch, env: dict, *argv: str) -> tuple[int, str, str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--actor", "alice", "kill", "--reason", "r", *argv], stdout=out,
                    stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_a_bad_setting_of_the_kill_is_a_usage_error_before_redis(monkeypatch):
    code, out, err = run_kill(monkeypatch, {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                                            "CANARY_REDIS_WAIT_TIMEOUT_MS": "0"})
    assert code == 2 and out == ""
    assert err == ("rollout: error: invalid setting CANARY_REDIS_WAIT_TIMEOUT_MS: Input should "
                   "be greater than or equal to 1\n")


def test_a_malformed_unrelated_setting_does_not_block_the_kill(monkeypatch):
    env = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "CANARY_MAX_BATCH_SIZE": "zero",
           "CANARY_WEBHOOK_URLS": "not a url", "CANARY_REDIS_TIMEOUT_S": "0.5"}
    code, _, err = run_kill(monkeypatch, env)
    assert code == 1 and "cannot reach Redis at redis://127.0.0.1" in err  # it went to Redis
    with pytest.raises(UsageError, match="CANARY_MAX_BATCH_SIZE"):
        settings_from(argparse.Namespace())  # where Settings() is built, it is refused
