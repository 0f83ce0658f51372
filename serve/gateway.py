"""The ingress deployment: validate, route, call the arm with a deadline, fall back, answer.

One request: parse and validate the body (422/413) -> decide the arm from the cached rollout
state (never a Redis call on this path) -> call that arm's model deployment with the request's
deadline (a call that concurrent requests for the arm may share: serve.coalesce) -> if the
*optimized* arm fails or times out, retry once on baseline within what is left
of the deadline (`fallback: true`); a baseline failure is never retried onto the canary ->
respond with `X-Request-ID`, `X-Canary-Arm` (the arm that answered) and `Server-Timing`.
For a share of answered requests the other arm is then also asked, off the response path, and
the two answers compared (serve.shadow).

Telemetry (serve.telemetry.observe) follows the request: a span per step in one trace that the model
replica joins, per-arm metrics (for Prometheus on the replica's own port, listed by
`GET /v1/metrics/targets`: serve.telemetry.metrics_targets; and on `GET /metrics`), a Redis window
record and one JSON log line. It never decides anything: with telemetry off the request path is the
same.
"""

import asyncio
import functools
import logging
import os
import socket
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollout import (
    Arm,
    DeploymentReport,
    Reason,
    Settings,
    StateWatcher,
    decide,
    effective_bp,
    format_bp,
    open_store,
)
from rollout.budget import RetryBudget
from rollout.settings import (
    BatchingSettings,
    ServingSettings,
    StateSettings,
    TelemetrySettings,
)
from serve import colocated, ingress, ray_env
from serve.admission import TIMEOUT_HEADER, Admission, ShedSummary, Slot, requested_timeout_s
from serve.answer import BatchShape, ModelAnswer
from serve.batching import Expired, RowsDidNotFit
from serve.coalesce import CallFailed, Coalescer
from serve.dashboard import DashboardRoutes
from serve.dashboard import router as dashboard_router
from serve.errors import (
    BodyTimeout,
    ClientGone,
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
from serve.idempotent import REPLAYED, Idempotency, check_redis_memory
from serve.ingress import (
    ARRIVED,
    BODY,
    BODY_PROBLEM,
    BUSY,
    DISCONNECTED,
    SLOT,
    TIMEOUT,
    TIMEOUT_S,
    TOO_LARGE,
    receive_body,
)
from serve.notify import RedisLedger, StoreOutageNotifier
from serve.override import override_allowed
from serve.preprocess import Preprocessor
from serve.protocols.door import FrontDoor, Parsed
from serve.protocols.endpoints import Doors, ProtocolRoutes, document
from serve.protocols.endpoints import router as protocol_router
from serve.protocols.oip_grpc import serve_grpc
from serve.schemas import (
    MAX_ROUTING_KEY,
    PREDICT_HEADERS,
    PREDICT_OPENAPI,
    Health,
    PredictResponse,
    Readiness,
    RolloutView,
    document_request_models,
    max_body_bytes,
    request_id_from,
)
from serve.shadow import Shadow
from serve.telemetry.instruments import observe_store_errors
from serve.telemetry.metrics_targets import (
    RedisTargetBook,
    ReplicaEndpoint,
    TargetGroup,
    TargetsUnavailable,
    read_discovery,
    replica_identity,
)
from serve.telemetry.observe import Observation, Observer
from serve.telemetry.otel import Telemetry
from serve.variants import Encoded, check_labels
from serve.webhooks import sender_from

log = logging.getLogger("canary.gateway")

api = FastAPI(title="Canary gateway", version="0.1.0")
api.include_router(dashboard_router)  # /dashboard and its /v1/ API (serve.dashboard)
document_request_models(api)  # the predict body, read by the gateway itself, in /openapi.json
api.include_router(protocol_router)  # OpenAI, Open Inference Protocol, TEI (serve.protocols)
document(api)  # their bodies, read by the gateway itself too


def _ids(request: Request) -> tuple[str, str | None]:
    incoming = request.headers.get("x-request-id")
    return request_id_from(incoming), incoming


@api.exception_handler(GatewayError)
async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
    rid, incoming = _ids(request)
    return to_response(exc, rid, incoming)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    rid, incoming = _ids(request)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, kind, str(exc.detail), rid, incoming_id=incoming)


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    rid, incoming = _ids(request)
    log.exception("unhandled error in request %s", rid)
    return error_response(500, "internal_error", "internal error", rid, incoming_id=incoming)


