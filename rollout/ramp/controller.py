"""The ramp controller: one loop per application that evaluates the ramp and applies decisions.

Every `interval_s` seconds: take or renew the lease (a controller without it stands by), load
the ramp, and if it is active run the current step's HTTP checks through the injected
checker (concurrently, each within its timeout; the lease is renewed after them), read the
rollout state, the versions the gateways serve, their verify verdict and the metrics; evaluate
(rollout.ramp.machine); apply the decision.

Applying: the share moves first, through `Rollout.set_canary` (audited, actor
`ramp-controller`, the decision as the reason): an advance is a compare-and-set on the state
the evaluation read, so a concurrent change wins and the next tick re-evaluates; a rollback to
0 retries through concurrent writes. Then the ramp record is written (fenced by the lease) when
the decision changed it, and audited with every gate's value and threshold; else the evaluation
is kept as the last one and audited only when its outcome changes or as a periodic heartbeat
(rollout.ramp.audit: a held step writes a few entries an hour, not one per interval). A crash
between the two writes is repaired by the next evaluation (machine rule 1).
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import replace

from rollout.clock import Clock, SystemClock
from rollout.control import Rollout
from rollout.errors import RevisionConflict, RolloutError
from rollout.ramp.audit import Held, heartbeat_reason, outcome, stalled, summarise
from rollout.ramp.checks import Checker, CheckResult, run_checks
from rollout.ramp.machine import CONTROLLER, Decision, Ramp, evaluate
from rollout.ramp.metrics import RampMetrics
from rollout.ramp.store import RampStore
from rollout.store import StateStore
from rollout.verdict import VerdictRules

log = logging.getLogger("canary.ramp")

_ROLLBACK_ATTEMPTS = 20


class RampController:
    def __init__(self, states: StateStore, ramps: RampStore, metrics: RampMetrics, *,
                 clock: Clock | None = None, owner: str | None = None,
                 interval_s: float = 5.0, lease_ttl_s: float = 15.0,
                 audit_heartbeat_s: float = 300.0, checker: Checker | None = None,
                 verdict_rules: VerdictRules | None = None):
        self.clock = clock or SystemClock()
        self.checker = checker  # fetches the plans' HTTP checks (serve.control_plane.checks)
        self.verdict_rules = verdict_rules  # what a verdict must record (rollout.verdict)
        self.states, self.ramps, self.metrics = states, ramps, metrics
        self.rollout = Rollout(states, self.clock)
        self.owner = owner or f"{CONTROLLER}-{uuid.uuid4().hex[:12]}"
        self.interval_s, self.lease_ttl_s = interval_s, lease_ttl_s
        self.audit_heartbeat_s = audit_heartbeat_s
        self.ticks = 0

    def tick(self) -> Decision | None:
        """One evaluation; None when standing by (no lease) or when no ramp is active."""
        self.ticks += 1
        if not self.ramps.acquire(self.owner, self.lease_ttl_s):
            return None
        ramp = self.ramps.get()
        if ramp is None or not ramp.active:
            return None
        checks = self._checks(ramp)
        if checks is None:
            return None  # the lease or the ramp changed while the checks ran: next tick
        state = self.states.get()
        live = self.rollout.live_versions()
        verdict = self.states.get_verdict(*next(iter(live))) if len(live) == 1 else None
        now = self.clock.time()
        decision = evaluate(ramp, state, self.metrics, verdict=verdict, live=live, now=now,
                            checks=checks, verdict_rules=self.verdict_rules)
        moves = decision.target_bp is not None and decision.target_bp != state.canary_bp
        if moves and not self._move(decision, state.revision):
            return decision
        unchanged = decision.ramp.model_copy(update={"updated_at": ramp.updated_at}) == ramp
        if unchanged:
            self._record(decision, now)
        else:
            held = Held.start(outcome(decision), now)
            after = decision.ramp.model_copy(update={"revision": ramp.revision + 1})
            self.ramps.put(ramp, after, actor=CONTROLLER, action=decision.action,
                           reason=decision.reason, detail=dict(decision.detail(),
                                                               held=held.as_dict()),
                           owner=self.owner, evaluation=True)
        if decision.kind not in ("hold", "wait-approval"):
            log.info("ramp %s: %s", decision.kind, decision.reason)
        return decision

    def _checks(self, ramp: Ramp) -> tuple[CheckResult, ...] | None:
        """The current step's HTTP checks, run at once (rollout.ramp.checks.run_checks). They
        may take up to their timeouts, so the lease is renewed after them; None when it was
        lost or the ramp changed meanwhile."""
        specs = ramp.plan.checks_at(ramp.step)
        if not specs:
            return ()
        results = run_checks(self.checker, specs)
        if not self.ramps.acquire(self.owner, self.lease_ttl_s):
            return None
        current = self.ramps.get()
        return results if current is not None and current.revision == ramp.revision else None

    def _record(self, decision: Decision, now: float) -> None:
        """Keep an evaluation that changed nothing as the last one; audit it when its outcome
        changed or as the heartbeat (rollout.ramp.audit)."""
        previous = Held.from_last(self.ramps.last_evaluation())
        held, why = summarise(previous, outcome(decision), now, self.audit_heartbeat_s)
        reason = decision.reason
        if why == "heartbeat":
            reason = heartbeat_reason(reason, previous, held)
        if not held.stalled and stalled(decision):
            held = replace(held, stalled=True)
            self._note_stalled(decision, now)
        self.ramps.record(ts=now, actor=CONTROLLER, action=decision.action, reason=reason,
                          detail=dict(decision.detail(), held=held.as_dict()),
                          audit=why is not None)

    def _note_stalled(self, decision: Decision, now: float) -> None:
        """Audit (once per stall: rollout.ramp.audit.Held.stalled) that a held ramp passed its
        step's soak time: the `ramp-stalled` notification."""
        ramp = decision.ramp
        where = f"step {ramp.step + 1}" if ramp.step >= 0 else "before its first step"
        self.states.note(
            ts=now, actor=CONTROLLER, action="ramp-stalled",
            reason=f"held {where} past its soak time: {decision.reason}",
            detail={"step": ramp.step, "status": ramp.status, "decision": decision.kind,
                    "time_in_step_s": decision.time_in_step_s},
        )

    def _move(self, decision: Decision, revision: int) -> bool:
        """Set the decided share; False when an advance lost to a concurrent change."""
        if decision.kind not in ("rollback", "deadline"):  # a deadline's share is 0
            try:
                self.rollout.set_canary(decision.target_bp, actor=CONTROLLER,
                                        reason=decision.reason, expected_revision=revision)
                return True
            except RevisionConflict:
                log.info("ramp: the state changed during the evaluation; re-evaluating")
                return False
        for _ in range(_ROLLBACK_ATTEMPTS):
            try:
                self.rollout.set_canary(0, actor=CONTROLLER, reason=decision.reason)
                return True
            except RevisionConflict:
                continue
        raise RevisionConflict(revision, self.states.get().revision)

    def run(self, stop: threading.Event) -> None:
        """Tick every `interval_s` until `stop` is set, then give the lease up. Errors (an
        unreachable store, a lost lease) are logged and the loop goes on."""
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except RolloutError as exc:
                    log.warning("ramp controller: %s", exc)
                except Exception:  # keep the loop alive; the next tick starts afresh
                    log.exception("ramp controller: unexpected error")
                stop.wait(self.interval_s)
        finally:
            try:
                self.ramps.release(self.owner)
            except RolloutError:
                pass
