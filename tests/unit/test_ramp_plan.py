"""Ramp plans from YAML: what is accepted, and that every refusal names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout import FakeClock, InvalidChange
from rollout.ramp import PlanError, WindowsMetrics, load_plan, read_plan
from rollout.shadow import PairOutcome, ShadowItem, merge_shadow, shadow_fields
from rollout.telemetry.windows import Attempt, MemoryHashes, RequestRecord, Windows, merge_fields

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
gates: {error_rate_delta: 0.01}
steps:
  - {percent: 0.5, min_duration_s: 60, min_samples: 10}
  - {percent: 100}
"""


def test_the_shipped_example_plan_is_valid():
    plan = read_plan(ROOT / "ops" / "plans" / "example-ramp.yaml")
    assert plan.shares_bp == (100, 500, 2500, 5000, 10_000)
    assert [s.approval for s in plan.steps] == [False, False, True, False, False]
    assert plan.gates.agreement_lower_bound == 0.98 and plan.failures_tolerated == 1
    assert plan.gates.confident_flip_rate == 0.005
    # the gates of out-of-sample fidelity and realized efficiency
    assert (plan.gates.worst_slice_agreement, plan.gates.min_slice_pairs) == (0.95, 100)
    assert plan.gates.realized_speedup == 1.2 and plan.accept_verdict_without_speed is False


def test_the_confident_flip_rate_is_a_gate_of_its_own():
    plan = load_plan("gates: {confident_flip_rate: 0, min_agreement_pairs: 200}\n"
                     "steps: [{percent: 100}]")
    assert plan.gates.confident_flip_rate == 0.0 and plan.gates.min_agreement_pairs == 200
    assert plan.gates.agreement_lower_bound is None
    assert load_plan(GOOD).gates.confident_flip_rate is None  # optional, like every gate


def test_defaults_of_a_minimal_plan():
    plan = load_plan(GOOD)
    assert plan.shares_bp == (50, 10_000)
    assert (plan.window_s, plan.failures_tolerated, plan.gates.min_samples) == (60, 0, 10)
    assert plan.steps[1].min_duration_s == 0 and plan.gates.p99_ms is None


@pytest.mark.parametrize("text, message", [
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 10}, {percent: 5}, {percent: 100}]",
     "steps.1.percent: shares must rise strictly"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 10}, {percent: 50}]",
     "steps.1.percent: the last step must be 100"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 0.125}, {percent: 100}]",
     "steps.0.percent: "),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 0}, {percent: 100}]",
     "steps.0.percent: Input should be greater than 0"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 100, min_duration_s: -1}]",
     "steps.0.min_duration_s: Input should be greater than or equal to 0"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 100, approvall: true}]",
     "steps.0.approvall: unknown field"),
    ("gates: {error_rate_delta: 0.01}\nsteps: []", "steps: Tuple should have at least 1 item"),
    ("gates: {p99_ratio: 0.5}\nsteps: [{percent: 100}]",
     "gates.p99_ratio: Input should be greater than or equal to 1"),
    ("gates: {min_samples: 5}\nsteps: [{percent: 100}]", "gates: give at least one gate"),
    ("gates: {error_rate_delta: 1.5}\nsteps: [{percent: 100}]", "gates.error_rate_delta: "),
    ("gates: {confident_flip_rate: 1.5}\nsteps: [{percent: 100}]",
     "gates.confident_flip_rate: Input should be less than or equal to 1"),
    ("gates: {confident_flip_rate: -0.1}\nsteps: [{percent: 100}]",
     "gates.confident_flip_rate: Input should be greater than or equal to 0"),
    ("steps: [{percent: 100}]", "gates: Field required"),
    ("gates: {error_rate_delta: 0.01}", "steps: Field required"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 100}]\nwindow_s: 0",
     "window_s: Input should be greater than or equal to 1"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 100}]\nfailures_tolerated: x",
     "failures_tolerated: Input should be a valid integer"),
    ("gates: {error_rate_delta: 0.01}\nsteps: [{percent: 100}]\nspeed: fast",
     "speed: unknown field"),
    ("- just\n- a list", "a ramp plan is a mapping"),
    ("steps: [unclosed", "not valid YAML"),
    ("", "a ramp plan is a mapping"),
])
def test_an_invalid_plan_is_refused_naming_the_field(text, message):
    with pytest.raises(PlanError) as caught:
        load_plan(text)
    assert message in str(caught.value)
    assert isinstance(caught.value, InvalidChange)  # the CLI's exit 2


