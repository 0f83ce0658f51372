"""Rollout logic, free of Ray and HTTP: state, store, routing policy, audited changes, and the
telemetry it is judged by (per-arm windows, recent traces, the sink that writes them)."""

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
from rollout.policy import Arm, Decision, Reason, bucket_of, decide, effective_bp
from rollout.settings import Settings
from rollout.shadow import ShadowStats
from rollout.sink import TelemetrySink
from rollout.state import (
    BUCKETS,
    AuditEntry,
    DeploymentReport,
    RolloutState,
    format_bp,
    parse_percent,
)
from rollout.store import MemoryStateStore, StateStore, Subscription
from rollout.traces import MemoryTelemetry, Traces, TraceSummary
from rollout.verdict import Thresholds, Verdict, judge, judge_summary, thresholds_from
from rollout.watcher import StateView, StateWatcher
from rollout.windows import ArmStats, Attempt, RequestRecord, Windows

__all__ = [
    "Arm", "ArmStats", "Attempt", "AuditEntry", "BUCKETS", "Clock", "Decision",
    "DeploymentReport", "FakeClock", "InvalidChange", "LeaseLost", "MemoryStateStore",
    "MemoryTelemetry", "PermissionDenied", "RampNotAllowed", "Reason", "RequestRecord",
    "RevisionConflict", "RevisionNotFound",
    "Rollout", "RolloutError", "RolloutState", "Settings", "ShadowStats", "StateStore",
    "StateView", "StateWatcher", "StoreUnavailable", "Subscription", "SystemClock",
    "TelemetrySink",
    "Thresholds", "TraceSummary", "Traces", "Verdict", "Windows", "bucket_of", "decide",
    "effective_bp", "format_bp", "judge", "judge_summary", "open_store", "open_telemetry",
    "parse_percent", "thresholds_from",
]


def open_store(settings: Settings) -> StateStore:
    """The Redis store named by the settings (imported lazily: unit tests need no Redis client)."""
    from rollout.redis_store import RedisStateStore

    return RedisStateStore(settings.redis_url, settings.app_name, timeout_s=settings.redis_timeout_s)


def open_telemetry(settings: Settings):
    """The Redis telemetry store named by the settings: the source of `Windows` and `Traces`."""
    from rollout.redis_telemetry import RedisTelemetry

    return RedisTelemetry(
        settings.redis_url, settings.app_name, timeout_s=settings.redis_timeout_s,
        max_traces=settings.telemetry_max_traces, trace_ttl_s=settings.telemetry_trace_ttl_s,
        window_ttl_s=settings.telemetry_window_ttl_s,
    )
