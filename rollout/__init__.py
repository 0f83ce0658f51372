"""Rollout logic, free of Ray and HTTP: state, store, routing policy, audited changes."""

from rollout.clock import Clock, FakeClock, SystemClock
from rollout.control import Rollout
from rollout.errors import (
    InvalidChange,
    RevisionConflict,
    RevisionNotFound,
    RolloutError,
    StoreUnavailable,
)
from rollout.policy import Arm, Decision, Reason, bucket_of, decide
from rollout.settings import Settings
from rollout.state import BUCKETS, AuditEntry, RolloutState, format_bp, parse_percent
from rollout.store import MemoryStateStore, StateStore, Subscription
from rollout.verdict import Thresholds, Verdict, judge
from rollout.watcher import StateView, StateWatcher

__all__ = [
    "Arm", "AuditEntry", "BUCKETS", "Clock", "Decision", "FakeClock", "InvalidChange",
    "MemoryStateStore", "Reason", "RevisionConflict", "RevisionNotFound", "Rollout",
    "RolloutError", "RolloutState", "Settings", "StateStore", "StateView", "StateWatcher",
    "StoreUnavailable", "Subscription", "SystemClock", "Thresholds", "Verdict", "bucket_of",
    "decide", "format_bp", "judge", "open_store", "parse_percent",
]


def open_store(settings: Settings) -> StateStore:
    """The Redis store named by the settings (imported lazily: unit tests need no Redis client)."""
    from rollout.redis_store import RedisStateStore

    return RedisStateStore(settings.redis_url, settings.app_name, timeout_s=settings.redis_timeout_s)
