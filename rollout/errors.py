"""The rollout library's exception tree.

    RolloutError
    ├── InvalidChange       a requested change is malformed (bad share, missing reason, ...)
    ├── RevisionConflict    compare-and-set lost: someone changed the state first
    ├── RevisionNotFound    no recorded state for the requested revision
    ├── PermissionDenied    the store refused: this identity may not do that (least privilege)
    ├── RampNotAllowed      the ramp is not in a state that allows this (none running, ...)
    ├── LeaseLost           a ramp controller wrote without holding its lease
    ├── NotAcknowledged     a write reached the Redis primary, but too few replicas confirmed it
    ├── StoreRefused        the store answered with an error (READONLY, OOM, MISCONF, BUSY, a
    │                       script error, a key of the wrong type)
    ├── StateUnreadable     the store holds a document this version cannot read
    └── StoreUnavailable    the state store cannot be reached

Nothing here knows about HTTP or processes: the dashboard and the CLI map these at their edges,
both from the one table at the end of this module (`ANSWERS`: exit code and HTTP status).
"""

from __future__ import annotations

from dataclasses import dataclass


class RolloutError(Exception):
    """Base class of every error raised by the rollout library."""


class InvalidChange(RolloutError, ValueError):
    """A requested change is malformed."""


class RevisionConflict(RolloutError):
    """Compare-and-set lost: the state is no longer at the expected revision."""

    def __init__(self, expected: int, actual: int):
        super().__init__(
            f"rollout state changed concurrently: expected revision {expected}, found {actual}"
        )
        self.expected = expected
        self.actual = actual


class RevisionNotFound(RolloutError, LookupError):
    """No state was recorded for the requested revision."""


class PermissionDenied(RolloutError, PermissionError):
    """The store refused the operation for this identity (e.g. a gateway's read-only Redis user)."""


class RampNotAllowed(RolloutError):
    """The ramp is not in a state that allows the requested action."""


class LeaseLost(RolloutError):
    """A ramp controller tried to write after another one took over its lease."""


class NotAcknowledged(RolloutError):
    """A write is in effect on the Redis primary, but fewer replicas than required acknowledged
    it (`WAIT`) in time: a failover could lose it (rollout.redis_conn)."""


class StoreRefused(RolloutError):
    """The store was reached and answered with an error: a demoted primary (READONLY), a full
    memory (OOM under `noeviction`), failed snapshots (MISCONF), a busy script (BUSY), a script
    error or a key of the wrong type. `kind` is the error's first word (`READONLY`, `OOM`, ...),
    what the watcher counts by; `transient` as StoreUnavailable's: most of these heal (a failover
    ends, memory is freed), a script error does not."""

    transient = True

    def __init__(self, message: str, kind: str = "ERR"):
        super().__init__(message)
        self.kind = kind

    @classmethod
    def from_reply(cls, reply: str, where: str) -> StoreRefused:
        """Redis' error `reply` from `where` (a URL, its password already redacted); its kind
        is the reply's first word (`SCRIPT` for a script's own error)."""
        first = reply.split(" ", 1)[0]
        kind = first if first.isupper() and first.isalpha() else "ERR"
        if kind == "ERR" and "script" in reply.lower():
            kind = "SCRIPT"
        error = cls(f"Redis at {where} answered: {reply.splitlines()[0]}", kind)
        error.transient = kind in TRANSIENT_REPLIES
        return error


# the error replies that heal by themselves: a failover ends, memory is freed, a snapshot
# succeeds again, a script or a pause ends
TRANSIENT_REPLIES = ("READONLY", "OOM", "MISCONF", "BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN",
                     "NOREPLICAS")


class StateUnreadable(RolloutError, ValueError):
    """The store holds a document this version cannot read (not JSON, a field of the wrong
    type, a share out of bounds): routed as stale, never served from."""


class StoreUnavailable(RolloutError, ConnectionError):
    """The state store cannot be reached (connection refused, timeout, auth failure).
    `transient` is False where trying again cannot help (a refused password): the kill, which
    retries across a Redis failover, gives up at once on those."""

    transient = True


# --- how the edges answer them ----------------------------------------------------------------
# One table for both edges that translate these errors: the `rollout` command (ops.cli.errors:
# exit codes) and the dashboard (serve.dashboard.errors: HTTP statuses). Plain ints: nothing
# here knows HTTP or processes. Most specific first: the first type an error is an instance of
# answers it. `http_status` None: the dashboard does not translate it (no action raises it).


@dataclass(frozen=True)
class EdgeAnswer:
    """How the edges answer one kind of rollout error."""

    exit_code: int  # the `rollout` command's: 1 refused or failed, 2 invalid usage or input
    http_status: int | None  # the dashboard's


ANSWERS: tuple[tuple[type[RolloutError], EdgeAnswer], ...] = (
    (InvalidChange, EdgeAnswer(2, 422)),
    (RevisionNotFound, EdgeAnswer(2, None)),
    (RevisionConflict, EdgeAnswer(1, 409)),
    (RampNotAllowed, EdgeAnswer(1, 409)),
    (PermissionDenied, EdgeAnswer(1, 503)),
    (NotAcknowledged, EdgeAnswer(1, 503)),
    (StoreRefused, EdgeAnswer(1, 503)),
    (StateUnreadable, EdgeAnswer(1, 503)),
    (StoreUnavailable, EdgeAnswer(1, 503)),
    (RolloutError, EdgeAnswer(1, None)),
)


def answer_for(kind: type[BaseException]) -> EdgeAnswer | None:
    """The answer to an error type (None: not a rollout error)."""
    return next((answer for known, answer in ANSWERS if issubclass(kind, known)), None)
