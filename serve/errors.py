"""The gateway's domain errors, and the one place they become HTTP responses.

    GatewayError
    ├── BodyTimeout       408  the body did not arrive within `body_timeout_s` of the headers
    ├── ClientGone        499  the client went away before its answer (recorded; nobody reads it)
    ├── InvalidInput      422  malformed JSON, wrong types, empty inputs, unknown task
    ├── InvalidOverride   400  X-Canary-Arm-Override names no arm (with the operator token)
    ├── OverrideNotAllowed 403 X-Canary-Arm-Override without the operator token
    ├── InputTooLarge     413  more items, characters or bytes than the configured limits
    ├── KeyReused         409  an Idempotency-Key already used for a different request
    ├── InProgress        409  the first request with this Idempotency-Key is still running
    ├── Overloaded        503  a model's queue is full (with Retry-After)
    ├── ModelTimeout      504  the model call passed its deadline (and was cancelled)
    └── ModelFailed       503  the model raised or its replica died (with Retry-After)

Overloaded is also the gateway's own shedding: past its adaptive in-flight limit
(serve.admission), or with `gateway_max_uploading` bodies being received.

The handlers only translate; nothing below the gateway's edge knows about status codes.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


class GatewayError(Exception):
    status = 500
    type = "internal_error"
    retry_after: int | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BodyTimeout(GatewayError):
    status, type = 408, "body_timeout"


class ClientGone(GatewayError):
    status, type = 499, "client_disconnected"


class InvalidInput(GatewayError):
    status, type = 422, "invalid_input"


class InvalidOverride(GatewayError):
    status, type = 400, "invalid_override"


class OverrideNotAllowed(GatewayError):
    status, type = 403, "override_not_allowed"


class InputTooLarge(GatewayError):
    status, type = 413, "input_too_large"


class KeyReused(GatewayError):
    status, type = 409, "idempotency_key_reused"


class InProgress(GatewayError):
    status, type, retry_after = 409, "idempotency_in_progress", 1


class Overloaded(GatewayError):
    status, type, retry_after = 503, "overloaded", 1


class ModelTimeout(GatewayError):
    status, type = 504, "timeout"


class ModelFailed(GatewayError):
    status, type, retry_after = 503, "model_unavailable", 1


def id_headers(request_id: str, incoming: str | None) -> dict[str, str]:
    """`X-Request-ID` for a response. Ray Serve's proxy already echoes the incoming id, so the
    gateway adds its own only when it replaced a malformed one."""
    return {} if request_id == incoming else {"X-Request-ID": request_id}


def error_response(
    status: int,
    type_: str,
    message: str,
    request_id: str,
    retry_after: int | None = None,
    incoming_id: str | None = None,
) -> JSONResponse:
    headers = id_headers(request_id, incoming_id)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"error": {"type": type_, "message": message, "request_id": request_id}}
    return JSONResponse(body, status_code=status, headers=headers)


def to_response(exc: GatewayError, request_id: str, incoming_id: str | None = None) -> JSONResponse:
    return error_response(
        exc.status, exc.type, exc.message, request_id, exc.retry_after, incoming_id
    )
