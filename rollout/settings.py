"""Every setting of the gateway and the CLI, in one pydantic settings object.

Read from the environment with the prefix `CANARY_` (e.g. `CANARY_MAX_BATCH_SIZE=32`), except
`REDIS_URL`, which is read under that common name. Nothing reads the environment at import time:
call `Settings()` where the process starts (the Serve application builder, the CLI's main).
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rollout.agreement import CONFIDENT_MARGIN

DEFAULT_LABELS = ("technology", "sports", "politics", "business", "entertainment", "health")
Recipe = Literal[
    "auto", "fp32", "int8-dynamic", "int8-dynamic-per-channel", "int8-torchao", "fp16",
    "bf16", "compiled", "accuracy-aware", "fp16-graphs", "onnx-int8", "onnx-fp32",
    "ct2-int8",
]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CANARY_", extra="forbid", frozen=True)

    # --- rollout state -----------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "CANARY_REDIS_URL", "redis_url"),
        description="Redis holding the rollout state, audit log and change channel",
    )
    control_redis_url: str | None = Field(
        None,
        description="Redis URL with write access to the rollout state, used inside the "
        "application by the ramp controller and dashboard actions; None: REDIS_URL",
    )
    operator_token: SecretStr | None = Field(
        None, min_length=16, max_length=256,
        description="bearer token for the dashboard's actions and the per-request "
        "X-Canary-Arm-Override; None: the dashboard is read-only and no override is honoured",
    )
    app_name: str = Field("default", description="namespace of this application's Redis keys")
    redis_timeout_s: float = Field(2.0, gt=0, le=30)
    state_poll_s: float = Field(1.0, gt=0, le=60, description="fallback poll of the state")
    state_staleness_s: float = Field(
        5.0, gt=0, le=3600, description="cached state older than this routes all to baseline"
    )
    routing_salt: str = Field("", max_length=64, description="changes which keys are canaries")

    # --- models --------------------------------------------------------------------------
    model_path: str | None = Field(
        None, description="local Hugging Face model folder of both arms unless an arm has its "
        "own (baseline_model_path, optimized_model_path); default: packaged all-MiniLM-L6-v2"
    )
    baseline_model_path: str | None = Field(
        None, description="the baseline arm's model folder; None: model_path"
    )
    optimized_model_path: str | None = Field(
        None, description="the optimized arm's model folder (new weights to canary); None: "
        "model_path"
    )
    baseline_recipe: Recipe = Field(
        "fp32", description="the baseline arm's recipe (not auto: auto is judged against an "
        "fp32 reference); after a promotion, the promoted arm's recipe"
    )
    optimized_recipe: Recipe = Field(
        "auto", description="auto: the fastest candidate for this host that passes the gate on "
        "the calibration split (serve.autopick), measured once and cached"
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    labels: Annotated[tuple[str, ...], NoDecode] = Field(
        DEFAULT_LABELS, description="zero-shot labels (comma-separated or a JSON list)"
    )
    label_template: str = Field("This text is about {}.", description="label description")
    default_task: Literal["classify", "embed"] = "classify"
    max_tokens: int = Field(256, ge=8, le=8192, description="inputs are truncated to this")
    torch_threads: int = Field(
        0, ge=0, le=256, description="threads per model replica; 0: cores / 2 at start, then "
        "following the share (compute_follows_share)"
    )
    compute_follows_share: bool = Field(
        True, description="with torch_threads 0: each model replica's threads follow the share "
        "of traffic its arm carries (serve.compute)"
    )
    hide_native_bf16: bool = Field(
        False,
        description="auto ignores a CPU's native bf16, so that the int8 runtime is measured and "
        "served on a bf16 machine as on an AVX2-only one; part of auto's cache key",
    )
    auto_choice_dir: str | None = Field(
        None,
        description="cache of auto's measured choices (one JSON file per weights, host and "
        "settings); default $XDG_CACHE_HOME/canary-gateway/auto, else ~/.cache/canary-gateway/auto",
    )

    # --- accuracy-aware recipe and `rollout verify` ------------------------------------------
    regression_set: str | None = Field(
        None, description="JSONL regression set; default: the shipped serve/data/regression.jsonl"
    )
    plan_dir: str | None = Field(
        None, description="cache of accuracy-aware plans; default ~/.cache/canary-gateway/plans"
    )
    aware_target_agreement: float = Field(
        0.998, gt=0, le=1, description="top-1 agreement the plan must reach on calibration"
    )
    aware_high_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="precision of the layers a plan keeps; auto: bf16 if native"
    )
    onnx_dir: str | None = Field(
        None, description="cache of runtime artifacts (onnx-* and ct2-int8 recipes); default "
        "~/.cache/canary-gateway/onnx"
    )
    int8_target_agreement: float = Field(
        0.99, gt=0, le=1, description="top-1 agreement the onnx-int8 calibration search must "
        "reach on the calibration split, with no confident flip"
    )
    verify_min_margin: float = Field(
        CONFIDENT_MARGIN, ge=0, le=1,
        description="a flip is confident when the baseline's top-1 minus top-2 score is at "
        "least this (below it: a near tie)",
    )
    verify_max_confident_flips: int = Field(
        0, ge=0, le=1_000_000, description="verify fails with more confident flips than this"
    )
    verify_max_accuracy_drop: float = Field(
        0.01, ge=0, le=1,
        description="verify fails when the optimized arm's accuracy on labelled inputs is lower "
        "than the baseline's by more than this",
    )
    verify_min_agreement: float = Field(
        0.98, ge=0, le=1, description="verify fails below this top-1 agreement"
    )
    verify_min_lower_bound: float = Field(
        0.98, ge=0, le=1,
        description="verify fails below this 95 % Wilson lower bound of the agreement",
    )
    verify_min_speedup: float = Field(
        1.0, ge=0, le=1000,
        description="verify fails below this throughput ratio at verify_speed_batch, on "
        "length-sorted (served-like) batches",
    )
    verify_min_cosine_p1: float = Field(
        0.95, ge=-1, le=1,
        description="verify fails below this 1st percentile of embedding cosine (encoders only)",
    )
    verify_batch_sizes: Annotated[tuple[int, ...], NoDecode] = Field(
        (1, 8, 32), description="batch sizes whose throughput verify measures"
    )
    verify_speed_batch: int = Field(32, ge=1, le=4096, description="the batch of `speedup`")
    verify_speed_inputs: int = Field(256, ge=1, le=100_000, description="inputs timed per pass")

    # --- batching ------------------------------------------------------------------------
    max_batch_size: int = Field(16, ge=1, le=4096, description="requests merged per batch")
    max_batch_tokens: int = Field(
        8_192, ge=8, le=1_000_000,
        description="padded tokens per forward; bigger merged batches are split",
    )
    batch_wait_ms: float = Field(
        5.0, ge=0, le=1000, description="how long a batch waits to fill"
    )

    # --- input limits and timeouts -----------------------------------------------------------
    max_items: int = Field(64, ge=1, le=10_000, description="inputs per request")
    max_item_chars: int = Field(8_192, ge=1, le=1_000_000, description="characters per input")
    max_total_chars: int = Field(131_072, ge=1, le=10_000_000, description="chars per request")
    request_timeout_s: float = Field(10.0, gt=0, le=600, description="deadline of a request")
    idempotency_ttl_s: float = Field(
        86_400, ge=1, le=30 * 86_400, description="how long a response is kept for replays"
    )
    retry_budget_ratio: float = Field(
        0.2, ge=0, le=1, description="fallback retries allowed per canary call (10 s window)"
    )
    retry_budget_min_per_s: float = Field(
        1.0, ge=0, le=10_000, description="fallback retries allowed per second regardless"
    )
    canary_timeout_fraction: float = Field(
        0.5, gt=0, le=1, description="share of the deadline the canary gets before the fallback"
    )

    # --- online agreement (shadow comparison, serve.shadow) ---------------------------------
    shadow_share: float = Field(
        0.05, ge=0, le=1,
        description="share of answered requests also sent to the other arm off the response path",
    )
    shadow_max_concurrency: int = Field(
        4, ge=1, le=10_000, description="shadow calls in flight per gateway replica; shed above"
    )
    shadow_shed_in_flight: int = Field(
        32, ge=0, le=100_000, description="no shadow while the gateway serves more requests"
    )
    shadow_shed_queue: int = Field(
        8, ge=0, le=1_000_000,
        description="no shadow when the answering replica reported a longer queue",
    )
    shadow_timeout_s: float = Field(5.0, gt=0, le=600, description="deadline of a shadow call")

    # --- flip capture (rollout.flips): inputs the shadowed arms disagreed on -------------------
    flip_capture: bool = Field(
        False, description="keep the inputs of shadowed classify pairs whose top-1 labels "
        "differ, with both labels and margins, in the Redis stream rollout:<app>:flips "
        "(`rollout flips`); off by default: inputs are user data",
    )
    flip_capture_max: int = Field(
        10_000, ge=10, le=1_000_000, description="flips kept (the stream's approximate MAXLEN)"
    )
    flip_capture_ttl_s: int = Field(
        7 * 86_400, ge=60, le=90 * 86_400,
        description="flips older than this are trimmed; the stream expires when none comes",
    )
    flip_capture_max_chars: int = Field(
        2_000, ge=1, le=1_000_000,
        description="a flipped input longer than this is not kept (counted as too_long)",
    )
    flip_redact: str | None = Field(
        None, description="redaction hook 'module:function', called as f(text) -> str | None "
        "before a flip is kept; None drops the input, a hook that raises drops it too",
    )

    # --- Serve resources ---------------------------------------------------------------------
    gateway_num_cpus: float = Field(0.25, ge=0, le=64)
    model_num_cpus: float = Field(0.5, ge=0, le=64)
    model_num_gpus: float = Field(0.0, ge=0, le=8)
    model_max_ongoing_requests: int = Field(64, ge=1, le=10_000)
    gateway_max_ongoing_requests: int = Field(256, ge=1, le=100_000)
    gateway_tokenize_threads: int = Field(
        2, ge=0, le=64,
        description="threads per gateway replica that tokenize requests; 0: the models do",
    )
    gateway_coalesce_calls: int = Field(
        1, ge=0, le=1024,
        description="model calls per arm a gateway replica keeps open; requests arriving while "
        "all are open go together in the next one (serve.coalesce); 0: one call per request",
    )
    gateway_max_in_flight: int = Field(
        128, ge=1, le=100_000, description="requests a gateway replica serves at once; 503 above"
    )
    gateway_adaptive_admission: bool = Field(
        True, description="the in-flight limit follows measured queueing (serve.admission); "
        "off: gateway_max_in_flight is the limit",
    )
    gateway_min_in_flight: int = Field(
        4, ge=1, le=100_000,
        description="the adaptive in-flight limit never goes below this (nor above the max)"
    )
    gateway_queue_target_ms: float = Field(
        50.0, ge=0, le=60_000,
        description="queueing an answered request may see (or one forward, if longer) "
        "before the adaptive limit shrinks",
    )
    gateway_max_uploading: int = Field(
        256, ge=1, le=100_000,
        description="requests a gateway replica receives bodies for at once; 503 above",
    )
    body_timeout_s: float = Field(
        5.0, gt=0, le=600,
        description="time a request's body has to arrive after its headers; 408 past it",
    )
    model_max_queued_requests: int = Field(
        256, ge=-1, le=1_000_000, description="requests waiting per model deployment; -1: no bound"
    )

    # --- telemetry ---------------------------------------------------------------------------
    telemetry_enabled: bool = Field(
        True, description="traces, metrics and request logs; off: none of them (no overhead)"
    )
    trace_sample_ratio: float = Field(
        1.0, ge=0, le=1, description="share of new traces recorded (an incoming one is followed)"
    )
    telemetry_redis: bool = Field(
        True, description="keep recent traces and per-arm windows in Redis (the embedded sink)"
    )
    telemetry_queue_size: int = Field(
        10_000, ge=10, le=1_000_000, description="sink queue; items beyond it are dropped"
    )
    telemetry_flush_s: float = Field(0.5, gt=0, le=60, description="sink write interval")
    telemetry_max_traces: int = Field(
        2_000, ge=10, le=1_000_000, description="recent traces kept in Redis"
    )
    telemetry_trace_ttl_s: int = Field(3_600, ge=10, le=30 * 86_400)
    telemetry_window_ttl_s: int = Field(
        3_600, ge=60, le=30 * 86_400, description="how long per-arm 1-second windows are kept "
        "(also the longest stretch of a ramp step its shadow gates can judge)"
    )
    request_log: bool = Field(True, description="one JSON line per request on stderr")
    device_hour_price: float = Field(
        0.0, ge=0, le=1_000_000, description="price of one device-hour, for cost per request"
    )

    # --- progressive ramp ----------------------------------------------------------------------
    ramp_interval_s: float = Field(
        5.0, gt=0, le=3_600, description="how often the ramp controller evaluates the ramp"
    )
    ramp_lease_ttl_s: float = Field(
        15.0, gt=0, le=3_600, description="a controller that stops renewing loses its lease"
    )
    ramp_controller_num_cpus: float = Field(0.05, ge=0, le=8)
    ramp_audit_heartbeat_s: float = Field(
        300.0, gt=0, le=86_400,
        description="a ramp evaluation that changes nothing is audited at most this often",
    )

    # --- notifications (rollout.events, serve.webhooks) ----------------------------------------
    webhook_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="http(s) URLs every rollout event is POSTed to as JSON (comma-separated;"
        " a Slack incoming-webhook URL works as is); empty: notifications off",
    )
    webhook_secret: SecretStr | None = Field(
        None, min_length=1, max_length=1024,
        description="signs every body: X-Canary-Signature: sha256=<hex HMAC-SHA256 of the body>",
    )
    webhook_kinds: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="event kinds sent (comma-separated, e.g. kill,ramp-rollback); empty: all"
    )
    webhook_min_severity: Literal["info", "warning", "critical"] = Field(
        "info", description="events below this severity are not sent"
    )
    webhook_timeout_s: float = Field(
        5.0, gt=0, le=120, description="timeout of one delivery attempt (connect, each read)"
    )
    webhook_retry_for_s: float = Field(
        600.0, ge=0, le=86_400,
        description="a failing delivery (connection error, timeout, 5xx, 429) is retried with "
        "backoff for this long, then given up (counted in `rollout status`)",
    )
    webhook_queue: int = Field(
        1_000, ge=1, le=1_000_000,
        description="events waiting per URL; beyond it the oldest is dropped (and counted)",
    )

    @field_validator("webhook_urls", "webhook_kinds", mode="before")
    @classmethod
    def _split_commas(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        return tuple(part.strip() for part in value if str(part).strip())

    @field_validator("webhook_urls")
    @classmethod
    def _webhook_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not re.match(r"^https?://[^/\s?#]+", url) or any(c.isspace() for c in url):
                raise ValueError("each URL must start with http:// or https:// and name a "
                                 "host, e.g. https://hooks.slack.com/services/...")
        return value

    @field_validator("webhook_kinds")
    @classmethod
    def _webhook_kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from rollout.events import EventFilter

        EventFilter.of(value)  # names the unknown kinds
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _split_labels(cls, value):
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                value = json.loads(text)
            else:
                value = [part for part in text.split(",")]
        labels = tuple(str(v).strip() for v in value)
        if len(labels) < 2 or any(not label for label in labels):
            raise ValueError("give at least two non-empty labels")
        if len(set(labels)) != len(labels):
            raise ValueError("labels must be distinct")
        return labels

    @field_validator("baseline_recipe")
    @classmethod
    def _baseline_recipe(cls, value: str) -> str:
        if value == "auto":
            raise ValueError("baseline_recipe cannot be auto: auto picks the optimized arm's "
                             "recipe by measuring against fp32; name the baseline's recipe, "
                             "e.g. fp32 or bf16")
        return value

    @field_validator("verify_batch_sizes", mode="before")
    @classmethod
    def _split_sizes(cls, value):
        if isinstance(value, str):
            value = [part for part in value.replace(" ", "").split(",") if part]
        sizes = tuple(sorted({int(v) for v in value}))
        if not sizes or sizes[0] < 1 or sizes[-1] > 4096:
            raise ValueError("batch sizes must be whole numbers within 1..4096")
        return sizes

    @field_validator("app_name")
    @classmethod
    def _app_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
            raise ValueError("app_name: 1-64 letters, digits, '_', '.' or '-'")
        return value

    @field_validator("redis_url", "control_redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not re.match(r"^(redis|rediss|unix)://", value):
            raise ValueError("REDIS_URL must start with redis://, rediss:// or unix://")
        return value

    @field_validator("flip_redact")
    @classmethod
    def _flip_redact(cls, value: str | None) -> str | None:
        from rollout.flips import HOOK_PATTERN  # resolved when a gateway starts (FlipCapture)

        if value is None or not value.strip():
            return None
        if not HOOK_PATTERN.fullmatch(value.strip()):
            raise ValueError("CANARY_FLIP_REDACT must be 'module:function' (an importable "
                             "function's path)")
        return value.strip()

    @field_validator("label_template")
    @classmethod
    def _template(cls, value: str) -> str:
        if value.count("{}") != 1:
            raise ValueError("label_template must contain '{}' exactly once")
        return value

    @model_validator(mode="after")
    def _cross_checks(self):
        if self.gateway_max_in_flight > self.gateway_max_ongoing_requests:
            raise ValueError("gateway_max_in_flight cannot exceed gateway_max_ongoing_requests")
        if self.state_staleness_s <= self.state_poll_s:
            raise ValueError("state_staleness_s must be longer than state_poll_s")
        if self.max_batch_tokens < self.max_tokens:
            raise ValueError("max_batch_tokens must hold at least one input of max_tokens")
        if self.verify_speed_batch not in self.verify_batch_sizes:
            raise ValueError("verify_speed_batch must be one of verify_batch_sizes")
        if self.max_item_chars > self.max_total_chars:
            raise ValueError("max_item_chars cannot exceed max_total_chars")
        if self.ramp_lease_ttl_s <= self.ramp_interval_s:
            raise ValueError("ramp_lease_ttl_s must be longer than ramp_interval_s")
        return self

    def control_settings(self) -> Settings:
        """These settings with the control connection as `redis_url`: what in-app components
        that change the rollout state (ramp controller, dashboard actions) open stores with."""
        return self.model_copy(update={"redis_url": self.control_redis_url or self.redis_url})

    def threads_per_model(self, replicas: int = 2) -> int:
        return self.torch_threads or max(1, (os.cpu_count() or 1) // replicas)
