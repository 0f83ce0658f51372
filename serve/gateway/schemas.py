"""Request validation: the shape of `POST /v1/predict` and the configured size limits.

Shape errors (malformed JSON, wrong types, empty list, empty or blank items, unknown fields)
are InvalidInput (422); size errors (items, characters, bytes over the limits) are
InputTooLarge (413). Size is checked on the raw body first, so an oversized body is refused
before it is parsed.

The gateway reads the body itself (serve.gateway.ingress receives it under a deadline), so FastAPI
never sees `PredictRequest`: `PREDICT_OPENAPI` and `document_request_models` put it in the OpenAPI
document; `PredictResponse` is the 200 body as the gateway builds it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, WithJsonSchema

from rollout.settings import AdmissionSettings
from serve.common.errors import InputTooLarge, InvalidInput

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@+=/-]{1,128}$")
MAX_ROUTING_KEY = 1024


Task = Literal["classify", "embed", "generate"]
# an input as documented: not empty nor blank (parse_predict checks it, with its own message)
Text = Annotated[StrictStr, WithJsonSchema({"type": "string", "minLength": 1, "pattern": r"\S"})]


class GenerateParameters(BaseModel):
    """How the task `generate` samples (a causal LM's, [generative arms](generative.md)); the
    completions' fields of the same names."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1, description="tokens to generate at most")
    temperature: float = Field(0.0, ge=0, le=2, description="0 (the default): greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, description="the same draw for the same seed")
    stop: list[Annotated[StrictStr, Field(min_length=1)]] = Field(
        default_factory=list, max_length=4, description="strings the answer ends before")


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: list[Text] = Field(
        min_length=1, description="the texts, none empty or blank; at most `max_items` of at "
        "most `max_item_chars` characters, `max_total_chars` in all (else 413); one prompt "
        "for the task generate")
    task: Task | None = Field(None, description="default: the gateway's `default_task`; a "
                              "causal LM's is generate, whatever that says")
    parameters: GenerateParameters | None = Field(
        None, description="the task generate's sampling (422 with another task)")


class Classification(BaseModel):
    label: str = Field(description="the top-scoring label")
    scores: dict[str, float] = Field(description="every label's score")


class Embedding(BaseModel):
    embedding: list[float]


class Generated(BaseModel):
    text: str = Field(description="the answer, without the prompt")
    finish_reason: Literal["stop", "length"] = Field(
        description="stop: an end-of-sequence token or a stop string; length: max_tokens or "
        "the model's context")
    prompt_tokens: int
    completion_tokens: int


class PredictResponse(BaseModel):
    """The 200 body of `POST /v1/predict` (built by serve.gateway.deployment's `_respond`)."""

    request_id: str
    arm: Literal["baseline", "optimized"] = Field(description="the arm that answered")
    model_version: str
    task: Task
    outputs: list[Classification | Embedding | Generated] = Field(
        description="one per input, in order")
    fallback: bool = Field(description="the optimized arm failed; baseline answered instead")
    routing: str = Field(description="why this arm: share, canary, route:<id>, override, ...")


class Health(BaseModel):
    """`GET /healthz`: the gateway's process answers."""

    status: Literal["ok"]


class Readiness(BaseModel):
    """`GET /readyz`: 200 when the baseline model answers, else 503."""

    ready: bool
    models: dict[str, bool] = Field(description="arm -> whether its model answered a ping")
    state: str = Field(description="`fresh`, or stale (routing all to baseline)")
    state_error: str | None = Field(None, description="why the state is not trusted: the "
                                    "last refresh error, or a store behind what was routed by")


class RolloutView(BaseModel):
    """`GET /v1/rollout`: the rollout state as this replica applies it."""

    state: dict[str, Any] = Field(description="the rollout state as stored")
    canary_percent: float
    effective_percent: float = Field(description="the share the replica routes to optimized")
    routing: str
    stale: bool
    state_age_s: float | None
    store_error: str | None
    store_errors: dict[str, int] = Field(
        {}, description="refresh errors by kind since the replica started (READONLY, OOM, "
        "unavailable, unreadable, ...)")
    idempotency_skipped: dict[str, int] = Field(
        {}, description="requests served without deduplication, by why (OOM, over budget...)")
    serving: dict[str, str] = Field(description="arm -> model version")
    topology: str = Field(description="where the arms' models run: `colocated` (in this "
                          "replica) or `remote` (a Serve deployment per arm)")
    admission: dict[str, Any]
    routes: list[dict[str, Any]] = Field(description="the header routes this replica applies")
    routes_applied: bool


def _header(name: str, description: str, **schema: Any) -> dict:
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {"type": "string", **schema}}


_REQUEST_ID_SCHEMA = {"pattern": _REQUEST_ID.pattern, "maxLength": 128}
PREDICT_OPENAPI: dict[str, Any] = {  # `openapi_extra` of the predict route
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}}}},
    "parameters": [
        _header("X-Request-ID", "echoed when well-formed, else replaced", **_REQUEST_ID_SCHEMA),
        _header("X-Routing-Key", "the key the canary share is decided on (default: the "
                "request id)", maxLength=MAX_ROUTING_KEY),
        _header("Idempotency-Key", "a retry with the same key and inputs replays the stored "
                "answer", **_REQUEST_ID_SCHEMA),
        _header("X-Canary-Arm-Override", "operators only (with `Authorization: Bearer "
                "<operator token>`)", enum=["baseline", "optimized"]),
    ],
}
PREDICT_HEADERS = {  # the 200 response's headers
    name: {"description": description, "schema": {"type": "string"}}
    for name, description in [
        ("X-Request-ID", "the request's id"), ("X-Canary-Arm", "the arm that answered"),
        ("X-Canary-Reason", "why this arm (as `routing`)"),
        ("Server-Timing", "the stages' milliseconds and the batch"),
        ("Idempotency-Status", "`replayed` when the answer is a stored one"),
    ]
}


