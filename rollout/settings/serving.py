"""Serving: what each Serve deployment reserves, and a request's deadlines and retries."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from rollout.redis_conn import check_url
from rollout.settings.base import CONFIG


class ServingSettings(BaseSettings):
    """Serving: Serve resources and the request path

    What each Serve deployment reserves and accepts, and the deadlines and retries of a
    request's model calls (serving layer: serve.config, serve.gateway.deployment).
    """

    model_config = CONFIG

    topology: Literal["colocated", "remote"] = Field(
        "remote",
        description="where the arms' models run: `colocated`, both loaded in every "
        "gateway replica (no second Ray hop per request; for models that fit twice in a "
        "replica; faster on one machine at bounded load and with short texts under overload, "
        "slower in a burst of long texts), or "
        "`remote`, one Serve deployment per arm, "
        "called from the gateway (arms that scale on their own: large models, a GPU per arm, "
        "a cluster) ([the topology]"
        "(production.md#the-topology))"
    )
    gateway_num_cpus: float = Field(
        0.25, ge=0, le=64, description="CPU reserved per gateway replica (colocated: plus "
        "`model_num_cpus` per arm)"
    )
    model_num_cpus: float = Field(
        0.5, ge=0, le=64, description="CPU reserved per model replica (fractions let all "
        "three fit on 2 cores)"
    )
    model_num_gpus: float = Field(0.0, ge=0, le=8, description="GPU fraction per model replica")
    model_max_ongoing_requests: int = Field(
        64, ge=1, le=10_000, description="concurrent requests per model replica (bounds batch "
        "size)"
    )
    gateway_max_ongoing_requests: int = Field(
        256, ge=1, le=100_000, description="concurrent requests Serve hands one gateway replica"
    )
    model_max_queued_requests: int = Field(
        256, ge=-1, le=1_000_000, description="requests waiting per model deployment (-1: "
        "unbounded); above it the call fails fast (503 `overloaded`, or the fallback for the "
        "canary)"
    )
    gateway_tokenize_threads: int = Field(
        2, ge=0, le=64,
        description="threads per gateway replica that tokenize requests off its event loop "
        "and send token ids to the models (tokenization scales with gateway replicas); 0: the "
        "model replicas tokenize",
    )
    gateway_coalesce_calls: int = Field(
        1, ge=0, le=1024,
        description="model calls per arm a gateway replica keeps open; requests that arrive "
        "while all are open go together in the next call (at most `max_batch_size`, and a full "
        "call goes at once), so a busy gateway pays one Ray call per batch instead of one per "
        "request; nothing waits while a call slot is free. About one per model replica of an "
        "arm; 0: one call per request (serve.gateway.coalesce)",
    )
    request_timeout_s: float = Field(
        10.0, gt=0, le=600, description="deadline of a request's model calls, fallback "
        "included (504 after); a client may ask for a shorter one in `X-Request-Timeout-Ms`"
    )
    stream_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="deadline of a generative request, whole or "
        "streamed, from its arrival to its last token ([generative arms](generative.md)); "
        "it takes the place of `request_timeout_s` there, which would cut long answers; a "
        "client may ask for a shorter one in `X-Request-Timeout-Ms`"
    )
    listen_host: str = Field(
        "127.0.0.1", min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:\-]+$",
        description="address the gateway listens on: the HTTP door (HAProxy's, and each "
        "gateway replica's behind it), the gRPC door, HAProxy's stats and metrics pages; with "
        "the loopback, a Ray that `serve run serve.config:app` starts keeps its own ports there "
        "too, and so does each replica's metrics port. `0.0.0.0`: every interface, for clients, "
        "Prometheus or Ray nodes on other machines ([ports](cluster.md#ports-to-open))"
    )
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="the Open Inference Protocol's gRPC service "
        "(`inference.GRPCInferenceService`, [HTTP API]"
        "(http-api.md#open-inference-protocol-v2-grpc)) on this port of every gateway replica "
        "(replicas on one node share it); 0: off"
    )
    canary_timeout_fraction: float = Field(
        0.5, gt=0, le=1, description="share of that deadline the optimized model gets; the "
        "rest is kept for the retry on baseline (colocated: a canary predicted past it keeps "
        "the whole deadline unless the baseline would answer sooner)"
    )
    retry_budget_ratio: float = Field(
        0.2, ge=0, le=1, description="fallback retries allowed per canary call over 10 s, so a "
        "sick canary cannot double baseline's load"
    )
    retry_budget_min_per_s: float = Field(
        1.0, ge=0, le=10_000, description="fallback retries allowed per second regardless of "
        "traffic"
    )
    idempotency_ttl_s: float = Field(
        600, ge=1, le=30 * 86_400, description="how long a response is kept for replays of "
        "its `Idempotency-Key` (retries come within minutes; every stored answer takes Redis "
        "memory for this long)"
    )
    idempotency_max_record_bytes: int = Field(
        256 * 1024, ge=1024, le=64 * 1024 * 1024, description="largest answer kept for "
        "replays; a larger one is served without deduplication"
    )
    idempotency_budget_bytes: int = Field(
        64 * 1024 * 1024, ge=1024 * 1024, description="bytes all gateway replicas may store "
        "for replays within one TTL; at start it is cut to a quarter of Redis' `maxmemory` "
        "when that is smaller; past it answers are served without deduplication, so the "
        "records never crowd the rollout state out of Redis"
    )
    idempotency_redis_url: str | None = Field(
        None, description="a Redis of their own for the `Idempotency-Key` records (same URL "
        "forms as `REDIS_URL`); none: `REDIS_URL`"
    )

    @field_validator("idempotency_redis_url")
    @classmethod
    def _idempotency_url(cls, value: str | None) -> str | None:
        return value if value is None else check_url(value)