def test_an_unreadable_plan_file_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="cannot read the ramp plan"):
        read_plan(tmp_path / "missing.yaml")


# --- the metrics adapter ------------------------------------------------------------------------


def windows_with_one_canary_request():
    clock = FakeClock(1_000.0)
    hashes = MemoryHashes()
    record = RequestRecord(routed="optimized", status=200, latency_ms=12.0,
                           attempts=(Attempt("optimized", "ok"),))
    hashes.increment(merge_fields([(999.5, record)], "app"))
    return Windows(hashes, "app", clock=clock)


def test_the_adapter_reads_arms_from_the_windows():
    metrics = WindowsMetrics(windows_with_one_canary_request())
    assert metrics.arm("optimized", 5).requests == 1
    assert metrics.arm("baseline", 5).requests == 0


def test_without_shadow_pairs_the_agreement_is_unknown():
    assert WindowsMetrics(windows_with_one_canary_request()).agreement(60) == (0, 0)


def test_the_agreement_is_the_shadow_windows_pairs_and_lower_bound():
    windows = windows_with_one_canary_request()
    outcomes = [PairOutcome(True, 0.3)] * 199 + [PairOutcome(False, 0.01)]
    windows.source.increment(merge_shadow([ShadowItem(999.5, shadow_fields(outcomes))], "app"))
    assert WindowsMetrics(windows).agreement(30) == (200, 199)  # counts: the machine bounds them
    assert WindowsMetrics(windows).agreement(30) == (200, windows.shadow(30).agreed)


def test_confident_pairs_are_the_shadow_pairs_from_margin_0_05_up():
    windows = windows_with_one_canary_request()
    outcomes = ([PairOutcome(True, 0.3)] * 50 + [PairOutcome(False, 0.05)] * 2
                + [PairOutcome(False, 0.0499)] * 7 + [PairOutcome(True, 0.001)] * 40)
    windows.source.increment(merge_shadow([ShadowItem(999.5, shadow_fields(outcomes))], "app"))
    assert WindowsMetrics(windows).confident(30) == (52, 2)  # the 0.0499 flips are near ties
    assert windows.shadow(30).confident_flip_rate == pytest.approx(2 / 52)
    assert WindowsMetrics(windows_with_one_canary_request()).confident(30) == (0, 0)
    assert windows_with_one_canary_request().shadow(30).confident_flip_rate is None


# --- checks and the progress deadline -----------------------------------------------------------

BASE = "gates: {error_rate_delta: 0.01}\nsteps: [{percent: 50}, {percent: 100}]\n"


def test_checks_and_a_deadline_are_read_with_their_defaults():
    plan = load_plan(BASE + "checks: [{url: 'http://mon:8080/canary/health/'}]\n"
                     "progress_deadline_s: 600\n")
    check = plan.checks[0]
    assert (check.timeout_s, check.expect, check.field, check.label) == (
        5.0, 200, None, "mon:8080/canary/health")
    assert plan.progress_deadline_s == 600 and plan.on_deadline == "abort"
    assert load_plan(BASE).progress_deadline_s is None  # optional


