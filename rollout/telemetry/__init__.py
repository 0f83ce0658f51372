"""The telemetry the rollout is judged by, without Ray or HTTP: per-arm one-second metric windows
(window_fields: the write side; window_stats: the read side; windows: the last N seconds on the
clock; series: the windows summed into chart steps), recent traces (traces), the bounded,
batching writer (sink) and their Redis store (redis_store, opened by `rollout.open_telemetry`).

The names below are the ones callers use; `rollout` re-exports them too.
"""

from rollout.telemetry.sink import TelemetrySink
from rollout.telemetry.traces import MemoryTelemetry, Traces, TraceSummary
from rollout.telemetry.windows import ArmStats, Attempt, RequestRecord, Windows

__all__ = [
    "ArmStats", "Attempt", "MemoryTelemetry", "RequestRecord", "TelemetrySink", "TraceSummary",
    "Traces", "Windows",
]
