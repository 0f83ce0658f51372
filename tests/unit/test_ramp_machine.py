"""The ramp's state machine, driven through its controller: in-memory stores, a fake clock and
scripted metrics (no Redis, no Ray)."""

from __future__ import annotations

import pytest

from rollout import RampNotAllowed
from rollout.ramp import CONTROLLER, RampController
from rollout.shadow import PairOutcome
from rollout.verdict import Thresholds, Verdict, VerdictRules
from tests.ramp_harness import BASELINE, OPTIMIZED, PLAN, Harness, ShadowFedMetrics, stats


@pytest.fixture
def h():
    harness = Harness()
    harness.verdict(passed=True)
    return harness


def climb_to_first_step(h: Harness) -> None:
    h.start()
    decision = h.tick()
    assert decision.kind == "advance" and h.share == 1000


# --- the happy path -----------------------------------------------------------------------------


def test_a_healthy_canary_climbs_every_step_and_is_promoted(h):
    h.start()
    h.healthy()
    promoted = h.run_until("promote")
    assert h.share == 10_000
    assert h.ramp.status == "promoted" and "100% passed every gate" in h.ramp.reason
    assert h.controller_changes() == ["canary 0% -> 10%", "canary 10% -> 50%",
                                      "canary 50% -> 100%"]
    advances = [e for e in h.states.audit() if e.action == "ramp-advance"]
    assert [e.detail["target_bp"] for e in advances] == [1000, 5000, 10_000]
    assert {g["name"] for g in promoted.detail()["gates"]} == {
        "error_rate", "timeout_rate", "p99_ratio", "p99_ms", "fallback_rate"}
    assert h.tick() is None  # a finished ramp is left alone


def test_each_step_soaks_for_its_minimum_duration(h):
    climb_to_first_step(h)
    h.healthy()
    held = [h.tick() for _ in range(5)]  # 25 s of the 30 s
    assert all(d.kind == "hold" for d in held) and h.share == 1000
    assert "in step 25s of 30s" in held[-1].reason
    assert h.tick().kind == "advance" and h.share == 5000


def test_a_step_holds_on_too_few_samples(h):
    climb_to_first_step(h)
    h.healthy(requests=20)
    for _ in range(10):
        decision = h.tick()
        assert decision.kind == "hold" and "20/50 canary samples" in decision.reason
    assert h.share == 1000
    h.healthy(requests=50)
    assert h.tick().kind == "advance"


def test_gates_wait_below_their_minimum_samples_instead_of_failing(h):
    climb_to_first_step(h)
    h.metrics.canary = stats("optimized", 5, error_rate=1.0)  # 5 of the 10 samples needed
    for _ in range(8):
        decision = h.tick()
        assert decision.kind == "hold"
        assert {g.status for g in decision.gates} == {"wait"}
    assert h.share == 1000 and h.ramp.failures == 0


def test_gates_judge_the_step_only_over_the_plan_window(h):
    climb_to_first_step(h)
    h.healthy(requests=20)  # too few to advance: the step goes on
    h.metrics.asked.clear()
    h.tick(seconds=7.0)
    assert set(h.metrics.asked) == {8}  # 7 s into the step, both ends' seconds included
    for _ in range(30):
        h.tick()
    assert set(h.metrics.asked[-2:]) == {60}  # the plan's window_s caps it


# --- rollback -----------------------------------------------------------------------------------

BREACHES = {
    "error_rate": dict(canary=dict(error_rate=0.05)),  # > baseline 0.0 + 0.01
    "timeout_rate": dict(canary=dict(timeout_rate=0.02)),
    "p99_ratio": dict(canary=dict(p99_ms=70.0)),  # > 40 x 1.5
    "p99_ms": dict(canary=dict(p99_ms=600.0), baseline=dict(p99_ms=500.0)),
    "fallback_rate": dict(canary=dict(fallbacks=3)),  # 3 of 100 > 0.02
}


