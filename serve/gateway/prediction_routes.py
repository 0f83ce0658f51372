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

Serve's replica names each HTTP request's route for its own metrics before the app sees it,
by matching the app's routes in order (ray.serve's `get_asgi_route_name`): ~30 matches for
`POST /v1/predict`, the class route Serve appends last, about 4 % of a busy gateway replica's
samples. The first prediction answered here moves the prediction routes to the front of the
app's routes (`put_first`; no two routes match one request, so FastAPI answers every other
request as before).
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
         "/predict": "tei_predict", "/v1/completions": "completions",
         "/v1/chat/completions": "chat"}
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


def put_first(app: Any) -> None:
    """Move `app`'s routes of prediction paths to the front of their router, and each router
    that holds one to the front of its parent's (FastAPI keeps an included router as one node
    of its parent's routes, `original_router` its own, which Serve's matcher walks into; a
    FastAPI or Starlette app; the module docstring)."""
    router = getattr(app, "router", None)
    if router is not None:
        _ours_first(getattr(router, "routes", None) or [])


# the prediction routes' paths as FastAPI declares them, the native door's first
ROUTE_PATHS = (*DOORS, OIP_PREFIX + "{name}" + OIP_SUFFIX)


def _ours_first(routes: list) -> bool:
    """Reorder `routes` (see put_first): routers holding a prediction route, then the
    prediction routes in ROUTE_PATHS' order, then the rest as they were; whether any of them
    is or holds a prediction route."""
    rank = {}
    for route in routes:
        inner = getattr(getattr(route, "original_router", None), "routes", None)
        path = getattr(route, "path", None)
        if path in ROUTE_PATHS:
            rank[id(route)] = 1 + ROUTE_PATHS.index(path)
        elif inner and _ours_first(inner):
            rank[id(route)] = 0
    if rank:
        ours = sorted((route for route in routes if id(route) in rank),
                      key=lambda route: rank[id(route)])
        routes[:] = [*ours, *(route for route in routes if id(route) not in rank)]
    return bool(rank)


class PredictionRoutes:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp):
        self.app = app
        self.ordered = False

    async def __call__(self, scope: Scope, receive, send) -> None:
        door = None
        if _serving and scope["type"] == "http" and scope.get("method") == "POST":
            door = door_for(_serving[0], scope)
        if door is None:
            await self.app(scope, receive, send)
            return
        if not self.ordered:
            put_first(scope.get("app"))
            self.ordered = True
        response = await _serving[0].serve_door(Request(scope, receive), door)
        await response(scope, receive, send)
