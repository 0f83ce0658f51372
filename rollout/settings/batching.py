"""Batching: how a model replica merges requests into forwards."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from rollout.settings.base import CONFIG


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
