"""OpenAI's embeddings API: `GET /v1/models` and `POST /v1/embeddings`, as the `openai` SDK
(`client.embeddings.create`) and what is built on it (LangChain, LlamaIndex, vector databases)
call them.

    POST /v1/embeddings  {"input": "text" | ["text", ...], "model", "encoding_format":
                          "float" | "base64", "dimensions", "user"}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
        "usage": {"prompt_tokens", "total_tokens"}}

`base64` is the vector's little-endian float32 bytes (the SDK asks for it by default when numpy
is installed, and decodes it). `dimensions` may only be the model's own width; `user` is the
routing key when no `X-Routing-Key` is sent. Token-id inputs are refused (400 naming `input`):
the gateway tokenizes texts itself. Errors are OpenAI's `{"error": {"message", "type", "param",
"code"}}`; a shed request is a 503 with `Retry-After`, which the SDK retries.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from serve.common.errors import GatewayError
from serve.common.json_body import JSONBody
from serve.gateway.protocols.door import BadRequest, FrontDoor, Parsed, error_headers, first_error
from serve.gateway.schemas import check_inputs

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error",
          408: "invalid_request_error", 409: "invalid_request_error",
          413: "invalid_request_error", 422: "invalid_request_error",
          403: "permission_error", 503: "server_error", 504: "timeout"}


class EmbeddingsRequest(BaseModel):
    """The body of `POST /v1/embeddings`."""

    model_config = ConfigDict(extra="forbid")

    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]] = Field(
        description="a text or a list of texts (token ids are refused: 400)")
    model: StrictStr = Field(description="the served model's name (`GET /v1/models`)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`base64`: little-endian float32 bytes")
    dimensions: StrictInt | None = Field(None, description="only the model's own width")
    user: StrictStr | None = Field(None, description="the routing key without X-Routing-Key")


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 float32 bytes")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    """The 200 body of `POST /v1/embeddings`."""

    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    """`GET /v1/models`: the served model."""

    object: Literal["list"]
    data: list[ModelCard]


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """OpenAI's error body."""

    error: OpenAIError


def _texts(value: str | list) -> list[str]:
    """The request's texts; token ids are a 400 naming `input`."""
    if isinstance(value, str):
        return [value]
    if value and not isinstance(value[0], str):
        raise BadRequest("token-id inputs are not supported: send the texts (the gateway "
                         "tokenizes them)", param="input")
    return value


class OpenAIDoor(FrontDoor):
    name = "openai"

    def parse(self, body: bytes, request: Request) -> Parsed:
        try:
            asked = EmbeddingsRequest.model_validate_json(body)
        except ValidationError as exc:
            raise BadRequest(*first_error(exc)) from None
        self.served.check(asked.model)
        if "embed" not in self.served.tasks:
            raise BadRequest(f"the model {self.served.name!r} does not embed (it has a "
                             f"classification head)", param="model")
        self.served.check_width(asked.dimensions)
        texts = _texts(asked.input)
        try:
            check_inputs(texts, self.limits, name="input")
        except GatewayError as exc:
            exc.param = "input"
            raise
        return Parsed(texts, "embed", routing_key=asked.user, options=asked.encoding_format)

    def answer(self, body: dict, tokens: int, parsed: Parsed) -> Response:
        encode = _base64 if parsed.options == "base64" else _floats
        data = [{"object": "embedding", "index": i, "embedding": encode(out["embedding"])}
                for i, out in enumerate(body["outputs"])]
        return JSONBody({"object": "list", "data": data, "model": self.served.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def models(self) -> dict:
        """`GET /v1/models`."""
        return {"object": "list", "data": [{"id": self.served.name, "object": "model",
                                            "created": 0, "owned_by": "canary-gateway"}]}

    def error(self, exc: GatewayError, request_id: str, incoming: str | None) -> Response:
        status = 400 if exc.status == 422 else exc.status
        body = {"error": {"message": exc.message, "type": _TYPES.get(status, "server_error"),
                          "param": getattr(exc, "param", None), "code": exc.type}}
        return JSONResponse(body, status_code=status,
                            headers=error_headers(exc, request_id, incoming))


def _floats(vector: list[float]) -> list[float]:
    return vector


def _base64(vector: list[float]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
