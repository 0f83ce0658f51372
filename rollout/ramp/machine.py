"""The ramp's state machine: one pure evaluation turns what the controller read into a decision.

States (`Ramp.status`): `running` -> `promoted` | `aborted`, and `running` <-> `paused`
(operators). `promoted` and `aborted` are final; a new ramp is a new `ramp start`.
`Ramp.step` is the index of the plan step whose share the ramp has set (-1: none yet, the
share is still the one it started from).

One evaluation (`evaluate`), in this order:

1. The share must be the one the ramp set. If it is the next step's share, written by the
   controller, an advance was interrupted between its two writes: the ramp adopts it. Any other
   share was changed by someone else: the ramp is aborted without touching the share.
2. The gateways must report exactly one pair of versions (else hold), and the optimized version
   must be the one the ramp started with: a new model mid-ramp rolls back.
3. Kill switch on: hold. Nothing else is judged, nothing is raised.
4. Gates (once a step's share is set), over the step's last `window_s` seconds at most: each is
   `pass`, `fail`, `wait` (too few samples or shadow pairs to judge) or `n/a` (no baseline to
   compare with). The two shadow gates judge every shadow pair since the step started (a
   sample that only grows; at most the telemetry's retention, `metrics.horizon_s`) and need
   `min_agreement_pairs`: `agreement_lower_bound` all shadow pairs, through an anytime-valid
   95 % confidence sequence (rollout.agreement.agreement_cs: passes when its lower end reaches
   the threshold, fails when its upper end is below it, else waits), so looking every few
   seconds does not inflate the chance of passing a canary that is truly below the threshold;
   `confident_flip_rate` those at a baseline margin >= `gates.min_margin` (a flip there is
   damage; one below is a near tie that only the overall agreement counts). A failing
   evaluation counts; the failure after `failures_tolerated` consecutive ones rolls back:
   share 0, status `aborted`, the failing gates as the reason. A passing evaluation resets the
   count. Gates are judged while paused too: pausing stops the climb, not the protection.
5. Paused: hold.
6. The step must have lasted `min_duration_s`, seen `min_samples` canary requests in the window,
   and have no gate waiting; else hold.
7. At the last step (100 %): promote. Otherwise the next step needs its approval (if the plan
   asks for one; else `wait-approval`) and a passing `rollout verify` verdict for the versions
   served (unless the ramp was started with `--force`); then advance.
8. Progress deadline (`progress_deadline_s`, when the plan sets one): a running ramp whose
   evaluation holds or waits for approval (rules 2, 3, 4 tolerated, 6, 7), measured from the
   later of its step's end of soak (start + `min_duration_s`; before the first step, the
   ramp's start) and its last resume (`progress_since`), for longer than the deadline ends as
   `on_deadline` says: `abort` sets the share to 0 and the status `aborted`, `pause` the status
   `paused`; the decision is `deadline` (audited `ramp-deadline`) and its reason says which
   step, for how long, and what held it. A paused ramp is never subject to the deadline.

HTTP checks (rollout.ramp.checks) are gates too: the controller runs the step's checks and
passes their results in; a `fail` counts like a failing gate (rule 4), a `wait` holds like a
gate in `wait` (rule 6), and a check of the step without a result waits.

In code: each rule is one `_rule_*` function, run in order by `evaluate` (`RULES`) until one
decides; each gate is a row of rollout.ramp.gates.GATE_SPECS (the `Gates` field that turns it
on, how its value and threshold are read, the comparison a pass needs, and whether a gate that
cannot be judged waits or is `n/a`), all judged by `judge_gates`.

Invariants: the share is only ever raised by an `advance` (never while the kill switch is on,
while paused, while waiting for approval, or without a passing verdict unless forced); every
decision carries every gate's value and threshold; a rollback always sets the share to 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.ramp.checks import CheckResult, unanswered
from rollout.ramp.gates import SHADOW_GATES as SHADOW_GATES  # re-exported: the CLI's view
from rollout.ramp.gates import GateResult, judge_gates
from rollout.ramp.metrics import RampMetrics
from rollout.ramp.plan import RampPlan
from rollout.state import RolloutState, format_bp
from rollout.verdict import Verdict, VerdictRules, verdict_problems

CONTROLLER = "ramp-controller"  # the actor of every change the controller makes
ACTIVE = ("running", "paused")

Status = Literal["running", "paused", "promoted", "aborted"]
Kind = Literal["advance", "hold", "wait-approval", "promote", "rollback", "abort", "deadline",
               "idle"]
STUCK = ("hold", "wait-approval")  # decisions a progress deadline can end


class Ramp(BaseModel):
    """A ramp in progress (or finished): its plan and where it stands. Each write bumps
    `revision` by one (compare-and-set, like the rollout state)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: RampPlan
    status: Status = "running"
    step: int = Field(-1, ge=-1)
    step_started_at: float | None = None
    progress_since: float | None = None  # the last resume (a progress deadline counts from it)
    start_bp: int = Field(0, ge=0)
    failures: int = Field(0, ge=0)
    approved: tuple[int, ...] = ()
    forced: bool = False
    baseline_version: str = ""
    optimized_version: str = ""
    reason: str = ""
    started_at: float = 0.0
    started_by: str = ""
    updated_at: float = 0.0
    revision: int = Field(0, ge=0)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def expected_bp(self) -> int:
        """The share this ramp has set."""
        return self.plan.shares_bp[self.step] if self.step >= 0 else self.start_bp

    @property
    def next_step(self) -> int | None:
        return self.step + 1 if self.step + 1 < len(self.plan.steps) else None

    def waiting_approval(self) -> int | None:
        """The next step, when it needs an approval it has not had."""
        nxt = self.next_step
        if nxt is not None and self.plan.steps[nxt].approval and nxt not in self.approved:
            return nxt
        return None


