"""What every settings group shares: the `CANARY_` prefix of its environment variables, unknown
names refused and values frozen once read."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

CONFIG = SettingsConfigDict(env_prefix="CANARY_", extra="forbid", frozen=True)
