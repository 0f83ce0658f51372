"""Shadow comparison and flip capture: online agreement between the arms."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from rollout.settings.base import CONFIG


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
        "differ, with both labels and margins, and the prompts of scored generated answers "
        "whose arms' most likely tokens part within 8 tokens, in the Redis stream "
        "`rollout:<app>:flips` ([Flip capture and replay](operator-guide.md#flip-capture-and-"
        "replay)); off by default: inputs and prompts are user data",
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
