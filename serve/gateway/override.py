"""The per-request arm override: `X-Canary-Arm-Override: baseline|optimized`, for operators.

Honoured only with `Authorization: Bearer <CANARY_OPERATOR_TOKEN>` (compared in constant time);
a gateway without an operator token honours none. A request that sends the override without
the token is refused (403 `override_not_allowed`) before anything is routed or any model is
called, so an outside client can neither pick its arm nor learn that its pick was ignored. With
the token, a value that is no arm is a 400. Where the override stands among the kill switch,
the fail-safe and the header routes is rollout.policy's business (the kill switch beats it).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from pydantic import SecretStr

from rollout.header_routes import OVERRIDE_HEADER
from rollout.policy import override_arm
from serve.common.errors import InvalidOverride, OverrideNotAllowed


def override_allowed(token: SecretStr | None, headers: Mapping[str, str]) -> bool:
    """True when the request carries an override the gateway must honour; False without the
    header; OverrideNotAllowed (403) or InvalidOverride (400) otherwise."""
    if headers.get(OVERRIDE_HEADER) is None:
        return False
    if token is None:
        raise OverrideNotAllowed(
            "this gateway honours no X-Canary-Arm-Override (no operator token configured)")
    scheme, _, given = (headers.get("authorization") or "").partition(" ")
    expected = token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise OverrideNotAllowed(
            "X-Canary-Arm-Override needs 'Authorization: Bearer <operator token>'")
    try:
        override_arm(headers)
    except ValueError as exc:
        raise InvalidOverride(str(exc)) from None
    return True
