"""Rollout logic, free of Ray and HTTP: state, store, routing policy, audited changes, and the
telemetry it is judged by (per-arm windows, recent traces, the sink that writes them).

The names below are imported on first use (PEP 562), so that importing one light module of the
package (rollout.share, rollout.killswitch: the CLI's kill switch) does not import pydantic and
every other module with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "rollout.clock": ("Clock", "FakeClock", "SystemClock"),
    "rollout.flips": ("FlipCapture", "FlipRecord", "MemoryFlips"),
    "rollout.control": ("Rollout",),
    "rollout.errors": (
        "InvalidChange", "LeaseLost", "PermissionDenied", "RampNotAllowed", "RevisionConflict",
        "RevisionNotFound", "RolloutError", "StoreUnavailable",
    ),
    "rollout.policy": ("Arm", "Reason", "RoutingDecision", "bucket_of", "decide", "effective_bp"),
    "rollout.header_routes": ("Route",),
    "rollout.settings": ("Settings",),
    "rollout.shadow": ("ShadowStats",),
    "rollout.telemetry.sink": ("TelemetrySink",),
    "rollout.state": ("AuditEntry", "DeploymentReport", "RolloutState"),
    "rollout.share": ("BUCKETS", "format_bp", "parse_percent"),
    "rollout.store": ("MemoryStateStore", "StateStore", "Subscription"),
    "rollout.telemetry.traces": ("MemoryTelemetry", "TraceSummary", "Traces"),
    "rollout.verdict": ("Thresholds", "Verdict", "judge", "judge_summary", "thresholds_from"),
    "rollout.watcher": ("StateView", "StateWatcher"),
    "rollout.telemetry.windows": ("ArmStats", "Attempt", "RequestRecord", "Windows"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "Arm", "ArmStats", "Attempt", "AuditEntry", "BUCKETS", "Clock",
    "DeploymentReport", "FakeClock", "FlipCapture", "FlipRecord", "InvalidChange", "LeaseLost",
    "MemoryFlips", "MemoryStateStore",
    "MemoryTelemetry", "PermissionDenied", "RampNotAllowed", "Reason", "RequestRecord",
    "RevisionConflict", "RevisionNotFound", "Route", "RoutingDecision",
    "Rollout", "RolloutError", "RolloutState", "Settings", "ShadowStats", "StateStore",
    "StateView", "StateWatcher", "StoreUnavailable", "Subscription", "SystemClock",
    "TelemetrySink",
    "Thresholds", "TraceSummary", "Traces", "Verdict", "Windows", "bucket_of", "decide",
    "effective_bp", "format_bp", "judge", "judge_summary", "open_store", "open_telemetry",
    "parse_percent", "thresholds_from",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from rollout.clock import Clock, FakeClock, SystemClock
    from rollout.control import Rollout
    from rollout.errors import (
        InvalidChange,
        LeaseLost,
        PermissionDenied,
        RampNotAllowed,
        RevisionConflict,
        RevisionNotFound,
        RolloutError,
        StoreUnavailable,
    )
    from rollout.flips import FlipCapture, FlipRecord, MemoryFlips
    from rollout.header_routes import Route
    from rollout.policy import Arm, Reason, RoutingDecision, bucket_of, decide, effective_bp
    from rollout.settings import Settings, StateSettings, TelemetrySettings
    from rollout.shadow import ShadowStats
    from rollout.share import BUCKETS, format_bp, parse_percent
    from rollout.state import AuditEntry, DeploymentReport, RolloutState
    from rollout.store import MemoryStateStore, StateStore, Subscription
    from rollout.telemetry.sink import TelemetrySink
    from rollout.telemetry.traces import MemoryTelemetry, Traces, TraceSummary
    from rollout.telemetry.windows import ArmStats, Attempt, RequestRecord, Windows
    from rollout.verdict import Thresholds, Verdict, judge, judge_summary, thresholds_from
    from rollout.watcher import StateView, StateWatcher


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


def open_store(settings: StateSettings) -> StateStore:
    """The Redis store named by the state settings (imported lazily: unit tests need no Redis
    client)."""
    from rollout.redis_store import RedisStateStore

    return RedisStateStore(settings.redis_url, settings.app_name,
                           timeout_s=settings.redis_timeout_s, ack=settings.acknowledgement())


def open_telemetry(state: StateSettings, telemetry: TelemetrySettings):
    """The Redis telemetry store where `state` names Redis, sized by `telemetry`: the source of
    `Windows` and `Traces`."""
    from rollout.telemetry.redis_store import RedisTelemetry

    return RedisTelemetry(
        state.redis_url, state.app_name, timeout_s=state.redis_timeout_s,
        max_traces=telemetry.telemetry_max_traces, trace_ttl_s=telemetry.telemetry_trace_ttl_s,
        window_ttl_s=telemetry.telemetry_window_ttl_s,
    )