_OVERRIDES = {
    Reason.KILL_SWITCH: "kill switch on: all baseline",
    Reason.STALE_STATE: "fail-safe: all baseline (rollout state stale)",
    Reason.VERSION_MISMATCH: "all baseline: the share was set for another optimized version",
}


def _rows(texts: list[str] | Encoded) -> int:
    """How many inputs a call carries, texts or the gateway's token ids."""
    return len(texts.ids) if isinstance(texts, Encoded) else len(texts)


def _timed_out(arm: Arm, remaining: float) -> ModelTimeout:
    return ModelTimeout(f"the {arm.value} model did not answer within {remaining:.2f} s")


def _model_error(arm: Arm, exc: Exception) -> GatewayError:
    """What a failed model call means for the client: the arm's queue is full (503), the
    request's inputs did not fit even alone (413), or the arm failed (a replica error or
    death, or the request's own failure inside a coalesced call): the arm, not the client."""
    if isinstance(exc, BackPressureError):
        return Overloaded(f"the {arm.value} model's queue is full; retry later")
    cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else exc
    if isinstance(cause, RowsDidNotFit):
        return InputTooLarge(str(cause))
    if isinstance(cause, Expired):  # the replica dropped it: its deadline passed in the queue
        return ModelTimeout(f"the {arm.value} model did not reach the request in time")
    kind = cause.kind if isinstance(cause, CallFailed) else type(exc).__name__
    log.warning("%s model call failed: %s", arm.value, kind)
    return ModelFailed(f"the {arm.value} model failed: {kind}")


def _body_error(problem: str, timeout_s: float) -> GatewayError:
    """What serve.ingress (or the gateway's own read) found wrong with a request's body."""
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
    the gateway's call to the model (serve.coalesce; 1 without coalescing)."""
    return f', batch;desc="requests={batch.requests} items={batch.items} call={batch.call}"'


@dataclass(frozen=True)
class _Exchange:
    """One admitted request on its way through `Gateway._predict`: what its steps share."""

    rid: str
    incoming: str | None  # the client's X-Request-ID, if it sent one
    obs: Observation
    slot: Slot
    start: float  # perf_counter when the request arrived
    timeout_s: float  # its own (X-Request-Timeout-Ms) or the server's request timeout
    door: FrontDoor  # its protocol: how it is parsed, answered and refused (serve.protocols)

    @property
    def deadline(self) -> float:
        return self.start + self.timeout_s


