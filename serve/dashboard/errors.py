"""The dashboard's errors, subclasses of the gateway's, so the gateway's one handler answers
them as JSON `{"error": {"type", "message", "request_id"}}`:

    GatewayError (serve.errors)
    ├── InvalidInput           422  a body or query that does not parse or is out of range
    ├── InputTooLarge          413  an action body over 4 KiB
    ├── Unauthorized           401  no or a wrong `Authorization: Bearer` operator token
    ├── ReadOnly               403  no operator token is configured: actions are refused
    ├── NotFound               404  no such trace, no such asset
    ├── Conflict               409  the state moved since the operator looked (revision)
    │   └── RampNotPossible    409  the ramp does not allow this action now (or there is none)
    ├── ConfirmationRequired   428  a big move (>= 50 points or to 100 %): resend confirmed
    └── ControlUnavailable     503  the state store cannot be reached or may not be changed
"""

from __future__ import annotations

from serve.errors import GatewayError, InputTooLarge, InvalidInput

__all__ = [
    "ConfirmationRequired", "Conflict", "ControlUnavailable", "InputTooLarge", "InvalidInput",
    "NotFound", "RampNotPossible", "ReadOnly", "Unauthorized",
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
