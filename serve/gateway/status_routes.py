"""The gateway's read-only HTTP surface beside predictions, mixed into the gateway deployment
as the dashboard's routes are:

    GET /v1/rollout          the rollout state as this replica applies it
    GET /metrics             Prometheus text of the replica that answered
    GET /v1/metrics/targets  every gateway replica's own metrics endpoint (service discovery)
    GET /healthz, /readyz    liveness, and readiness (the baseline model answers)

The gateway class provides `watcher`, `serving`, `models`, `topology`, `idempotency`,
`admission`, `telemetry`, `targets` and `arms`.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from rollout import Arm, Reason, effective_bp, format_bp
from serve.common.errors import openapi_errors
from serve.gateway.schemas import Health, Readiness, RolloutView
from serve.telemetry.metrics_targets import TargetGroup, TargetsUnavailable, read_discovery

router = APIRouter()

_OVERRIDES = {
    Reason.KILL_SWITCH: "kill switch on: all baseline",
    Reason.STALE_STATE: "fail-safe: all baseline (rollout state stale)",
    Reason.VERSION_MISMATCH: "all baseline: the share was set for another optimized version",
}


class StatusRoutes:
    """Mixin of the gateway deployment; see the module docstring."""

    @router.get("/v1/rollout", responses={200: {"model": RolloutView}, **openapi_errors()})
    async def rollout_state(self) -> dict:
        view = self.watcher.view()
        state = view.state
        share, override = effective_bp(state, stale=view.stale, serving=self.serving)
        routing = _OVERRIDES.get(override, f"{format_bp(share)} to optimized")
        return {
            "state": state.model_dump(),
            "canary_percent": state.canary_percent,
            "effective_percent": share / 100,
            "routing": routing,
            "stale": view.stale,
            "state_age_s": None if view.age_s == float("inf") else round(view.age_s, 3),
            "store_error": view.error,
            "store_errors": dict(view.errors),
            "idempotency_skipped": dict(self.idempotency.skipped),
            "serving": {arm.value: info["version"] for arm, info in self.models.items()},
            "topology": self.topology,
            "admission": self.admission.snapshot(),
            # the header routes this replica applies (none while killed or stale)
            "routes": [route.model_dump(mode="json", include={"id", "header", "values", "arm"})
                       for route in state.routes],
            "routes_applied": bool(state.routes) and override is not Reason.KILL_SWITCH
            and not view.stale,
        }

    @router.get("/metrics")
    async def metrics(self) -> Response:
        """Prometheus text exposition of the metrics of the replica that answered (empty with
        telemetry off): with several gateway replicas, point Prometheus' `http_sd_configs` at
        `/v1/metrics/targets` instead."""
        return Response(self.telemetry.prometheus_text(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.get("/v1/metrics/targets", response_model=list[TargetGroup],
                responses=openapi_errors(TargetsUnavailable))
    async def metrics_targets(self) -> list[dict]:
        """Every gateway replica's own metrics endpoint, as Prometheus HTTP service discovery
        (`http_sd_configs`) reads it: one target group per replica (docs/telemetry.md)."""
        return await asyncio.to_thread(read_discovery, self.targets, time.time())

    @router.get("/healthz", responses={200: {"model": Health}, **openapi_errors()})
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @router.get("/readyz", response_model=None, responses={
        200: {"model": Readiness}, 503: {"model": Readiness, "description": "not ready: the "
                                          "baseline model does not answer"}, **openapi_errors()})
    async def readyz(self) -> JSONResponse:
        view = self.watcher.view()
        arms = list(self.arms.handles)
        checks = await asyncio.gather(*(self.arms.ping(arm) for arm in arms))
        models = dict(zip((arm.value for arm in arms), checks, strict=True))
        ready = models[Arm.BASELINE.value]
        body = {
            "ready": ready,
            "models": models,
            "state": "stale (routing all to baseline)" if view.stale else "fresh",
            "state_error": view.error,
        }
        return JSONResponse(body, status_code=200 if ready else 503)
