"""The rollout library's exception tree.

    RolloutError
    ├── InvalidChange       a requested change is malformed (bad share, missing reason, ...)
    ├── RevisionConflict    compare-and-set lost: someone changed the state first
    ├── RevisionNotFound    no recorded state for the requested revision
    ├── PermissionDenied    the store refused: this identity may not do that (least privilege)
    ├── RampNotAllowed      the ramp is not in a state that allows this (none running, ...)
    ├── LeaseLost           a ramp controller wrote without holding its lease
    └── StoreUnavailable    the state store cannot be reached

Nothing here knows about HTTP or exit codes: the gateway and the CLI map these at their edges.
"""


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


class StoreUnavailable(RolloutError, ConnectionError):
    """The state store cannot be reached (connection refused, timeout, auth failure)."""
