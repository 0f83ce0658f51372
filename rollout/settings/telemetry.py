"""Telemetry: traces, per-arm windows, request logs, metrics targets and cost."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from rollout.settings.base import CONFIG


class TelemetrySettings(BaseSettings):
    """Telemetry

    Traces, per-arm windows, request logs and cost (every deployment writes them; the rollout
    layer's status, ramp and dashboard read the windows).
    """

    model_config = CONFIG

    telemetry_enabled: bool = Field(
        True, description="traces, metrics and request logs; off: none of them (no overhead)"
    )
    trace_sample_ratio: float = Field(
        0.01, ge=0, le=1, description="share of requests whose trace is recorded, chosen by "
        "request id; an incoming sampled `traceparent` is always followed, and every error, "
        "refusal, fallback and request slower than `CANARY_TRACE_SLOW_MS` is recorded "
        "whatever its id ([sampling](telemetry.md#which-traces-are-kept))"
    )
    trace_slow_ms: float = Field(
        1000.0, gt=0, le=3_600_000, description="an answer at least this slow has its "
        "trace recorded even when its request was not sampled"
    )
    telemetry_redis: bool = Field(
        True, description="keep recent traces and per-arm windows in Redis (the embedded "
        "default)"
    )
    telemetry_queue_size: int = Field(
        10_000, ge=10, le=1_000_000, description="items a process buffers for Redis or the "
        "log; beyond it they are dropped and counted"
    )
    telemetry_flush_s: float = Field(
        0.5, gt=0, le=60, description="how often the buffered telemetry is written"
    )
    telemetry_max_traces: int = Field(
        2_000, ge=10, le=1_000_000, description="recent traces kept in Redis (older ones are "
        "trimmed)"
    )
    telemetry_trace_ttl_s: int = Field(
        3_600, ge=10, le=30 * 86_400, description="a trace's spans expire after this"
    )
    telemetry_window_ttl_s: int = Field(
        3_600, ge=60, le=30 * 86_400, description="per-arm and shadow one-second windows "
        "expire after this; a ramp step longer than this has its shadow gates judge only its "
        "last this-many seconds (raise it for long steps)"
    )
    request_log: bool = Field(
        True, description="one JSON line per request on the gateway's stderr"
    )
    device_hour_price: float = Field(
        0.0, ge=0, le=1_000_000, description="price of one device-hour (any currency), for "
        "cost per 1,000 requests"
    )
    metrics_targets: bool = Field(
        True, description="each gateway replica serves its Prometheus metrics on a port of its "
        "own and registers it in Redis, listed by `GET /v1/metrics/targets` for Prometheus' "
        "`http_sd_configs` (docs/telemetry.md); off: only `GET /metrics`"
    )
    metrics_host: str = Field(
        "", max_length=253, pattern=r"^[A-Za-z0-9.:\-]*$", description="address a gateway "
        "replica's metrics port binds to and is registered under; empty: the node's IP as Ray "
        "knows it; `0.0.0.0` binds every interface and registers the node's IP"
    )
    metrics_port: int = Field(
        0, ge=0, le=65_535, description="0: an ephemeral port per gateway replica; else the "
        "first port tried, upward through 99 more (replicas on one node take the next free "
        "one: open that range to Prometheus)"
    )
    metrics_target_ttl_s: float = Field(
        30.0, ge=15, le=3_600, description="a replica's registration expires unless it is "
        "refreshed (every 10 s) within this: a replica that died without saying so leaves the "
        "discovered targets after at most this"
    )
