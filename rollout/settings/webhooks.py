"""Notifications: rollout events POSTed to webhooks."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode

from rollout.settings.base import CONFIG


def _split_commas(value):
    """A comma-separated string (the environment's form) as a tuple of its non-empty parts."""
    if isinstance(value, str):
        value = value.split(",")
    return tuple(part.strip() for part in value if str(part).strip())


class WebhookSettings(BaseSettings):
    """Notifications

    Rollout events POSTed to webhooks ([Notifications](operator-guide.md#notifications);
    rollout.events chooses them, serve.control_plane.webhooks delivers them).
    """

    model_config = CONFIG

    webhook_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="http(s) URLs every rollout event is POSTed to as JSON (comma-separated;"
        " a Slack incoming-webhook URL works as is); empty: notifications off",
    )
    webhook_secret: SecretStr | None = Field(
        None, min_length=1, max_length=1024,
        description="signs every body: `X-Canary-Signature: sha256=<hex HMAC-SHA256 of the "
        "body>`; none: unsigned",
    )
    webhook_kinds: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="event kinds sent (comma-separated, e.g. `kill,ramp-rollback`); empty: "
        "all"
    )
    webhook_min_severity: Literal["info", "warning", "critical"] = Field(
        "info", description="events below this severity are not sent"
    )
    webhook_timeout_s: float = Field(
        5.0, gt=0, le=120, description="timeout of one delivery attempt (connect, each read)"
    )
    webhook_retry_for_s: float = Field(
        600.0, ge=0, le=86_400,
        description="a failing delivery (connection error, timeout, 5xx, 429) is retried with "
        "backoff for this long, then given up (counted in `rollout status`)",
    )
    webhook_queue: int = Field(
        1_000, ge=1, le=1_000_000,
        description="events waiting per URL; beyond it the oldest is dropped (and counted)",
    )

    @field_validator("webhook_urls", "webhook_kinds", mode="before")
    @classmethod
    def _split_commas(cls, value):
        return _split_commas(value)

    @field_validator("webhook_urls")
    @classmethod
    def _webhook_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not re.match(r"^https?://[^/\s?#]+", url) or any(c.isspace() for c in url):
                raise ValueError("each URL must start with http:// or https:// and name a "
                                 "host, e.g. https://hooks.slack.com/services/...")
        return value

    @field_validator("webhook_kinds")
    @classmethod
    def _webhook_kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from rollout.events import EventFilter

        EventFilter.of(value)  # names the unknown kinds
        return value
