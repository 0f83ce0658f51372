"""The rollout state and the audit record, as immutable pydantic models.

The canary share is kept in basis points (rollout.share: 1 bp = 0.01 %) so that every share an
operator can set is exact: 0.01 % is the smallest step and 10,000 bp is all traffic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout.header_routes import Route, check_routes
from rollout.share import BUCKETS, format_bp, parse_percent

__all__ = ["BUCKETS", "AuditEntry", "DeploymentReport", "RolloutState", "format_bp",
           "parse_percent"]


class RolloutState(BaseModel):
    """What every gateway routes by. Each change bumps `revision` (by one, or past the highest
    revision a gateway reports having seen: rollout.change.stamp).

    Fields a newer version writes are read, kept and written back after these (`extra`
    allowed): during a mixed-version upgrade an older reader still follows the kill switch and
    the share, and an older writer never drops what the newer one stored."""

    model_config = ConfigDict(frozen=True, extra="allow")

    canary_bp: int = Field(0, ge=0, le=BUCKETS, description="canary share in basis points")
    kill: bool = Field(False, description="kill switch: when on, everything goes to baseline")
    baseline_version: str = ""
    optimized_version: str = ""
    revision: int = Field(0, ge=0)
    updated_at: float = 0.0
    updated_by: str = ""
    reason: str = ""
    routes: tuple[Route, ...] = Field(
        (), description="header routes (rollout.header_routes), in id order; they beat the share")

    @field_validator("routes", mode="before")
    @classmethod
    def _no_routes(cls, value):
        """Lua's cjson writes an empty list as `{}` (the operator guide's redis-cli kill)."""
        return () if value == {} else value

    @field_validator("routes")
    @classmethod
    def _routes(cls, routes: tuple[Route, ...]) -> tuple[Route, ...]:
        return check_routes(routes)

    @property
    def canary_percent(self) -> float:
        return self.canary_bp / 100

    @property
    def effective_bp(self) -> int:
        """The share actually routed to the canary: the kill switch beats the share."""
        return 0 if self.kill else self.canary_bp


class AuditEntry(BaseModel):
    """One change: who, when, what, why, and the state before and after."""

    model_config = ConfigDict(frozen=True)

    id: str
    ts: float
    actor: str
    action: str
    reason: str
    revision: int
    before: RolloutState | None
    after: RolloutState
    detail: dict | None = None  # what a note saw (e.g. a ramp evaluation's gate values)


class DeploymentReport(BaseModel):
    """What one gateway replica serves, reported (heartbeat) to the store; read by operators."""

    model_config = ConfigDict(frozen=True)

    gateway: str
    baseline_version: str
    optimized_version: str
    ts: float
    state_revision: int = 0  # the revision this gateway routes by
    events: tuple[str, ...] = ()  # store outages and resets it lived through, newest last
    optimized_recipe: str = ""  # the recipe the optimized arm runs (what `auto` resolved to)
    auto: str = ""  # when the recipe was `auto`: how it was chosen (serve.recipes.auto's describe)
    # flip capture as this gateway runs it (None: a gateway from before it was reported)
    flip_capture: bool | None = None
    shadow_share: float | None = None
    topology: str = ""  # where the arms' models run: colocated or remote ("": not reported)
    stale: bool | None = None  # routing all to baseline on a stale state (None: not reported)
    state_error: str | None = None  # why the state is not trusted (the watcher's view.error)
    store_errors: dict[str, int] = {}  # the watcher's refresh errors by kind since its start
