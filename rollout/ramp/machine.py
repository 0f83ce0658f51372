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

Invariants: the share is only ever raised by an `advance` (never while the kill switch is on,
while paused, while waiting for approval, or without a passing verdict unless forced); every
decision carries every gate's value and threshold; a rollback always sets the share to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.agreement import agreement_cs
from rollout.ramp.checks import CheckResult, unanswered
from rollout.ramp.metrics import RampMetrics
from rollout.ramp.plan import Gates, RampPlan
from rollout.state import RolloutState, format_bp
from rollout.verdict import Verdict

CONTROLLER = "ramp-controller"  # the actor of every change the controller makes
SHADOW_GATES = ("agreement_lower_bound", "confident_flip_rate")  # wait for shadow pairs
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
class GateResult:
    name: str
    value: float | None
    threshold: float | None
    status: Literal["pass", "fail", "wait", "n/a"]
    note: str = ""

    def text(self) -> str:
        value = "-" if self.value is None else f"{self.value:.4g}"
        threshold = "-" if self.threshold is None else f"{self.threshold:.4g}"
        op = ">=" if self.name == "agreement_lower_bound" else "<="
        return f"{self.name} {value} {op} {threshold}: {self.status}" + (
            f" ({self.note})" if self.note else "")


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


def _agreement_gate(gates: Gates, metrics: RampMetrics, shadow_s: int, span: str) -> tuple:
    """(value, threshold, bad, note) of `agreement_lower_bound`: the anytime-valid 95 %
    confidence sequence (rollout.agreement.agreement_cs) over the step's shadow pairs. Its
    lower end at or above the threshold passes, its upper end below it fails; a threshold
    inside it waits for more pairs (None: neither side is proven yet)."""
    threshold = gates.agreement_lower_bound
    pairs, agreed = metrics.agreement(shadow_s)
    lower, upper = agreement_cs(agreed, pairs, threshold)
    if pairs < gates.min_agreement_pairs:
        return (lower if pairs else None, threshold, None,
                f"{pairs}/{gates.min_agreement_pairs} shadow pairs in {span}")
    bad = False if lower >= threshold else True if upper < threshold else None
    return lower, threshold, bad, (f"anytime 95% CS [{lower:.4f}, {upper:.4f}] of "
                                   f"{agreed}/{pairs} agreed in {span}")


def _confident_gate(gates: Gates, metrics: RampMetrics, shadow_s: int, span: str) -> tuple:
    """(value, threshold, bad, note) of `confident_flip_rate`: the share of the step's shadow
    pairs at a baseline margin >= `min_margin` whose labels differ."""
    pairs, flips = metrics.confident(shadow_s, gates.min_margin)
    where = f"at baseline margin >= {gates.min_margin:g} in {span}"
    if pairs < gates.min_agreement_pairs:
        return (flips / pairs if pairs else None, gates.confident_flip_rate, None,
                f"{pairs}/{gates.min_agreement_pairs} confident shadow pairs {where}")
    rate = flips / pairs
    return rate, gates.confident_flip_rate, rate > gates.confident_flip_rate, \
        f"{flips} of {pairs} flipped {where}"