@pytest.mark.parametrize("gate", sorted(BREACHES))
def test_each_gate_rolls_back_after_the_failures_tolerated(h, gate):
    climb_to_first_step(h)
    h.metrics.canary = stats("optimized", 100, **BREACHES[gate]["canary"])
    h.metrics.baseline = stats("baseline", 500, **BREACHES[gate].get("baseline", {}))
    first = h.tick()
    assert first.kind == "hold" and h.ramp.failures == 1 and h.share == 1000
    assert f"failing 1/1 tolerated: {gate}" in first.reason
    second = h.tick()
    assert second.kind == "rollback" and h.share == 0
    assert h.ramp.status == "aborted" and h.ramp.reason.startswith(f"rollback: {gate}")
    entry = h.states.audit()[-1]
    assert entry.action == "ramp-rollback" and entry.actor == CONTROLLER
    failing = [g for g in entry.detail["gates"] if g["status"] == "fail"]
    assert [g["name"] for g in failing] == [gate]
    assert failing[0]["value"] > failing[0]["threshold"]
    assert h.controller_changes()[-1] == "canary 10% -> 0%"
    assert h.tick() is None and h.share == 0


def test_the_agreement_gate_rolls_back_and_waits_for_shadow_pairs():
    plan = dict(PLAN, failures_tolerated=0,
                gates={"agreement_lower_bound": 0.98, "min_agreement_pairs": 40})
    h = Harness(plan)
    h.verdict()
    climb_to_first_step(h)
    h.healthy()
    for _ in range(3):  # no shadow comparison at all (what windows without `shadow` answer)
        decision = h.tick()
        assert decision.kind == "hold" and "0/40 shadow pairs" in decision.reason
    h.metrics.pairs, h.metrics.agreed = 10, 5  # too few pairs to judge
    for _ in range(8):
        decision = h.tick()
        assert decision.kind == "hold" and "10/40 shadow pairs" in decision.reason
    h.metrics.pairs, h.metrics.agreed = 400, 380  # 95 %: the CS's upper end is below 0.98
    decision = h.tick()
    assert decision.kind == "rollback" and h.share == 0
    assert "agreement_lower_bound 0.9" in decision.reason and ">= 0.98: fail" in decision.reason


def test_the_confident_flip_gate_passes_near_tie_flips_and_rolls_back_on_a_confident_one():
    plan = dict(PLAN, failures_tolerated=0,
                gates={"confident_flip_rate": 0.0, "min_agreement_pairs": 40})
    h = Harness(plan)
    h.metrics = ShadowFedMetrics(h.clock)
    h.controller = h.new_controller("c1")
    h.verdict()
    climb_to_first_step(h)
    h.healthy()
    near_ties = [PairOutcome(False, m) for m in (0.0, 0.004, 0.01, 0.03, 0.0499)]
    h.metrics.file(h.clock.time(), near_ties * 20)  # 100 flips, none of them confident
    decision = h.tick()
    assert decision.kind == "hold" and "0/40 confident shadow pairs" in decision.reason
    h.metrics.file(h.clock.time(), [PairOutcome(True, 0.05), PairOutcome(True, 0.4)] * 25)
    advance = h.run_until("advance")  # a third of all pairs flipped, but only near ties
    [gate] = advance.gates
    assert (gate.name, gate.status, gate.value) == ("confident_flip_rate", "pass", 0.0)
    assert gate.note.startswith("0 of 50 flipped at baseline margin >= 0.05 in the step's ")
    assert h.share == 5000
    h.metrics.file(h.clock.time(), [PairOutcome(True, 0.3)] * 99 + [PairOutcome(False, 0.05)])
    decision = h.tick()
    assert decision.kind == "rollback" and h.share == 0
    assert "confident_flip_rate 0.01 <= 0: fail (1 of 100 flipped at baseline margin >= 0.05" \
        in decision.reason


def test_a_passing_evaluation_resets_the_failure_count(h):
    climb_to_first_step(h)
    h.metrics.canary = stats("optimized", 100, error_rate=0.5)
    assert h.tick().kind == "hold" and h.ramp.failures == 1
    h.healthy()
    assert h.tick().kind == "hold" and h.ramp.failures == 0
    h.metrics.canary = stats("optimized", 100, error_rate=0.5)
    assert h.tick().kind == "hold" and h.share == 1000