def document_request_models(app: Any) -> None:
    """Add the models of bodies the gateway reads itself (`PredictRequest`) to `app`'s OpenAPI
    components, where `PREDICT_OPENAPI` refers to them. `app`: a FastAPI application."""
    build: Callable[[], dict] = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schemas = build().setdefault("components", {}).setdefault("schemas", {})
            schema = PredictRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))  # GenerateParameters, beside it
            schemas["PredictRequest"] = schema
        return app.openapi_schema

    app.openapi = openapi


def request_id_from(header: str | None) -> str:
    """Echo a well-formed client request id; anything else is replaced, never echoed."""
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def max_body_bytes(settings: AdmissionSettings) -> int:
    # Worst case JSON: every character escaped as \\uXXXX (6 bytes), plus framing per item.
    return settings.max_total_chars * 6 + settings.max_items * 16 + 4096


def parse_predict(body: bytes, settings: AdmissionSettings) -> PredictRequest:
    if len(body) > max_body_bytes(settings):
        raise InputTooLarge(f"request body of {len(body)} bytes is over the limit")
    try:
        request = PredictRequest.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidInput(_describe(exc)) from None
    check_inputs(request.inputs, settings)
    return request


def check_inputs(inputs: list[str], settings: AdmissionSettings, name: str = "inputs") -> None:
    """Every protocol's texts against the same rules: none empty or blank (InvalidInput), and
    within the items, characters per item and characters in all limits (InputTooLarge); the
    messages name the field as the protocol calls it (`name`)."""
    if not inputs:
        raise InvalidInput(f"{name} is empty")
    for i, text in enumerate(inputs):
        if not text.strip():
            raise InvalidInput(f"{name}[{i}] is empty")
    if len(inputs) > settings.max_items:
        raise InputTooLarge(
            f"{len(inputs)} {name} is over the limit of {settings.max_items} per request"
        )
    total = 0
    for i, text in enumerate(inputs):
        if len(text) > settings.max_item_chars:
            raise InputTooLarge(
                f"{name}[{i}] has {len(text)} characters, "
                f"over the limit of {settings.max_item_chars}"
            )
        total += len(text)
    if total > settings.max_total_chars:
        raise InputTooLarge(
            f"{name} total {total} characters, over the limit of {settings.max_total_chars}"
        )


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    if first["type"] == "json_invalid":
        return "request body is not valid JSON"
    return f"{where}: {first['msg']}"
