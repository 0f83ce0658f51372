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

Precedence of one decision, first that applies wins (`decide`):

1. kill switch on -> baseline (nothing beats it: no route, no override);
2. stale state -> baseline (fail-safe);
3. the operator override (`X-Canary-Arm-Override`, only when the gateway authorised it);
4. the first header route, in id order, whose header carries one of its values
   (rollout.header_routes);
5. the hashed share above, version binding included.

Steps 3 and 4 look only at the request's headers, never at its bucket, so for a request that
neither matches the decision is exactly the hashed one: adding or removing routes changes no
other request's arm, and stickiness and monotonicity hold for them unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from rollout.header_routes import OVERRIDE_HEADER, first_match
from rollout.state import BUCKETS, RolloutState


class Arm(StrEnum):
    BASELINE = "baseline"
    OPTIMIZED = "optimized"


class Reason(StrEnum):
    CANARY = "canary"  # bucket inside the canary share
    SHARE = "share"  # bucket outside the canary share
    KILL_SWITCH = "kill-switch"
    STALE_STATE = "stale-state"  # fail-safe: cached state too old
    VERSION_MISMATCH = "version-mismatch"  # the share was set for another optimized model
    OVERRIDE = "override"  # the operator's X-Canary-Arm-Override
    ROUTE = "route"  # a header route (RoutingDecision.route names it)


@dataclass(frozen=True)
class RoutingDecision:
    arm: Arm
    bucket: int
    reason: Reason
    route: str | None = None  # the id of the header route that decided, with Reason.ROUTE

    @property
    def label(self) -> str:
        """Why, as the response says it: 'share', 'kill-switch', 'override', 'route:r2', ..."""
        return f"route:{self.route}" if self.route else self.reason.value


_NO_HEADERS: Mapping[str, str] = {}


def override_arm(headers: Mapping[str, str]) -> Arm | None:
    """The arm `X-Canary-Arm-Override` asks for; None without the header. ValueError for a
    value that is no arm. Whether it is honoured is the caller's (authorisation) business."""
    value = headers.get(OVERRIDE_HEADER)
    if value is None:
        return None
    try:
        return Arm(value.strip().lower())
    except ValueError:
        raise ValueError(f"{OVERRIDE_HEADER} must be baseline or optimized, got "
                         f"{value[:40]!r}") from None


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
    headers: Mapping[str, str] = _NO_HEADERS,
    override_allowed: bool = False,
) -> RoutingDecision:
    """Route one request (precedence in the module docstring). `serving` is the optimized
    version this gateway serves; `headers` the request's, with lower-case names;
    `override_allowed` whether the request carried the operator token (an override header
    without it is ignored here; the gateway refuses such a request before routing)."""
    bucket = bucket_of(key, salt)
    if state.kill:
        return RoutingDecision(Arm.BASELINE, bucket, Reason.KILL_SWITCH)
    if stale:
        return RoutingDecision(Arm.BASELINE, bucket, Reason.STALE_STATE)
    if override_allowed:
        try:
            arm = override_arm(headers)
        except ValueError:
            arm = None
        if arm is not None:
            return RoutingDecision(arm, bucket, Reason.OVERRIDE)
    route = first_match(state.routes, headers) if state.routes else None
    if route is not None:
        return RoutingDecision(Arm(route.arm), bucket, Reason.ROUTE, route.id)
    share, override = effective_bp(state, stale=stale, serving=serving)
    if override is not None:
        return RoutingDecision(Arm.BASELINE, bucket, override)
    if bucket < share:
        return RoutingDecision(Arm.OPTIMIZED, bucket, Reason.CANARY)
    return RoutingDecision(Arm.BASELINE, bucket, Reason.SHARE)
