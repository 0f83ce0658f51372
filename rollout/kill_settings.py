"""The settings `rollout kill` and `rollout unkill` read, with the standard library only; their
defaults and bounds are written here once, and StateSettings (rollout/settings/state.py) takes
them from here.

    REDIS_URL (else CANARY_REDIS_URL; --redis-url)   redis://127.0.0.1:6379/0
    CANARY_APP_NAME (--app)                         default   1-64 of [A-Za-z0-9_.-]
    CANARY_REDIS_TIMEOUT_S                          2.0       0 < s <= 30
    CANARY_REDIS_WAIT_REPLICAS                      none      0..16
    CANARY_REDIS_WAIT_TIMEOUT_MS                    1000      1..60000
    CANARY_KILL_RETRY_S                             30.0      0..600

`read_kill_settings` reads them as `Settings()` does: a flag first, then the environment, names
case-insensitive (of two spellings of one name the later in the environment wins), a number as
pydantic parses a string (surrounding whitespace, a sign, `_` between digits; exponents, `inf`
and `nan` for a float; `10.0` for an int), within the same bounds. A bad value raises
`BadSettings`, each problem with the message pydantic gives for it
(tests/unit/test_kill_settings.py holds the two readers to each other, bad values included).

It reads these six and nothing else: every other `CANARY_*` variable is left unread, so a
malformed setting of the gateway (a batch size, a webhook URL) never blocks pulling a canary
back. `Settings()` validates them all, where everything else starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout.redis_conn import Acknowledgement, acknowledgement_for, check_url

REDIS_URL = "redis://127.0.0.1:6379/0"
APP_NAME = "default"
_APP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_INT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
                    re.IGNORECASE)
# what pydantic strips around a number: Unicode White_Space (str.isspace() less \x1c-\x1f)
_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
          "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


@dataclass(frozen=True)
class Number:
    """A number setting: its default and its bounds, as pydantic's `Field` takes them
    (`Field(spec.default, **spec.bounds)`)."""

    default: int | float | None
    kind: type[int] | type[float]
    bounds: dict[str, int] = field(default_factory=dict)  # gt / ge and le

    def parse(self, text: str) -> int | float:
        """`text` as pydantic reads it into this field; ValueError with pydantic's message."""
        value = _parse(text, self.kind)
        for name in sorted(self.bounds, key=_BOUND_ORDER.index):  # pydantic's order (nan)
            limit = self.bounds[name]
            if not {"le": value <= limit, "ge": value >= limit, "gt": value > limit}[name]:
                raise ValueError(f"Input should be {_BOUND_WORDS[name]} {limit}")
        return value


_BOUND_ORDER = ("le", "ge", "gt")
_BOUND_WORDS = {"gt": "greater than", "ge": "greater than or equal to",
                "le": "less than or equal to"}

REDIS_TIMEOUT_S = Number(2.0, float, {"gt": 0, "le": 30})
REDIS_WAIT_REPLICAS = Number(None, int, {"ge": 0, "le": 16})
REDIS_WAIT_TIMEOUT_MS = Number(1000, int, {"ge": 1, "le": 60_000})
KILL_RETRY_S = Number(30.0, float, {"ge": 0, "le": 600})
NUMBERS = {"redis_timeout_s": REDIS_TIMEOUT_S, "redis_wait_replicas": REDIS_WAIT_REPLICAS,
           "redis_wait_timeout_ms": REDIS_WAIT_TIMEOUT_MS, "kill_retry_s": KILL_RETRY_S}


def _parse(text: str, kind: type) -> int | float:
    stripped = text.strip(_SPACE)
    if kind is int:
        if not _INT.fullmatch(stripped):
            raise ValueError("Input should be a valid integer, unable to parse string as an "
                             "integer")
        return int(stripped.partition(".")[0])
    if _FLOAT.fullmatch(stripped):
        return float(stripped)
    plain = text.replace("_", "")  # pydantic's second try: underscores out, nothing stripped
    if text[:1] == "_" or text[-1:] == "_" or "__" in text or not _FLOAT.fullmatch(plain):
        raise ValueError("Input should be a valid number, unable to parse string as a number")
    return float(plain)


def check_app_name(value: str) -> str:
    """`value` when it is an application name (the Redis keys' namespace); ValueError if not."""
    if not _APP_NAME.fullmatch(value):
        raise ValueError("app_name: 1-64 letters, digits, '_', '.' or '-'")
    return value


class BadSettings(ValueError):
    """Settings the kill cannot use: `problems` is (field name, message) per bad setting, in
    the settings' field order."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(f"{name}: {message}" for name, message in problems))
        self.problems = problems


@dataclass(frozen=True)
class KillSettings:
    """What the kill needs: where the state is, how long to wait, what a write must reach."""

    redis_url: str = REDIS_URL
    app_name: str = APP_NAME
    redis_timeout_s: float = REDIS_TIMEOUT_S.default
    redis_wait_replicas: int | None = REDIS_WAIT_REPLICAS.default
    redis_wait_timeout_ms: int = REDIS_WAIT_TIMEOUT_MS.default
    kill_retry_s: float = KILL_RETRY_S.default

    def acknowledgement(self) -> Acknowledgement:
        """As Settings.acknowledgement: the replicas each write waits for."""
        return acknowledgement_for(self.redis_url, self.redis_wait_replicas,
                                   self.redis_wait_timeout_ms, self.redis_timeout_s)


def read_kill_settings(environ: Mapping[str, str], *, redis_url: str | None = None,
                       app_name: str | None = None) -> KillSettings:
    """The kill's settings from the flags and `environ`, as Settings reads them; BadSettings
    naming every bad one."""
    env = {name.lower(): value for name, value in environ.items()}  # the later spelling wins
    if redis_url is None:
        redis_url = env.get("redis_url", env.get("canary_redis_url", REDIS_URL))
    if app_name is None:
        app_name = env.get("canary_app_name", APP_NAME)
    values: dict = {}
    problems: list[tuple[str, str]] = []
    checks = [("redis_url", redis_url, check_url), ("app_name", app_name, check_app_name)]
    checks += [(name, env.get(f"canary_{name}"), spec.parse) for name, spec in NUMBERS.items()]
    for name, text, check in checks:
        if text is None:
            continue
        try:
            values[name] = check(text)
        except ValueError as exc:
            problems.append((name, str(exc)))
    if problems:
        raise BadSettings(problems)
    return KillSettings(**values)
