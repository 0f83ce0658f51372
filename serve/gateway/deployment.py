"""The ingress deployment: validate, route, call the arm with a deadline, fall back, answer.

One request: parse and validate the body (422/413) -> decide the arm from the cached rollout
state (never a Redis call on this path) -> call that arm's model with the request's deadline
(serve.gateway.arms: a call that concurrent requests for the arm may share; if the *optimized*
arm fails or times out, one retry on baseline within what is left of the deadline, `fallback:
true`; a baseline failure is never retried onto the canary) -> respond with `X-Request-ID`,
`X-Canary-Arm` (the arm that answered) and `Server-Timing`. For a share of answered requests
the other arm is then also asked, off the response path, and the two answers compared
(serve.gateway.shadow). What the request's steps share, and how it ends when no model answers
it, is serve.gateway.exchange; the read-only routes beside predictions are
serve.gateway.status_routes.

Telemetry (serve.telemetry.observe) follows the request: a span per step in one trace that the
model replica joins, per-arm metrics (for Prometheus on the replica's own port, listed by
`GET /v1/metrics/targets`: serve.telemetry.metrics_targets; and on `GET /metrics`), a Redis
window record and one JSON log line. It never decides anything: with telemetry off the request
path is the same.
"""

import asyncio
import functools
import logging
import os
import socket
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollout import (
    Arm,
    DeploymentReport,
    Settings,
    StateWatcher,
    decide,
    effective_bp,
    open_store,
)
from rollout.settings import StateSettings, TelemetrySettings
from serve import ray_env
from serve.common.answer import ModelAnswer
from serve.common.errors import (
    BodyTimeout,
    GatewayError,
    InProgress,
    InputTooLarge,
    InvalidInput,
    InvalidOverride,
    InvalidTimeout,
    KeyReused,
    ModelFailed,
    ModelTimeout,
    Overloaded,
    OverrideNotAllowed,
    error_response,
    id_headers,
    openapi_errors,
    to_response,
)
from serve.control_plane.notify import RedisLedger, StoreOutageNotifier
from serve.control_plane.webhooks import sender_from
from serve.dashboard import DashboardRoutes
from serve.dashboard import router as dashboard_router
from serve.gateway import colocated, ingress, prediction_routes
from serve.gateway.admission import Admission, ShedSummary
from serve.gateway.arms import Arms
from serve.gateway.exchange import (
    Exchange,
    abandoned,
    batch_timing,
    ids,
    read_body,
    server_timing,
    timeout_of,
)
from serve.gateway.generation import TASK, Generation, settings_for
from serve.gateway.idempotent import Idempotency, check_redis_memory
from serve.gateway.ingress import ARRIVED, SLOT
from serve.gateway.override import override_allowed
from serve.gateway.prediction_routes import PredictionRoutes
from serve.gateway.preprocess import Preprocessor
from serve.gateway.protocols.door import FrontDoor, Parsed
from serve.gateway.protocols.endpoints import Doors, ProtocolRoutes, document
from serve.gateway.protocols.endpoints import router as protocol_router
from serve.gateway.protocols.oip_grpc import serve_grpc
from serve.gateway.schemas import (
    MAX_ROUTING_KEY,
    PREDICT_HEADERS,
    PREDICT_OPENAPI,
    PredictResponse,
    document_request_models,
)
from serve.gateway.shadow import Shadow
from serve.gateway.status_routes import StatusRoutes
from serve.gateway.status_routes import router as status_router
from serve.recipes.source import check_labels
from serve.telemetry.instruments import observe_store_errors
from serve.telemetry.metrics_targets import RedisTargetBook, ReplicaEndpoint, replica_identity
from serve.telemetry.observe import Observation, Observer
from serve.telemetry.otel import Telemetry

log = logging.getLogger("canary.gateway")

api = FastAPI(title="Canary gateway", version="0.1.0")
# the front doors' routes first: Serve names every request's route by matching the app's
# routes in order (serve.gateway.prediction_routes `put_first`)
api.include_router(protocol_router)  # OpenAI, Open Inference Protocol, TEI (protocols/)
document(api)  # their bodies, read by the gateway itself, in /openapi.json
api.include_router(dashboard_router)  # /dashboard and its /v1/ API (serve.dashboard)
document_request_models(api)  # the predict body, read by the gateway itself too
api.include_router(status_router)  # rollout state, metrics, health (status_routes)
# POST to a prediction path: answered before FastAPI's router (serve.gateway.prediction_routes)
api.add_middleware(PredictionRoutes)


