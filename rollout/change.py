"""What every audited change stamps on the state, and the kill switch's two changes, written once
for the two writers of the rollout state: rollout.control.Rollout (over a StateStore, pydantic
states) and rollout.killswitch.QuickSwitch (over a bare Redis connection, plain states: what
`rollout kill` runs). Standard library only.

The kill switch's rules: `kill` always wins (it reads the state and writes on top of it, again
up to KILL_ATTEMPTS times while concurrent writes take the revision first, so an operator
pulling the canary back is never told to try again); `unkill` with `expected_revision` (the
state the operator confirmed) writes only on top of that revision, and without it retries like
`kill`. Each writer supplies `state()` and `_write(before, *, actor, action, reason, **changes)`,
a compare-and-set of `before` with `changes` and `stamp(...)` applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from rollout.errors import InvalidChange, RevisionConflict

KILL_ATTEMPTS = 20


def stamp(before, *, actor: str, reason: str, now: float, seen: int = 0) -> dict:
    """The fields every change sets on top of `before` (the next revision, when, who, why);
    InvalidChange without an actor or a reason (surrounding blanks do not count).

    The next revision is above both `before`'s and `seen`, the highest revision a gateway
    reports routing by: a store that lost writes (a failover to a replica that missed them, a
    restart without its data) is behind what gateways saw, and they follow no revision until
    one above it arrives (rollout.watcher)."""
    actor, reason = actor.strip(), reason.strip()
    if not actor:
        raise InvalidChange("every change must name an actor")
    if not reason:
        raise InvalidChange("every change must give a reason")
    return {"revision": max(before.revision, seen) + 1, "updated_at": now, "updated_by": actor,
            "reason": reason}


def highest_seen(reports: Iterable[str]) -> int:
    """The highest `state_revision` among gateways' stored reports (DeploymentReport JSON, as
    the `deployed` hash holds them); a report this version cannot read counts as 0."""
    highest = 0
    for raw in reports:
        try:
            revision = json.loads(raw).get("state_revision", 0)
        except (ValueError, AttributeError):
            continue
        if type(revision) is int:
            highest = max(highest, revision)
    return highest


def jumped(before, after) -> str | None:
    """What to tell an operator whose change skipped revisions (`stamp`'s `seen`), or None."""
    if after.revision <= before.revision + 1:
        return None
    return (f"the store was at revision {before.revision}, behind revision "
            f"{after.revision - 1} that gateways routed by (a failover lost writes, or Redis "
            f"restarted without its data): they kept all traffic on baseline until this change, "
            f"numbered {after.revision}; check `rollout audit` for what was lost")


class KillSwitch:
    """`kill` and `unkill` over a writer's `state()` and `_write(...)`; each returns the state
    before and after."""

    def state(self):
        raise NotImplementedError

    def _write(self, before, *, actor: str, action: str, reason: str, **changes):
        raise NotImplementedError

    def kill(self, *, actor: str, reason: str):
        return self._until_written(actor=actor, reason=reason, action="kill", kill=True)

    def unkill(self, *, actor: str, reason: str, expected_revision: int | None = None):
        """Turn the kill switch off. With `expected_revision` (the state the operator confirmed)
        it writes only on top of that revision; without, it retries through concurrent writes."""
        if expected_revision is None:
            return self._until_written(actor=actor, reason=reason, action="unkill", kill=False)
        before = self.state()
        if before.revision != expected_revision:
            raise RevisionConflict(expected_revision, before.revision)
        return before, self._write(before, actor=actor, reason=reason, action="unkill",
                                   kill=False)

    def _until_written(self, **write):
        for _ in range(KILL_ATTEMPTS):
            before = self.state()
            try:
                return before, self._write(before, **write)
            except RevisionConflict:
                continue
        raise RevisionConflict(before.revision, self.state().revision)