def test_error_rate_is_judged_against_the_baseline(h):
    climb_to_first_step(h)
    h.metrics.baseline = stats("baseline", 500, error_rate=0.04)
    h.metrics.canary = stats("optimized", 100, error_rate=0.045)  # within baseline + 0.01
    decision = h.tick()
    gate = next(g for g in decision.gates if g.name == "error_rate")
    assert gate.status == "pass" and gate.threshold == pytest.approx(0.05)


def test_latency_ratio_is_not_applicable_without_baseline_traffic(h):
    h.start()
    h.healthy()
    h.run_until("advance")
    h.run_until("advance")
    h.run_until("advance")  # now at 100 %: baseline serves nothing
    h.metrics.baseline = stats("baseline", 0)
    promoted = h.run_until("promote")
    ratio = next(g for g in promoted.gates if g.name == "p99_ratio")
    assert ratio.status == "n/a" and "0 baseline samples" in ratio.note


# --- what never raises the share ----------------------------------------------------------------


def test_the_kill_switch_wins(h):
    climb_to_first_step(h)
    h.healthy()
    h.rollout.kill(actor="bob", reason="incident")
    for _ in range(20):
        decision = h.tick()
        assert decision.kind == "hold" and decision.reason == "hold: the kill switch is on"
        assert decision.detail()["kill"] is True
    assert h.share == 1000 and h.states.get().kill
    h.rollout.unkill(actor="bob", reason="resolved")
    assert h.tick().kind == "advance" and h.share == 5000


def test_the_kill_switch_on_at_start_holds_the_first_step(h):
    h.rollout.kill(actor="bob", reason="incident")
    h.start()
    assert all(h.tick().kind == "hold" for _ in range(5)) and h.share == 0


def test_pause_holds_and_resume_climbs_on(h):
    climb_to_first_step(h)
    h.healthy()
    h.control.pause(actor="bob", reason="look at the dashboards")
    for _ in range(12):
        assert h.tick().reason == "hold: paused"
    assert h.share == 1000 and h.ramp.status == "paused"
    h.control.resume(actor="bob", reason="looks fine")
    assert h.tick().kind == "advance" and h.share == 5000


def test_a_paused_ramp_still_rolls_back(h):
    climb_to_first_step(h)
    h.control.pause(actor="bob", reason="lunch")
    h.metrics.canary = stats("optimized", 100, error_rate=0.5)
    h.tick()
    assert h.tick().kind == "rollback" and h.share == 0 and h.ramp.status == "aborted"


def test_a_step_that_needs_approval_waits_for_it():
    plan = dict(PLAN, steps=[PLAN["steps"][0], dict(PLAN["steps"][1], approval=True),
                             PLAN["steps"][2]])
    h = Harness(plan)
    h.verdict()
    climb_to_first_step(h)
    h.healthy()
    waiting = h.run_until("wait-approval")
    assert "approval of step 2 (50%)" in waiting.reason
    assert all(h.tick().kind == "wait-approval" for _ in range(5)) and h.share == 1000
    h.control.approve(actor="carol", reason="signed off")
    assert h.ramp.approved == (1,)
    assert h.tick().kind == "advance" and h.share == 5000
    with pytest.raises(RampNotAllowed, match="no step of this ramp is waiting"):
        h.control.approve(actor="carol", reason="again")


def test_an_approval_may_be_given_before_the_step_is_reached():
    plan = dict(PLAN, steps=[dict(PLAN["steps"][0], approval=True), *PLAN["steps"][1:]])
    h = Harness(plan)
    h.verdict()
    h.start()
    assert h.tick().kind == "wait-approval" and h.share == 0
    h.control.approve(actor="carol", reason="go")
    assert h.tick().kind == "advance" and h.share == 1000


@pytest.mark.parametrize("verdict", [None, False])
def test_no_passing_verdict_holds(verdict):
    h = Harness()
    if verdict is not None:
        h.verdict(passed=verdict)
    h.start()
    h.healthy()
    for _ in range(5):
        decision = h.tick()
        assert decision.kind == "hold" and "rollout verify" in decision.reason
    assert h.share == 0
    h.verdict(passed=True)
    assert h.tick().kind == "advance"


