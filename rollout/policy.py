"""Sticky bucket assignment and the routing decision.

Algorithm: a routing key (the client's `X-Routing-Key`, else the request id) is hashed with
BLAKE2b (64-bit digest) into one of 10,000 buckets, `bucket = H(salt, key) mod 10_000`. A request
goes to the optimized arm iff `bucket < effective share in basis points`.

Invariants that follow:

- Sticky: the bucket depends on the key alone, so a key keeps its arm while the share is unchanged.
- Monotone: the canary set for share s is buckets [0, s); raising the share only *adds* buckets,
  so no key ever moves optimized -> baseline while widening (and lowering only removes keys).
- Uniform: a 64-bit hash reduced mod 10,000 has bias below 1e-15, so over many distinct keys the
  observed canary fraction converges to the configured one; 1 bucket = 0.01 % of keys.
- Fail-safe: the kill switch beats the share, and a gateway whose cached state is older than its
  staleness bound routes everything to baseline (the arm known to be good) until it hears again.
- Bound to a version: a share recorded for optimized version X routes nothing when the gateway
  serves another optimized version, so a newly deployed model starts from 0 % by construction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum

from rollout.state import BUCKETS, RolloutState


class Arm(str, Enum):
    BASELINE = "baseline"
    OPTIMIZED = "optimized"


class Reason(str, Enum):
    CANARY = "canary"  # bucket inside the canary share
    SHARE = "share"  # bucket outside the canary share
    KILL_SWITCH = "kill-switch"
    STALE_STATE = "stale-state"  # fail-safe: cached state too old
    VERSION_MISMATCH = "version-mismatch"  # the share was set for another optimized model


@dataclass(frozen=True)
class Decision:
    arm: Arm
    bucket: int
    reason: Reason


def bucket_of(key: str, salt: str = "") -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8, key=salt.encode()[:64]).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def effective_bp(
    state: RolloutState, *, stale: bool = False, serving: str | None = None
) -> tuple[int, Reason | None]:
    """The share that actually reaches the canary, and why it is 0 when something overrides it."""
    if state.kill:
        return 0, Reason.KILL_SWITCH
    if stale:
        return 0, Reason.STALE_STATE
    if serving and state.optimized_version and state.optimized_version != serving:
        return 0, Reason.VERSION_MISMATCH
    return state.canary_bp, None


def decide(
    state: RolloutState,
    key: str,
    *,
    stale: bool = False,
    salt: str = "",
    serving: str | None = None,
) -> Decision:
    """Route one request. `serving` is the optimized version this gateway serves."""
    bucket = bucket_of(key, salt)
    share, override = effective_bp(state, stale=stale, serving=serving)
    if override is not None:
        return Decision(Arm.BASELINE, bucket, override)
    if bucket < share:
        return Decision(Arm.OPTIMIZED, bucket, Reason.CANARY)
    return Decision(Arm.BASELINE, bucket, Reason.SHARE)
