"""Every setting of the gateway and the CLI (rollout.settings.composed), imported from here."""

from __future__ import annotations

from rollout.settings.composed import (
    CONFIG,
    DEFAULT_LABELS,
    SETTING_GROUPS,
    AdmissionSettings,
    BatchingSettings,
    ModelSettings,
    RampSettings,
    Recipe,
    ServingSettings,
    Settings,
    ShadowSettings,
    StateSettings,
    TelemetrySettings,
    VerifySettings,
    WebhookSettings,
)

__all__ = [
    "CONFIG", "DEFAULT_LABELS", "SETTING_GROUPS", "AdmissionSettings", "BatchingSettings",
    "ModelSettings", "RampSettings", "Recipe", "ServingSettings", "Settings", "ShadowSettings",
    "StateSettings", "TelemetrySettings", "VerifySettings", "WebhookSettings",
]
