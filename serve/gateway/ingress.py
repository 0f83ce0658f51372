"""What every HTTP request meets before Ray Serve and the gateway: its body received under a
deadline, outside every in-flight bound, and a request id that is safe to echo.

Installed as Ray Serve's HTTP proxy callback (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=
serve.gateway.ingress:middlewares`, which serve.ray_env sets), so it wraps Serve's own middleware
and request handling, in the gateway replica's HTTP server (direct ingress) and in Serve's proxy:

- **Bodies.** A request with a body is only handed on once the whole body is here. Until then
  it holds no Serve slot (`gateway_max_ongoing_requests`) and no gateway in-flight slot; it
  counts in a pool of its own, `gateway_max_uploading`. A body that has not arrived
  `body_timeout_s` after the headers, a client that went away mid-body, a full pool and a body
  over the size limit are handed on as what they are (`BODY_PROBLEM` in the ASGI scope), so the
  gateway answers them (408, 499, 503, 413) and records them like any other request.
- **The in-flight slot is taken here.** Once its body is in and the door let it through, a
  prediction request takes its in-flight slot (serve.gateway.admission, the memory cap) here and
  holds it until its answer is sent, and its deadline runs from here (`ARRIVED`): requests that wait
  in Serve before the gateway's handler runs (past `gateway_max_ongoing_requests`) count
  against the cap and against their deadline. Without that, under a flood the door saw a free
  cap while hundreds waited unseen: at 5x capacity, 200s came 2.4 s after they were sent with
  a 1 s deadline, all within 1 s of the handler's start.
- **Shedding at the door.** When the gateway's admission (serve.gateway.admission `door`) says a
  prediction request cannot be answered within its deadline (`X-Request-Timeout-Ms` or the
  server's) whatever its arm, or the memory cap is reached, it is answered 503 + Retry-After
  here, without Serve's request handling, the web framework or per-request telemetry: under a
  flood of requests the CPU goes to the admitted ones. Refused on arrival with a large body
  (over `SMALL_BODY`), its body is not even read (the answer closes the connection); a small
  body is read first, so the kept-alive connection carries the client's next request: closing
  every refused request's connection made clients and HAProxy open a new one for each, which
  waited to be accepted (at 5x capacity the 200s' p99 was 1.4-2.4 s past their 1 s deadline,
  0.73 s with the connections kept). It is counted in the gateway's metrics. A malformed
  header is left to the gateway (400).
- **Request ids.** Serve echoes the incoming `X-Request-ID` as it came. A malformed one
  (over 128 characters, spaces, control or markup characters) is replaced here by a fresh id
  before Serve sees it, so every layer echoes the one validated id and nothing raw.

Headers themselves are the ingress proxy's to bound (HAProxy, which waits for complete headers
before it forwards anything).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from starlette.middleware import Middleware

from rollout.settings import AdmissionSettings, ServingSettings
from serve.common.errors import Overloaded, error_response
from serve.gateway.admission import TIMEOUT_HEADER, requested_timeout_s
from serve.gateway.protocols import predicts, shed_response
from serve.gateway.schemas import max_body_bytes, request_id_from

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# scope keys this middleware sets for the gateway
BODY = "canary.body"  # the complete body (bytes), when it arrived
BODY_PROBLEM = "canary.body_problem"  # one of the problems below, when it did not
SLOT = "canary.slot"  # the in-flight slot held for a prediction request (serve.gateway.admission)
ARRIVED = "canary.arrived"  # perf_counter when it reached the replica: its deadline's start
TIMEOUT_S = "canary.timeout_s"  # its deadline in seconds, X-Request-Timeout-Ms read once here

TIMEOUT, DISCONNECTED, TOO_LARGE, BUSY = "timeout", "disconnected", "too_large", "busy"
_WITH_BODY = {"POST", "PUT", "PATCH"}


def sanitize_request_id(scope: Scope) -> None:
    """Leave exactly one well-formed `x-request-id` in the request's headers when the client
    sent any: its own if well-formed, else a fresh one (serve.gateway.schemas.request_id_from)."""
    headers = scope.get("headers") or []
    sent = [value for name, value in headers if name.lower() == b"x-request-id"]
    if not sent:
        return
    incoming = sent[0].decode("latin-1")
    valid = request_id_from(incoming)
    if len(sent) == 1 and valid == incoming:
        return
    scope["headers"] = [(n, v) for n, v in headers if n.lower() != b"x-request-id"]
    scope["headers"].append((b"x-request-id", valid.encode("latin-1")))


class Admission(Protocol):
    loop: Any  # serve.gateway.admission.LoopLag: `lag_s`
    in_flight: int  # requests holding a slot
    ceiling: int  # the memory cap (gateway_max_in_flight)

    def door(self, timeout_s: float) -> int | None: ...

    def enter(self) -> Any: ...

    def leave(self, slot: Any) -> None: ...


@dataclass
class _Gateway:
    settings: AdmissionSettings | None = None
    request_timeout_s: float = 0.0  # the server's request deadline (ServingSettings)
    admission: Admission | None = None
    on_shed: Callable[[float], None] | None = None  # latency in ms of a request shed here


_gateway = _Gateway()
SHED_PATH = "/v1/predict"


def configure(settings: AdmissionSettings, serving: ServingSettings,
              admission: Admission | None = None,
              on_shed: Callable[[float], None] | None = None) -> None:
    """The admission settings the gateway runs with, its request deadline (`serving`) and its
    admission, for the middleware in its process (the gateway calls this at start; elsewhere,
    e.g. in Serve's proxy, the environment's settings apply and nothing is shed here)."""
    _gateway.settings, _gateway.request_timeout_s = settings, serving.request_timeout_s
    _gateway.admission, _gateway.on_shed = admission, on_shed


@functools.cache
def _from_environment() -> AdmissionSettings:
    return AdmissionSettings()


class BodyGate:
    """ASGI middleware: see the module docstring. `settings`: fixed ones (tests); by default
    those given to `configure`, else the environment's."""

    def __init__(self, app: ASGIApp, settings: AdmissionSettings | None = None):
        self.app = app
        self._settings = settings
        self.uploading = 0  # bodies being received now

    @property
    def settings(self) -> AdmissionSettings:
        return self._settings or _gateway.settings or _from_environment()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sanitize_request_id(scope)
        if scope.get("method") not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        settings = self.settings
        refusal = self._door(scope)
        if refusal is not None and not _small_body(scope):
            # shed before reading a large body nobody will use: the connection cannot go on
            await self._shed(scope, receive, send, started, refusal, close=True)
            return
        if self.uploading >= settings.gateway_max_uploading:
            body, problem = b"", BUSY
        else:
            self.uploading += 1
            try:
                body, problem = await receive_body(
                    receive, settings.body_timeout_s, max_body_bytes(settings))
            finally:
                self.uploading -= 1
        if problem is not None:
            scope[BODY_PROBLEM] = problem
            await self.app(scope, _replay(body, receive), send)
            return
        if refusal is None:
            refusal = self._door(scope)
        if refusal is not None:  # its body read: the connection stays open for the next
            await self._shed(scope, receive, send, started, refusal, close=False)
            return
        scope[BODY] = body
        await self._admitted(scope, _replay(body, receive), send, started)

    async def _admitted(self, scope: Scope, receive: Receive, send: Send,
                        started: float) -> None:
        """Hand a prediction request on holding its in-flight slot from here (its body in)
        until its answer is sent: the requests waiting in Serve for the gateway's handler
        count against the memory cap, and its deadline runs from here (`ARRIVED`)."""
        admission = _gateway.admission
        slot = admission.enter() if admission is not None and self._predicts(scope) else None
        if slot is None:
            await self.app(scope, receive, send)
            return
        scope[SLOT], scope[ARRIVED] = slot, started - admission.loop.lag_s
        try:
            await self.app(scope, receive, send)
        finally:
            admission.leave(slot)

    @staticmethod
    def _predicts(scope: Scope) -> bool:
        """A prediction, through any front door (serve.gateway.protocols)."""
        return predicts(scope.get("path"))

    def _door(self, scope: Scope) -> Refusal | None:
        """Why and for how long the gateway's admission refuses this prediction request before
        its arm is known (serve.gateway.admission `door`), else None. Its deadline is read here,
        once: `scope[TIMEOUT_S]` (absent when the header is invalid: the gateway answers 400)."""
        admission = _gateway.admission
        if admission is None or not self._predicts(scope):
            return None
        timeout_s = scope.get(TIMEOUT_S)
        if timeout_s is None:
            sent = [v for n, v in scope.get("headers") or [] if n == TIMEOUT_HEADER.encode()]
            try:
                timeout_s = scope[TIMEOUT_S] = requested_timeout_s(
                    sent[0].decode("latin-1") if sent else None, _gateway.request_timeout_s)
            except ValueError:  # the gateway answers 400 for it
                return None
        retry_after = admission.door(timeout_s)
        if retry_after is None:
            return None
        return Refusal(retry_after, AT_CAP if admission.in_flight >= admission.ceiling else LATE)

    @staticmethod
    async def _shed(scope: Scope, receive: Receive, send: Send, started: float,
                    refusal: Refusal, *, close: bool) -> None:
        sent = [v for n, v in scope.get("headers") or [] if n == b"x-request-id"]
        request_id = sent[0].decode("latin-1") if sent else uuid.uuid4().hex
        response = shed_response(scope.get("path"), refusal.message, request_id,
                                 refusal.retry_after) or error_response(
            503, Overloaded.type, refusal.message, request_id, retry_after=refusal.retry_after)
        if close:  # its body was not read: the connection cannot carry another request
            response.headers["Connection"] = "close"
        await response(scope, receive, send)
        if _gateway.on_shed is not None:
            _gateway.on_shed((time.perf_counter() - started) * 1000)