def test_force_climbs_without_a_verdict_and_says_so():
    h = Harness()
    h.start(force=True)
    decision = h.tick()
    assert decision.kind == "advance" and h.share == 1000
    assert "forced: no passing verify verdict" in decision.reason
    start = next(e for e in h.states.audit() if e.action.startswith("ramp-start"))
    assert start.action == "ramp-start --force" and start.detail["forced"] is True
    assert h.states.get().reason == decision.reason  # the state change says it too


RULES = VerdictRules(thresholds=Thresholds(), set_digest="7595854274529594")
RECORDED = dict(baseline_version=BASELINE, optimized_version=OPTIMIZED, passed=True, n=1617,
                agreement=0.995, agreement_lower_bound=0.99, speedup=2.0,
                thresholds=Thresholds(), split="held-out", set_digest="7595854274529594",
                speed_judged=True)


def ruled(h, **fields):
    """`h` with a controller that checks verdicts against RULES, and a passing verdict whose
    record is RECORDED with `fields` changed."""
    h.controller = RampController(h.states, h.ramps, h.metrics, clock=h.clock, owner="c1",
                                  verdict_rules=RULES)
    h.states.put_verdict(Verdict(**{**RECORDED, **fields}))
    return h


@pytest.mark.parametrize(("fields", "problem"), [
    ({"speed_judged": False, "speedup": None}, "speed was not judged"),
    ({"thresholds": None}, "records no thresholds"),
    ({"thresholds": Thresholds(min_agreement=0.9)}, "looser min_agreement 0.9 < 0.98"),
    ({"thresholds": Thresholds(max_confident_flips=3)}, "looser max_confident_flips 3 > 0"),
    ({"split": ""}, "not judged out of sample"),
    ({"set_digest": "0123456789abcdef"}, "judged on set 0123456789abcdef, not on the "
                                         "configured set 7595854274529594"),
])
def test_a_passing_verdict_whose_record_does_not_fit_holds(fields, problem):
    h = ruled(Harness(), **fields)
    h.start()
    h.healthy()
    decision = h.tick()
    assert decision.kind == "hold" and h.share == 0
    assert "the verify verdict does not count: " in decision.reason and problem in decision.reason


@pytest.mark.parametrize("fields", [
    {}, {"set_digest": "7595854274529594:400"},  # judged on the first 400 inputs of the set
    {"split": "external", "set_digest": "0123456789abcdef"},  # another set, all of it
    {"thresholds": Thresholds(min_agreement=0.99, min_slice_agreement=0.97)},  # stricter
])
def test_a_verdict_judged_out_of_sample_with_the_rules_climbs(fields):
    h = ruled(Harness(), **fields)
    h.start()
    h.healthy()
    assert h.tick().kind == "advance" and h.share == 1000


def test_a_plan_may_accept_a_verdict_without_speed():
    h = ruled(Harness({**PLAN, "accept_verdict_without_speed": True}), speed_judged=False,
              speedup=None)
    h.start()
    h.healthy()
    assert h.tick().kind == "advance"


# --- versions, outside changes, crashes ---------------------------------------------------------


def test_no_reporting_gateway_holds(h):
    climb_to_first_step(h)
    h.healthy()
    h.clock.advance(120)  # every report is older than the deployment TTL
    decision = h.controller.tick()
    assert decision.kind == "hold" and "no gateway reports" in decision.reason


def test_a_new_optimized_version_mid_ramp_rolls_back(h):
    climb_to_first_step(h)
    h.versions = (h.versions[0], "int8-cccc")
    decision = h.tick()
    assert decision.kind == "rollback" and h.share == 0
    assert "optimized version changed from bf16-bbbb to int8-cccc" in h.ramp.reason


def test_a_new_version_before_the_first_step_ends_the_ramp_without_a_share_write(h):
    h.start()
    h.versions = (h.versions[0], "int8-cccc")
    assert h.tick().kind == "rollback" and h.ramp.status == "aborted"
    assert h.states.get().revision == 0  # the share was 0 already: no empty change


