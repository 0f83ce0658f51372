"""Redis and the rollout state: where the state lives and how a process follows it."""

from __future__ import annotations

from typing import Self

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from rollout import kill_settings as kill
from rollout.redis_conn import Acknowledgement, acknowledgement_for, check_url
from rollout.settings.base import CONFIG


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
