"""`rollout kill` and `rollout unkill`: one implementation, on rollout.killswitch.QuickSwitch.

An operator pulling a canary back waits for Python to start and import, not for Redis. The rest
of `rollout` imports pydantic, pydantic-settings and redis-py (which imports redis.asyncio):
`import redis` alone takes about 0.3-0.4 s on a 2-core machine, `import rollout.settings` about
0.35 s, so no amount of lazy importing brings a command that builds `Settings()` and a redis-py
client under 0.25 s. The choice: these two commands never take that path. They read the six
settings they use with rollout.kill_settings, talk to Redis with rollout.resp_client (standard
library only) and change the state with QuickSwitch, whose `kill` / `unkill` are
`Rollout.kill` / `unkill` (rollout.change) writing what the Redis store writes. Everything else
is shared with the other commands: the parser (ops.cli.args: --help, usage errors, exit 2), the
context and its confirmation prompt (ops.cli.context), the one table of errors and exit codes
(ops.cli.errors), the output lines.

The goal: each of the two exits within 0.25 s of its spawn against a reachable Redis; on a
shared 2-vCPU machine they take 0.12-0.16 s (best / median), most of it Python's own start and
the standard library's imports (0.8-1.6 s over redis-py). The measurements, and how to
repeat them, are in docs/benchmarks-history.md ("`rollout kill`: one path").

What it does and says (the same as the other commands):

- usage errors and --help as every command (exit 2 / 0); a bad value of a setting it reads
  (CANARY_APP_NAME, REDIS_URL / CANARY_REDIS_URL, CANARY_REDIS_TIMEOUT_S,
  CANARY_REDIS_WAIT_REPLICAS, CANARY_REDIS_WAIT_TIMEOUT_MS, CANARY_KILL_RETRY_S, --app,
  --redis-url) is a usage error naming the variable, exit 2, before Redis is reached. Other
  `CANARY_*` variables are not read, so not validated: a malformed setting of the gateway (a
  batch size, a webhook URL) never blocks pulling a canary back.
- `unkill` of a big move (a share of 50 % or more) asks on a terminal, is refused without one
  unless --yes (exit 2), and declining is exit 1; `kill` never asks.
- Redis unreachable, refusing the password (StoreUnavailable) or the command (NOPERM:
  PermissionDenied), a conflict: one line and exit 1, as rollout.resp_client.rollout_error and
  ops.cli.errors put them.
- Behind Redis Sentinel (a `redis+sentinel://` URL) a kill always lands: while the primary
  cannot be reached or answers as a replica (a failover), it finds the primary again and
  retries, until CANARY_KILL_RETRY_S after the command started. A reply lost after the write
  was sent means the kill is written a second time ("it was already on"). A write the replicas
  do not acknowledge in time (CANARY_REDIS_WAIT_REPLICAS, WAIT asked again until the same
  deadline) is reported, exit 1, the kill in effect on the primary.
- A Redis URL with an option rollout.resp_client does not implement runs the same QuickSwitch
  over redis-py (rollout.killswitch.RedisPyConnection, imported then: about 0.3 s more); a
  stored state that is not exactly what `rollout` writes is read by RolloutState (pydantic,
  imported then), written back as it would be, or refused with its error (exit 1).

Tests inject a store (ops.cli.main(store=...)): the same handlers then run on
rollout.control.Rollout over it, whose `kill` / `unkill` are QuickSwitch's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

from ops.cli.args import invalid_setting
from ops.cli.context import Ask, ChangeContext, is_terminal
from ops.cli.errors import UsageError, fail
from rollout import resp_client
from rollout.kill_settings import BadSettings, KillSettings, read_kill_settings
from rollout.killswitch import QuickSwitch, RedisPyConnection
from rollout.redis_conn import is_sentinel
from rollout.share import format_bp

RETRY_PAUSE_S = 0.2  # between two tries of a kill while Redis fails over


# --- the handlers -----------------------------------------------------------------------------


def kill(ctx: ChangeContext) -> int:
    """Turn the kill switch on; never asks."""
    def report(before, _) -> str:
        was = "kill switch on (it was already on)" if before.kill else "kill switch off -> on"
        return was + ", all traffic to baseline"

    ctx.change(lambda: ctx.rollout.kill(actor=ctx.actor, reason=ctx.args.reason), report)
    return 0


def unkill(ctx: ChangeContext) -> int:
    """Turn the kill switch off, asking first when the stored share is a big move."""
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


HANDLERS = {"kill": kill, "unkill": unkill}


@dataclass
class KillContext(ChangeContext):
    """A handler's context; its lines are printed once the command is done, so that a closed
    stdout is never mistaken for a Redis failure (and retried)."""

    args: object
    rollout: object  # QuickSwitch, or rollout.control.Rollout over a test's store
    out: IO[str]
    err: IO[str]
    stdin: IO[str]
    interactive: bool
    lines: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)


# --- the command ------------------------------------------------------------------------------


def run(args, *, store=None, clock=None, stdin: IO[str] | None = None,
        stdout: IO[str] | None = None, stderr: IO[str] | None = None,
        environ: Mapping[str, str] | None = None) -> int:
    """Run `kill` or `unkill` (`args` from ops.cli.args' parser) and return its exit code: on
    QuickSwitch over the Redis the settings name, or on Rollout over `store` (tests). The
    kill's retry budget (CANARY_KILL_RETRY_S) runs from here: in a process started for the
    command that is ~0.1 s after its start; in a process that runs many commands, this one's."""
    started = time.monotonic()
    out, err = stdout or sys.stdout, stderr or sys.stderr

    def handle(switch) -> KillContext:
        ctx = KillContext(args, switch, out, err, stdin or sys.stdin,
                          stdin is not None or is_terminal(sys.stdin))
        HANDLERS[args.command](ctx)
        return ctx

    try:
        if store is not None:
            from rollout.control import Rollout

            ctx = handle(Rollout(store, clock))
        else:
            settings = settings_for(args, os.environ if environ is None else environ)
            ctx = on_redis(settings, handle, retry=args.command == "kill", started=started)
        out.write("".join(line + "\n" for line in ctx.lines))
        out.flush()
        return 0
    except (KeyboardInterrupt, Exception) as exc:
        return fail(exc, err, own_stdout=stdout is None)


def settings_for(args, environ: Mapping[str, str]) -> KillSettings:
    """The settings the kill reads, flags first; a bad one is a usage error naming it."""
    try:
        return read_kill_settings(environ, redis_url=getattr(args, "redis_url", None),
                                  app_name=getattr(args, "app", None))
    except BadSettings as exc:
        raise UsageError("; ".join(invalid_setting(name, message)
                                   for name, message in exc.problems)) from None


def on_redis(settings: KillSettings, handle: Callable[[QuickSwitch], KillContext], *,
             retry: bool, started: float) -> KillContext:
    """`handle` on QuickSwitch over a fresh connection; with `retry` behind Sentinel, again on
    a new one while Redis fails over, until the kill's budget (from `started`, monotonic) is
    spent. Transport errors come out as the rollout's (rollout.resp_client.rollout_error)."""
    deadline = None
    if retry and is_sentinel(settings.redis_url):
        deadline = started + settings.kill_retry_s
    ack = settings.acknowledgement()

    def attempt() -> KillContext:
        with connect(settings) as conn:
            return handle(QuickSwitch(conn, settings.app_name, ack=ack, ack_until=deadline))

    try:
        return retrying(attempt, deadline, resp_client.retryable)
    except Exception as exc:
        raise resp_client.rollout_error(exc, settings.redis_url) from None


def connect(settings: KillSettings):
    """resp_client's connection, or redis-py's for a URL option resp_client does not
    implement."""
    try:
        return resp_client.connect(settings.redis_url, settings.redis_timeout_s)
    except resp_client.Unsupported:
        return RedisPyConnection(settings.redis_url, settings.redis_timeout_s)


def retrying(attempt: Callable, deadline: float | None, retryable: Callable) -> object:
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
