"""Progressive ramp: the ramp controller deployment's pace and lease."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from rollout.settings.base import CONFIG


class RampSettings(BaseSettings):
    """Progressive ramp

    The ramp controller deployment ([Progressive ramp](operator-guide.md#progressive-ramp));
    the ramp's plan itself is given to `rollout ramp start` (rollout layer: rollout.ramp).
    """

    model_config = CONFIG

    ramp_interval_s: float = Field(
        5.0, gt=0, le=3_600, description="how often the ramp controller evaluates a running ramp"
    )
    ramp_lease_ttl_s: float = Field(
        15.0, gt=0, le=3_600, description="a controller that stops renewing its lease loses it "
        "after this, and another takes over (must exceed the interval)"
    )
    ramp_controller_num_cpus: float = Field(
        0.05, ge=0, le=8, description="CPU reserved for the `ramp-controller` deployment (one "
        "replica)"
    )
    ramp_audit_heartbeat_s: float = Field(
        300.0, gt=0, le=86_400,
        description="a ramp evaluation that changes nothing (a held step) is audited at most "
        "this often; every change is audited at once",
    )

    @model_validator(mode="after")
    def _lease_outlives_interval(self):
        if self.ramp_lease_ttl_s <= self.ramp_interval_s:
            raise ValueError("ramp_lease_ttl_s must be longer than ramp_interval_s")
        return self
