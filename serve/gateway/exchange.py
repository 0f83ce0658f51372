"""One admitted request's exchange with the gateway: what its steps share (ids, observation,
slot, deadline, protocol), how its timeout and body are read, and how it ends when it is not
answered by a model (replayed, failed, abandoned), with the timing headers of an answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from rollout.settings import AdmissionSettings
from serve.common.answer import BatchShape
from serve.common.errors import (
    BodyTimeout,
    ClientGone,
    GatewayError,
    InputTooLarge,
    InvalidTimeout,
    Overloaded,
)
from serve.gateway.admission import TIMEOUT_HEADER, Slot, requested_timeout_s
from serve.gateway.idempotent import REPLAYED
from serve.gateway.ingress import (
    BODY,
    BODY_PROBLEM,
    BUSY,
    DISCONNECTED,
    TIMEOUT,
    TIMEOUT_S,
    TOO_LARGE,
    receive_body,
)
from serve.gateway.protocols.door import FrontDoor, Parsed
from serve.gateway.schemas import max_body_bytes, request_id_from
from serve.telemetry.observe import Observation


@dataclass(frozen=True)
class Exchange:
    """One admitted request on its way through `Gateway._predict`: what its steps share."""

    rid: str
    incoming: str | None  # the client's X-Request-ID, if it sent one
    obs: Observation
    slot: Slot
    start: float  # perf_counter when the request arrived
    timeout_s: float  # its own (X-Request-Timeout-Ms) or the server's request timeout
    door: FrontDoor  # its protocol: how it is parsed, answered and refused (protocols/)

    @property
    def deadline(self) -> float:
        return self.start + self.timeout_s

    def failed(self, exc: GatewayError) -> Response:
        """A domain error as the client's response, in its protocol's shape."""
        self.obs.finish(exc.status, error_type=exc.type)
        return self.door.error(exc, self.rid, self.incoming)

    def replay(self, stored: dict, parsed: Parsed) -> Response:
        """The response stored under the request's Idempotency-Key, sent again as it was (in
        the shape of the protocol that asks again)."""
        self.obs.finish(stored["status"], arm=stored["body"]["arm"], replayed=True)
        response = self.door.answer(stored["body"], stored.get("tokens", 0), parsed)
        response.status_code = stored["status"]
        response.headers.update({**stored["headers"], **REPLAYED})
        return response


def ids(request: Request) -> tuple[str, str | None]:
    """The request's id (the client's X-Request-ID when it is safe, else a new one) and the
    header as the client sent it."""
    incoming = request.headers.get("x-request-id")
    return request_id_from(incoming), incoming


def abandoned(exc: BaseException, obs: Observation) -> None:
    """A request that ends without a response: the client went away (499) or a bug."""
    if isinstance(exc, asyncio.CancelledError):
        obs.finish(499, error_type="cancelled")
    else:
        obs.finish(500, error_type="internal_error")


def timeout_of(request: Request, request_timeout_s: float) -> float:
    """The request's timeout in seconds: `X-Request-Timeout-Ms`, capped at the server's
    `request_timeout_s`, or that (400 for a header that is not a positive integer); as
    serve.gateway.ingress read it, when it did."""
    read = request.scope.get(TIMEOUT_S)
    if read is not None:
        return read
    try:
        return requested_timeout_s(request.headers.get(TIMEOUT_HEADER), request_timeout_s)
    except ValueError as exc:
        raise InvalidTimeout(str(exc)) from None


async def read_body(request: Request, settings: AdmissionSettings) -> bytes:
    """The body serve.gateway.ingress received, or its problem as the client's error; without
    serve.gateway.ingress in front (Serve's proxy callback not set), read here under the same
    deadline and limit."""
    limit = max_body_bytes(settings)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise InputTooLarge(f"request body of {declared} bytes is over the limit")
    if BODY in request.scope or BODY_PROBLEM in request.scope:
        body, problem = request.scope.get(BODY, b""), request.scope.get(BODY_PROBLEM)
    else:
        body, problem = await receive_body(request.receive, settings.body_timeout_s, limit)
    if problem is not None:
        raise _body_error(problem, settings.body_timeout_s)
    return body


def _body_error(problem: str, timeout_s: float) -> GatewayError:
    """What serve.gateway.ingress (or the gateway's own read) found wrong with a request's
    body."""
    if problem == TIMEOUT:
        return BodyTimeout(f"the request body did not arrive within {timeout_s:g} s")
    if problem == DISCONNECTED:
        return ClientGone("the client went away before its request body arrived")
    if problem == TOO_LARGE:
        return InputTooLarge("request body is over the limit")
    if problem == BUSY:
        return Overloaded("the gateway is receiving too many request bodies; retry later")
    raise ValueError(f"unknown body problem {problem!r}")


def server_timing(stages: dict[str, float]) -> str:
    return ", ".join(f"{name};dur={ms:.3f}" for name, ms in stages.items())


def batch_timing(batch: BatchShape) -> str:
    """The batch the request rode in: its requests and inputs, and how many requests shared
    the gateway's call to the model (serve.gateway.coalesce; 1 without coalescing)."""
    return f', batch;desc="requests={batch.requests} items={batch.items} call={batch.call}"'