def test_a_share_changed_by_someone_else_aborts_the_ramp_and_keeps_that_share(h):
    climb_to_first_step(h)
    h.rollout.set_canary(300, actor="bob", reason="manual")
    decision = h.tick()
    assert decision.kind == "abort" and h.share == 300
    assert h.ramp.status == "aborted" and "changed by bob: manual" in h.ramp.reason


def test_an_advance_interrupted_between_its_writes_is_adopted(h):
    climb_to_first_step(h)
    h.healthy()
    h.clock.advance(30)
    # the controller set the share, then crashed before writing the ramp
    h.rollout.set_canary(5000, actor=CONTROLLER, reason="advance 10% -> 50%")
    decision = h.tick()
    assert decision.kind == "hold" and h.ramp.step == 1 and h.share == 5000
    assert h.ramp.step_started_at == h.states.get().updated_at


def test_a_crashed_controller_loses_its_lease_and_another_takes_over(h):
    standby = h.new_controller("c2")
    h.start()
    h.healthy()
    assert h.tick().kind == "advance"
    assert h.tick(controller=standby) is None  # c1 holds the lease
    assert h.ramps.holder() == "c1"
    # c1 crashes: it never ticks again; its lease runs out 15 s after its last renewal
    assert h.tick(seconds=5.0, controller=standby) is None
    decision = h.tick(seconds=6.0, controller=standby)
    assert decision is not None and h.ramps.holder() == "c2"
    promoted = h.run_until_with(standby, "promote")
    assert promoted.ramp.status == "promoted" and h.share == 10_000
    assert h.controller.tick() is None  # c1 comes back: the lease is c2's


def test_start_is_refused_while_a_ramp_is_active_or_above_the_first_step(h):
    h.start()
    with pytest.raises(RampNotAllowed, match="already running"):
        h.start()
    h.control.abort(actor="bob", reason="restart")
    h.rollout.set_canary(1000, actor="bob", reason="manual")
    with pytest.raises(RampNotAllowed, match="must be above it"):
        h.start()


def test_start_needs_the_gateways_versions():
    h = Harness()
    h.clock.advance(120)
    with pytest.raises(RampNotAllowed, match="no gateway reports"):
        h.start()
    assert h.ramp is None


def test_abort_rolls_the_share_back_and_is_audited(h):
    climb_to_first_step(h)
    h.control.abort(actor="bob", reason="customer complaint")
    assert h.share == 0 and h.ramp.status == "aborted"
    assert h.ramp.reason == "customer complaint"
    actions = [(e.actor, e.action) for e in h.states.audit()[-2:]]
    assert actions == [("bob", "ramp-abort"), ("bob", "canary 10% -> 0%")]
    assert h.tick() is None and h.share == 0
    with pytest.raises(RampNotAllowed, match="cannot abort: the ramp is aborted"):
        h.control.abort(actor="bob", reason="again")


@pytest.mark.parametrize("action", ["pause", "resume", "approve", "abort"])
def test_actions_without_a_ramp_are_refused(action):
    h = Harness()
    with pytest.raises(RampNotAllowed, match="no ramp has been started"):
        getattr(h.control, action)(actor="bob", reason="why")


def test_resume_of_a_running_ramp_is_refused(h):
    h.start()
    with pytest.raises(RampNotAllowed, match="cannot resume: the ramp is running"):
        h.control.resume(actor="bob", reason="why")


def test_every_evaluation_is_audited_with_values_and_thresholds(h):
    climb_to_first_step(h)
    h.metrics.canary = stats("optimized", 100, p99_ms=45.0)
    h.tick()
    entry = h.states.audit()[-1]
    assert entry.action == "ramp-evaluate" and entry.actor == CONTROLLER
    assert entry.revision == h.states.get().revision  # a note: the state did not move
    p99 = next(g for g in entry.detail["gates"] if g["name"] == "p99_ms")
    assert (p99["value"], p99["threshold"], p99["status"]) == (45.0, 500, "pass")
    assert entry.detail["samples"] == 100 and entry.detail["share_bp"] == 1000
    assert h.ramps.last_evaluation()["reason"] == entry.reason


