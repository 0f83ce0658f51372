"""The progressive ramp: a plan of steps and gates (plan), the state machine that judges it
(machine), its HTTP checks (checks), where it is kept (store, redis_store), the operators'
actions (control) and the server-side loop that applies it (controller)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout.ramp.checks import Check, Checker, CheckResult
from rollout.ramp.control import RampControl, RampView
from rollout.ramp.controller import RampController
from rollout.ramp.machine import CONTROLLER, Decision, GateResult, Ramp, evaluate
from rollout.ramp.metrics import RampMetrics, WindowsMetrics
from rollout.ramp.plan import Gates, PlanError, RampPlan, Step, load_plan, parse_plan, read_plan
from rollout.ramp.store import MemoryRampStore, RampStore

if TYPE_CHECKING:
    from rollout.settings import StateSettings

__all__ = [
    "CONTROLLER", "Check", "CheckResult", "Checker", "Decision", "GateResult", "Gates",
    "MemoryRampStore", "PlanError", "Ramp",
    "RampControl", "RampController", "RampMetrics", "RampPlan", "RampStore", "RampView", "Step",
    "WindowsMetrics", "evaluate", "load_plan", "open_ramp_store", "parse_plan", "read_plan",
]


def open_ramp_store(settings: StateSettings) -> RampStore:
    """The Redis ramp store named by the state settings (imported lazily, like `open_store`)."""
    from rollout.ramp.redis_store import RedisRampStore

    return RedisRampStore(settings.redis_url, settings.app_name,
                          timeout_s=settings.redis_timeout_s, ack=settings.acknowledgement())
