"""The dashboard's errors, subclasses of the gateway's, so the gateway's one handler answers
them as JSON `{"error": {"type", "message", "request_id"}}`:

    GatewayError (serve.common.errors)
    ├── InvalidInput           422  a body or query that does not parse or is out of range
    ├── InputTooLarge          413  an action body over 4 KiB
    ├── Unauthorized           401  no or a wrong `Authorization: Bearer` operator token
    ├── ReadOnly               403  no operator token is configured: actions are refused
    ├── NotFound               404  no such trace, no such asset
    ├── Conflict               409  the state moved since the operator looked (revision)
    │   └── RampNotPossible    409  the ramp does not allow this action now (or there is none)
    ├── ConfirmationRequired   428  a big move (>= 50 points or to 100 %): resend confirmed
    └── ControlUnavailable     503  the state store cannot be reached or may not be changed
        └── NotAcknowledged    503  written to the Redis primary, but too few replicas
                                    acknowledged it (`CANARY_REDIS_WAIT_REPLICAS`): in effect,
                                    not yet safe from a failover

A rollout error (rollout.errors) becomes one of these by its HTTP status in the table the CLI
shares for its exit codes (rollout.errors.ANSWERS): `dashboard_error`.
"""

from __future__ import annotations

from rollout.errors import NotAcknowledged, RampNotAllowed, RolloutError, answer_for
from serve.common.errors import GatewayError, InputTooLarge, InvalidInput

__all__ = [
    "ConfirmationRequired", "Conflict", "ControlUnavailable", "InputTooLarge", "InvalidInput",
    "NotFound", "RampNotPossible", "ReadOnly", "Unacknowledged", "Unauthorized",
    "dashboard_error",
]


class Unauthorized(GatewayError):
    status, type = 401, "unauthorized"


class ReadOnly(GatewayError):
    status, type = 403, "read_only"


class NotFound(GatewayError):
    status, type = 404, "not_found"


class Conflict(GatewayError):
    status, type = 409, "revision_conflict"


class RampNotPossible(Conflict):
    type = "ramp_not_allowed"


class ConfirmationRequired(GatewayError):
    status, type = 428, "confirmation_required"


class ControlUnavailable(GatewayError):
    status, type, retry_after = 503, "store_unavailable", 1


class Unacknowledged(ControlUnavailable):
    type = "not_acknowledged"


_BY_STATUS: dict[int, type[GatewayError]] = {
    422: InvalidInput, 409: Conflict, 503: ControlUnavailable,
}
_BY_TYPE: dict[type[RolloutError], type[GatewayError]] = {
    RampNotAllowed: RampNotPossible, NotAcknowledged: Unacknowledged,
}


def dashboard_error(exc: RolloutError, message: str) -> GatewayError | None:
    """The dashboard's error for a rollout error, saying `message`: its HTTP status from
    rollout.errors.ANSWERS (a ramp that does not allow an action: RampNotPossible). None where
    the dashboard does not translate it (no action raises it: a bug, answered 500)."""
    kind = next((mine for theirs, mine in _BY_TYPE.items() if isinstance(exc, theirs)), None)
    answer = answer_for(type(exc))
    if kind is None and answer is not None and answer.http_status is not None:
        kind = _BY_STATUS[answer.http_status]
    return None if kind is None else kind(message)
