"""`rollout kill` and `rollout unkill`: their handlers, and the fast path that runs them first.

An operator pulling a canary back waits for Python to start and import, not for Redis: the full
path imports pydantic, pydantic-settings and redis-py (which pulls in asyncio and OpenTelemetry's
SDK) before its one write, about 0.35 s on a quiet 2-core machine and seconds on a loaded one.
The fast path (`quick`) runs the same two handlers on rollout.killswitch.QuickSwitch over a
rollout.resp_client connection: the same checks, the same compare-and-set script and audit entry,
the same output, with the standard library only.

It only ever succeeds. It steps aside (returns None), and the full path runs from the start with
its own parsing, settings, messages and exit codes, whenever:

- the command line is not a valid `kill` / `unkill` (or asks for --help);
- the environment holds a CANARY_* setting other than the ones it reads (CANARY_APP_NAME,
  CANARY_REDIS_URL, CANARY_REDIS_TIMEOUT_S, CANARY_REDIS_WAIT_REPLICAS,
  CANARY_REDIS_WAIT_TIMEOUT_MS, CANARY_KILL_RETRY_S): the full path validates every setting,
  and a bad one is a usage error (exit 2) that never reaches Redis;
- a setting it reads is not one it reads exactly as Settings does, or the Redis URL has an
  option rollout.resp_client does not implement;
- anything fails (Redis unreachable or refusing, a conflict, a stored state it does not
  recognise), or `unkill` needs a confirmation.

A reply lost after the write was sent also hands over: the kill is then written a second time
("it was already on"), and an unkill reports the switch already off.

Behind Redis Sentinel (a `redis+sentinel://` URL) a kill always lands: while the primary cannot
be reached or answers as a replica (a failover), it finds the primary again and retries, until
CANARY_KILL_RETRY_S after the command started; the full path then gets what is left of that
budget. A write the replicas do not acknowledge in time (CANARY_REDIS_WAIT_REPLICAS) is reported
here (exit 1, the kill in effect on the primary), not handed over: that would write it twice.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO

from ops.cli.args import PROG, UsageError, build_parser
from ops.cli.context import Ask, ChangeContext
from ops.cli.errors import exit_for
from rollout import resp_client
from rollout.errors import NotAcknowledged, StoreUnavailable
from rollout.killswitch import QuickSwitch
from rollout.redis_conn import acknowledgement_for, is_sentinel
from rollout.share import big_move, format_bp

# Settings' defaults for the settings read here (tests/unit/test_cli_kill.py and
# tests/unit/test_redis_conn.py check them).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_APP = "default"
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_WAIT_TIMEOUT_MS = 1000
DEFAULT_KILL_RETRY_S = 30.0
_READ = {"canary_app_name", "canary_redis_url", "canary_redis_timeout_s",
         "canary_redis_wait_replicas", "canary_redis_wait_timeout_ms", "canary_kill_retry_s"}
_URL = re.compile(r"^(redis|rediss|unix|redis\+sentinel|rediss\+sentinel)://")
_APP = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SECONDS = re.compile(r"\d+(\.\d+)?")
_WHOLE = re.compile(r"\d{1,6}")
_STARTED = time.monotonic()  # the command's start (imported first thing): the kill's budget
RETRY_PAUSE_S = 0.2  # between two tries of a kill while Redis fails over


# --- the handlers (both paths) ----------------------------------------------------------------


def kill(ctx: ChangeContext) -> int:
    """Turn the kill switch on. Behind Sentinel (the full path's settings) a store that cannot
    be reached is tried again until the kill's budget (CANARY_KILL_RETRY_S) is spent."""
    def report(before, _) -> str:
        was = "kill switch on (it was already on)" if before.kill else "kill switch off -> on"
        return was + ", all traffic to baseline"

    _retrying(lambda: ctx.change(
        lambda: ctx.rollout.kill(actor=ctx.actor, reason=ctx.args.reason), report),
        _full_path_deadline(ctx),
        lambda exc: isinstance(exc, StoreUnavailable) and exc.transient)
    return 0


def _retrying(attempt, deadline: float | None, retryable):
    """`attempt()`, tried again RETRY_PAUSE_S later while what it raised is `retryable` and
    `deadline` (monotonic; None: one try) leaves room for another try."""
    while True:
        try:
            return attempt()
        except Exception as exc:
            if deadline is None or not retryable(exc) or (
                    time.monotonic() + RETRY_PAUSE_S >= deadline):
                raise
        time.sleep(RETRY_PAUSE_S)


def _full_path_deadline(ctx: ChangeContext) -> float | None:
    settings = getattr(ctx, "settings", None)  # the full path's, when it opened the stores
    if settings is None or not is_sentinel(settings.redis_url):
        return None
    return _STARTED + settings.kill_retry_s


def unkill(ctx: ChangeContext) -> int:
    before = ctx.rollout.state()
    share = format_bp(before.canary_bp)
    if not before.kill:
        ctx.say(f"kill switch already off (revision {before.revision}): nothing changed")
        return 0
    ctx.change(
        lambda: ctx.rollout.unkill(actor=ctx.actor, reason=ctx.args.reason,
                                   expected_revision=before.revision),
        lambda _, after: f"kill switch on -> off, {format_bp(after.effective_bp)} to optimized",
        Ask(before, before.model_copy(update={"kill": False}),
            f"Turn the kill switch off, sending {share} of traffic to optimized "
            f"(revision {before.revision})?",
            f"turning the kill switch off with the canary at {share}"))
    return 0


_HANDLERS = {"kill": kill, "unkill": unkill}


# --- the fast path ----------------------------------------------------------------------------


class _FullPath(Exception):
    """The fast path steps aside: the full path runs the command from the start."""


@dataclass(frozen=True)
class Target:
    """The settings a kill needs."""

    redis_url: str
    app: str
    timeout_s: float
    wait_replicas: int | None = None
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS
    retry_s: float = DEFAULT_KILL_RETRY_S


@dataclass
class _QuickContext(ChangeContext):
    """What the handlers use of the full path's context; output waits until the command is
    done, so that nothing is printed twice when the full path takes over."""

    args: object
    rollout: QuickSwitch
    lines: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)

    def confirm(self, before, planned, question: str, what: str) -> None:
        if self.args.yes or not big_move(before, planned):
            return
        raise _FullPath("the change needs a confirmation (or its refusal)")