def judge_gates(ramp: Ramp, metrics: RampMetrics, window_s: int,
                step_s: int | None = None) -> tuple[int, list[GateResult]]:
    """Every gate of the plan over the last `window_s` seconds, and the canary's sample count;
    the two shadow gates judge the step's whole `step_s` seconds (capped at what the metrics
    keep, `metrics.horizon_s`), a sample that only grows, as an anytime-valid bound needs."""
    gates = ramp.plan.gates
    canary, baseline = metrics.arm("optimized", window_s), metrics.arm("baseline", window_s)
    samples = canary.requests
    enough = samples >= gates.min_samples
    few = f"{samples}/{gates.min_samples} samples"
    results = []

    def add(name, value, threshold, bad: bool | None, note=""):
        """`bad` None: cannot be judged, `note` says why (`wait`: holds; `n/a`: does not)."""
        if not enough:
            status, note = "wait", few
        elif bad is None:
            status = "wait" if name in SHADOW_GATES else "n/a"
        else:
            status = "fail" if bad else "pass"
        results.append(GateResult(name, value, threshold, status, note))

    shadow_s = min(step_s or window_s, metrics.horizon_s)
    span = (f"the last {shadow_s}s: telemetry retention" if step_s and step_s > shadow_s
            else f"the step's {shadow_s}s")
    if gates.agreement_lower_bound is not None:
        add("agreement_lower_bound", *_agreement_gate(gates, metrics, shadow_s, span))
    if gates.confident_flip_rate is not None:
        add("confident_flip_rate", *_confident_gate(gates, metrics, shadow_s, span))
    if gates.error_rate_delta is not None:
        threshold = (baseline.error_rate or 0.0) + gates.error_rate_delta
        value = canary.error_rate or 0.0
        add("error_rate", value, threshold, value > threshold)
    if gates.timeout_rate is not None:
        value = canary.timeout_rate or 0.0
        add("timeout_rate", value, gates.timeout_rate, value > gates.timeout_rate)
    if gates.p99_ratio is not None:
        if baseline.p99_ms is None or baseline.requests < gates.min_samples:
            add("p99_ratio", canary.p99_ms, None, None,
                f"{baseline.requests} baseline samples to compare with")
        else:
            threshold = baseline.p99_ms * gates.p99_ratio
            add("p99_ratio", canary.p99_ms, threshold, (canary.p99_ms or 0.0) > threshold)
    if gates.p99_ms is not None:
        add("p99_ms", canary.p99_ms, gates.p99_ms, (canary.p99_ms or 0.0) > gates.p99_ms)
    if gates.fallback_rate is not None:
        value = canary.fallbacks / samples if samples else 0.0
        add("fallback_rate", value, gates.fallback_rate, value > gates.fallback_rate)
    return samples, results


def evaluate(ramp: Ramp, state: RolloutState, metrics: RampMetrics, *, verdict: Verdict | None,
             live: set[tuple[str, str]], now: float,
             checks: tuple[CheckResult, ...] = ()) -> Decision:
    """One evaluation of an active ramp (see the module docstring for the rules, in order);
    `checks`: the results of the current step's HTTP checks."""
    return _deadline(_evaluate(ramp, state, metrics, verdict=verdict, live=live, now=now,
                               checks=checks), now)


