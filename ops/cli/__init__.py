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
first try a fast path (ops.cli.kill) that imports neither pydantic nor redis-py and returns in
a few tens of milliseconds; whatever it cannot do (an error to report, a question to ask) the
full path (ops.cli.commands) does, from the start.
The argparse value types of this and every other ops command are ops.cli.types.
Exit codes: 0 done, 1 store unavailable, conflict or aborted, 2 invalid usage or input, 130 Ctrl-C.
"""

from __future__ import annotations

from typing import IO

from ops.cli.args import build_parser
from ops.cli.kill import quick

__all__ = ["build_parser", "main"]


def main(argv=None, *, store=None, clock=None, stdin: IO[str] | None = None,
         stdout: IO[str] | None = None, stderr: IO[str] | None = None, telemetry=None,
         ramps=None) -> int:
    """Run one command and return its exit code. Tests inject the stores (state, telemetry,
    ramp), clock and streams; without a store, Settings() and the Redis stores are built from
    the environment and flags."""
    if store is None and clock is None and telemetry is None and ramps is None:
        code = quick(argv, stdout=stdout, stderr=stderr)
        if code is not None:
            return code
    from ops.cli.commands import run

    return run(argv, store=store, clock=clock, stdin=stdin, stdout=stdout, stderr=stderr,
               telemetry=telemetry, ramps=ramps)

