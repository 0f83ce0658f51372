"""`app`: the application that `serve run serve.config:app` starts.

`app` is a Serve application builder: Serve calls it with the `key=value` arguments given on the
command line (none are needed), which override the environment's settings, e.g.
`serve run serve.config:app max_batch_size=32`. Reading settings here, not at import, keeps the
environment out of import time.

`app` also gives a `serve run` started by hand the serving path of `ops/run.sh`: Ray's
environment for the gateway (serve.ray_env: throughput mode, direct ingress, the ingress
middleware, OpenMP's wait policy), each as a default that a value already in the environment
overrides. `serve run` calls `app` before it starts Ray; when it would start a local one, `app`
starts it (serve.local_start: what a killed gateway left is stopped, held ports refused in one
line, listeners on `listen_host`, SIGTERM stops as Ctrl-C does), and Ray inherits them.
When Ray is already up, or `serve run` joins a cluster started elsewhere (`--address`,
`RAY_ADDRESS`, or a local `ray start` cluster it finds), that cluster keeps the environment it
was started with; each gateway replica then warns at start of what is missing
(`serve.ray_env.warn_missing`).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import ray
from pydantic import SecretStr
from ray.serve import Application

from rollout.settings import Settings, TelemetrySettings
from serve import local_start, ray_env
from serve.control_plane.controller import RampControllerDeployment
from serve.gateway.colocated import ARMS, COLOCATED
from serve.gateway.deployment import Gateway
from serve.gateway.shadow import flip_capture
from serve.recipes.causal_lm import serves_causal_lm
from serve.replica.generate_server import GenerateServer
from serve.replica.model_server import ModelServer


def build(settings: Settings, live: dict[str, dict] | None = None) -> Application:
    """The gateway and the ramp controller, sized from the settings, with the arms' models
    as `topology` places them: one model deployment per arm (`remote`), or loaded in every
    gateway replica (`colocated`, serve.gateway.colocated). A causal LM's arms generate
    (serve.replica.generate_server), remote only.

    `live` adds per-arm live settings (see `ModelServer.reconfigure`), e.g.
    `{"optimized": {"fault_error": True}}` for a fault drill: each model deployment's
    `user_config`, or the gateway's (`{"arms": ...}`) when colocated.
    """
    live = live or {}
    generative = serves_causal_lm(settings)  # a causal LM's arms generate (one-line errors)
    if generative and (settings.topology == COLOCATED or live):
        raise ValueError("a causal LM is served in the remote topology (CANARY_TOPOLOGY="
                         "remote), without live arm settings: each arm is a model deployment")
    if unknown := set(live) - set(ARMS):
        raise ValueError(f"live settings for unknown arms {sorted(unknown)}: choose from "
                         f"{', '.join(ARMS)}")
    flip_capture(settings)  # a CANARY_FLIP_REDACT that cannot be imported fails now
    arms_config = {arm: {"max_batch_size": settings.max_batch_size,
                         "batch_wait_ms": settings.batch_wait_ms, **live.get(arm, {})}
                   for arm in ARMS}
    controller = RampControllerDeployment.options(
        ray_actor_options={"num_cpus": settings.ramp_controller_num_cpus},
    ).bind(settings)
    logging = gateway_logging(settings)
    if settings.topology == COLOCATED:  # both models in every gateway replica
        return Gateway.options(
            ray_actor_options={
                "num_cpus": settings.gateway_num_cpus + len(ARMS) * settings.model_num_cpus,
                "num_gpus": len(ARMS) * settings.model_num_gpus,
            },
            max_ongoing_requests=settings.gateway_max_ongoing_requests,
            user_config={"arms": arms_config}, logging_config=logging,
        ).bind(None, None, settings, ramp_controller=controller)
    arms = model_arms(settings, arms_config, generative)
    return Gateway.options(
        ray_actor_options={"num_cpus": settings.gateway_num_cpus},
        max_ongoing_requests=settings.gateway_max_ongoing_requests, logging_config=logging,
    ).bind(arms["baseline"], arms["optimized"], settings, ramp_controller=controller)


def model_arms(settings: Settings, arms_config: dict[str, dict], generative: bool) -> dict:
    """Per arm, its model deployment bound with the settings: an encoder's (ModelServer, its
    live settings in `user_config`) or a causal LM's (GenerateServer, a decode loop)."""
    model = (GenerateServer if generative else ModelServer).options(
        ray_actor_options={
            "num_cpus": settings.model_num_cpus,
            "num_gpus": settings.model_num_gpus,
        },
        max_ongoing_requests=settings.model_max_ongoing_requests,
        max_queued_requests=settings.model_max_queued_requests,
    )
    # a version of its own (Serve's `version` is internal API): see `model_version`
    return {arm: model.options(name=arm, version=model_version(settings, arm), _internal=True,
                               **({} if generative else {"user_config": arms_config[arm]}))
            .bind(settings, arm) for arm in ARMS}


def gateway_logging(telemetry: TelemetrySettings) -> dict:
    """The gateway's Serve logging: Serve's access log (a line per HTTP request) only where
    the gateway writes no request log of its own, whose line says all it says and more; one
    line per request costs the event loop that formats and writes it."""
    return {"enable_access_log": not (telemetry.telemetry_enabled and telemetry.request_log)}


def model_version(settings: Settings, arm: str) -> str:
    """What an arm's model replicas are built from: the code and the settings they are bound
    with. Serve restarts a deployment's replicas when its version changes and only reconfigures
    them (`user_config`: batching, fault injection) when it does not. Left to Serve, every
    `serve.run` of the app gives each deployment a random version, so a redeploy that changes
    live settings alone reloaded both models."""
    values = sorted((name, value.get_secret_value() if isinstance(value, SecretStr) else value)
                    for name, value in settings)  # a secret's value too, not its mask
    key = hashlib.sha256(f"{_code_digest()}\0{arm}\0{values!r}".encode())
    return key.hexdigest()[:16]


@functools.cache
def _code_digest() -> str:
    """SHA-256 over the project's code (rollout/ and serve/, names and bytes): new code is a
    new version, whatever the settings."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted([*(root / "rollout").rglob("*.py"), *(root / "serve").rglob("*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def app(args: dict[str, str]) -> Application:
    settings = Settings(**args)
    try:  # what a causal LM cannot be served with, in one line before anything starts
        serves_causal_lm(settings)
    except ValueError as exc:
        raise SystemExit(f"start: {exc}") from None
    if (runtime_env := local_start.starts_local_ray()) is not None:
        local_start.start(settings, runtime_env)  # serve run's own Ray, on listen_host
    elif not ray.is_initialized():  # else the cluster's environment is set already
        ray_env.apply()
    return build(settings)
