"""The gateway's domain errors, and the one place they become HTTP responses.

    GatewayError
    ├── BodyTimeout       408  the body did not arrive within `body_timeout_s` of the headers
    ├── ClientGone        499  the client went away before its answer (recorded; nobody reads it)
    ├── InvalidInput      422  malformed JSON, wrong types, empty inputs, unknown task
    ├── InvalidOverride   400  X-Canary-Arm-Override names no arm (with the operator token)
    ├── InvalidTimeout    400  X-Request-Timeout-Ms is not a positive whole number
    ├── OverrideNotAllowed 403 X-Canary-Arm-Override without the operator token
    ├── InputTooLarge     413  more items, characters or bytes than the configured limits
    ├── KeyReused         409  an Idempotency-Key already used for a different request
    ├── InProgress        409  the first request with this Idempotency-Key is still running
    ├── Overloaded        503  it would not be answered within its deadline, or a queue is
    │                          full (with Retry-After)
    ├── ModelTimeout      504  the model call passed its deadline (and was cancelled)
    └── ModelFailed       503  the model raised or its replica died (with Retry-After)

Overloaded is also the gateway's own shedding: a request predicted to be answered after its
deadline or past the memory cap (serve.gateway.admission), or with `gateway_max_uploading` bodies
being received.

The handlers only translate; nothing below the gateway's edge knows about status codes.
Every error answers the same body, `ErrorBody`; `openapi_errors` declares, for an endpoint's
OpenAPI operation, the statuses its errors answer with that body.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


class GatewayError(Exception):
    """an unexpected error (a bug); nothing more is said to the client"""

    status = 500
    type = "internal_error"
    retry_after: int | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BodyTimeout(GatewayError):
    """the body did not arrive within `body_timeout_s` of the headers"""

    status, type = 408, "body_timeout"


class ClientGone(GatewayError):
    """the client went away before its answer (recorded; nobody reads it)"""

    status, type = 499, "client_disconnected"


class InvalidInput(GatewayError):
    """malformed JSON, wrong types, empty inputs, unknown task or a malformed Idempotency-Key"""

    status, type = 422, "invalid_input"


class InvalidOverride(GatewayError):
    """X-Canary-Arm-Override names no arm (with the operator token)"""

    status, type = 400, "invalid_override"


class OverrideNotAllowed(GatewayError):
    """X-Canary-Arm-Override without the operator token"""

    status, type = 403, "override_not_allowed"


class InputTooLarge(GatewayError):
    """more items, characters or bytes than the configured limits"""

    status, type = 413, "input_too_large"


class KeyReused(GatewayError):
    """an Idempotency-Key already used for a different request"""

    status, type = 409, "idempotency_key_reused"


class InProgress(GatewayError):
    """the first request with this Idempotency-Key is still running"""

    status, type, retry_after = 409, "idempotency_in_progress", 1


class InvalidTimeout(GatewayError):
    """X-Request-Timeout-Ms is not a positive whole number of milliseconds"""

    status, type = 400, "invalid_timeout"


class Overloaded(GatewayError):
    """it would not be answered within its deadline, or a queue is full; retry after
    Retry-After"""

    status, type, retry_after = 503, "overloaded", 1

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        if retry_after is not None:
            self.retry_after = retry_after


class ModelTimeout(GatewayError):
    """the model call passed the request's deadline (and was cancelled)"""

    status, type = 504, "timeout"


class ModelFailed(GatewayError):
    """the model raised or its replica died; retry after Retry-After"""

    status, type, retry_after = 503, "model_unavailable", 1


class ErrorDetail(BaseModel):
    type: str = Field(description="what went wrong, for programs: `invalid_input`, `overloaded`, "
                      "`timeout`, ... (the error classes of serve.common.errors, and `not_found`, "
                      "`method_not_allowed`, `internal_error`)")
    message: str = Field(description="what went wrong, for people")
    request_id: str = Field(description="the request's id, as in its `X-Request-ID` header")


class ErrorBody(BaseModel):
    """The body of every error response the gateway sends."""

    error: ErrorDetail


_RETRY_AFTER = {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}


def openapi_errors(*errors: type[GatewayError]) -> dict[int | str, dict]:
    """OpenAPI `responses` for the errors an endpoint answers (and 500, which any endpoint may
    answer): per status, `ErrorBody`, the `type`s it carries and, where one of them sends it,
    the Retry-After header. 499 (ClientGone) is only logged, never sent: it is left out."""
    by_status: dict[int, list[type[GatewayError]]] = {}
    for error in (*errors, GatewayError):
        if error is not ClientGone:
            by_status.setdefault(error.status, []).append(error)
    responses: dict[int | str, dict] = {}
    for status, group in sorted(by_status.items()):
        described = "; ".join(f"`{error.type}`: {error.__doc__}" for error in group)
        responses[status] = {"model": ErrorBody, "description": described}
        if any(error.retry_after is not None for error in group):
            responses[status]["headers"] = {"Retry-After": _RETRY_AFTER}
    return responses


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
    body = ErrorBody(error=ErrorDetail(type=type_, message=message, request_id=request_id))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def to_response(exc: GatewayError, request_id: str, incoming_id: str | None = None) -> JSONResponse:
    return error_response(
        exc.status, exc.type, exc.message, request_id, exc.retry_after, incoming_id
    )