def target_from(args, environ: Mapping[str, str]) -> Target | None:
    """The Redis URL, application and timeout, read as Settings reads them (flags first, then
    the environment, case-insensitively); None when the full path must read the settings."""
    env: dict[str, str] = {}
    for name, value in environ.items():
        key = name.lower()
        if env.setdefault(key, value) != value:
            return None  # two spellings of one name disagree: let Settings choose
        if key.startswith("canary_") and key not in _READ:
            return None  # a setting to validate
    url = getattr(args, "redis_url", None)
    if url is None:
        url = env.get("redis_url", env.get("canary_redis_url", DEFAULT_REDIS_URL))
    app = getattr(args, "app", None)
    if app is None:
        app = env.get("canary_app_name", DEFAULT_APP)
    timeout_s = _number(env, "canary_redis_timeout_s", DEFAULT_TIMEOUT_S, _SECONDS, 0, 30,
                        low_open=True)
    replicas = _number(env, "canary_redis_wait_replicas", None, _WHOLE, 0, 16)
    wait_ms = _number(env, "canary_redis_wait_timeout_ms", DEFAULT_WAIT_TIMEOUT_MS, _WHOLE, 1,
                      60_000)
    retry_s = _number(env, "canary_kill_retry_s", DEFAULT_KILL_RETRY_S, _SECONDS, 0, 600)
    if _BAD in (timeout_s, replicas, wait_ms, retry_s):
        return None
    if not _URL.match(url) or not _APP.fullmatch(app):
        return None
    return Target(url, app, timeout_s, replicas, wait_ms, retry_s)


_BAD = object()


def _number(env: dict[str, str], name: str, default, pattern: re.Pattern, low: float,
            high: float, *, low_open: bool = False):
    """A setting's number as Settings reads it (`pattern`, low <= value <= high; above `low`
    with `low_open`), its default when unset, _BAD when Settings must judge it."""
    text = env.get(name)
    if text is None:
        return default
    if not pattern.fullmatch(text):
        return _BAD
    value = float(text) if pattern is _SECONDS else int(text)
    if value > high or value < low or (low_open and value == low):
        return _BAD
    return value


def _parse(argv: list[str]):
    """The parsed command line, or None (a usage error or --help: the full path says it)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return build_parser().parse_args(argv)
        except (SystemExit, UsageError):
            return None


def _run_quick(args, target: Target) -> _QuickContext:
    """Run the handler on a fresh connection; behind Sentinel, a kill finds the primary again
    and retries while Redis fails over, until its budget is spent."""
    sentinel = is_sentinel(target.redis_url)
    deadline = _STARTED + target.retry_s if sentinel and args.command == "kill" else None
    ack = acknowledgement_for(target.redis_url, target.wait_replicas, target.wait_timeout_ms)

    def attempt() -> _QuickContext:
        with resp_client.connect(target.redis_url, target.timeout_s) as conn:
            ctx = _QuickContext(args, QuickSwitch(conn, target.app, ack=ack, ack_until=deadline))
            _HANDLERS[args.command](ctx)
        return ctx

    return _retrying(attempt, deadline, resp_client.retryable)


def quick(argv=None, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
          environ: Mapping[str, str] | None = None) -> int | None:
    """Run `kill` or `unkill` on the fast path: its exit code, or None to take the full path."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not _HANDLERS.keys() & set(argv):
        return None
    args = _parse(argv)
    if args is None or args.command not in _HANDLERS:
        return None
    target = target_from(args, os.environ if environ is None else environ)
    if target is None:
        return None
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        ctx = _run_quick(args, target)
    except KeyboardInterrupt:
        err.write(f"\n{PROG}: interrupted\n")
        err.flush()
        return 130
    except NotAcknowledged as exc:  # written: handing over would write it again
        code, message, _ = exit_for(exc)
        err.write(f"{PROG}: {message}\n")
        err.flush()
        return code
    except Exception:  # whatever it is, the full path starts afresh and reports it
        return None
    try:
        out.write("".join(line + "\n" for line in ctx.lines))
        out.flush()
    except BrokenPipeError:  # as the full path: `rollout kill ... | head -0`
        if stdout is None:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0
