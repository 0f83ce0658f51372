"""The one `Settings`: every group composed by inheritance, then the checks across groups."""

from __future__ import annotations

from pydantic import model_validator
from pydantic_settings import BaseSettings

from rollout.settings.admission import AdmissionSettings
from rollout.settings.base import CONFIG
from rollout.settings.batching import BatchingSettings
from rollout.settings.models import ModelSettings
from rollout.settings.ramp import RampSettings
from rollout.settings.recipes import RecipeSettings
from rollout.settings.serving import ServingSettings
from rollout.settings.shadow import ShadowSettings
from rollout.settings.state import StateSettings
from rollout.settings.telemetry import TelemetrySettings
from rollout.settings.verify import VerifySettings
from rollout.settings.webhooks import WebhookSettings


class Settings(  # the groups last to first: pydantic takes fields and checks from the last base
    WebhookSettings, RampSettings, ShadowSettings, TelemetrySettings, AdmissionSettings,
    ServingSettings, BatchingSettings, VerifySettings, RecipeSettings, ModelSettings,
    StateSettings,
):
    """Every group in one object: each group's fields and checks, then the checks across
    groups."""

    model_config = CONFIG

    @model_validator(mode="after")
    def _cross_checks(self):
        if self.gateway_max_in_flight > self.gateway_max_ongoing_requests:
            raise ValueError("gateway_max_in_flight cannot exceed gateway_max_ongoing_requests")
        if self.max_batch_tokens < self.max_tokens:
            raise ValueError("max_batch_tokens must hold at least one input of max_tokens")
        return self


SETTING_GROUPS: tuple[type[BaseSettings], ...] = tuple(reversed(Settings.__bases__))
