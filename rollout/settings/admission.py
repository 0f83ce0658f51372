"""Admission and slow clients: what a gateway replica lets in."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from rollout.settings.base import CONFIG


class AdmissionSettings(BaseSettings):
    """Admission and slow clients

    What a gateway replica lets in: request size limits, the memory cap on requests in flight
    (below it, requests are refused only when they would miss their deadline) and slow uploads
    (serving layer: serve.gateway.admission, serve.gateway.ingress).
    """

    model_config = CONFIG

    max_items: int = Field(
        64, ge=1, le=10_000, description="inputs per request (413 above)"
    )
    max_item_chars: int = Field(
        8_192, ge=1, le=1_000_000, description="characters per input (413 above)"
    )
    max_total_chars: int = Field(
        131_072, ge=1, le=10_000_000, description="characters per request (413 above)"
    )
    gateway_max_in_flight: int = Field(
        128, ge=1, le=100_000, description="the most requests a gateway replica serves at once "
        "(the memory cap); above it 503 + `Retry-After` at once. Below it a request is refused "
        "only when it would be answered after its deadline ([admission]"
        "(production.md#admission-by-deadline))"
    )
    gateway_max_uploading: int = Field(
        256, ge=1, le=100_000,
        description="requests a gateway replica receives bodies for at once, outside the "
        "in-flight bound; 503 above",
    )
    body_timeout_s: float = Field(
        5.0, gt=0, le=600,
        description="time a request's body has to arrive after its headers; 408 "
        "`body_timeout` past it",
    )

    @model_validator(mode="after")
    def _item_within_request(self):
        if self.max_item_chars > self.max_total_chars:
            raise ValueError("max_item_chars cannot exceed max_total_chars")
        return self
