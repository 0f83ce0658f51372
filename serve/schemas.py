"""Request validation: the shape of `POST /v1/predict` and the configured size limits.

Shape errors (malformed JSON, wrong types, empty list, empty or blank items, unknown fields)
are InvalidInput (422); size errors (items, characters, bytes over the limits) are
InputTooLarge (413). Size is checked on the raw body first, so an oversized body is refused
before it is parsed.
"""

from __future__ import annotations

import re
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from rollout.settings import Settings
from serve.errors import InputTooLarge, InvalidInput

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@+=/-]{1,128}$")
MAX_ROUTING_KEY = 1024


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: list[StrictStr] = Field(min_length=1)
    task: Literal["classify", "embed"] | None = None


def request_id_from(header: str | None) -> str:
    """Echo a well-formed client request id; anything else is replaced, never echoed."""
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def max_body_bytes(settings: Settings) -> int:
    # Worst case JSON: every character escaped as \\uXXXX (6 bytes), plus framing per item.
    return settings.max_total_chars * 6 + settings.max_items * 16 + 4096


def parse_predict(body: bytes, settings: Settings) -> PredictRequest:
    if len(body) > max_body_bytes(settings):
        raise InputTooLarge(f"request body of {len(body)} bytes is over the limit")
    try:
        request = PredictRequest.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidInput(_describe(exc)) from None
    for i, text in enumerate(request.inputs):
        if not text.strip():
            raise InvalidInput(f"inputs[{i}] is empty")
    if len(request.inputs) > settings.max_items:
        raise InputTooLarge(
            f"{len(request.inputs)} inputs is over the limit of {settings.max_items} per request"
        )
    total = 0
    for i, text in enumerate(request.inputs):
        if len(text) > settings.max_item_chars:
            raise InputTooLarge(
                f"inputs[{i}] has {len(text)} characters, "
                f"over the limit of {settings.max_item_chars}"
            )
        total += len(text)
    if total > settings.max_total_chars:
        raise InputTooLarge(
            f"inputs total {total} characters, over the limit of {settings.max_total_chars}"
        )
    return request


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    if first["type"] == "json_invalid":
        return "request body is not valid JSON"
    return f"{where}: {first['msg']}"