def test_a_steps_checks_are_judged_after_the_plans():
    plan = load_plan(
        "gates: {error_rate_delta: 0.01}\nchecks: [{url: 'http://a/x', name: all}]\n"
        "on_deadline: pause\nsteps:\n"
        "  - {percent: 50, checks: [{url: 'https://b/y', field: d.rate, max: 0.1, min: 0}]}\n"
        "  - {percent: 100}\n")
    assert [c.label for c in plan.checks_at(0)] == ["all", "b/y"]
    assert [c.label for c in plan.checks_at(1)] == ["all"]
    assert plan.checks_at(-1) == () and plan.on_deadline == "pause"


@pytest.mark.parametrize(("extra", "message"), [
    ("checks: [{url: 'ftp://a/x'}]", "checks.0.url: an http:// or https:// URL with a host"),
    ("checks: [{url: 'http:///x'}]", "checks.0.url: an http:// or https:// URL with a host"),
    ("checks: [{name: x}]", "checks.0.url: Field required"),
    ("checks: [{url: 'http://a/x', timeout_s: 61}]",
     "checks.0.timeout_s: Input should be less than or equal to 60"),
    ("checks: [{url: 'http://a/x', timeout_s: 0}]", "checks.0.timeout_s: Input should be greater"),
    ("checks: [{url: 'http://a/x', expect: 99}]", "checks.0.expect: "),
    ("checks: [{url: 'http://a/x', max: 0.1}]", "checks.0.max: a threshold needs `field`"),
    ("checks: [{url: 'http://a/x', min: 1}]", "checks.0.min: a threshold needs `field`"),
    ("checks: [{url: 'http://a/x', field: data.rate}]",
     "checks.0.field: data.rate needs `max` and/or `min`"),
    ("checks: [{url: 'http://a/x', field: 'data..rate', max: 1}]",
     "checks.0.field: a dotted path such as data.error_rate"),
    ("checks: [{url: 'http://a/x', field: d, max: 1, min: 2}]", "checks.0.min: 2 is above max 1"),
    ("checks: [{url: 'http://a/x', field: d, max: .nan}]", "checks.0.max: "),
    ("checks: [{url: 'http://a/x', header: y}]", "checks.0.header: unknown field"),
    ("checks: [{url: 'http://a/x'}, {url: 'http://a/x/'}]",
     "checks.1.name: 'a/x' names another check judged at the same step"),
    ("checks: {url: 'http://a/x'}", "checks: Input should be a valid"),
    ("progress_deadline_s: 0", "progress_deadline_s: Input should be greater than 0"),
    ("progress_deadline_s: soon", "progress_deadline_s: Input should be a valid number"),
    ("on_deadline: rollback", "on_deadline: Input should be 'abort' or 'pause'"),
])
def test_a_bad_check_or_deadline_is_refused_naming_the_field(extra, message):
    with pytest.raises(PlanError) as caught:
        load_plan(BASE + extra)
    assert message in str(caught.value)


def test_a_steps_check_is_named_with_its_step():
    with pytest.raises(PlanError) as caught:
        load_plan("gates: {error_rate_delta: 0.01}\nchecks: [{url: 'http://a/x'}]\nsteps:\n"
                  "  - {percent: 50, checks: [{url: 'http://b/x', max: 1}, {url: 'http://a/x'}]}\n"
                  "  - {percent: 100}\n")
    assert "steps.0.checks.0.max: a threshold needs `field`" in str(caught.value)
    with pytest.raises(PlanError, match=r"steps\.0\.checks\.0\.name: 'a/x' names another"):
        load_plan("gates: {error_rate_delta: 0.01}\nchecks: [{url: 'http://a/x'}]\nsteps:\n"
                  "  - {percent: 50, checks: [{url: 'http://a/x'}]}\n  - {percent: 100}\n")


def test_the_example_plan_has_a_deadline_and_no_live_check():
    plan = read_plan(ROOT / "ops" / "plans" / "example-ramp.yaml")
    assert (plan.progress_deadline_s, plan.on_deadline) == (3600, "abort")
    assert plan.checks == ()  # commented out: a live URL would hold every step
    assert "CANARY_WEBHOOK_URLS" in (ROOT / "ops" / "plans" / "example-ramp.yaml").read_text()
