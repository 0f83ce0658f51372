"""The operators' audited ramp actions: start, pause, resume, approve, abort, and status.

The CLI and the dashboard both call these, so every path records an actor and a reason in the
audit stream. Each action is a compare-and-set on the ramp's revision, retried a few times when
the controller wrote meanwhile (each retry re-reads the ramp and re-checks the action).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.control import Rollout
from rollout.errors import InvalidChange, RampNotAllowed, RevisionConflict
from rollout.ramp.audit import HELD_KINDS, Held
from rollout.ramp.machine import Ramp
from rollout.ramp.plan import RampPlan
from rollout.ramp.store import RampStore
from rollout.state import format_bp
from rollout.store import StateStore

_ATTEMPTS = 5


@dataclass(frozen=True)
class RampView:
    """What `rollout ramp status` shows."""

    ramp: Ramp | None
    last: dict | None  # the controller's last evaluation
    holder: str | None  # the controller holding the lease
    now: float

    @property
    def time_in_step_s(self) -> float | None:
        ramp = self.ramp
        if ramp is None or ramp.step_started_at is None:
            return None
        end = self.now if ramp.active else ramp.updated_at
        return max(0.0, end - ramp.step_started_at)

    @property
    def held_since(self) -> float | None:
        """Since when an active ramp's evaluations have held the share for the reason of the
        last one (None: not held, or no evaluation yet)."""
        last, ramp = self.last, self.ramp
        if ramp is None or not ramp.active or not last or last["ts"] < ramp.started_at or \
                last.get("decision") not in HELD_KINDS:
            return None  # not held, or the last evaluation is of an earlier ramp
        held = Held.from_last(last)
        return held.since if held is not None else last["ts"]

    @property
    def stalled(self) -> bool:
        """Held past the step's soak time (or before the first step): what holds it is not
        the soak but something that needs a person (a verdict, an approval, the kill switch,
        the versions, traffic). A paused ramp is held on purpose, not stalled."""
        ramp = self.ramp
        if self.held_since is None or ramp.status == "paused":
            return False
        if ramp.step < 0:
            return True
        return (self.time_in_step_s or 0.0) >= ramp.plan.steps[ramp.step].min_duration_s


class RampControl:
    def __init__(self, states: StateStore, ramps: RampStore, clock: Clock | None = None):
        self.clock = clock or SystemClock()
        self.rollout = Rollout(states, self.clock)
        self.states, self.ramps = states, ramps

    def view(self) -> RampView:
        return RampView(self.ramps.get(), self.ramps.last_evaluation(), self.ramps.holder(),
                        self.clock.time())

    def start(self, plan: RampPlan, *, actor: str, reason: str, force: bool = False) -> Ramp:
        """A new ramp from the current share. Refused while another ramp is active, when the
        plan's first step is not above the current share, or while the gateways do not report
        one pair of versions. `force` lets it climb without a passing verify verdict."""
        actor, reason = _who(actor, reason)
        before = self.ramps.get()
        if before is not None and before.active:
            raise RampNotAllowed(f"a ramp is already {before.status} (step {before.step + 1} of "
                                 f"{len(before.plan.steps)}): abort it first")
        state = self.states.get()
        if plan.shares_bp[0] <= state.canary_bp:
            raise RampNotAllowed(
                f"the canary is already at {format_bp(state.canary_bp)}: the plan's first step "
                f"({format_bp(plan.shares_bp[0])}) must be above it")
        live = self.rollout.live_versions()
        if len(live) != 1:
            raise RampNotAllowed("no gateway reports its versions" if not live else
                                 "gateways serve different versions: wait for the deployment")
        baseline, optimized = next(iter(live))
        verdict = self.states.get_verdict(baseline, optimized)
        now = self.clock.time()
        after = Ramp(
            plan=plan, start_bp=state.canary_bp, forced=force, baseline_version=baseline,
            optimized_version=optimized, reason=reason, started_at=now, started_by=actor,
            updated_at=now, revision=(before.revision if before else 0) + 1,
        )
        detail = {"plan": plan.model_dump(mode="json"), "forced": force,
                  "versions": [baseline, optimized],
                  "verdict_passed": None if verdict is None else verdict.passed}
        action = "ramp-start --force" if force else "ramp-start"
        return self.ramps.put(before, after, actor=actor, action=action, reason=reason,
                              detail=detail)

    def pause(self, *, actor: str, reason: str) -> Ramp:
        """Stop the climb (the gates still roll back a failing canary)."""
        return self._change("ramp-pause", actor, reason, lambda r: _need(r, "running", "pause")
                            or {"status": "paused"})

    def resume(self, *, actor: str, reason: str) -> Ramp:
        """Let a paused ramp climb again; its progress deadline counts from now."""
        return self._change("ramp-resume", actor, reason, lambda r: _need(r, "paused", "resume")
                            or {"status": "running", "progress_since": self.clock.time()})

    def approve(self, *, actor: str, reason: str) -> Ramp:
        """Approve the next step that asks for an approval and has none yet."""
        def change(ramp: Ramp) -> dict:
            _need(ramp, ("running", "paused"), "approve")
            waiting = [i for i, step in enumerate(ramp.plan.steps)
                       if i > ramp.step and step.approval and i not in ramp.approved]
            if not waiting:
                raise RampNotAllowed("no step of this ramp is waiting for an approval")
            return {"approved": (*ramp.approved, waiting[0])}
        return self._change("ramp-approve", actor, reason, change)

    def abort(self, *, actor: str, reason: str) -> Ramp:
        """End the ramp and roll the share back to 0 (both audited)."""
        ramp = self._change("ramp-abort", actor, reason, lambda r: _need(
            r, ("running", "paused"), "abort") or {"status": "aborted", "reason": reason})
        if self.states.get().canary_bp:
            self.rollout.set_canary(0, actor=actor, reason=f"ramp aborted: {reason}")
        return ramp

    def _change(self, action: str, actor: str, reason: str,
                change: Callable[[Ramp], dict]) -> Ramp:
        actor, reason = _who(actor, reason)
        for _ in range(_ATTEMPTS):
            before = self.ramps.get()
            if before is None:
                raise RampNotAllowed("no ramp has been started")
            update = change(before)
            after = before.model_copy(update={**update, "updated_at": self.clock.time(),
                                              "revision": before.revision + 1})
            try:
                return self.ramps.put(before, after, actor=actor, action=action, reason=reason,
                                      detail={"step": after.step, "status": after.status})
            except RevisionConflict as exc:
                conflict = exc
        raise conflict


def _who(actor: str, reason: str) -> tuple[str, str]:
    actor, reason = actor.strip(), reason.strip()
    if not actor:
        raise InvalidChange("every change must name an actor")
    if not reason:
        raise InvalidChange("every change must give a reason")
    return actor, reason


def _need(ramp: Ramp, statuses: str | tuple[str, ...], what: str) -> None:
    allowed = (statuses,) if isinstance(statuses, str) else statuses
    if ramp.status not in allowed:
        raise RampNotAllowed(f"cannot {what}: the ramp is {ramp.status}")