# --- HTTP checks: gates judged from the checker's results ---------------------------------------


class ScriptedChecker:
    """Answers each check with the status the test set (default: pass); counts calls."""

    def __init__(self):
        self.status: dict[str, str] = {}
        self.calls: list[str] = []

    def check(self, check):
        from rollout.ramp.checks import CheckResult

        self.calls.append(check.label)
        status = self.status.get(check.label, "pass")
        note = {"fail": "HTTP 500, expected 200", "wait": "unreachable: refused"}.get(status, "")
        return CheckResult(check.label, status, 500.0 if status == "fail" else None,
                           check.threshold_text(), note)


def with_checks(checker=None, **plan) -> Harness:
    """A harness whose plan has a ramp-wide check `health` and a check `smoke` at step 2."""
    steps = [PLAN["steps"][0], dict(PLAN["steps"][1], checks=[
        {"url": "http://qa.internal/smoke", "name": "smoke"}]), PLAN["steps"][2]]
    h = Harness(dict(PLAN, checks=[{"url": "http://mon.internal/health", "name": "health"}],
                     steps=steps, **plan))
    h.verdict()
    h.controller = RampController(h.states, h.ramps, h.metrics, clock=h.clock, owner="c1",
                                  checker=checker)
    return h


def test_passing_checks_climb_and_each_step_judges_its_own():
    checker = ScriptedChecker()
    h = with_checks(checker)
    h.start()
    assert h.tick().kind == "advance" and checker.calls == []  # no step yet: nothing to check
    h.healthy()
    advance = h.run_until("advance")
    assert [c["name"] for c in advance.detail()["checks"]] == ["health"]
    checker.calls.clear()
    held = h.tick()
    assert checker.calls == ["health", "smoke"]  # step 2: the plan's, then the step's
    assert [(c.name, c.status) for c in held.checks] == [("health", "pass"), ("smoke", "pass")]
    assert h.run_until("promote").kind == "promote"


def test_a_failing_check_is_a_failing_gate_and_rolls_back_after_the_tolerated_ones():
    checker = ScriptedChecker()
    h = with_checks(checker)
    climb_to_first_step(h)
    h.healthy()
    checker.status["health"] = "fail"
    first = h.tick()
    assert first.kind == "hold" and "failing 1/1 tolerated: check health 500" in first.reason
    rollback = h.tick()
    assert rollback.kind == "rollback" and h.share == 0 and h.ramp.status == "aborted"
    assert "check health 500 (status 200): fail (HTTP 500, expected 200)" in rollback.reason
    entry = [e for e in h.states.audit() if e.action == "ramp-rollback"][-1]
    assert entry.detail["checks"] == [{"name": "health", "status": "fail", "value": 500.0,
                                       "threshold": "status 200",
                                       "note": "HTTP 500, expected 200"}]


def test_an_unreachable_check_waits_and_never_passes():
    checker = ScriptedChecker()
    h = with_checks(checker)
    climb_to_first_step(h)
    h.healthy()
    checker.status["health"] = "wait"
    for _ in range(30):  # far past the soak, every gate passing
        decision = h.tick()
        assert decision.kind == "hold" and h.share == 1000
    assert "check health - (status 200): wait (unreachable: refused)" in decision.reason
    assert h.ramp.failures == 0  # a wait is not a failure
    checker.status.clear()
    assert h.tick().kind == "advance"


def test_without_a_checker_a_plans_checks_wait():
    h = with_checks(checker=None)
    climb_to_first_step(h)
    h.healthy()
    decision = h.run_until("hold")
    assert [(c.status, c.note) for c in decision.checks] == [("wait", "no checker configured")]
    assert all(h.tick().kind == "hold" for _ in range(20)) and h.share == 1000


