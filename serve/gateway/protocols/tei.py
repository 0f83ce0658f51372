"""Hugging Face Text Embeddings Inference's routes, as `huggingface_hub`'s `InferenceClient`
calls them (`InferenceClient(model="http://gateway:8000/embed").feature_extraction(text)`,
`InferenceClient(model="http://gateway:8000/predict").text_classification(text)`):

    POST /embed    {"inputs": "text" | ["text", ...], "normalize", "truncate",
                    "truncation_direction", "prompt_name", "dimensions"} -> [[float, ...], ...]
    POST /predict  {"inputs": "text" | ["text", ...], "raw_scores", "truncate", "parameters"}
                   -> [{"label", "score"}, ...] for one text (best first),
                      [[{"label", "score"}, ...], ...] for a list
    GET  /info     the model: its id, type, limits

The gateway's vectors are always L2-normalised and its inputs truncated at `max_tokens`, so
`normalize: false` and a `prompt_name` are refused (422); `dimensions` may only be the model's
own width. Text pairs are refused. Errors are TEI's `{"error", "error_type"}`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from rollout.settings import AdmissionSettings, BatchingSettings
from serve.common.errors import GatewayError
from serve.common.json_body import JSONBody
from serve.gateway.protocols.door import BadRequest, FrontDoor, Parsed, error_headers, first_error
from serve.gateway.schemas import check_inputs

VERSION = "0.1.0"
_ERROR_TYPES = {413: "Validation", 422: "Validation", 400: "Validation", 404: "Validation",
                409: "Validation", 503: "Overloaded", 504: "Backend", 408: "Validation"}


class EmbedRequest(BaseModel):
    """The body of `POST /embed`."""

    model_config = ConfigDict(extra="forbid")

    inputs: StrictStr | list[StrictStr] = Field(description="a text or a list of texts")
    normalize: StrictBool = Field(True, description="only true: vectors are L2-normalised")
    truncate: StrictBool | None = Field(None, description="inputs are truncated at max_tokens")
    truncation_direction: Literal["Left", "Right", "left", "right"] | None = None
    prompt_name: None = Field(None, description="not supported (must be null)")
    dimensions: StrictInt | None = Field(None, description="only the model's own width")


class PredictParameters(BaseModel):
    """What `InferenceClient.text_classification` sends; every label is answered, best first."""

    model_config = ConfigDict(extra="forbid")

    function_to_apply: StrictStr | None = None
    top_k: StrictInt | None = None


class TeiPredictRequest(BaseModel):
    """The body of `POST /predict`."""

    model_config = ConfigDict(extra="forbid")

    inputs: StrictStr | list[StrictStr] = Field(description="a text or a list of texts")
    raw_scores: StrictBool = Field(False, description="the gateway's scores as they are")
    truncate: StrictBool | None = None
    truncation_direction: Literal["Left", "Right", "left", "right"] | None = None
    parameters: PredictParameters | None = None


class Prediction(BaseModel):
    label: str
    score: float


class TeiError(BaseModel):
    """TEI's error body."""

    error: str
    error_type: str


class TeiInfo(BaseModel):
    """`GET /info`."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    tokenization_workers: int
    version: str


def _validated(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise BadRequest(first_error(exc)[0], status=422) from None


def _texts(inputs: str | list[str], limits: AdmissionSettings) -> list[str]:
    texts = [inputs] if isinstance(inputs, str) else inputs
    check_inputs(texts, limits)
    return texts


class TeiDoor(FrontDoor):
    """The error shape and `/info`, shared by `/embed` and `/predict`."""

    name = "tei"

    def error(self, exc: GatewayError, request_id: str, incoming: str | None) -> Response:
        body = {"error": exc.message, "error_type": _ERROR_TYPES.get(exc.status, "Backend")}
        return JSONResponse(body, status_code=exc.status,
                            headers=error_headers(exc, request_id, incoming))

    def info(self, batching: BatchingSettings) -> dict:
        """`GET /info`: the model and the limits a client should keep to."""
        served = self.served
        if "embed" in served.tasks:
            model_type: dict = {"embedding": {"pooling": "mean"}}
        else:
            model_type = {"classifier": {"id2label": dict(enumerate(served.labels)),
                                         "label2id": {x: i for i, x in enumerate(served.labels)}}}
        return {"model_id": served.name, "model_sha": None, "model_dtype": "float32",
                "model_type": model_type,
                "max_concurrent_requests": self.limits.gateway_max_in_flight,
                "max_input_length": served.max_tokens,
                "max_batch_tokens": batching.max_batch_tokens,
                "max_batch_requests": batching.max_batch_size,
                "max_client_batch_size": self.limits.max_items, "tokenization_workers": 1,
                "version": VERSION}


class TeiEmbedDoor(TeiDoor):
    def parse(self, body: bytes, request: Request) -> Parsed:
        asked = _validated(EmbedRequest, body)
        if "embed" not in self.served.tasks:
            raise BadRequest("this model does not embed (it has a classification head)", status=422)
        if not asked.normalize:
            raise BadRequest("normalize: this gateway's vectors are always L2-normalised",
                             status=422)
        self.served.check_width(asked.dimensions, status=422)
        return Parsed(_texts(asked.inputs, self.limits), "embed")

    def answer(self, body: dict, tokens: int, parsed: Parsed) -> Response:
        return JSONBody([out["embedding"] for out in body["outputs"]])


class TeiPredictDoor(TeiDoor):
    def parse(self, body: bytes, request: Request) -> Parsed:
        asked = _validated(TeiPredictRequest, body)
        return Parsed(_texts(asked.inputs, self.limits), "classify",
                      options=isinstance(asked.inputs, str))

    def answer(self, body: dict, tokens: int, parsed: Parsed) -> Response:
        ranked = [sorted(({"label": label, "score": score}
                          for label, score in out["scores"].items()),
                         key=lambda p: -p["score"]) for out in body["outputs"]]
        return JSONBody(ranked[0] if parsed.options else ranked)