def _evaluate(ramp: Ramp, state: RolloutState, metrics: RampMetrics, *,
              verdict: Verdict | None, live: set[tuple[str, str]], now: float,
              checks: tuple[CheckResult, ...]) -> Decision:
    """Rules 1 to 7."""
    if not ramp.active:
        return Decision("idle", f"the ramp is {ramp.status}", ramp)
    facts = {"kill": state.kill, "state_revision": state.revision}

    def decide(kind: Kind, reason: str, ramp_after: Ramp, **extra) -> Decision:
        return Decision(kind, reason, ramp_after.model_copy(update={"updated_at": now}),
                        facts=facts, **extra)

    # 1. the share is the ramp's, or an interrupted advance
    if state.canary_bp != ramp.expected_bp:
        nxt = ramp.next_step
        if (nxt is not None and state.canary_bp == ramp.plan.shares_bp[nxt]
                and state.updated_by == CONTROLLER):
            ramp = ramp.model_copy(update={"step": nxt, "step_started_at": state.updated_at,
                                           "failures": 0})
        else:
            reason = (f"aborted: the share is {format_bp(state.canary_bp)}, not the "
                      f"{format_bp(ramp.expected_bp)} this ramp set (changed by "
                      f"{state.updated_by or 'nobody'}: {state.reason or '-'})")
            return decide("abort", reason, ramp.model_copy(
                update={"status": "aborted", "reason": reason}))
    # 2. versions
    if len(live) != 1:
        why = "no gateway reports its versions" if not live else \
            "gateways serve different versions (a deployment in progress)"
        return decide("hold", f"hold: {why}", ramp)
    baseline_version, optimized_version = next(iter(live))
    if ramp.optimized_version and optimized_version != ramp.optimized_version:
        reason = (f"rollback: the optimized version changed from {ramp.optimized_version} to "
                  f"{optimized_version} during the ramp")
        return decide("rollback", reason, ramp.model_copy(
            update={"status": "aborted", "reason": reason}), target_bp=0)
    verdict_facts = None if verdict is None else {
        "passed": verdict.passed, "failures": list(verdict.failures),
        "baseline_version": verdict.baseline_version,
        "optimized_version": verdict.optimized_version}
    # 3. kill switch
    if state.kill:
        return decide("hold", "hold: the kill switch is on", ramp, verdict=verdict_facts)
    # 4. gates
    gates: list[GateResult] = []
    samples = window = 0
    in_step = None
    if ramp.step >= 0:
        started = ramp.step_started_at if ramp.step_started_at is not None else now
        in_step = max(0.0, now - started)
        step_s = max(1, int(now) - int(started) + 1)
        window = min(ramp.plan.window_s, step_s)
        samples, gates = judge_gates(ramp, metrics, window, step_s)
    results = _step_checks(ramp, checks)
    seen = dict(gates=tuple(gates), samples=samples, window_s=window, time_in_step_s=in_step,
                verdict=verdict_facts, checks=results)
    failing = [g for g in (*gates, *results) if g.status == "fail"]
    if failing:
        failures = ramp.failures + 1
        text = "; ".join(g.text() for g in failing)
        if failures > ramp.plan.failures_tolerated:
            reason = f"rollback: {text}"
            return decide("rollback", reason, ramp.model_copy(update={
                "status": "aborted", "reason": reason, "failures": failures}),
                target_bp=0, **seen)
        return decide("hold", f"hold: failing {failures}/{ramp.plan.failures_tolerated} "
                      f"tolerated: {text}", ramp.model_copy(update={"failures": failures}),
                      **seen)
    ramp = ramp.model_copy(update={"failures": 0})
    # 5. paused
    if ramp.status == "paused":
        return decide("hold", "hold: paused", ramp, **seen)
    # 6. the step's soak
    if ramp.step >= 0:
        step = ramp.plan.steps[ramp.step]
        waits = []
        if in_step < step.min_duration_s:
            waits.append(f"in step {in_step:.0f}s of {step.min_duration_s:g}s")
        if samples < step.min_samples:
            waits.append(f"{samples}/{step.min_samples} canary samples")
        waits += [g.text() for g in (*gates, *results) if g.status == "wait"]
        if waits:
            return decide("hold", "hold: " + "; ".join(waits), ramp, **seen)
    # 7. promote, or the next step
    nxt = ramp.next_step
    if nxt is None:
        reason = f"promote: {format_bp(ramp.expected_bp)} passed every gate"
        return decide("promote", reason, ramp.model_copy(
            update={"status": "promoted", "reason": reason}), **seen)
    target = ramp.plan.shares_bp[nxt]
    if ramp.waiting_approval() is not None:
        return decide("wait-approval", f"waiting for approval of step {nxt + 1} "
                      f"({format_bp(target)}): `rollout ramp approve`", ramp, **seen)
    passed = verdict is not None and verdict.passed
    if not passed and not ramp.forced:
        why = "no verify verdict" if verdict is None else "the verify verdict failed"
        return decide("hold", f"hold: {why} for {baseline_version} / {optimized_version} "
                      "(run `rollout verify`, or start the ramp with --force)", ramp, **seen)
    note = "" if passed else " (forced: no passing verify verdict)"
    reason = f"advance {format_bp(ramp.expected_bp)} -> {format_bp(target)}{note}"
    return decide("advance", reason, ramp.model_copy(
        update={"step": nxt, "step_started_at": now, "failures": 0, "progress_since": None}),
        target_bp=target, **seen)


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