def test_evaluate_without_results_for_the_steps_checks_waits():
    from rollout.ramp import evaluate

    h = with_checks(ScriptedChecker())
    climb_to_first_step(h)
    h.healthy()
    h.clock.advance(60)
    h.heartbeat()
    decision = evaluate(h.ramp, h.states.get(), h.metrics, verdict=None, live=h.rollout
                        .live_versions(), now=h.clock.time())
    assert decision.kind == "hold" and "check health - (status 200): wait (not run)" in \
        decision.reason


# --- the progress deadline -----------------------------------------------------------------------


def test_a_step_held_past_its_deadline_aborts_to_share_0():
    h = Harness(dict(PLAN, progress_deadline_s=60))
    h.verdict()
    climb_to_first_step(h)  # step 1 starts; soak 30 s, so the deadline is at 30 + 60 s
    h.healthy(requests=20)  # too few samples: held
    held = [h.tick() for _ in range(18)]  # 90 s
    assert all(d.kind == "hold" for d in held) and h.share == 1000
    deadline = h.tick()
    assert deadline.kind == "deadline" and h.share == 0 and h.ramp.status == "aborted"
    assert deadline.reason == ("deadline: step 1 (10%) could not progress for 65 s: "
                               "20/50 canary samples")
    entry = [e for e in h.states.audit() if e.action == "ramp-deadline"][-1]
    assert entry.actor == CONTROLLER and entry.detail["on_deadline"] == "abort"
    assert h.controller_changes() == ["canary 0% -> 10%", "canary 10% -> 0%"]
    assert h.tick() is None  # ended


def test_a_deadline_that_pauses_keeps_the_share_and_a_paused_ramp_has_no_deadline():
    h = Harness(dict(PLAN, progress_deadline_s=60, on_deadline="pause"))
    h.verdict()
    climb_to_first_step(h)
    h.healthy(requests=20)
    deadline = h.run_until("deadline")
    assert h.ramp.status == "paused" and h.share == 1000
    assert deadline.reason.startswith("deadline: step 1 (10%) could not progress for")
    assert all(h.tick().reason == "hold: paused" for _ in range(50))  # no deadline while paused
    assert [e.action for e in h.states.audit()].count("ramp-deadline") == 1


def test_the_deadline_counts_from_the_last_resume():
    h = Harness(dict(PLAN, progress_deadline_s=60, on_deadline="pause"))
    h.verdict()
    climb_to_first_step(h)
    h.healthy(requests=20)
    h.control.pause(actor="bob", reason="look")
    for _ in range(40):  # 200 s paused: far past the step's soak + deadline
        h.tick()
    h.control.resume(actor="bob", reason="go on")
    assert h.ramp.progress_since == h.clock.time()
    assert all(h.tick().kind == "hold" for _ in range(12))  # 60 s after the resume
    assert h.tick().kind == "deadline" and h.ramp.status == "paused"


def test_a_wait_for_approval_nobody_gives_ends_at_the_deadline():
    plan = dict(PLAN, progress_deadline_s=120, steps=[
        PLAN["steps"][0], dict(PLAN["steps"][1], approval=True), PLAN["steps"][2]])
    h = Harness(plan)
    h.verdict()
    climb_to_first_step(h)
    h.healthy()
    deadline = h.run_until("deadline")
    assert deadline.reason.endswith("could not progress for 125 s: waiting for approval of "
                                    "step 2 (50%): `rollout ramp approve`")
    assert h.share == 0 and h.ramp.status == "aborted"


def test_the_deadline_before_the_first_step_counts_from_the_ramps_start():
    h = Harness(dict(PLAN, progress_deadline_s=30))
    h.start()  # no verify verdict: held before the first step
    assert [h.tick().kind for _ in range(6)] == ["hold"] * 6
    deadline = h.tick()
    assert deadline.kind == "deadline" and h.ramp.status == "aborted" and h.share == 0
    assert deadline.reason.startswith("deadline: before step 1 (share 0%) could not progress "
                                      "for 35 s: no verify verdict")


def test_an_advancing_ramp_never_meets_its_deadline():
    h = Harness(dict(PLAN, progress_deadline_s=1))
    h.verdict()
    h.start()
    h.healthy()
    assert h.run_until("promote").kind == "promote"  # the soak is not a stall