class Refusal(NamedTuple):
    """A request shed at the door: when to come back, and why (the error's message)."""

    retry_after: int
    message: str


LATE = "the gateway cannot answer this request within its deadline; retry later"
AT_CAP = "the gateway is at its in-flight limit (gateway_max_in_flight); retry later"
SMALL_BODY = 64 * 1024  # a refused request's body up to this size is read, keeping the connection


def _small_body(scope: Scope) -> bool:
    """Whether the request declares a body of at most SMALL_BODY bytes: refused, it is read
    first, so its kept-alive connection carries the next request (closing it makes the client
    and HAProxy open a new one for each, and new connections wait to be accepted: at 5x
    capacity most refusals closed their connection)."""
    declared = [v for n, v in scope.get("headers") or [] if n == b"content-length"]
    return len(declared) == 1 and declared[0].isdigit() and int(declared[0]) <= SMALL_BODY


async def receive_body(receive: Receive, timeout_s: float, max_bytes: int
                       ) -> tuple[bytes, str | None]:
    """A request's whole body from ASGI `receive`, or what went wrong: TIMEOUT (not all here
    within `timeout_s`), DISCONNECTED or TOO_LARGE (over `max_bytes`; reading stops there)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return b"", DISCONNECTED
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_bytes:
                    return b"", TOO_LARGE
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks), None
    except TimeoutError:
        return b"", TIMEOUT


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the buffered body as one message, then the connection's own
    messages (a later `http.disconnect`, which Serve watches for)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def middlewares() -> list[Middleware]:
    """Ray Serve's HTTP proxy callback (see the module docstring)."""
    return [Middleware(BodyGate)]