@serve.deployment(name="gateway")
@serve.ingress(api)
class Gateway(DashboardRoutes, ProtocolRoutes):
    async def __init__(
        self, baseline: DeploymentHandle | None, optimized: DeploymentHandle | None,
        settings: Settings, ramp_controller: DeploymentHandle | None = None,
    ):
        """The replica's composition root: `settings` holds every group (rollout.settings),
        and each component is handed the groups its signature names. Without the arms'
        deployments (the colocated topology) it loads both models itself (serve.colocated)."""
        self.settings = settings
        self.ramp_controller = ramp_controller  # bound here so the application includes it
        await self._open_arms(baseline, optimized, settings)
        infos = await asyncio.gather(*(self.handles[arm].info.remote() for arm in Arm))
        check_labels(infos[0]["labels"], infos[1]["labels"])  # else agreement means nothing
        self.models = {Arm.BASELINE: infos[0], Arm.OPTIMIZED: infos[1]}
        self.tasks = set(infos[0]["tasks"]) & set(infos[1]["tasks"])
        self.doors = Doors.build(settings, settings, infos[0], self.tasks)  # serve.protocols
        self.serving = infos[1]["version"]
        self.preprocess = Preprocessor(settings, settings, infos)  # tokenizes here if models agree
        self.identity = f"gateway@{socket.gethostname()}:{os.getpid()}"
        self._open_telemetry(settings, settings)
        self.store = open_store(settings)
        self.idempotency = Idempotency(settings, settings)
        self.admission = Admission(ceiling=settings.gateway_max_in_flight,
                                   batch_rows=settings.max_batch_size)
        self.shed_summary = ShedSummary(self.admission, log.warning)
        self._lag_task = asyncio.get_running_loop().create_task(self.admission.loop.run())
        # serve.ingress: the body deadline and limits, and shedding before Serve's handling
        ingress.configure(settings, settings, self.admission, self._shed_at_the_door)
        self.shadow = Shadow(settings, self._remote, self.telemetry)
        self.coalescers = self._coalescers(settings, settings)
        self.retry_budget = RetryBudget(
            ratio=settings.retry_budget_ratio, min_per_s=settings.retry_budget_min_per_s
        )
        # store-stale / store-recovered webhooks, sent by this replica (serve.notify)
        self.notifier = sender_from(settings, RedisLedger(
            settings.redis_url, settings.app_name, timeout_s=settings.redis_timeout_s),
            name="gateway-webhooks")
        self.watcher = StateWatcher(
            self.store,
            poll_s=settings.state_poll_s,
            staleness_s=settings.state_staleness_s,
            heartbeat=self._heartbeat,
            on_stale=StoreOutageNotifier(self.notifier, settings.app_name, self.identity)
            if self.notifier else None,
        )
        self.watcher.start()
        self.grpc = await serve_grpc(self, settings)  # the OIP over gRPC (serve.protocols)
        await asyncio.to_thread(check_redis_memory, self.idempotency, self.store)
        observe_store_errors(self.telemetry.meter, lambda: {
            "state": dict(self.watcher.view().errors), "idempotency": self.idempotency.skipped})

    async def _open_arms(self, baseline: DeploymentHandle | None,
                         optimized: DeploymentHandle | None, settings: Settings) -> None:
        """`handles`: the arms' deployments (the remote topology), or both models loaded in
        this replica (`local`: the colocated topology, serve.colocated) when none is bound."""
        self.local = None
        if baseline is None or optimized is None:
            ray_env.warn_missing(log.warning)
            self.local = await colocated.load(settings)
            baseline, optimized = self.local["baseline"], self.local["optimized"]
        else:
            baseline, optimized = ray_env.serving_path(log.warning, baseline, optimized)
        self.handles = {Arm.BASELINE: baseline, Arm.OPTIMIZED: optimized}

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
        """Where the arms' models run (serve.colocated)."""
        return colocated.REMOTE if self.local is None else colocated.COLOCATED

    def reconfigure(self, user_config: dict) -> None:
        """Live settings of the models this replica loaded (the colocated topology): per arm
        under `arms`, what `ModelServer.reconfigure` takes (batching, fault injection)."""
        if self.local is None:
            raise ValueError("live arm settings go to the model deployments in the remote "
                             "topology, not to the gateway")
        colocated.reconfigure(self.local, user_config.get("arms", {}))

    def _coalescers(self, serving: ServingSettings,
                    batching: BatchingSettings) -> dict[Arm, Coalescer] | None:
        """Per arm, concurrent requests go as one model call (serve.coalesce), when enabled;
        never to models in this process, which batch the requests themselves at no cost per
        call."""
        if not serving.gateway_coalesce_calls or self.local is not None:
            return None
        return {arm: Coalescer(functools.partial(self._send, arm),
                               calls=serving.gateway_coalesce_calls,
                               max_items=batching.max_batch_size,
                               hold_s=batching.batch_wait_ms / 1000)
                for arm in self.handles}

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
        lag = getattr(self, "_lag_task", None)
        if lag is not None:
            lag.cancel()
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
        """A request serve.ingress shed (serve.admission's `door`): counted, nothing else."""
        self.admission.shed += 1
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
        """One prediction request, whatever its protocol (`door`: serve.protocols). The
        request's deadline (`X-Request-Timeout-Ms`, capped at `request_timeout_s`) and its body
        (received by serve.ingress under `body_timeout_s`, outside any in-flight bound), then
        a slot under the memory cap (`gateway_max_in_flight`; 503 + Retry-After past it).
        Once its arm is known, it is refused only if it would be answered after its deadline
        (serve.admission)."""
        # when it reached the replica (serve.ingress), else now less what the loop lags
        start = request.scope.get(ARRIVED) or time.perf_counter() - self.admission.loop.lag_s
        rid, incoming = _ids(request)
        obs = self.observer.start(rid, request.headers, door.name, request.scope.get("path"))
        try:
            timeout_s = self._timeout(request)
            body = await self._read_body(request)
        except GatewayError as exc:
            obs.finish(exc.status, error_type=exc.type)
            return door.error(exc, rid, incoming)
        held = request.scope.get(SLOT)  # taken by serve.ingress, which gives it back
        if held is not None:
            return await self._predict(request, body,
                                       _Exchange(rid, incoming, obs, held, start, timeout_s,
                                                 door))
        with self.admission.admitted() as slot:
            if slot is None:
                obs.finish(503, error_type=Overloaded.type)
                return door.error(Overloaded("the gateway is at capacity; retry later"), rid,
                                  incoming)
            exchange = _Exchange(rid, incoming, obs, slot, start, timeout_s, door)
            return await self._predict(request, body, exchange)

    def _timeout(self, request: Request) -> float:
        """The request's timeout in seconds: `X-Request-Timeout-Ms`, capped at the server's
        `request_timeout_s`, or that (400 for a header that is not a positive integer); as
        serve.ingress read it, when it did."""
        read = request.scope.get(TIMEOUT_S)
        if read is not None:
            return read
        try:
            return requested_timeout_s(request.headers.get(TIMEOUT_HEADER),
                                       self.settings.request_timeout_s)
        except ValueError as exc:
            raise InvalidTimeout(str(exc)) from None

    async def _predict(self, request: Request, body: bytes, ex: _Exchange) -> Response:
        """An admitted request, one step each: check an override header against the operator
        token -> parse -> claim its Idempotency-Key (or replay the stored answer) -> route ->
        call the arm (with fallback) -> respond -> offer a shadow comparison. A GatewayError
        becomes the client's error response; the claim settles itself when its block ends,
        however it ends."""
        try:
            overridden = override_allowed(self.settings.operator_token, request.headers)
            parsed, task = self._parse(body, request, ex)
            key = request.headers.get("idempotency-key")
            async with self.idempotency.claim(key, task, parsed.inputs) as claim:
                if claim.replay is not None:
                    return self._replay(claim.replay, ex, parsed)
                try:
                    decision = self._route(request, overridden, ex, parsed.routing_key)
                    answer, fallback = await self._call_arm(decision.arm, parsed.inputs, task, ex)
                except GatewayError as exc:  # answered before the claim is released
                    return self._failed(exc, ex)
                response, stored = self._respond(answer, fallback, decision.label, task, ex,
                                                 parsed)
                claim.complete(stored)
        except GatewayError as exc:
            return self._failed(exc, ex)
        except BaseException as exc:
            self._abandoned(exc, ex.obs)
            raise
        if self.shadow.enabled and not fallback:
            self._offer_shadow(ex.obs, answer, parsed.inputs, task, request.headers)
        return response

    def _parse(self, body: bytes, request: Request, ex: _Exchange) -> tuple[Parsed, str]:
        """The request body, as its protocol reads it, as inputs and a task this model serves
        (422 otherwise)."""
        parsed = ex.door.parse(body, request)
        task = parsed.task or self.settings.default_task
        ex.obs.parsed(parsed.inputs, task)
        if task not in self.tasks:
            raise InvalidInput(f"task {task!r} is not supported by this model")
        return parsed, task

    def _replay(self, stored: dict, ex: _Exchange, parsed: Parsed) -> Response:
        """The response stored under the request's Idempotency-Key, sent again as it was (in
        the shape of the protocol that asks again)."""
        ex.obs.finish(stored["status"], arm=stored["body"]["arm"], replayed=True)
        response = ex.door.answer(stored["body"], stored.get("tokens", 0), parsed)
        response.status_code = stored["status"]
        response.headers.update({**stored["headers"], **REPLAYED})
        return response

    def _route(self, request: Request, overridden: bool, ex: _Exchange, body_key: str | None):
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
                        ex: _Exchange) -> tuple[ModelAnswer, bool]:
        """The arm's answer within the request's deadline, and whether it came from the
        baseline fallback; refused at once (503) when the arm would answer after the deadline
        (serve.admission). The canary is judged against its share of the deadline (what its
        call gets, `canary_timeout_fraction`): when it cannot answer within it, the baseline
        answers instead (a fallback), and nothing is refused for it."""
        left = ex.deadline - time.perf_counter()
        rerouted = arm is Arm.OPTIMIZED and self.admission.late(
            arm.value, len(texts), min(left, ex.timeout_s * self.settings.canary_timeout_fraction))
        if rerouted:
            arm = Arm.BASELINE
        self._admit(arm, len(texts), left)
        inputs = await self.preprocess.encode(texts)
        answer, fallback = await self._call_with_fallback(ex, arm, inputs, task)
        return answer, fallback or rerouted

    def _admit(self, arm: Arm, rows: int, timeout_s: float) -> None:
        """Overloaded (503 with Retry-After, counted as shed) when `rows` more for `arm` would
        be answered after `timeout_s` (serve.admission)."""
        refusal = self.admission.judge(arm.value, rows, timeout_s)
        if refusal is not None:
            self.shed_summary.shed()
            raise Overloaded(refusal.message(arm.value), retry_after=refusal.retry_after)

    def _respond(self, answer: ModelAnswer, fallback: bool, routing: str, task: str,
                 ex: _Exchange, parsed: Parsed) -> tuple[Response, dict]:
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

    def _failed(self, exc: GatewayError, ex: _Exchange) -> Response:
        """A domain error as the client's response, in its protocol's shape."""
        ex.obs.finish(exc.status, error_type=exc.type)
        return ex.door.error(exc, ex.rid, ex.incoming)

    @staticmethod
    def _abandoned(exc: BaseException, obs: Observation) -> None:
        """A request that ends without a response: the client went away (499) or a bug."""
        if isinstance(exc, asyncio.CancelledError):
            obs.finish(499, error_type="cancelled")
        else:
            obs.finish(500, error_type="internal_error")

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

    async def _read_body(self, request: Request) -> bytes:
        """The body serve.ingress received, or its problem as the client's error; without
        serve.ingress in front (Serve's proxy callback not set), read here under the same
        deadline and limit."""
        limit = max_body_bytes(self.settings)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise InputTooLarge(f"request body of {declared} bytes is over the limit")
        if BODY in request.scope or BODY_PROBLEM in request.scope:
            body, problem = request.scope.get(BODY, b""), request.scope.get(BODY_PROBLEM)
        else:
            body, problem = await receive_body(request.receive, self.settings.body_timeout_s,
                                               limit)
        if problem is not None:
            raise _body_error(problem, self.settings.body_timeout_s)
        return body

    async def _call_with_fallback(
        self, ex: _Exchange, arm: Arm, texts: list[str], task: str
    ) -> tuple[ModelAnswer, bool]:
        """A failed canary call is retried once on baseline, within the deadline and within the
        retry budget (rollout.budget), when the baseline can still answer in the time left
        (else the request is shed, 503 with Retry-After, rather than timed out); a baseline
        failure is never retried on the canary."""
        first_deadline, rid = ex.deadline, ex.rid
        if arm is Arm.OPTIMIZED:  # leave the baseline retry its share of the deadline
            share = ex.timeout_s * self.settings.canary_timeout_fraction
            first_deadline = min(ex.deadline, time.perf_counter() + share)
            self.retry_budget.record_call()
        try:
            return await self._call(ex, arm, texts, task, first_deadline), False
        except (ModelFailed, ModelTimeout, Overloaded) as exc:
            if arm is not Arm.OPTIMIZED:
                raise
            if not self.retry_budget.try_retry():
                log.warning("request %s: optimized arm failed (%s), retry budget spent",
                            rid, exc.type)
                raise ModelFailed(f"{exc.message} (no retry: the retry budget is spent)") from None
            log.warning("request %s: optimized arm failed (%s), retrying on baseline",
                        rid, exc.type)
        # the retry would miss the deadline too: shed, not a 504
        self._admit(Arm.BASELINE, _rows(texts), ex.deadline - time.perf_counter())
        return await self._call(ex, Arm.BASELINE, texts, task, ex.deadline), True

    async def _call(
        self, ex: _Exchange, arm: Arm, texts: list[str], task: str, deadline: float
    ) -> ModelAnswer:
        """One call of `arm`, its rows counted on the arm's queue while it runs
        (serve.admission)."""
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise ModelTimeout(f"no time left for the {arm.value} model within the deadline")
        rows = _rows(texts)
        with ex.obs.call(arm.value) as call, ex.slot.counted(arm.value, rows):
            if self.coalescers is None:
                result = await self._remote(arm, texts, task, remaining, call.carrier)
            else:
                result = await self._coalesced(arm, texts, task, remaining, call.carrier)
            ex.slot.answered(result.timing.model / 1000, result.batch.items)
            call.answered(result)
            return result

    async def _remote(
        self, arm: Arm, texts: list[str], task: str, remaining: float, carrier: dict | None
    ) -> ModelAnswer:
        """One model call for one request (also the shadow's way to the other arm)."""
        response = self.handles[arm].predict.remote(texts, task, carrier, remaining)
        try:
            return await asyncio.wait_for(response, timeout=remaining)
        except TimeoutError:
            response.cancel()
            raise _timed_out(arm, remaining) from None
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:
            raise _model_error(arm, exc) from None

    async def _coalesced(
        self, arm: Arm, texts: list[str], task: str, remaining: float, carrier: dict | None
    ) -> ModelAnswer:
        """This request's answer from a model call it may share (serve.coalesce)."""
        try:
            # the deadline goes along on this clock; `_send` turns it into the time left
            call = (texts, task, carrier, time.perf_counter() + remaining)
            return await self.coalescers[arm].call(call, remaining)
        except TimeoutError:
            raise _timed_out(arm, remaining) from None
        except Exception as exc:
            raise _model_error(arm, exc) from None

    async def _send(self, arm: Arm, calls: list[tuple]) -> list[ModelAnswer | Exception]:
        now = time.perf_counter()  # deadlines cross processes as the seconds left
        calls = [(*call[:3], call[3] - now) for call in calls]
        response = self.handles[arm].predict_many.remote(calls)
        try:
            return await response
        except asyncio.CancelledError:  # every request of the call has gone
            response.cancel()
            raise

    @api.get("/v1/rollout", responses={200: {"model": RolloutView}, **openapi_errors()})
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

    @api.get("/metrics")
    async def metrics(self) -> Response:
        """Prometheus text exposition of the metrics of the replica that answered (empty with
        telemetry off): with several gateway replicas, point Prometheus' `http_sd_configs` at
        `/v1/metrics/targets` instead."""
        return Response(self.telemetry.prometheus_text(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @api.get("/v1/metrics/targets", response_model=list[TargetGroup],
             responses=openapi_errors(TargetsUnavailable))
    async def metrics_targets(self) -> list[dict]:
        """Every gateway replica's own metrics endpoint, as Prometheus HTTP service discovery
        (`http_sd_configs`) reads it: one target group per replica (docs/telemetry.md)."""
        return await asyncio.to_thread(read_discovery, self.targets, time.time())

    @api.get("/healthz", responses={200: {"model": Health}, **openapi_errors()})
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/readyz", response_model=None, responses={
        200: {"model": Readiness}, 503: {"model": Readiness, "description": "not ready: the "
                                          "baseline model does not answer"}, **openapi_errors()})
    async def readyz(self) -> JSONResponse:
        view = self.watcher.view()
        checks = await asyncio.gather(
            *(self._ping(arm) for arm in self.handles), return_exceptions=False
        )
        models = dict(zip((arm.value for arm in self.handles), checks, strict=True))
        ready = models[Arm.BASELINE.value]
        body = {
            "ready": ready,
            "models": models,
            "state": "stale (routing all to baseline)" if view.stale else "fresh",
            "state_error": view.error,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def _ping(self, arm: Arm) -> bool:
        try:
            await asyncio.wait_for(self.handles[arm].info.remote(), timeout=2.0)
            return True
        except Exception:
            return False
