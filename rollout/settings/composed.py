"""Every setting of the gateway and the CLI, in one pydantic settings object.

Read from the environment with the prefix `CANARY_` (e.g. `CANARY_MAX_BATCH_SIZE=32`), except
`REDIS_URL`, which is read under that common name. Nothing reads the environment at import time:
call `Settings()` where the process starts (the Serve application builder, the CLI's main).

The fields are grouped by what they tune, one settings class per group (`SETTING_GROUPS`, in
order), each with its own checks; `Settings` composes them by inheritance, so every variable,
keyword and attribute is flat (`settings.max_batch_size`, `CANARY_MAX_BATCH_SIZE`) and each
group can also be read alone (`RampSettings()`). The groups read by the serving layer only
(models, batching, serving, admission) say so; they live here, not in `serve/`, because the
one `Settings` that the CLI and the library import must not import `serve/`. Each field's
`description` is the one place its meaning is written: docs/settings.md's table is generated
from them (`python -m ops.generate.settings_doc`).
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal, Self

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rollout import kill_settings as kill
from rollout.agreement import CONFIDENT_MARGIN
from rollout.redis_conn import Acknowledgement, acknowledgement_for, check_url

DEFAULT_LABELS = ("technology", "sports", "politics", "business", "entertainment", "health")
Recipe = Literal[
    "auto", "fp32", "int8-dynamic", "int8-dynamic-per-channel", "int8-torchao", "fp16",
    "bf16", "compiled", "accuracy-aware", "fp16-graphs", "onnx-int8", "onnx-fp32",
    "ct2-int8", "ov-int8",
]
CONFIG = SettingsConfigDict(env_prefix="CANARY_", extra="forbid", frozen=True)


def _split_commas(value):
    """A comma-separated string (the environment's form) as a tuple of its non-empty parts."""
    if isinstance(value, str):
        value = value.split(",")
    return tuple(part.strip() for part in value if str(part).strip())


class StateSettings(BaseSettings):
    """Redis and the rollout state

    Where the rollout state, the audit log and the change channel live, and how a process
    follows the state (rollout layer: the library, the CLI and every deployment read them).
    """

    model_config = CONFIG

    # the settings `rollout kill` reads take their defaults and bounds from
    # rollout.kill_settings, which reads them without pydantic
    redis_url: str = Field(
        kill.REDIS_URL,
        validation_alias=AliasChoices("REDIS_URL", "CANARY_REDIS_URL", "redis_url"),
        description="Redis with the rollout state, audit log and change channel (`redis://`, "
        "`rediss://` or `unix://`; user and password in the URL), or Redis Sentinel: "
        "`redis+sentinel://[user:password@]host:port[,host:port...]/<service>/<db>` "
        "(`rediss+sentinel://` for TLS; [Redis with failover](production.md#redis-with-"
        "failover-sentinel))",
    )
    control_redis_url: str | None = Field(
        None,
        description="Redis URL with write access to the rollout state, for the components "
        "inside the application that change it (ramp controller, dashboard actions); give them "
        "the `controller` user when the gateway's is read-mostly; none: `REDIS_URL`",
    )
    operator_token: SecretStr | None = Field(
        None, min_length=16, max_length=256,
        description="bearer token for the [dashboard](dashboard.md)'s actions and the "
        "per-request `X-Canary-Arm-Override`; none: the dashboard is read-only and no override "
        "is honoured",
    )
    app_name: str = Field(
        kill.APP_NAME, description="namespace of this application's Redis keys "
        "(`rollout:<app>:...`): 1-64 letters, digits, `_`, `.` or `-`"
    )
    redis_timeout_s: float = Field(
        kill.REDIS_TIMEOUT_S.default, **kill.REDIS_TIMEOUT_S.bounds,
        description="connect and command timeout towards Redis"
    )
    redis_wait_replicas: int | None = Field(
        kill.REDIS_WAIT_REPLICAS.default, **kill.REDIS_WAIT_REPLICAS.bounds,
        description="replicas that must acknowledge (`WAIT`) a share change, "
        "kill, unkill, audit entry or ramp write before it is reported done; fewer in time is "
        "an error (the change is in effect but may not survive a failover); none: 1 with a "
        "Sentinel URL, 0 (no `WAIT`) with one Redis"
    )
    redis_wait_timeout_ms: int = Field(
        kill.REDIS_WAIT_TIMEOUT_MS.default, **kill.REDIS_WAIT_TIMEOUT_MS.bounds,
        description="how long a write waits for its replicas' "
        "acknowledgement (`CANARY_REDIS_WAIT_REPLICAS`); at most `CANARY_REDIS_TIMEOUT_S` less "
        "0.25 s, which would cut a longer wait off"
    )
    kill_retry_s: float = Field(
        kill.KILL_RETRY_S.default, **kill.KILL_RETRY_S.bounds,
        description="with a Sentinel URL: how long `rollout kill` keeps "
        "retrying (finding the new primary) while Redis fails over, counted from the command's "
        "start; 0: one attempt. One Redis: no retry"
    )
    state_poll_s: float = Field(
        1.0, gt=0, le=60, description="fallback poll of the rollout state"
    )
    state_staleness_s: float = Field(
        5.0, gt=0, le=3600, description="cached state older than this routes everything to "
        "baseline (must exceed the poll)"
    )
    routing_salt: str = Field(
        "", max_length=64, description="changes which keys are canaries (use a new salt per "
        "model to spread risk)"
    )

    @field_validator("app_name")
    @classmethod
    def _app_name(cls, value: str) -> str:
        return kill.check_app_name(value)

    @field_validator("redis_url", "control_redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return value if value is None else check_url(value)

    @model_validator(mode="after")
    def _staleness_after_poll(self):
        if self.state_staleness_s <= self.state_poll_s:
            raise ValueError("state_staleness_s must be longer than state_poll_s")
        return self

    def acknowledgement(self) -> Acknowledgement:
        """The replica acknowledgement durable writes wait for (rollout.redis_conn)."""
        return acknowledgement_for(self.redis_url, self.redis_wait_replicas,
                                   self.redis_wait_timeout_ms, self.redis_timeout_s)

    def control_settings(self) -> Self:
        """These settings with the control connection as `redis_url`: what in-app components
        that change the rollout state (ramp controller, dashboard actions) open stores with."""
        return self.model_copy(update={"redis_url": self.control_redis_url or self.redis_url})


class ModelSettings(BaseSettings):
    """Models and recipes

    What each arm serves: its weights, its recipe and how it runs (read by the serving layer's
    model replicas and by `rollout verify`).
    """

    model_config = CONFIG

    model_path: str | None = Field(
        None, description="any local Hugging Face model folder (encoder or sequence "
        "classifier) of both arms unless an arm has its own; none: the packaged "
        "all-MiniLM-L6-v2"
    )
    baseline_model_path: str | None = Field(
        None, description="the baseline arm's own model folder ([Roll out new weights]"
        "(operator-guide.md#roll-out-new-weights)); none: `CANARY_MODEL_PATH`"
    )
    optimized_model_path: str | None = Field(
        None, description="the optimized arm's own model folder: new weights to canary; none: "
        "`CANARY_MODEL_PATH`"
    )
    baseline_recipe: Recipe = Field(
        "fp32", description="the baseline arm's recipe: any of `CANARY_OPTIMIZED_RECIPE`'s "
        "except `auto` (auto is judged against an fp32 reference); after a promotion, the "
        "promoted arm's recipe"
    )
    optimized_recipe: Recipe = Field(
        "auto", description="the optimized arm's recipe ([Optimization recipes](recipes.md)); "
        "`auto`: the fastest candidate for this host that passes the gate on the validation "
        "split, measured once and cached ([`auto`](recipes.md#auto-the-recipe-picked-by-"
        "measurement)); a named recipe pins it"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the models run; `auto`: cuda when available"
    )
    labels: Annotated[tuple[str, ...], NoDecode] = Field(
        DEFAULT_LABELS, description="zero-shot labels, comma-separated or a JSON list (at least "
        "two, distinct)"
    )
    label_template: str = Field(
        "This text is about {}.", description="how a label is described to the encoder "
        "(`{}` exactly once)"
    )
    default_task: Literal["classify", "embed"] = Field(
        "classify", description="task when a request names none"
    )
    served_model_name: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$",
        description="the model's name in the OpenAI, Open Inference Protocol and TEI routes "
        "([HTTP API](http-api.md)); another name is a 404; none: the baseline model folder's "
        "name (`all-MiniLM-L6-v2` for the packaged model)"
    )
    max_tokens: int = Field(
        256, ge=8, le=8192, description="inputs are truncated to this many tokens"
    )
    torch_threads: int = Field(
        0, ge=0, le=256, description="threads per model replica; 0: cores / 2 at start, then "
        "following the share (`CANARY_COMPUTE_FOLLOWS_SHARE`)"
    )
    compute_follows_share: bool = Field(
        True, description="with `CANARY_TORCH_THREADS=0`: each model replica watches the "
        "rollout state and takes round(cores x the share its arm carries) threads, at least "
        "one; the kill switch and a stale state count as all baseline ([compute follows the "
        "share](production.md#compute-follows-the-share))"
    )
    hide_native_bf16: bool = Field(
        False,
        description="`auto` ignores a CPU's native bf16, so that a bf16 machine measures and "
        "serves the int8 runtimes as an AVX2-only one would; part of `auto`'s cache key",
    )
    auto_choice_dir: str | None = Field(
        None,
        description="where `auto` caches its choice and evidence (one JSON file per weights, "
        "hardware, library versions and settings); none: `$XDG_CACHE_HOME/canary-gateway/auto`, "
        "else `~/.cache/canary-gateway/auto`",
    )
    plan_dir: str | None = Field(
        None, description="where accuracy-aware plans are cached (shipped plans in "
        "`serve/recipes/plans/` are read too); none: `~/.cache/canary-gateway/plans`"
    )
    aware_target_agreement: float = Field(
        0.998, gt=0, le=1, description="top-1 agreement with fp32 the accuracy-aware plan must "
        "reach on the calibration split"
    )
    aware_high_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="precision of the layers an accuracy-aware plan keeps; `auto`: "
        "bf16 where the CPU has native bf16, else fp32"
    )
    onnx_dir: str | None = Field(
        None, description="where the runtime recipes (`onnx-*`, `ct2-int8`, `ov-int8`) cache their "
        "built artifacts, checked by digest on every load; none: `~/.cache/canary-gateway/onnx`"
    )
    int8_target_agreement: float = Field(
        0.99, gt=0, le=1, description="top-1 agreement the `onnx-int8` and `ov-int8` calibration "
        "searches must "
        "reach on the calibration split, with no confident flip"
    )

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

    @field_validator("label_template")
    @classmethod
    def _template(cls, value: str) -> str:
        if value.count("{}") != 1:
            raise ValueError("label_template must contain '{}' exactly once")
        return value

    def threads_per_model(self, replicas: int = 2) -> int:
        return self.torch_threads or max(1, (os.cpu_count() or 1) // replicas)


class VerifySettings(BaseSettings):
    """`rollout verify` and the regression set

    The offline comparison of the two arms that a ramp needs before it advances (rollout
    layer: the verdict; the measurement runs the serving layer's models).
    """

    model_config = CONFIG

    regression_set: str | None = Field(
        None, description="JSONL regression set used by `rollout verify` and to calibrate the "
        "recipes (`accuracy-aware`, `onnx-int8`, `auto`); none: the shipped "
        "`serve/common/data/regression.jsonl`"
    )
    verify_min_margin: float = Field(
        CONFIDENT_MARGIN, ge=0, le=1,
        description="a flip is *confident* when the baseline's margin (top-1 minus top-2 score) "
        "is at least this; below it, a near tie",
    )
    verify_max_confident_flips: int = Field(
        0, ge=0, le=1_000_000, description="`rollout verify` fails with more confident flips "
        "than this"
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
        description="verify fails below this throughput ratio at `CANARY_VERIFY_SPEED_BATCH`, "
        "on length-sorted (served) batches",
    )
    verify_min_cosine_p1: float = Field(
        0.95, ge=-1, le=1,
        description="verify fails below this 1st percentile of embedding cosine (encoders; a "
        "classifier has no embedding to compare)",
    )
    verify_min_slice_agreement: float = Field(
        0.95, ge=0, le=1,
        description="verify fails when a judged slice (script, length bucket, baseline label) "
        "agrees below this beyond doubt: the upper end of its 95 % Wilson interval is below it",
    )
    verify_min_slice_size: int = Field(
        30, ge=1, le=1_000_000,
        description="inputs a slice needs before verify judges it (smaller slices are shown, "
        "not judged)",
    )
    verify_min_recall_at_10: float = Field(
        0.95, ge=0, le=1,
        description="embedding models: verify (and `auto`) fail below this recall@10 of the "
        "optimized arm's neighbours against the baseline's, overall, on a half re-embedded "
        "index and per judged slice (about what an approximate-nearest-neighbour index gives "
        "up against exact search)",
    )
    verify_batch_sizes: Annotated[tuple[int, ...], NoDecode] = Field(
        (1, 8, 32), description="batch sizes whose throughput verify measures (comma-separated, "
        "each 1-4096)"
    )
    verify_speed_batch: int = Field(
        32, ge=1, le=4096, description="the batch size of the reported `speedup` (one of "
        "`CANARY_VERIFY_BATCH_SIZES`)"
    )
    verify_speed_inputs: int = Field(
        256, ge=1, le=100_000, description="inputs (evenly spaced over the set) timed per pass"
    )

    @field_validator("verify_batch_sizes", mode="before")
    @classmethod
    def _split_sizes(cls, value):
        if isinstance(value, str):
            value = [part for part in value.replace(" ", "").split(",") if part]
        sizes = tuple(sorted({int(v) for v in value}))
        if not sizes or sizes[0] < 1 or sizes[-1] > 4096:
            raise ValueError("batch sizes must be whole numbers within 1..4096")
        return sizes

    @model_validator(mode="after")
    def _speed_batch_measured(self):
        if self.verify_speed_batch not in self.verify_batch_sizes:
            raise ValueError("verify_speed_batch must be one of verify_batch_sizes")
        return self


class BatchingSettings(BaseSettings):
    """Batching

    How a model replica merges requests into forwards (serving layer: serve.common.batching).
    Batching can be changed on a running deployment through Serve's `user_config`.
    """

    model_config = CONFIG

    max_batch_size: int = Field(
        16, ge=1, le=4096, description="requests merged into one forward (live: `user_config`)"
    )
    max_batch_tokens: int = Field(
        8_192, ge=8, le=1_000_000,
        description="padded tokens per forward: a merged batch is packed (sorted by length) "
        "into forwards under this budget; a forward out of memory is split in halves",
    )
    batch_wait_ms: float = Field(
        5.0, ge=0, le=1000, description="longest wait for a batch to fill (live: `user_config`)"
    )


class ServingSettings(BaseSettings):
    """Serving: Serve resources and the request path

    What each Serve deployment reserves and accepts, and the deadlines and retries of a
    request's model calls (serving layer: serve.config, serve.gateway.deployment).
    """

    model_config = CONFIG

    topology: Literal["colocated", "remote"] = Field(
        "remote", description="where the arms' models run: `colocated`, both loaded in every "
        "gateway replica (no second Ray hop per request; for models that fit twice in a "
        "replica), or `remote`, one Serve deployment per arm, called from the gateway (arms "
        "that scale on their own: large models, a GPU per arm, a cluster) ([the topology]"
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
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="the Open Inference Protocol's gRPC service "
        "(`inference.GRPCInferenceService`, [HTTP API]"
        "(http-api.md#open-inference-protocol-v2-grpc)) on this port of every gateway replica "
        "(replicas on one node share it); 0: off"
    )
    canary_timeout_fraction: float = Field(
        0.5, gt=0, le=1, description="share of that deadline the optimized model gets; the "
        "rest is kept for the retry on baseline"
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


class AdmissionSettings(BaseSettings):
    """Admission and slow clients

    What a gateway replica lets in: request size limits, the memory cap on requests in flight
    (below it, requests are refused only when they would miss their deadline) and slow uploads
    (serving layer: serve.gateway.admission, serve.gateway.ingress).
    """

    model_config = CONFIG

    max_items: int = Field(
        64, ge=1, le=10_000, description="inputs per request (413 above)"
    )
    max_item_chars: int = Field(
        8_192, ge=1, le=1_000_000, description="characters per input (413 above)"
    )
    max_total_chars: int = Field(
        131_072, ge=1, le=10_000_000, description="characters per request (413 above)"
    )
    gateway_max_in_flight: int = Field(
        128, ge=1, le=100_000, description="the most requests a gateway replica serves at once "
        "(the memory cap); above it 503 + `Retry-After` at once. Below it a request is refused "
        "only when it would be answered after its deadline ([admission]"
        "(production.md#admission-by-deadline))"
    )
    gateway_max_uploading: int = Field(
        256, ge=1, le=100_000,
        description="requests a gateway replica receives bodies for at once, outside the "
        "in-flight bound; 503 above",
    )
    body_timeout_s: float = Field(
        5.0, gt=0, le=600,
        description="time a request's body has to arrive after its headers; 408 "
        "`body_timeout` past it",
    )

    @model_validator(mode="after")
    def _item_within_request(self):
        if self.max_item_chars > self.max_total_chars:
            raise ValueError("max_item_chars cannot exceed max_total_chars")
        return self


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
        1.0, ge=0, le=1, description="share of new traces recorded; an incoming "
        "`traceparent`'s decision is followed"
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


class ShadowSettings(BaseSettings):
    """Shadow comparison and flip capture

    Online agreement: a share of answered requests also sent to the other arm off the
    response path (serve.gateway.shadow), and the inputs the arms disagreed on (rollout.flips).
    """

    model_config = CONFIG

    shadow_share: float = Field(
        0.05, ge=0, le=1,
        description="share of answered requests also sent to the other arm off the response "
        "path, to measure online agreement (see [Online agreement](operator-guide.md#online-"
        "agreement-shadow)); 0 turns shadowing off. 5 % costs the shadowed arm about 5 % more "
        "work",
    )
    shadow_max_concurrency: int = Field(
        4, ge=1, le=10_000, description="shadow calls in flight per gateway replica; a "
        "sampled request past it is shed (counted), never queued"
    )
    shadow_shed_in_flight: int = Field(
        32, ge=0, le=100_000, description="no shadow (shed) while the gateway replica serves "
        "more requests than this"
    )
    shadow_shed_queue: int = Field(
        8, ge=0, le=1_000_000,
        description="no shadow (shed) when the answering model replica reported more requests "
        "queued than this",
    )
    shadow_timeout_s: float = Field(
        5.0, gt=0, le=600, description="deadline of one shadow call (it never holds up the "
        "response)"
    )
    shadow_reservoir_size: int = Field(
        2_000, ge=0, le=100_000, description="embed requests: recent baseline vectors each "
        "gateway replica keeps, in which a shadowed pair's two top-10 neighbours are compared "
        "(online recall@10, the ramp's `min_recall_at_10`); 0: not measured"
    )
    slice_header: str = Field(
        "", max_length=100, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]*$",
        description="request header whose value is a slice of the shadow comparison (e.g. a "
        "tenant or locale header: `header:<value>`, beside script, length and label; see "
        "[Per-slice agreement](operator-guide.md#per-slice-agreement)); at most 32 values of at "
        "most 64 printable characters per gateway replica, later ones count as `other`; empty: "
        "off",
    )
    flip_capture: bool = Field(
        False, description="keep the inputs of shadowed classify pairs whose top-1 labels "
        "differ, with both labels and margins, in the Redis stream `rollout:<app>:flips` "
        "([Flip capture and replay](operator-guide.md#flip-capture-and-replay)); off by "
        "default: inputs are user data",
    )
    flip_capture_max: int = Field(
        10_000, ge=10, le=1_000_000, description="flips kept (the stream's approximate "
        "`MAXLEN`)"
    )
    flip_capture_ttl_s: int = Field(
        7 * 86_400, ge=60, le=90 * 86_400,
        description="flips older than this (7 days) are trimmed; the stream expires when none "
        "comes for that long",
    )
    flip_capture_max_chars: int = Field(
        2_000, ge=1, le=1_000_000,
        description="a flipped input longer than this is not kept (counted `too_long`)",
    )
    flip_redact: str | None = Field(
        None, description="redaction hook `module:function`, called as `f(text) -> str | None` "
        "before a flip is kept; `None` or an exception drops the input; none: the input is kept "
        "as is",
    )

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


class WebhookSettings(BaseSettings):
    """Notifications

    Rollout events POSTed to webhooks ([Notifications](operator-guide.md#notifications);
    rollout.events chooses them, serve.control_plane.webhooks delivers them).
    """

    model_config = CONFIG

    webhook_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="http(s) URLs every rollout event is POSTed to as JSON (comma-separated;"
        " a Slack incoming-webhook URL works as is); empty: notifications off",
    )
    webhook_secret: SecretStr | None = Field(
        None, min_length=1, max_length=1024,
        description="signs every body: `X-Canary-Signature: sha256=<hex HMAC-SHA256 of the "
        "body>`; none: unsigned",
    )
    webhook_kinds: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="event kinds sent (comma-separated, e.g. `kill,ramp-rollback`); empty: "
        "all"
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
        return _split_commas(value)

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


class Settings(  # the groups last to first: pydantic takes fields and checks from the last base
    WebhookSettings, RampSettings, ShadowSettings, TelemetrySettings, AdmissionSettings,
    ServingSettings, BatchingSettings, VerifySettings, ModelSettings, StateSettings,
):
    """Every group in one object: each group's fields and checks, then the checks across
    groups."""

    model_config = CONFIG

    @model_validator(mode="after")
    def _cross_checks(self):
        if self.gateway_max_in_flight > self.gateway_max_ongoing_requests:
            raise ValueError("gateway_max_in_flight cannot exceed gateway_max_ongoing_requests")
        if self.max_batch_tokens < self.max_tokens:
            raise ValueError("max_batch_tokens must hold at least one input of max_tokens")
        return self


SETTING_GROUPS: tuple[type[BaseSettings], ...] = tuple(reversed(Settings.__bases__))
