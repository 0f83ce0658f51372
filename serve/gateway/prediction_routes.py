"""The prediction routes as a plain ASGI handler in front of the gateway's FastAPI app.

Every prediction route of every door is one line: `serve_door(request, door)`
(serve.gateway.deployment, serve.gateway.protocols.endpoints). Through FastAPI each request also
pays its router (matching the path against ~30 routes in turn), its dependency machinery (the
class-based view's `self`, the `Request` parameter) and two more middleware layers: 18 % of a
busy gateway replica's samples on 2 cores, more than the gateway's own routing and telemetry
(docs/benchmarks.md). `PredictionRoutes` answers `POST` on a prediction path itself, before
FastAPI's router, through the same `serve_door`: the same answers, errors, headers and
telemetry. Everything else (another method, a path it does not know, the control, status and
dashboard routes, the OpenAPI document, 404 and 405) goes on to FastAPI as before, and so do
predictions until a gateway has started (`serve`).

An unexpected exception propagates as it did from the route, to the app's handler (500).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

# exact paths -> the door's attribute in the gateway's `doors` (protocols.endpoints.Doors)
DOORS = {"/v1/predict": "native", "/v1/embeddings": "openai", "/embed": "tei_embed",
         "/predict": "tei_predict"}
OIP_PREFIX, OIP_SUFFIX = "/v2/models/", "/infer"


class Gateway(Protocol):
    doors: Any

    async def serve_door(self, request: Request, door: Any) -> Response: ...


_serving: list[Gateway] = []  # the gateway of this process, once it has started


def serve(gateway: Gateway) -> None:
    """Route this process's prediction requests to `gateway` (its `__init__` calls this)."""
    _serving[:] = [gateway]


def door_for(gateway: Gateway, scope: Scope) -> Any | None:
    """The door a `POST` to the scope's path goes through, None when FastAPI should decide
    (its path params set as FastAPI's router would: the OIP model `name`)."""
    path = scope.get("path") or ""
    name = DOORS.get(path)
    if name is not None:
        return getattr(gateway.doors, name)
    if path.startswith(OIP_PREFIX) and path.endswith(OIP_SUFFIX):
        model = path[len(OIP_PREFIX):-len(OIP_SUFFIX)]
        if model and "/" not in model:
            scope["path_params"] = {"name": model}
            return gateway.doors.oip
    return None


class PredictionRoutes:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive, send) -> None:
        door = None
        if _serving and scope["type"] == "http" and scope.get("method") == "POST":
            door = door_for(_serving[0], scope)
        if door is None:
            await self.app(scope, receive, send)
            return
        response = await _serving[0].serve_door(Request(scope, receive), door)
        await response(scope, receive, send)
