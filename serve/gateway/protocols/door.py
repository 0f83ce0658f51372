"""A front door: one protocol's way into the gateway's one request path, and back out.

A door parses a request body into `Parsed` (the texts, the task, a routing key the body may
carry), and encodes the gateway's answer (the native `POST /v1/predict` body, `PredictResponse`)
and its errors (serve.common.errors) in its protocol's shape. Everything between the two (routing,
the kill switch, header routes, admission by deadline, idempotency, fallback, shadow and
telemetry) is the gateway's, the same for every door. `FrontDoor` is the native protocol.

`Served` is what the doors say about the model: its name (`served_model_name`, else derived
from the baseline model folder), its embedding width, its labels and tasks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from rollout.settings import AdmissionSettings, ModelSettings
from serve.common.errors import GatewayError, id_headers, to_response
from serve.common.json_body import JSONBody
from serve.gateway.schemas import parse_predict

PACKAGED_NAME = "all-MiniLM-L6-v2"  # the packaged model's name (its folder is called `model`)


class BadRequest(GatewayError):
    """the request does not follow its protocol; names the field (`param`)"""

    status, type = 400, "invalid_request"

    def __init__(self, message: str, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.param = param
        if status is not None:
            self.status = status


class ModelNotFound(GatewayError):
    """the request names a model this gateway does not serve"""

    status, type = 404, "model_not_found"


@dataclass(frozen=True)
class Served:
    """The served model as the protocols describe it."""

    name: str
    width: int  # the embedding's width (the encoder's hidden size); -1: unknown here
    labels: tuple[str, ...]
    tasks: frozenset[str]
    default_task: str
    max_tokens: int
    version: str  # the baseline arm's model version

    def check_width(self, dimensions: int | None, status: int = 400) -> None:
        """BadRequest naming `dimensions` unless it is None or the model's own width."""
        if dimensions is None or dimensions == self.width:
            return
        has = f"have {self.width}" if self.width > 0 else "have a width this gateway cannot see"
        raise BadRequest(f"dimensions: this model's embeddings {has}, not {dimensions} "
                         f"(leave it out)", param="dimensions", status=status)

    def check(self, name: str) -> None:
        """ModelNotFound (404) unless `name` is the served model's."""
        if name != self.name:
            raise ModelNotFound(f"the model {name!r} does not exist; this gateway serves "
                                f"{self.name!r}")


def served_name(settings: ModelSettings, folder: Path) -> str:
    """`served_model_name`, else the baseline model folder's name; the packaged model (whose
    folder is called `model`) is `all-MiniLM-L6-v2`."""
    if settings.served_model_name:
        return settings.served_model_name
    if not (settings.baseline_model_path or settings.model_path):
        return PACKAGED_NAME
    return folder.resolve().name


def served_model(settings: ModelSettings, folder: Path, info: dict, tasks: set[str]) -> Served:
    """The served model, from the settings, the baseline folder's config.json and the
    baseline replica's `info()`. A gateway on a node without the folder serves all the same,
    its width unknown (-1)."""
    try:
        width = int(json.loads((folder / "config.json").read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        width = -1
    return Served(name=served_name(settings, folder), width=width,
                  labels=tuple(info["labels"]), tasks=frozenset(tasks),
                  default_task=settings.default_task, max_tokens=settings.max_tokens,
                  version=info["version"])


@dataclass(frozen=True)
class Parsed:
    """One request as the gateway serves it, whatever door it came through."""

    inputs: list[str]
    task: str | None  # None: the gateway's default task
    routing_key: str | None = None  # from the body, when no X-Routing-Key is sent
    options: Any = None  # what the door needs to encode the answer


def first_error(exc: ValidationError) -> tuple[str, str | None]:
    """A pydantic error as a message and the top-level field it is about."""
    first = exc.errors(include_url=False, include_input=False)[0]
    if first["type"] == "json_invalid":
        return "the request body is not valid JSON", None
    loc = [str(part) for part in first["loc"]]
    where = ".".join(loc) or "body"
    return f"{where}: {first['msg']}", loc[0] if loc else None


class FrontDoor:
    """The native door (`POST /v1/predict`), and the base of the others."""

    name = "native"

    def __init__(self, served: Served, limits: AdmissionSettings):
        self.served, self.limits = served, limits

    def parse(self, body: bytes, request: Request) -> Parsed:
        request_model = parse_predict(body, self.limits)
        return Parsed(request_model.inputs, request_model.task, options=request_model.parameters)

    def answer(self, body: dict, tokens: int, parsed: Parsed) -> Response:
        """The 200 response for the gateway's native answer `body` to `parsed`; `tokens`:
        the request's tokens."""
        return JSONBody(body)

    def error(self, exc: GatewayError, request_id: str, incoming: str | None) -> Response:
        return to_response(exc, request_id, incoming)


def error_headers(exc: GatewayError, request_id: str, incoming: str | None) -> dict[str, str]:
    """An error response's headers: `X-Request-ID` (serve.common.errors `id_headers`) and, when the
    error asks the client to come back, `Retry-After`."""
    headers = id_headers(request_id, incoming)
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return headers
