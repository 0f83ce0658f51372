"""The `rollout` command's own errors, the one table that turns any error into an exit code
and a one-line message, and `fail`, which ends every command on an error (ops.cli.main,
ops.cli.commands, ops.cli.kill). Rollout errors take their exit code from the table the
dashboard shares (rollout.errors.ANSWERS); this module adds the CLI's messages.

Light on purpose (no pydantic): `rollout kill` imports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import IO, NamedTuple

from ops.cli.format import one_line
from rollout.errors import (
    InvalidChange,
    NotAcknowledged,
    PermissionDenied,
    RevisionConflict,
    RevisionNotFound,
    RolloutError,
    StoreUnavailable,
    answer_for,
)

PROG = "rollout"


class UsageError(Exception):
    """Bad command line, input or settings: exit 2."""


class Aborted(Exception):
    """The operator declined to confirm: exit 1."""


class NothingRecorded(Exception):
    """What the operator asked to see is not recorded (a trace, flips to export): exit 1."""


class Exit(NamedTuple):
    """How the command ends on one type of error: `{prefix}rollout: {message}`, then `code`."""

    kind: type[BaseException]
    code: int
    message: str  # formatted with the error as `exc` and its type's name as `name`
    prefix: str = ""


def _rollout(kind: type[RolloutError], message: str) -> Exit:
    answer = answer_for(kind)
    assert answer is not None
    return Exit(kind, answer.exit_code, message)


# Most specific first: the first type an error is an instance of ends the command.
EXITS: tuple[Exit, ...] = (
    Exit(KeyboardInterrupt, 130, "interrupted", prefix="\n"),
    Exit(UsageError, 2, "error: {exc}"),
    _rollout(InvalidChange, "error: {exc}"),
    _rollout(RevisionNotFound, "error: {exc}"),
    Exit(Aborted, 1, "aborted: nothing was changed"),
    _rollout(PermissionDenied, "error: {exc} (this Redis user may not change the rollout; use "
                               "an operator's credentials)"),
    Exit(NothingRecorded, 1, "error: {exc}"),
    _rollout(RevisionConflict, "error: {exc}: nothing was changed; check `rollout status` and "
                               "try again"),
    _rollout(NotAcknowledged, "error: {exc}"),
    _rollout(StoreUnavailable, "error: {exc} (check REDIS_URL or --redis-url)"),
    _rollout(RolloutError, "error: {exc}"),
    # a bug or an unexpected store reply: still one line, no traceback
    Exit(Exception, 1, "error: unexpected {name}: {exc}"),
)


def exit_for(exc: BaseException) -> tuple[int, str, str]:
    """(exit code, message, prefix) for an error; an error no row names is raised again."""
    for row in EXITS:
        if isinstance(exc, row.kind):
            return row.code, row.message.format(exc=exc, name=type(exc).__name__), row.prefix
    raise exc


def fail(exc: BaseException, err: IO[str], *, own_stdout: bool = True) -> int:
    """End a command on `exc`: its one line on `err` and its exit code (EXITS). A closed pipe
    (`rollout audit | head -1`) ends quietly with 1, stdout pointed at /dev/null first when it
    is the process's own (`own_stdout`), so that Python's exit does not complain."""
    if isinstance(exc, BrokenPipeError):
        if own_stdout:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    code, message, prefix = exit_for(exc)
    err.write(f"{prefix}{PROG}: {one_line(message)}\n")
    err.flush()
    return code
