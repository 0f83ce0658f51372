"""What an operator may do from the dashboard: move the share, kill, unkill, add and remove
header routes (rollout.header_routes).

Safe by the same rules as the `rollout` CLI, through the same audited path
(`rollout.control.Rollout`):

- Only with the operator token configured on the gateway (`CANARY_OPERATOR_TOKEN`), sent as
  `Authorization: Bearer <token>` and compared in constant time. Without a configured token
  every action is refused (403): the page is read-only.
- Every change names a reason; the actor is `dashboard:<name>@<client address>` (or
  `dashboard:<client address>`), so the audit log tells page changes from CLI ones.
- A change that moves the stored or the effective share by 50 points or more, or to 100 %,
  must be confirmed (428 until the request says `"confirm": true`).
- A change is a compare-and-set on the revision the operator saw (`expected_revision`): a
  concurrent change is a 409, never overwritten. Kill never asks and always wins.
- The store is opened with the control connection (`CANARY_CONTROL_REDIS_URL`), the gateway's
  only write-capable one; the gateway's own Redis user may not change the state.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout import (
    PermissionDenied,
    RevisionConflict,
    Rollout,
    RolloutError,
    RolloutState,
    format_bp,
    parse_percent,
)
from rollout.control import big_move
from serve.dashboard.errors import (
    ConfirmationRequired,
    InputTooLarge,
    InvalidInput,
    ReadOnly,
    Unauthorized,
    dashboard_error,
)

MAX_BODY = 4_096
_NAME = re.compile(r"^[A-Za-z0-9_.@ -]{1,64}$")


class Change(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reason: str = Field(min_length=1, max_length=500)
    actor: str | None = Field(None, max_length=64, description="who, as they call themselves")
    expected_revision: int | None = Field(None, ge=0)
    confirm: bool = False


class ShareChange(Change):
    percent: str | int | float


class RouteAdd(Change):
    header: str = Field(min_length=1, max_length=64)
    values: list[str] = Field(min_length=1, max_length=32)
    arm: str


class RouteRemove(Change):
    id: str = Field(min_length=1, max_length=8)


BODIES = {"canary": ShareChange, "route-add": RouteAdd, "route-remove": RouteRemove}


def authorize(configured, header: str | None) -> None:
    """Raise unless `header` is `Bearer <the configured token>` (constant-time comparison)."""
    if configured is None:
        raise ReadOnly("this gateway has no operator token (CANARY_OPERATOR_TOKEN): "
                       "the dashboard is read-only")
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Unauthorized("send the operator token as 'Authorization: Bearer <token>'")
    expected = configured.get_secret_value().encode()
    if not hmac.compare_digest(given.strip().encode(), expected):
        raise Unauthorized("wrong operator token")


def parse(body: bytes, model: type[Change]) -> Change:
    if len(body) > MAX_BODY:
        raise InputTooLarge(f"an action body is at most {MAX_BODY} bytes")
    try:
        return model.model_validate(json.loads(body or b"null"))
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise InvalidInput(f"{where}: {first['msg']}") from None
        raise InvalidInput("the body must be a JSON object") from None


def actor_of(change: Change, client: str | None) -> str:
    where = client or "unknown"
    if change.actor is None or not change.actor.strip():
        return f"dashboard:{where}"
    if not _NAME.match(change.actor.strip()):
        raise InvalidInput("actor: letters, digits, spaces and _ . @ - only (at most 64)")
    return f"dashboard:{change.actor.strip()}@{where}"


def _answer(changed: bool, message: str, state: RolloutState) -> dict:
    return {"changed": changed, "message": message, "state": state.model_dump(mode="json")}


@contextmanager
def rollout_errors(*, conflict: str) -> Iterator[None]:
    """Rollout errors of an action as the dashboard's 4xx/503 (`conflict` follows a 409's
    message: what the operator should do about it)."""
    try:
        yield
    except RolloutError as exc:
        error = dashboard_error(exc, _action_message(exc, conflict))
        if error is None:
            raise
        raise error from None


def _action_message(exc: RolloutError, conflict: str) -> str:
    if isinstance(exc, RevisionConflict):
        return f"{exc}: {conflict}"
    if isinstance(exc, PermissionDenied):
        return (f"{exc} (set CANARY_CONTROL_REDIS_URL to a Redis user that may change the "
                "rollout)")
    return str(exc)


class Actions:
    def __init__(self, rollout: Rollout):
        self.rollout = rollout

    def run(self, kind: str, body: bytes, client: str | None) -> dict:
        """Apply one action ('canary', 'kill', 'unkill', 'route-add' or 'route-remove');
        rollout errors become 4xx/503."""
        change = parse(body, BODIES.get(kind, Change))
        actor = actor_of(change, client)
        with rollout_errors(conflict="nothing was changed; look again and retry"):
            return getattr(self, "_" + kind.replace("-", "_"))(change, actor)

    def _before(self, change: Change) -> RolloutState:
        before = self.rollout.state()
        if change.expected_revision is not None and before.revision != change.expected_revision:
            raise RevisionConflict(change.expected_revision, before.revision)
        return before

    def _confirm(self, change: Change, before: RolloutState, planned: RolloutState,
                 question: str) -> None:
        if big_move(before, planned) and not change.confirm:
            raise ConfirmationRequired(question)

    def _canary(self, change: ShareChange, actor: str) -> dict:
        bp = parse_percent(change.percent)
        before = self._before(change)
        old, new = format_bp(before.canary_bp), format_bp(bp)
        if bp == before.canary_bp:
            return _answer(False, f"canary already at {new}: nothing changed", before)
        self._confirm(change, before, before.model_copy(update={"canary_bp": bp}),
                      f"Move canary from {old} to {new} (revision {before.revision})?")
        _, after = self.rollout.set_canary(bp, actor=actor, reason=change.reason,
                                           expected_revision=before.revision)
        note = " (the kill switch is on: traffic stays on baseline)" if after.kill else ""
        return _answer(True, f"canary {old} -> {new}{note}", after)

    def _route_add(self, change: RouteAdd, actor: str) -> dict:
        _, after = self.rollout.add_route(change.header, change.values, change.arm, actor=actor,
                                          reason=change.reason,
                                          expected_revision=change.expected_revision)
        note = " (the kill switch is on: traffic stays on baseline)" if after.kill else ""
        return _answer(True, f"route {after.routes[-1].describe()} added{note}", after)

    def _route_remove(self, change: RouteRemove, actor: str) -> dict:
        before, after = self.rollout.remove_route(change.id, actor=actor, reason=change.reason,
                                                  expected_revision=change.expected_revision)
        gone = next(r for r in before.routes if r.id == change.id.strip())
        return _answer(True, f"route {gone.describe()} removed", after)

    def _kill(self, change: Change, actor: str) -> dict:
        before, after = self.rollout.kill(actor=actor, reason=change.reason)
        was = "it was already on" if before.kill else "off -> on"
        return _answer(True, f"kill switch on ({was}): all traffic to baseline", after)

    def _unkill(self, change: Change, actor: str) -> dict:
        before = self._before(change)
        if not before.kill:
            return _answer(False, "kill switch already off: nothing changed", before)
        share = format_bp(before.canary_bp)
        self._confirm(change, before, before.model_copy(update={"kill": False}),
                      f"Turn the kill switch off, sending {share} of traffic to optimized "
                      f"(revision {before.revision})?")
        _, after = self.rollout.unkill(actor=actor, reason=change.reason,
                                       expected_revision=before.revision)
        return _answer(True, f"kill switch off: {format_bp(after.effective_bp)} to optimized",
                       after)
