"""The audited ways to change the rollout state.

Every mutation names an actor and a reason, is a compare-and-set on the revision the caller
read, and lands in the audit log with the state before and after. Kill is the one change that
always wins: it retries through concurrent writes, because an operator pulling the canary back
must never be told to try again. `kill`, `unkill` and what every change stamps on the state are
rollout.change's, shared with `rollout kill`'s rollout.killswitch.QuickSwitch.
"""

from __future__ import annotations

from rollout.change import KillSwitch, stamp
from rollout.clock import Clock, SystemClock
from rollout.errors import InvalidChange, RevisionConflict
from rollout.header_routes import with_route, without_route
from rollout.share import BIG_MOVE_BP, BUCKETS, big_move, format_bp
from rollout.state import RolloutState
from rollout.store import StateStore

__all__ = ["BIG_MOVE_BP", "DEPLOYMENT_TTL_S", "Rollout", "big_move"]

DEPLOYMENT_TTL_S = 60.0  # a gateway report older than this no longer counts as live


class Rollout(KillSwitch):
    """The audited changes over a state store; `kill` and `unkill` are rollout.change's."""

    def __init__(self, store: StateStore, clock: Clock | None = None):
        self.store = store
        self.clock = clock or SystemClock()

    def state(self) -> RolloutState:
        return self.store.get()

    def _write(self, before: RolloutState, *, actor: str, action: str, reason: str, **changes):
        seen = max((r.state_revision for r in self.store.deployments()), default=0)
        stamped = stamp(before, actor=actor, reason=reason, now=self.clock.time(), seen=seen)
        after = before.model_copy(update=dict(changes, **stamped))
        RolloutState.model_validate(after.model_dump())  # re-check field bounds
        return self.store.compare_and_set(before, after, actor=stamped["updated_by"],
                                          action=action, reason=stamped["reason"])

    def set_canary(
        self, bp: int, *, actor: str, reason: str, expected_revision: int | None = None
    ) -> tuple[RolloutState, RolloutState]:
        """Move the canary share to `bp` basis points.

        With `expected_revision`, fail with RevisionConflict unless the state is still at that
        revision (the CLI passes the revision it showed the operator when asking to confirm).
        """
        if not 0 <= bp <= BUCKETS:
            raise InvalidChange(f"canary share must be within 0..{BUCKETS} bp, got {bp}")
        before = self.store.get()
        if expected_revision is not None and before.revision != expected_revision:
            raise RevisionConflict(expected_revision, before.revision)
        action = f"canary {format_bp(before.canary_bp)} -> {format_bp(bp)}"
        versions = self._bind_versions(bp)
        return before, self._write(
            before, actor=actor, action=action, reason=reason, canary_bp=bp, **versions
        )

    def live_versions(self) -> set[tuple[str, str]]:
        """(baseline, optimized) pairs that gateways reported within DEPLOYMENT_TTL_S."""
        now = self.clock.time()
        return {
            (r.baseline_version, r.optimized_version)
            for r in self.store.deployments()
            if now - r.ts <= DEPLOYMENT_TTL_S
        }

    def _bind_versions(self, bp: int) -> dict[str, str]:
        """A share is approved for one optimized model: record the version the gateways serve.

        Gateways route the canary only when the state's optimized version is the one they
        serve, so a share never silently carries over to a newly deployed model. With no live
        report the versions are left as they are; with several (a deployment in progress) a
        non-zero share is refused.
        """
        live = self.live_versions()
        if len(live) == 1:
            baseline, optimized = next(iter(live))
            return {"baseline_version": baseline, "optimized_version": optimized}
        if len(live) > 1 and bp > 0:
            serving = ", ".join(sorted(optimized for _, optimized in live))
            raise InvalidChange(
                f"gateways serve different optimized versions ({serving}): wait until the "
                "deployment has finished, then set the share"
            )
        return {}

    def add_route(
        self, header: str, values: tuple[str, ...] | list[str], arm: str, *, actor: str,
        reason: str, expected_revision: int | None = None,
    ) -> tuple[RolloutState, RolloutState]:
        """Add a header route (rollout.header_routes) with the next free id; audited as `route-add`.
        InvalidChange for a bad header, value or arm, a header value already routed, or a full
        table; RevisionConflict when the state moved on."""
        before = self.store.get()
        if expected_revision is not None and before.revision != expected_revision:
            raise RevisionConflict(expected_revision, before.revision)
        routes = with_route(before.routes, header, values, arm, actor=actor.strip(),
                            reason=reason.strip(), now=self.clock.time())
        return before, self._write(before, actor=actor, action="route-add", reason=reason,
                                   routes=routes)

    def remove_route(
        self, route_id: str, *, actor: str, reason: str, expected_revision: int | None = None
    ) -> tuple[RolloutState, RolloutState]:
        """Remove the route `route_id`; audited as `route-remove`. InvalidChange if unknown."""
        before = self.store.get()
        if expected_revision is not None and before.revision != expected_revision:
            raise RevisionConflict(expected_revision, before.revision)
        routes, _ = without_route(before.routes, route_id.strip())
        return before, self._write(before, actor=actor, action="route-remove", reason=reason,
                                   routes=routes)

    def revert(
        self, revision: int, *, actor: str, reason: str, expected_revision: int | None = None
    ) -> tuple[RolloutState, RolloutState]:
        """Restore the share, kill switch and header routes recorded at `revision` (itself a new,
        audited revision).

        The versions the current share is bound to are kept. A revert that would send traffic to
        an optimized model other than the one deployed now is refused: that share was never
        approved for it.
        """
        target = self.store.state_at(revision)
        before = self.store.get()
        if expected_revision is not None and before.revision != expected_revision:
            raise RevisionConflict(expected_revision, before.revision)
        live = {optimized for _, optimized in self.live_versions()} or {before.optimized_version}
        deployed = next(iter(live)) if len(live) == 1 else None
        bound_elsewhere = bool(target.optimized_version) and target.optimized_version != deployed
        if target.effective_bp > 0 and bound_elsewhere:
            raise InvalidChange(
                f"revision {revision} routed {format_bp(target.canary_bp)} to optimized version "
                f"{target.optimized_version}, but {deployed or 'another version'} is "
                "deployed now: set the share explicitly instead"
            )
        after = self._write(
            before, actor=actor, reason=reason, action=f"revert to revision {revision}",
            canary_bp=target.canary_bp, kill=target.kill, routes=target.routes,
        )
        return before, after
