"""`rollout kill` and `rollout unkill`: their handlers, and the fast path that runs them first.

An operator pulling a canary back waits for Python to start and import, not for Redis: the full
path imports pydantic, pydantic-settings and redis-py (which pulls in asyncio and OpenTelemetry's
SDK) before its one write, about 0.35 s on a quiet 2-core machine and seconds on a loaded one.
The fast path (`quick`) runs the same two handlers on rollout.killswitch.QuickSwitch over a
rollout.resp connection: the same checks, the same compare-and-set script and audit entry, the
same output, with the standard library only.

It only ever succeeds. It steps aside (returns None), and the full path runs from the start with
its own parsing, settings, messages and exit codes, whenever:

- the command line is not a valid `kill` / `unkill` (or asks for --help);
- the environment holds a CANARY_* setting other than the three it reads (CANARY_APP_NAME,
  CANARY_REDIS_URL, CANARY_REDIS_TIMEOUT_S): the full path validates every setting, and a bad
  one is a usage error (exit 2) that never reaches Redis;
- a setting it reads is not one it reads exactly as Settings does, or the Redis URL has an
  option rollout.resp does not implement;
- anything fails (Redis unreachable or refusing, a conflict, a stored state it does not
  recognise), or `unkill` needs a confirmation.

A reply lost after the write was sent also hands over: the kill is then written a second time
("it was already on"), and an unkill reports the switch already off.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO

from ops._cli_args import PROG, UsageError, build_parser
from ops._cli_context import Ask, ChangeContext
from rollout import resp
from rollout.killswitch import QuickSwitch
from rollout.share import big_move, format_bp

# Settings' defaults for the three settings read here (tests/unit/test_cli_kill.py checks them).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_APP = "default"
DEFAULT_TIMEOUT_S = 2.0
_READ = {"canary_app_name", "canary_redis_url", "canary_redis_timeout_s"}
_URL = re.compile(r"^(redis|rediss|unix)://")
_APP = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SECONDS = re.compile(r"\d+(\.\d+)?")


# --- the handlers (both paths) ----------------------------------------------------------------


def kill(ctx: ChangeContext) -> int:
    def report(before, _) -> str:
        was = "kill switch on (it was already on)" if before.kill else "kill switch off -> on"
        return was + ", all traffic to baseline"

    ctx.change(lambda: ctx.rollout.kill(actor=ctx.actor, reason=ctx.args.reason), report)
    return 0


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
    """The three settings a kill needs."""

    redis_url: str
    app: str
    timeout_s: float


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
    timeout = env.get("canary_redis_timeout_s")
    timeout_s = DEFAULT_TIMEOUT_S
    if timeout is not None:
        if not _SECONDS.fullmatch(timeout) or not 0 < float(timeout) <= 30:
            return None
        timeout_s = float(timeout)
    if not _URL.match(url) or not _APP.fullmatch(app):
        return None
    return Target(url, app, timeout_s)


def _parse(argv: list[str]):
    """The parsed command line, or None (a usage error or --help: the full path says it)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return build_parser().parse_args(argv)
        except (SystemExit, UsageError):
            return None


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
        with resp.connect(target.redis_url, target.timeout_s) as conn:
            ctx = _QuickContext(args, QuickSwitch(conn, target.app))
            _HANDLERS[args.command](ctx)
    except KeyboardInterrupt:
        err.write(f"\n{PROG}: interrupted\n")
        err.flush()
        return 130
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
