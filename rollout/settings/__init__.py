"""Every setting of the gateway and the CLI, in one pydantic settings object.

Read from the environment with the prefix `CANARY_` (e.g. `CANARY_MAX_BATCH_SIZE=32`), except
`REDIS_URL`, which is read under that common name. Nothing reads the environment at import time:
call `Settings()` where the process starts (the Serve application builder, the CLI's main).

The fields are grouped by what they tune, one settings class per group and one module per
group (`state`, `models`, `recipes`, `verify`, `batching`, `serving`, `admission`, `telemetry`,
`shadow`, `ramp`, `webhooks`; `SETTING_GROUPS`, in order), each with its own checks; `Settings`
(`composed`) composes them by inheritance, so every variable, keyword and attribute is flat
(`settings.max_batch_size`, `CANARY_MAX_BATCH_SIZE`) and each group can also be read alone
(`RampSettings()`). The groups read by the serving layer only (models, recipes, batching,
serving, admission) say so; they live here, not in `serve/`, because the one `Settings` that
the CLI and the library import must not import `serve/`. Each field's `description` is the one
place its meaning is written: docs/settings.md's table is generated from them
(`python -m ops.generate.settings_doc`).

Import every name from this package (`from rollout.settings import ShadowSettings`); the
modules are where each group is written, not an interface of their own.
"""

from __future__ import annotations

from rollout.settings.admission import AdmissionSettings
from rollout.settings.base import CONFIG
from rollout.settings.batching import BatchingSettings
from rollout.settings.composed import SETTING_GROUPS, Settings
from rollout.settings.models import DEFAULT_LABELS, ModelSettings, Recipe
from rollout.settings.ramp import RampSettings
from rollout.settings.recipes import RecipeSettings
from rollout.settings.serving import ServingSettings
from rollout.settings.shadow import ShadowSettings
from rollout.settings.state import StateSettings
from rollout.settings.telemetry import TelemetrySettings
from rollout.settings.verify import VerifySettings
from rollout.settings.webhooks import WebhookSettings

__all__ = [
    "CONFIG", "DEFAULT_LABELS", "SETTING_GROUPS", "AdmissionSettings", "BatchingSettings",
    "ModelSettings", "RampSettings", "Recipe", "RecipeSettings", "ServingSettings", "Settings",
    "ShadowSettings", "StateSettings", "TelemetrySettings", "VerifySettings", "WebhookSettings",
]
