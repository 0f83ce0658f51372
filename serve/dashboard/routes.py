"""The dashboard's HTTP surface, mixed into the gateway deployment
(serve.gateway.deployment.Gateway).

    GET  /dashboard                     the page (static, shipped in the package, no CDN)
    GET  /dashboard/static/<file>       its script and style sheet
    GET  /v1/status                     `rollout status --json`, plus the answering replica's
                                        routing view (`routing`: GET /v1/rollout)
    GET  /v1/series?last_s=&step_s=     per-arm time series (default: the last hour by minute)
    GET  /v1/audit?last=                the newest audit entries, newest first
    GET  /v1/traces?last=               the newest traces' summaries
    GET  /v1/traces/<trace id>          one trace's spans
    GET  /v1/ramp                       `rollout ramp status --json`, plus `active`
    POST /v1/ramp/<action>              pause, resume, approve, abort: {"reason", "actor"}
    POST /v1/rollout/canary             {"percent", "reason", "expected_revision", "confirm"}
    POST /v1/rollout/kill               {"reason"}
    POST /v1/rollout/unkill             {"reason", "expected_revision", "confirm"}
    POST /v1/rollout/route-add          {"header", "values", "arm", "reason", "expected_revision"}
    POST /v1/rollout/route-remove       {"id", "reason", "expected_revision"}

Reads are open like `GET /v1/rollout`; actions need the operator token (serve.dashboard.actions).
Redis is only touched from worker threads, never on the event loop that serves predictions.
The gateway class provides `settings`, `store` and `rollout_state()`; the readers and the
control store are made on first use.
"""

from __future__ import annotations

import asyncio
from functools import cache, cached_property
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rollout import Rollout, open_store, open_telemetry
from rollout.ramp import RampControl, open_ramp_store
from serve.dashboard.actions import MAX_BODY, Actions, authorize
from serve.dashboard.errors import NotFound
from serve.dashboard.ramp import ACTIONS as RAMP_ACTIONS
from serve.dashboard.ramp import ramp_action, ramp_status
from serve.dashboard.reads import Readings, bounded_int

router = APIRouter()
ROLLOUT_ACTIONS = ("canary", "kill", "unkill", "route-add", "route-remove")
RAMP_TTL_S = 1.0
STATIC = Path(__file__).parent / "static"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# the page runs only its own script and style, talks only to this gateway, and is never framed
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    return (STATIC / name).read_bytes()


async def _body(request: Request, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the body: enough to refuse a bigger one without reading it."""
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)


class DashboardRoutes:
    """Mixin of the gateway deployment; see the module docstring."""

    @cached_property
    def _readings(self) -> Readings:
        settings = self.settings
        return Readings(settings, settings, self.store, open_telemetry(settings, settings))

    @cached_property
    def _ramp_reader(self) -> RampControl:
        return RampControl(self.store, open_ramp_store(self.settings))

    @cached_property
    def _control_store(self):
        """The write-capable state store (control connection), opened on first use."""
        return open_store(self.settings.control_settings())

    @cached_property
    def _control_ramps(self):
        return open_ramp_store(self.settings.control_settings())

    async def _operator_request(self, request: Request) -> tuple[bytes, str | None]:
        """An action's body (bounded) and client address, once the operator token checks out."""
        authorize(self.settings.operator_token, request.headers.get("authorization"))
        body = await _body(request, MAX_BODY)
        return body, request.client.host if request.client else None

    def _actions(self) -> Actions:
        return Actions(Rollout(self._control_store))

    @router.get("/dashboard", include_in_schema=False)
    async def dashboard_page(self) -> Response:
        return Response(_asset("index.html"), media_type="text/html; charset=utf-8",
                        headers=PAGE_HEADERS)

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    async def dashboard_asset(self, name: str) -> Response:
        if name not in ASSETS:
            raise NotFound(f"no dashboard asset {name!r}")
        return Response(_asset(name), media_type=ASSETS[name], headers=PAGE_HEADERS)

    @router.get("/v1/status")
    async def dashboard_status(self) -> dict:
        doc = await asyncio.to_thread(self._readings.status)
        return {**doc, "routing": await self.rollout_state(),
                "actions": self.settings.operator_token is not None}

    @router.get("/v1/series")
    async def dashboard_series(self, request: Request) -> dict:
        query = request.query_params
        last_s = bounded_int(query.get("last_s"), "last_s", 3_600, 1, 86_400)
        step_s = bounded_int(query.get("step_s"), "step_s", 60, 1, 86_400)
        return await asyncio.to_thread(self._readings.series, last_s, step_s)

    @router.get("/v1/audit")
    async def dashboard_audit(self, request: Request) -> dict:
        last = bounded_int(request.query_params.get("last"), "last", 50, 1, 500)
        return {"entries": await asyncio.to_thread(self._readings.audit, last)}

    @router.get("/v1/traces")
    async def dashboard_traces(self, request: Request) -> dict:
        last = bounded_int(request.query_params.get("last"), "last", 20, 1, 200)
        return {"traces": await asyncio.to_thread(self._readings.traces, last)}

    @router.get("/v1/traces/{trace_id}")
    async def dashboard_trace(self, trace_id: str) -> dict:
        return await asyncio.to_thread(self._readings.trace, trace_id)

    @router.get("/v1/ramp")
    async def dashboard_ramp(self) -> dict:
        readings = self._readings
        control = self._ramp_reader
        return await asyncio.to_thread(
            readings.memo.get, "ramp", RAMP_TTL_S, lambda: ramp_status(control))

    @router.post("/v1/ramp/{action}")
    async def dashboard_ramp_action(self, action: str, request: Request) -> dict:
        if action not in RAMP_ACTIONS:
            raise NotFound(f"no ramp action {action!r} ({', '.join(RAMP_ACTIONS)})")
        body, client = await self._operator_request(request)
        control = RampControl(self._control_store, self._control_ramps)
        answer = await asyncio.to_thread(ramp_action, control, action, body, client)
        self._readings.changed()
        return answer

    @router.post("/v1/rollout/{kind}")
    async def dashboard_action(self, kind: str, request: Request) -> dict:
        if kind not in ROLLOUT_ACTIONS:
            raise NotFound(f"no rollout action {kind!r} ({', '.join(ROLLOUT_ACTIONS)})")
        body, client = await self._operator_request(request)
        answer = await asyncio.to_thread(self._actions().run, kind, body, client)
        self._readings.changed()
        return answer