@dataclass(frozen=True)
class Decision:
    """What one evaluation decided, the ramp after it, and everything it saw."""

    kind: Kind
    reason: str
    ramp: Ramp
    target_bp: int | None = None  # the share to set; None: leave it
    gates: tuple[GateResult, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    samples: int = 0
    window_s: int = 0
    time_in_step_s: float | None = None
    verdict: dict | None = None
    facts: dict = field(default_factory=dict)

    @property
    def action(self) -> str:
        return f"ramp-{self.kind}" if self.kind != "hold" else "ramp-evaluate"

    def detail(self) -> dict:
        """The audit record's detail: values and thresholds, as plain JSON."""
        ramp = self.ramp
        return {
            "decision": self.kind, "status": ramp.status, "step": ramp.step,
            "share_bp": ramp.expected_bp, "target_bp": self.target_bp,
            "time_in_step_s": self.time_in_step_s, "window_s": self.window_s,
            "samples": self.samples, "failures": ramp.failures,
            "failures_tolerated": ramp.plan.failures_tolerated,
            "gates": [g.__dict__ for g in self.gates], "verdict": self.verdict,
            "checks": [c.as_dict() for c in self.checks],
            "forced": ramp.forced, **self.facts,
        }


# --- evaluation: one function per rule, in order ---------------------------------------------


def evaluate(ramp: Ramp, state: RolloutState, metrics: RampMetrics, *, verdict: Verdict | None,
             live: set[tuple[str, str]], now: float,
             checks: tuple[CheckResult, ...] = (),
             verdict_rules: VerdictRules | None = None) -> Decision:
    """One evaluation of an active ramp (see the module docstring for the rules, in order);
    `checks`: the results of the current step's HTTP checks; `verdict_rules`: what a verdict
    must have been judged with (rollout.verdict.verdict_problems; None: any passing one)."""
    if not ramp.active:
        return _deadline(Decision("idle", f"the ramp is {ramp.status}", ramp), now)
    turn = _Turn(ramp, state, metrics, verdict, live, now, checks, verdict_rules)
    for rule in RULES:
        decision = rule(turn)
        if decision is not None:
            return _deadline(decision, now)
    raise AssertionError("rule 7 always decides")  # pragma: no cover


@dataclass
class _Turn:
    """One evaluation: its inputs, the ramp as the rules so far left it, and what they saw.
    A rule returns a Decision (the evaluation ends) or None (the next rule goes on)."""

    ramp: Ramp
    state: RolloutState
    metrics: RampMetrics
    verdict: Verdict | None
    live: set[tuple[str, str]]
    now: float
    checks: tuple[CheckResult, ...]
    verdict_rules: VerdictRules | None = None
    versions: tuple[str, str] = ("", "")  # (baseline, optimized) the gateways serve: rule 2
    seen: dict = field(default_factory=dict)  # what rule 4 judged, carried by later decisions
    facts: dict = field(init=False)

    def __post_init__(self):
        self.facts = {"kill": self.state.kill, "state_revision": self.state.revision}

    def decide(self, kind: Kind, reason: str, ramp_after: Ramp | None = None,
               **extra) -> Decision:
        after = self.ramp if ramp_after is None else ramp_after
        return Decision(kind, reason, after.model_copy(update={"updated_at": self.now}),
                        facts=self.facts, **extra)

    def end(self, kind: Kind, reason: str, status: Status, **extra) -> Decision:
        """A decision that ends the ramp as `status`, with `reason` as its reason."""
        return self.decide(kind, reason, self.ramp.model_copy(
            update={"status": status, "reason": reason}), **extra)

    @property
    def verdict_facts(self) -> dict | None:
        verdict = self.verdict
        return None if verdict is None else {
            "passed": verdict.passed, "failures": list(verdict.failures),
            "baseline_version": verdict.baseline_version,
            "optimized_version": verdict.optimized_version}


def _rule_share(turn: _Turn) -> Decision | None:
    """1. The share is the ramp's; the next step's share written by the controller is an
    interrupted advance, adopted; any other share aborts the ramp (the share untouched)."""
    ramp, state = turn.ramp, turn.state
    if state.canary_bp == ramp.expected_bp:
        return None
    nxt = ramp.next_step
    if (nxt is not None and state.canary_bp == ramp.plan.shares_bp[nxt]
            and state.updated_by == CONTROLLER):
        turn.ramp = ramp.model_copy(update={"step": nxt, "step_started_at": state.updated_at,
                                            "failures": 0})
        return None
    reason = (f"aborted: the share is {format_bp(state.canary_bp)}, not the "
              f"{format_bp(ramp.expected_bp)} this ramp set (changed by "
              f"{state.updated_by or 'nobody'}: {state.reason or '-'})")
    return turn.end("abort", reason, "aborted")


def _rule_versions(turn: _Turn) -> Decision | None:
    """2. Exactly one pair of versions served (else hold), its optimized version the one the
    ramp started with (else roll back)."""
    if len(turn.live) != 1:
        why = "no gateway reports its versions" if not turn.live else \
            "gateways serve different versions (a deployment in progress)"
        return turn.decide("hold", f"hold: {why}")
    turn.versions = next(iter(turn.live))
    started, served = turn.ramp.optimized_version, turn.versions[1]
    if started and served != started:
        reason = (f"rollback: the optimized version changed from {started} to {served} "
                  "during the ramp")
        return turn.end("rollback", reason, "aborted", target_bp=0)
    return None


def _rule_kill(turn: _Turn) -> Decision | None:
    """3. Kill switch on: hold, judging nothing."""
    if turn.state.kill:
        return turn.decide("hold", "hold: the kill switch is on", verdict=turn.verdict_facts)
    return None


def _rule_gates(turn: _Turn) -> Decision | None:
    """4. Gates and checks: a failure counts, the one past `failures_tolerated` rolls back;
    a passing evaluation resets the count."""
    gates, results = _observe(turn)
    failing = [g for g in (*gates, *results) if g.status == "fail"]
    ramp = turn.ramp
    if not failing:
        turn.ramp = ramp.model_copy(update={"failures": 0})
        return None
    failures, tolerated = ramp.failures + 1, ramp.plan.failures_tolerated
    text = "; ".join(g.text() for g in failing)
    if failures > tolerated:
        reason = f"rollback: {text}"
        return turn.decide("rollback", reason, ramp.model_copy(update={
            "status": "aborted", "reason": reason, "failures": failures}),
            target_bp=0, **turn.seen)
    return turn.decide("hold", f"hold: failing {failures}/{tolerated} tolerated: {text}",
                       ramp.model_copy(update={"failures": failures}), **turn.seen)


def _observe(turn: _Turn) -> tuple[list[GateResult], tuple[CheckResult, ...]]:
    """Judge the step's gates (once its share is set) over its last `window_s` seconds at
    most, and its checks; what was seen goes into `turn.seen` for every later decision."""
    ramp, now = turn.ramp, turn.now
    gates: list[GateResult] = []
    samples = window = 0
    in_step = None
    if ramp.step >= 0:
        started = ramp.step_started_at if ramp.step_started_at is not None else now
        in_step = max(0.0, now - started)
        step_s = max(1, int(now) - int(started) + 1)
        window = min(ramp.plan.window_s, step_s)
        samples, gates = judge_gates(ramp, turn.metrics, window, step_s)
    results = _step_checks(ramp, turn.checks)
    turn.seen = dict(gates=tuple(gates), samples=samples, window_s=window,
                     time_in_step_s=in_step, verdict=turn.verdict_facts, checks=results)
    return gates, results


def _rule_paused(turn: _Turn) -> Decision | None:
    """5. Paused: hold (the gates were judged)."""
    if turn.ramp.status == "paused":
        return turn.decide("hold", "hold: paused", **turn.seen)
    return None


def _rule_soak(turn: _Turn) -> Decision | None:
    """6. The step has lasted `min_duration_s`, seen `min_samples` canary requests, and no
    gate or check waits; else hold."""
    ramp, seen = turn.ramp, turn.seen
    if ramp.step < 0:
        return None
    step, in_step, samples = ramp.plan.steps[ramp.step], seen["time_in_step_s"], seen["samples"]
    waits = []
    if in_step < step.min_duration_s:
        waits.append(f"in step {in_step:.0f}s of {step.min_duration_s:g}s")
    if samples < step.min_samples:
        waits.append(f"{samples}/{step.min_samples} canary samples")
    waits += [g.text() for g in (*seen["gates"], *seen["checks"]) if g.status == "wait"]
    if waits:
        return turn.decide("hold", "hold: " + "; ".join(waits), **seen)
    return None


def _rule_promote(turn: _Turn) -> Decision | None:
    """7a. At the last step (100 %): promote."""
    ramp = turn.ramp
    if ramp.next_step is not None:
        return None
    reason = f"promote: {format_bp(ramp.expected_bp)} passed every gate"
    return turn.end("promote", reason, "promoted", **turn.seen)


def _rule_approval(turn: _Turn) -> Decision | None:
    """7b. The next step's approval, when the plan asks for one."""
    ramp = turn.ramp
    if ramp.waiting_approval() is None:
        return None
    nxt = ramp.next_step
    return turn.decide("wait-approval", f"waiting for approval of step {nxt + 1} "
                       f"({format_bp(ramp.plan.shares_bp[nxt])}): `rollout ramp approve`",
                       **turn.seen)


def _rule_verdict(turn: _Turn) -> Decision | None:
    """7c. A passing `rollout verify` verdict for the versions served, whose record fits the
    gateway's rules (rollout.verdict.verdict_problems), unless forced."""
    verdict = turn.verdict
    if turn.ramp.forced:
        return None
    if verdict is not None and verdict.passed:
        problems = verdict_problems(verdict, turn.verdict_rules,
                                    speed_optional=turn.ramp.plan.accept_verdict_without_speed)
        if not problems:
            return None
        why = "the verify verdict does not count: " + "; ".join(problems)
    else:
        why = "no verify verdict" if verdict is None else "the verify verdict failed"
    baseline_version, optimized_version = turn.versions
    return turn.decide("hold", f"hold: {why} for {baseline_version} / {optimized_version} "
                       "(run `rollout verify`, or start the ramp with --force)", **turn.seen)


def _rule_advance(turn: _Turn) -> Decision:
    """7d. Advance to the next step's share."""
    ramp, nxt = turn.ramp, turn.ramp.next_step
    target = ramp.plan.shares_bp[nxt]
    passed = turn.verdict is not None and turn.verdict.passed
    note = "" if passed else " (forced: no passing verify verdict)"
    reason = f"advance {format_bp(ramp.expected_bp)} -> {format_bp(target)}{note}"
    return turn.decide("advance", reason, ramp.model_copy(update={
        "step": nxt, "step_started_at": turn.now, "failures": 0, "progress_since": None}),
        target_bp=target, **turn.seen)


RULES: tuple[Callable[[_Turn], Decision | None], ...] = (
    _rule_share, _rule_versions, _rule_kill, _rule_gates, _rule_paused, _rule_soak,
    _rule_promote, _rule_approval, _rule_verdict, _rule_advance,
)  # rules 1 to 7, in order; rule 8 (`_deadline`) then judges the decision


def _step_checks(ramp: Ramp, results: tuple[CheckResult, ...]) -> tuple[CheckResult, ...]:
    """The result of every check of the current step, in plan order; one without a result
    waits (a check never passes unseen)."""
    by_name = {r.name: r for r in results}
    return tuple(by_name.get(c.label) or unanswered(c, "not run")
                 for c in ramp.plan.checks_at(ramp.step))


def _deadline(decision: Decision, now: float) -> Decision:
    """Rule 8: a running ramp held past its progress deadline ends as the plan says."""
    ramp, plan = decision.ramp, decision.ramp.plan
    if plan.progress_deadline_s is None or decision.kind not in STUCK or \
            ramp.status != "running":
        return decision
    if ramp.step >= 0:
        started = ramp.step_started_at if ramp.step_started_at is not None else ramp.started_at
        since = started + plan.steps[ramp.step].min_duration_s
        where = f"step {ramp.step + 1} ({format_bp(ramp.expected_bp)})"
    else:
        since, where = ramp.started_at, f"before step 1 (share {format_bp(ramp.start_bp)})"
    since = max(since, ramp.progress_since or since)
    if now - since <= plan.progress_deadline_s:
        return decision
    held = decision.reason.removeprefix("hold: ")
    reason = f"deadline: {where} could not progress for {now - since:.0f} s: {held}"
    if plan.on_deadline == "pause":
        after, target = ramp.model_copy(update={"status": "paused", "reason": reason}), None
    else:
        after, target = ramp.model_copy(update={"status": "aborted", "reason": reason}), 0
    return replace(decision, kind="deadline", reason=reason, ramp=after, target_bp=target,
                   facts={**decision.facts, "on_deadline": plan.on_deadline,
                          "stuck_s": round(now - since, 3)})
