"""The protocols' routes, mixed into the gateway deployment (serve.gateway.deployment.Gateway), and
the doors it serves them through.

Every prediction route hands its request to the gateway's `serve_door(request, door)`, the
one request path `POST /v1/predict` takes too; the other routes describe the served model.
The gateway provides `serve_door`, `doors`, `settings` and `arms`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from rollout import Arm
from rollout.settings import AdmissionSettings, ModelSettings
from serve.common.errors import GatewayError
from serve.gateway.protocols.door import FrontDoor, Served, served_model
from serve.gateway.protocols.oip import SERVER, InferRequest, InferResponse, OipDoor, OipError
from serve.gateway.protocols.oip_grpc import OipGrpcDoor
from serve.gateway.protocols.openai_api import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    ModelList,
    OpenAIDoor,
    OpenAIErrorBody,
)
from serve.gateway.protocols.openai_generate import (
    ChatCompletionRequest,
    ChatDoor,
    CompletionRequest,
    CompletionsDoor,
)
from serve.gateway.protocols.tei import (
    EmbedRequest,
    Prediction,
    TeiEmbedDoor,
    TeiError,
    TeiInfo,
    TeiPredictDoor,
    TeiPredictRequest,
)
from serve.gateway.schemas import PREDICT_OPENAPI, request_id_from
from serve.recipes.source import model_dir

router = APIRouter()
REQUEST_MODELS = (EmbeddingsRequest, InferRequest, EmbedRequest, TeiPredictRequest,
                  CompletionRequest, ChatCompletionRequest)
_STATUSES = (400, 403, 404, 408, 409, 413, 422, 500, 503, 504)
_HEADERS = {"parameters": PREDICT_OPENAPI["parameters"]}  # X-Routing-Key and the others


@dataclass(frozen=True)
class Doors:
    """One gateway replica's doors, all on the same served model."""

    native: FrontDoor
    openai: OpenAIDoor
    oip: OipDoor
    tei_embed: TeiEmbedDoor
    tei_predict: TeiPredictDoor
    oip_grpc: OipGrpcDoor
    completions: CompletionsDoor
    chat: ChatDoor

    @classmethod
    def build(cls, models: ModelSettings, limits: AdmissionSettings, info: dict,
              tasks: set[str]) -> Doors:
        """The doors for the baseline replica's `info()` and the tasks both arms serve."""
        try:
            folder = model_dir(models, generative=None)
        except FileNotFoundError:  # not on this node: the name from the setting, no width
            folder = Path(models.baseline_model_path or models.model_path or "model")
        served: Served = served_model(models, folder, info, tasks)
        return cls(*(door(served, limits) for door in (
            FrontDoor, OpenAIDoor, OipDoor, TeiEmbedDoor, TeiPredictDoor, OipGrpcDoor,
            CompletionsDoor, ChatDoor)))


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route whose body the gateway reads itself."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {**_HEADERS, "requestBody": {"required": True,
                                        "content": {"application/json": {"schema": ref}}}}


def _answers(ok: Any, error: type[BaseModel], *, raw: bool = False,
             stream: bool = False) -> dict:
    """OpenAPI `responses`: the 200 body and the protocol's error body for each status;
    `raw`: binary tensors may answer too; `stream`: server-sent events may."""
    answers: dict[int | str, dict] = {
        status: {"model": error, "description": "the protocol's error"} for status in _STATUSES}
    answers[200] = {"model": ok, "description": "the answer"}
    if raw:
        answers[200]["content"] = {"application/octet-stream": {}}
    if stream:
        answers[200]["content"] = {"text/event-stream": {}}
    return answers


def document(app: Any) -> None:
    """Add the request bodies the gateway reads itself to `app`'s OpenAPI components."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schemas = build().setdefault("components", {}).setdefault("schemas", {})
            for model in REQUEST_MODELS:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
        return app.openapi_schema

    app.openapi = openapi


class ProtocolRoutes:
    """Mixin of the gateway deployment; see the module docstring."""

    async def baseline_ready(self) -> bool:
        """Whether the baseline model answers (readiness, over REST and gRPC)."""
        return await self.arms.ping(Arm.BASELINE)

    @staticmethod
    def _refused(door: FrontDoor, request: Request, exc: GatewayError) -> Response:
        incoming = request.headers.get("x-request-id")
        return door.error(exc, request_id_from(incoming), incoming)

    @router.get("/v1/models", response_model=ModelList)
    async def openai_models(self) -> dict:
        return self.doors.openai.models()

    @router.post("/v1/embeddings", openapi_extra=_body(EmbeddingsRequest),
                 responses=_answers(EmbeddingsResponse, OpenAIErrorBody))
    async def openai_embeddings(self, request: Request) -> Response:
        return await self.serve_door(request, self.doors.openai)

    @router.post("/v1/completions", openapi_extra=_body(CompletionRequest),
                 responses=_answers(dict, OpenAIErrorBody, stream=True))
    async def openai_completions(self, request: Request) -> Response:
        return await self.serve_door(request, self.doors.completions)

    @router.post("/v1/chat/completions", openapi_extra=_body(ChatCompletionRequest),
                 responses=_answers(dict, OpenAIErrorBody, stream=True))
    async def openai_chat_completions(self, request: Request) -> Response:
        return await self.serve_door(request, self.doors.chat)

    @router.get("/v2")
    async def oip_server(self) -> dict:
        return SERVER

    @router.get("/v2/health/live")
    async def oip_live(self) -> dict:
        return {"live": True}

    @router.get("/v2/health/ready")
    async def oip_ready(self) -> JSONResponse:
        ready = await self.baseline_ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @router.get("/v2/models/{name}", responses=_answers(dict, OipError))
    async def oip_metadata(self, name: str, request: Request) -> Response:
        try:
            return JSONResponse(self.doors.oip.metadata(name))
        except GatewayError as exc:
            return self._refused(self.doors.oip, request, exc)

    @router.get("/v2/models/{name}/ready", responses=_answers(dict, OipError))
    async def oip_model_ready(self, name: str, request: Request) -> Response:
        try:
            self.doors.oip.served.check(name)
        except GatewayError as exc:
            return self._refused(self.doors.oip, request, exc)
        ready = await self.baseline_ready()
        return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)

    @router.post("/v2/models/{name}/infer", openapi_extra=_body(InferRequest),
                 responses=_answers(InferResponse, OipError, raw=True))
    async def oip_infer(self, name: str, request: Request) -> Response:
        return await self.serve_door(request, self.doors.oip)

    @router.post("/embed", openapi_extra=_body(EmbedRequest),
                 responses=_answers(list[list[float]], TeiError))
    async def tei_embed(self, request: Request) -> Response:
        return await self.serve_door(request, self.doors.tei_embed)

    @router.post("/predict", openapi_extra=_body(TeiPredictRequest),
                 responses=_answers(list[Prediction] | list[list[Prediction]], TeiError))
    async def tei_predict(self, request: Request) -> Response:
        return await self.serve_door(request, self.doors.tei_predict)

    @router.get("/info", response_model=TeiInfo)
    async def tei_info(self) -> dict:
        return self.doors.tei_embed.info(self.settings)