@api.exception_handler(GatewayError)
async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
    rid, incoming = ids(request)
    return to_response(exc, rid, incoming)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    rid, incoming = ids(request)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, kind, str(exc.detail), rid, incoming_id=incoming)


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    rid, incoming = ids(request)
    log.exception("unhandled error in request %s", rid)
    return error_response(500, "internal_error", "internal error", rid, incoming_id=incoming)


@serve.deployment(name="gateway")
@serve.ingress(api)
class Gateway(DashboardRoutes, ProtocolRoutes, StatusRoutes):
    async def __init__(
        self, baseline: DeploymentHandle | None, optimized: DeploymentHandle | None,
        settings: Settings, ramp_controller: DeploymentHandle | None = None,
    ):
        """The replica's composition root: `settings` holds every group (rollout.settings),
        and each component is handed the groups its signature names. Without the arms'
        deployments (the colocated topology) it loads both models itself
        (serve.gateway.colocated)."""
        self.settings = settings
        self.ramp_controller = ramp_controller  # bound here so the application includes it
        handles, infos, settings = await self._open_arms(baseline, optimized, settings)
        self.doors = Doors.build(settings, settings, infos[0], self.tasks)  # protocols/
        self.serving = infos[1]["version"]
        self.preprocess = Preprocessor(settings, settings, infos)  # tokenizes here if models agree
        self.identity = f"gateway@{socket.gethostname()}:{os.getpid()}"
        self._open_telemetry(settings, settings)
        self.store = open_store(settings)
        self.idempotency = Idempotency(settings, settings)
        self.admission = Admission(settings.gateway_max_in_flight, settings.max_batch_size,
                                   shared_compute=self.local is not None)
        self.shed_summary = ShedSummary(self.admission, log.warning)
        if self.local is not None:  # the models' batches leave a busy loop a core
            colocated.share_loop(self.local, self.admission.loop_busy)
        self._lag_task = asyncio.get_running_loop().create_task(self.admission.loop.run())
        # serve.gateway.ingress: the body deadline and limits, and shedding before Serve's handling
        ingress.configure(settings, settings, self.admission, self._shed_at_the_door)
        self.arms = Arms(handles, settings, settings, self.admission, self.shed_summary,
                         local=self.local is not None)
        self.shadow = Shadow(settings, self.arms.remote, self.telemetry,
                             recall_tolerance=settings.verify_retrieval_tolerance)
        # store-stale / store-recovered webhooks, sent by this replica (serve.control_plane.notify)
        self.notifier = sender_from(settings, RedisLedger(
            settings.redis_url, settings.app_name, timeout_s=settings.redis_timeout_s),
            name="gateway-webhooks")
        self.watcher = StateWatcher(
            self.store, poll_s=settings.state_poll_s, staleness_s=settings.state_staleness_s,
            heartbeat=self._heartbeat,
            on_stale=StoreOutageNotifier(self.notifier, settings.app_name, self.identity)
            if self.notifier else None,
        )
        self.watcher.start()
        self.generation = await Generation.open(  # a causal LM's doors (serve.gateway.generation)
            handles, settings, settings, settings, self.idempotency, self._route,
            self.telemetry.meter, {arm: info["version"] for arm, info in self.models.items()},
            self._offer_tokens) if TASK in self.tasks else None
        self.grpc = await serve_grpc(self, settings)  # the OIP over gRPC (serve.gateway.protocols)
        await asyncio.to_thread(check_redis_memory, self.idempotency, self.store)
        observe_store_errors(self.telemetry.meter, lambda: {
            "state": dict(self.watcher.view().errors), "idempotency": self.idempotency.skipped})
        prediction_routes.serve(self)  # predictions now skip FastAPI's router

    async def _open_arms(self, baseline: DeploymentHandle | None,
                         optimized: DeploymentHandle | None,
                         settings: Settings) -> tuple[dict, list[dict], Settings]:
        """Per arm, its deployment's handle (the remote topology), or the model loaded in
        this replica (`local`: the colocated topology, serve.gateway.colocated) when none is
        bound; what each says of itself (`info()`), from which the tasks both serve; and the
        replica's settings: arms that generate (a causal LM) give the gateway those of
        generative requests (serve.gateway.generation `settings_for`)."""
        self.local = None
        if baseline is None or optimized is None:
            ray_env.warn_missing(log.warning)
            self.local = await colocated.load(settings)
            baseline, optimized = self.local["baseline"], self.local["optimized"]
        else:
            baseline, optimized = ray_env.serving_path(log.warning, baseline, optimized)
        handles = {Arm.BASELINE: baseline, Arm.OPTIMIZED: optimized}
        infos = await asyncio.gather(*(handles[arm].info.remote() for arm in Arm))
        check_labels(infos[0]["labels"], infos[1]["labels"])  # else agreement means nothing
        self.models = {Arm.BASELINE: infos[0], Arm.OPTIMIZED: infos[1]}
        self.tasks = set(infos[0]["tasks"]) & set(infos[1]["tasks"])
        self.settings = settings_for(settings, self.tasks)
        return handles, infos, self.settings

    def _open_telemetry(self, state: StateSettings, settings: TelemetrySettings) -> None:
        """Traces, metrics and logs (serve.telemetry), and this replica's own metrics port,
        registered for Prometheus (serve.telemetry.metrics_targets)."""
        self.replica, node_ip = replica_identity()
        self.telemetry = Telemetry(state, settings, "canary-gateway", prometheus=True,
                                   request_log=True, instance=self.replica)
        self.targets = RedisTargetBook(state.redis_url, state.app_name,
                                       timeout_s=state.redis_timeout_s,
                                       key_ttl_s=2 * settings.metrics_target_ttl_s)
        self.metrics_endpoint = ReplicaEndpoint.open(
            state, settings, self.telemetry.registry, self.targets, replica=self.replica,
            node_ip=node_ip)
        self.observer = Observer(self.telemetry)

    @property
    def topology(self) -> str:
        """Where the arms' models run (serve.gateway.colocated)."""
        return colocated.REMOTE if self.local is None else colocated.COLOCATED

    def reconfigure(self, user_config: dict) -> None:
        """Live settings of the models this replica loaded (the colocated topology): per arm
        under `arms`, what `ModelServer.reconfigure` takes (batching, fault injection)."""
        if self.local is None:
            raise ValueError("live arm settings go to the model deployments in the remote "
                             "topology, not to the gateway")
        colocated.reconfigure(self.local, user_config.get("arms", {}))

    def _heartbeat(self) -> None:
        """The watcher's heartbeat (every 10 s): register this replica's metrics endpoint again
        (never raises), then report what it serves."""
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.refresh()
        self._report()

    def _report(self) -> None:
        """Tell operators what this replica serves and what it went through (operator guide)."""
        view = self.watcher.view()
        self.store.report_deployment(
            DeploymentReport(
                gateway=self.identity,
                baseline_version=self.models[Arm.BASELINE]["version"],
                optimized_version=self.serving,
                ts=time.time(),
                state_revision=view.state.revision,
                stale=view.stale, state_error=view.error, store_errors=dict(view.errors),
                events=view.events,
                optimized_recipe=self.models[Arm.OPTIMIZED].get("recipe", ""),
                auto=self.models[Arm.OPTIMIZED].get("auto") or "",
                flip_capture=self.settings.flip_capture,
                shadow_share=self.settings.shadow_share,
                topology=self.topology,
            )
        )

    def __del__(self):
        for task in (getattr(self, "_lag_task", None),
                     getattr(getattr(self, "generation", None), "polling", None)):
            if task is not None:
                task.cancel()
        shadow = getattr(self, "shadow", None)
        if shadow is not None:
            shadow.close()
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.stop(timeout=1)
        notifier = getattr(self, "notifier", None)
        if notifier is not None:
            notifier.close(timeout_s=1)
        endpoint = getattr(self, "metrics_endpoint", None)
        if endpoint is not None:
            endpoint.close()  # out of Prometheus' targets before the port closes
        targets = getattr(self, "targets", None)
        if targets is not None:
            targets.close()
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.shutdown()

    def _shed_at_the_door(self, latency_ms: float) -> None:
        """A request serve.gateway.ingress shed (serve.gateway.admission's `door`): counted, nothing
        else."""
        self.admission.refused()
        self.shed_summary.shed()
        self.observer.shed(latency_ms)

    @property
    def in_flight(self) -> int:
        """Requests this replica has admitted and not yet answered."""
        return self.admission.in_flight

    @api.post("/v1/predict", response_model=PredictResponse, openapi_extra=PREDICT_OPENAPI,
              responses={200: {"headers": PREDICT_HEADERS}, **openapi_errors(
                  InvalidOverride, InvalidTimeout, OverrideNotAllowed, BodyTimeout, KeyReused,
                  InProgress,
                  InputTooLarge, InvalidInput, Overloaded, ModelFailed, ModelTimeout)})
    async def predict(self, request: Request) -> Response:
        return await self.serve_door(request, self.doors.native)

    async def serve_door(self, request: Request, door: FrontDoor) -> Response:
        """One prediction request, whatever its protocol (`door`: serve.gateway.protocols). The
        request's deadline (`X-Request-Timeout-Ms`, capped at `request_timeout_s`) and its body
        (received by serve.gateway.ingress under `body_timeout_s`, outside any in-flight bound),
        then a slot under the memory cap (`gateway_max_in_flight`; 503 + Retry-After past it).
        Once its arm is known, it is refused only if it would be answered after its deadline
        (serve.gateway.admission)."""
        # when it reached the replica (serve.gateway.ingress), else now less what the loop lags
        start = request.scope.get(ARRIVED) or time.perf_counter() - self.admission.loop.lag_s
        rid, incoming = ids(request)
        obs = self.observer.start(rid, request.headers, door.name, request.scope.get("path"))
        try:
            timeout_s = timeout_of(request, self.settings.request_timeout_s)
            body = await read_body(request, self.settings)
        except GatewayError as exc:
            obs.finish(exc.status, error_type=exc.type)
            return door.error(exc, rid, incoming)
        held = request.scope.get(SLOT)  # taken by serve.gateway.ingress, which gives it back
        if held is not None:
            return await self._predict(request, body,
                                       Exchange(rid, incoming, obs, held, start, timeout_s,
                                                 door))
        with self.admission.admitted() as slot:
            if slot is None:
                obs.finish(503, error_type=Overloaded.type)
                return door.error(Overloaded("the gateway is at capacity; retry later"), rid,
                                  incoming)
            exchange = Exchange(rid, incoming, obs, slot, start, timeout_s, door)
            return await self._predict(request, body, exchange)

    async def _predict(self, request: Request, body: bytes, ex: Exchange) -> Response:
        """An admitted request, one step each: check an override header against the operator
        token -> parse -> claim its Idempotency-Key (or replay the stored answer) -> route ->
        call the arm (with fallback) -> respond -> offer a shadow comparison. A GatewayError
        becomes the client's error response; the claim settles itself when its block ends,
        however it ends."""
        if self.generation is not None:  # every request of a causal LM generates
            return await self.generation.serve(request, body, ex)
        try:
            overridden = override_allowed(self.settings.operator_token, request.headers)
            parsed, task = self._parse(body, request, ex)
            key = request.headers.get("idempotency-key")
            async with self.idempotency.claim(key, task, parsed.inputs) as claim:
                if claim.replay is not None:
                    return ex.replay(claim.replay, parsed)
                try:
                    decision = self._route(request, overridden, ex, parsed.routing_key)
                    answer, fallback = await self._call_arm(decision.arm, parsed.inputs, task, ex)
                except GatewayError as exc:  # answered before the claim is released
                    return ex.failed(exc)
                response, stored = self._respond(answer, fallback, decision.label, task, ex,
                                                 parsed)
                claim.complete(stored)
        except GatewayError as exc:
            return ex.failed(exc)
        except BaseException as exc:
            abandoned(exc, ex.obs)
            raise
        if self.shadow.enabled and not fallback:
            self._offer_shadow(ex.obs, answer, parsed.inputs, task, request.headers)
        return response

    def _parse(self, body: bytes, request: Request, ex: Exchange) -> tuple[Parsed, str]:
        """The request body, as its protocol reads it, as inputs and a task this model serves
        (422 otherwise)."""
        parsed = ex.door.parse(body, request)
        task = parsed.task or self.settings.default_task
        ex.obs.parsed(parsed.inputs, task)
        if task not in self.tasks:
            raise InvalidInput(f"task {task!r} is not supported by this model")
        if ex.door.name == FrontDoor.name and parsed.options is not None:
            raise InvalidInput(f"parameters: only for the task generate, not {task!r}")
        return parsed, task

    def _route(self, request: Request, overridden: bool, ex: Exchange, body_key: str | None):
        """The arm for the request (rollout.policy `decide`): from the cached rollout state,
        never a Redis call, keyed on `X-Routing-Key` (else the key its body carries, OpenAI's
        `user`, else the request ID), with the header
        routes and, when the operator token allowed it (`overridden`), the override header."""
        key = (request.headers.get("x-routing-key") or body_key or ex.rid)[:MAX_ROUTING_KEY]
        routing = time.perf_counter()
        view = self.watcher.view()
        decision = decide(
            view.state, key, stale=view.stale, salt=self.settings.routing_salt,
            serving=self.serving, headers=request.headers, override_allowed=overridden,
        )
        ex.obs.route(decision, view, routing)
        return decision

    async def _call_arm(self, arm: Arm, texts: list[str], task: str,
                        ex: Exchange) -> tuple[ModelAnswer, bool]:
        """The arm's answer within the request's deadline, and whether it came from the
        baseline fallback; refused at once (503) when the arm would answer after the deadline
        (serve.gateway.admission). The canary is judged against its share of the deadline (what its
        call gets, `canary_timeout_fraction`): when it cannot answer within it, the baseline
        answers instead (a fallback), and nothing is refused for it. Where both arms share one
        compute thread (colocated), the baseline waits behind the same rows ahead at its slower
        pace: a late canary's request then stays on the canary, with the whole deadline, unless
        the baseline would answer it sooner (`Admission.sooner`)."""
        left = ex.deadline - time.perf_counter()
        late = arm is Arm.OPTIMIZED and self.admission.late(
            arm.value, len(texts), min(left, ex.timeout_s * self.settings.canary_timeout_fraction))
        rerouted = late and self.admission.sooner(Arm.BASELINE.value, arm.value, len(texts))
        if rerouted:
            arm = Arm.BASELINE
        self.arms.admit(arm, len(texts), left, ex.slot)
        inputs = await self.preprocess.encode(texts)
        answer, fallback = await self.arms.call_with_fallback(
            ex, arm, inputs, task, retry_share=not late)
        return answer, fallback or rerouted

    def _respond(self, answer: ModelAnswer, fallback: bool, routing: str, task: str,
                 ex: Exchange, parsed: Parsed) -> tuple[Response, dict]:
        """The 200 response (and the record an Idempotency-Key stores to replay it); what the
        request saw goes to the admission and the observation."""
        total_ms = (time.perf_counter() - ex.start) * 1000
        timing = answer.timing.as_dict()
        timing["gateway"] = max(total_ms - sum(timing.values()), 0.0)
        timing["total"] = total_ms
        ex.obs.finish(200, arm=answer.arm, fallback=fallback, gateway_ms=timing["gateway"])
        body = {
            "request_id": ex.rid,
            "arm": answer.arm,
            "model_version": answer.model_version,
            "task": task,
            "outputs": answer.outputs,
            "fallback": fallback,
            "routing": routing,  # why this arm: share, canary, route:r1, override, ...
        }
        arm_headers = {"X-Canary-Arm": answer.arm, "X-Canary-Reason": routing}
        headers = {**id_headers(ex.rid, ex.incoming), **arm_headers,
                   "Server-Timing": server_timing(timing) + batch_timing(answer.batch)}
        stored = {"status": 200, "body": body, "tokens": answer.tokens,
                  "headers": {"X-Request-ID": ex.rid, **arm_headers}}
        response = ex.door.answer(body, answer.tokens, parsed)  # in its protocol's shape
        response.headers.update(headers)
        return response, stored

    def _offer_tokens(self, opened, tokens: list[int], ex) -> None:
        """A generated answer's shadow offer (serve.gateway.shadow `offer_tokens`), judged
        safe on the state as it is now, as `_offer_shadow`; a bug here is logged."""
        if not self.shadow.enabled:
            return
        try:
            view = self.watcher.view()
            _, override = effective_bp(view.state, stale=view.stale, serving=self.serving)
            self.shadow.offer_tokens(
                answered=opened.arm, prompt=opened.prompt_text,
                score=functools.partial(self.generation.score, opened.prompt, tokens),
                prompt_tokens=len(opened.prompt), in_flight=self.in_flight, override=override,
                parent=ex.obs.context, request_id=ex.rid,
                versions=(self.models[Arm.BASELINE]["version"],
                          self.models[Arm.OPTIMIZED]["version"]))
        except Exception:
            log.exception("starting a shadow comparison failed (the response is not affected)")

    def _offer_shadow(self, obs: Observation, result: ModelAnswer, texts: list[str],
                      task: str, headers=None) -> None:
        """Maybe compare with the other arm in the background (never awaited here); safety is
        judged on the state as it is now, not as it was when the request was routed; the
        request's CANARY_SLICE_HEADER value goes along as a slice. A bug here is logged; the
        answered request is not affected."""
        try:
            view = self.watcher.view()
            _, override = effective_bp(view.state, stale=view.stale, serving=self.serving)
            name = self.settings.slice_header
            self.shadow.offer(answered=Arm(result.arm), result=result, texts=texts, task=task,
                              in_flight=self.in_flight, override=override, parent=obs.context,
                              request_id=getattr(obs, "request_id", ""),
                              header=headers.get(name) if name and headers is not None else None)
        except Exception:
            log.exception("starting a shadow comparison failed (the response is not affected)")
