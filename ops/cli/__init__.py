"""The `rollout` command: look at and change the canary rollout, safely and on the record.

    rollout status [--json]                    what the gateways route by
    rollout canary PCT --reason TEXT [--yes]   move the canary share
    rollout kill --reason TEXT                 send everything to baseline, now
    rollout unkill --reason TEXT [--yes]       hand the canary its share back
    rollout audit [--last N] [--json]          who changed what, when and why
    rollout revert REVISION --reason TEXT [--yes]
    rollout traces [--last N | --request-id ID | --trace-id ID] [--json]
    rollout verify [--recipe NAME] [--set PATH] [--limit N] [--json]
    rollout ramp start PLAN.yaml [--force] | status | pause | resume | approve | abort
    rollout flips [--last N] [--json] [--export FILE]   what the arms disagreed on
    rollout route add --header NAME=VALUE[,VALUE...] --arm ARM --reason TEXT | list | remove ID

Safe by default: every change names a reason and an actor and lands in the audit log; a change
that moves the canary share, or the share actually routed to the canary, by 50 points or more,
or to 100 %, asks for confirmation (or `--yes`); every change is a compare-and-set on the
revision the operator saw, so a concurrent change is reported, never overwritten. The kill
switch is the exception: it never asks and always wins.

The command imports only the `rollout` package (no Ray, torch or HTTP), so it answers at once;
`verify` alone imports torch and transformers (ops.verify.runner), when it runs. `kill` and `unkill`
import neither pydantic nor redis-py either: they run on their own, lighter stack (ops.cli.kill,
which says why and how long they take); every other command runs in ops.cli.commands.
The argparse value types of this and every other ops command are ops.cli.types.
Exit codes: 0 done, 1 store unavailable, conflict or aborted, 2 invalid usage or input, 130 Ctrl-C.
"""

from __future__ import annotations

import contextlib
import sys
from typing import IO

from ops.cli import kill
from ops.cli.args import build_parser
from ops.cli.errors import fail

__all__ = ["build_parser", "main"]


def main(argv=None, *, store=None, clock=None, stdin: IO[str] | None = None,
         stdout: IO[str] | None = None, stderr: IO[str] | None = None, telemetry=None,
         ramps=None) -> int:
    """Run one command and return its exit code. Tests inject the stores (state, telemetry,
    ramp), clock and streams; without a store, the settings and the Redis stores are read from
    the environment and flags."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except (KeyboardInterrupt, Exception) as exc:  # a usage error: exit 2
        return fail(exc, err, own_stdout=stdout is None)
    if args.command in kill.HANDLERS:
        return kill.run(args, store=store, clock=clock, stdin=stdin, stdout=stdout,
                        stderr=stderr)
    from ops.cli.commands import run

    return run(args, store=store, clock=clock, stdin=stdin, stdout=stdout, stderr=stderr,
               telemetry=telemetry, ramps=ramps)
