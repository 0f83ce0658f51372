"""The ramp's agreement gate looked at every few seconds: simulated ramps
for its false-pass rate, the step-long sample it judges, and the `min_margin` of the confident
flip gate. Seeded, pure Python (ops.bench.gate_sim); no Redis, no Ray."""

from __future__ import annotations

import random
import statistics

import pytest

from ops.bench import gate_sim
from ops.bench.gate_sim import (
    Scenario,
    new_gate,
    pairs_to_pass,
    pass_rate,
    simulate_looks,
    wilson_gate,
)
from rollout.agreement import agreement_cs
from rollout.ramp import PlanError, WindowsMetrics, parse_plan
from rollout.shadow import PairOutcome, ShadowItem, merge_shadow, shadow_fields
from rollout.telemetry.windows import MemoryHashes, Windows
from tests.ramp_harness import PLAN, Harness, ShadowFedMetrics

# The example plan's agreement gate (ops/plans/example-ramp.yaml): 0.98 from 100 pairs; a
# 30-minute step evaluated every 5 s (CANARY_RAMP_INTERVAL_S), 2-20 shadow pairs/s.
SCENARIO = Scenario(threshold=0.98, duration_s=1_800, interval_s=5, rate=(2.0, 20.0),
                    min_pairs=100, window_s=120)
RAMPS = 400  # a 5 % rate sits 4.6 standard errors above the ~1-2 % the gate reaches


# --- simulated ramps ----------------------------------------------------------------------------


@pytest.mark.parametrize("truth", [0.975, 0.979, 0.98])
def test_the_gate_passes_a_canary_below_its_threshold_in_at_most_5_percent_of_ramps(truth):
    rate = pass_rate(new_gate(SCENARIO), truth, SCENARIO, RAMPS, seed=1400)
    assert rate <= 0.05


def test_the_old_wilson_gate_fails_the_same_simulation():
    """The simulation can tell: a Wilson bound recomputed at every look passes most ramps."""
    assert pass_rate(wilson_gate(SCENARIO, sliding=True), 0.979, SCENARIO, RAMPS,
                     seed=1400) > 0.25
    assert pass_rate(wilson_gate(SCENARIO, sliding=False), 0.979, SCENARIO, RAMPS,
                     seed=1400) > 0.05  # the growing sample alone does not save it


def test_the_gate_passes_a_good_canary_within_a_few_hundred_pairs():
    needed, never = pairs_to_pass(0.995, SCENARIO, 200, seed=7)
    assert never == 0
    assert statistics.median(needed) < 1_000  # measured: about 470


def test_the_gate_rarely_rolls_back_a_canary_at_its_threshold_and_always_a_bad_one():
    at_threshold = pass_rate(new_gate(SCENARIO, "fail"), 0.98, SCENARIO, 200, seed=3)
    assert at_threshold <= 0.05
    assert pass_rate(new_gate(SCENARIO, "fail"), 0.95, SCENARIO, 100, seed=4) == 1.0


def test_simulated_looks_grow_and_agree_at_the_true_rate():
    looks = simulate_looks(random.Random(5), 0.975, SCENARIO)
    assert len(looks) == 360
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(looks, looks[1:], strict=False))
    pairs, agreed = looks[-1]
    assert 3_600 <= pairs <= 36_000 and agreed / pairs == pytest.approx(0.975, abs=0.01)
    assert simulate_looks(random.Random(5), 1.0, SCENARIO)[-1][1] == looks[-1][0]
    assert simulate_looks(random.Random(5), 0.0, SCENARIO)[-1][1] == 0


def test_the_confidence_sequence_always_holds_the_observed_agreement():
    """What lets the simulation skip looks at which a gate cannot pass (or fail)."""
    rng = random.Random(6)
    for _ in range(2_000):
        n = rng.choice([1, 3, 100, 5_000, 10 ** 6])
        agreed = rng.randint(0, n)
        lower, upper = agreement_cs(agreed, n, rng.choice([0.5, 0.98, 0.999]))
        assert lower <= agreed / n <= upper


def test_the_simulator_cli(capsys):
    assert gate_sim.main(["--ramps", "20", "--agreements", "0.97", "--duration-s", "300"]) == 0
    out = capsys.readouterr().out
    assert "| 0.97 |" in out and "new: CS, whole step" in out and "median" in out
    with pytest.raises(SystemExit) as exc:
        gate_sim.main(["--ramps", "0"])
    assert exc.value.code == 2 and "--ramps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gate_sim.main(["--rate", "20-2"])
    assert "LOW-HIGH" in capsys.readouterr().err


# --- the gate in the state machine --------------------------------------------------------------


def agreement_harness(**gates) -> Harness:
    h = Harness(dict(PLAN, failures_tolerated=0, gates={
        "agreement_lower_bound": 0.98, "min_agreement_pairs": 100, **gates}))
    h.verdict()
    h.start()
    assert h.tick().kind == "advance"
    h.healthy()
    return h


def agreement_gate(decision):
    [gate] = [g for g in decision.gates if g.name == "agreement_lower_bound"]
    return gate


def test_the_agreement_gate_passes_waits_and_fails_on_its_confidence_sequence():
    h = agreement_harness()
    h.metrics.pairs, h.metrics.agreed = 1_000, 990  # 99 %: CS about [0.979, 0.996]: undecided
    gate = agreement_gate(h.tick())
    lower, upper = agreement_cs(990, 1_000, 0.98)
    assert lower < 0.98 < upper and gate.status == "wait" and gate.value == lower
    assert gate.note.startswith(f"anytime 95% CS [{lower:.4f}, {upper:.4f}] of 990/1000 agreed")
    assert h.ramp.failures == 0  # undecided is no failure
    h.metrics.pairs, h.metrics.agreed = 3_000, 2_990
    assert agreement_gate(h.tick()).status == "pass"
    h.metrics.pairs, h.metrics.agreed = 3_000, 2_900  # 96.7 %: the upper end is below 0.98
    decision = h.tick()
    assert decision.kind == "rollback" and h.share == 0
    assert "agreement_lower_bound" in decision.reason and "agreed in the step's" in decision.reason


def test_the_shadow_gates_judge_the_whole_step_not_the_plan_window():
    h = agreement_harness(confident_flip_rate=0.01)
    h.metrics.shadow_asked.clear()
    for _ in range(30):  # 150 s into a step whose plan window is 60 s
        h.tick()
    assert h.metrics.asked[-1] == 60  # the arm gates keep the plan's window
    assert h.metrics.shadow_asked[-2:] == [(151, None), (151, 0.05)]


def test_a_step_longer_than_the_telemetry_retention_reads_what_is_kept_and_says_so():
    h = agreement_harness()
    h.metrics.horizon_s = 100
    h.metrics.pairs, h.metrics.agreed = 1_000, 990  # undecided: the step goes on
    for _ in range(30):
        decision = h.tick()
    assert h.metrics.shadow_asked[-1] == (100, None)
    assert agreement_gate(decision).note.endswith("in the last 100s: telemetry retention")


# --- min_margin -----------------------------------------------------------------------------------


def test_min_margin_must_be_a_margin_bucket_edge():
    plan = dict(PLAN, gates={"confident_flip_rate": 0.0})
    assert parse_plan(plan).gates.min_margin == 0.05
    assert parse_plan(dict(plan, gates={"confident_flip_rate": 0.0, "min_margin": 0.1}))
    for bad in (0.03, 0.0, 1.0, "wide"):
        with pytest.raises(PlanError, match=r"gates\.min_margin: ") as exc:
            parse_plan(dict(plan, gates={"confident_flip_rate": 0.0, "min_margin": bad}))
        if bad != "wide":
            assert "0.005, 0.01, 0.02, 0.05, 0.1" in str(exc.value)


@pytest.mark.parametrize(("min_margin", "verdict", "note"), [
    (0.1, "advance", "0 of 40 flipped at baseline margin >= 0.1"),  # the 0.06 flip is below
    (0.05, "rollback", "1 of 50 flipped at baseline margin >= 0.05"),
])
def test_the_confident_flip_gate_counts_from_min_margin(min_margin, verdict, note):
    plan = dict(PLAN, failures_tolerated=0, gates={
        "confident_flip_rate": 0.0, "min_margin": min_margin, "min_agreement_pairs": 40})
    h = Harness(plan)
    h.metrics = ShadowFedMetrics(h.clock)
    h.controller = h.new_controller("c1")
    h.verdict()
    h.start()
    assert h.tick().kind == "advance"
    h.healthy()
    h.metrics.file(h.clock.time(), [PairOutcome(True, 0.2)] * 40 + [PairOutcome(True, 0.05)] * 9
                   + [PairOutcome(False, 0.06)] + [PairOutcome(False, 0.01)] * 30)
    decision = h.run_until(verdict)
    [gate] = decision.gates
    assert gate.name == "confident_flip_rate" and gate.note.startswith(note)


# --- what operators see ---------------------------------------------------------------------------


def test_the_dashboard_ramp_panel_gets_both_shadow_gates_with_what_they_are():
    from pathlib import Path

    from rollout.ramp import RampControl
    from rollout.ramp.machine import SHADOW_GATES
    from serve.dashboard.ramp import ramp_status

    h = agreement_harness(confident_flip_rate=0.005, min_margin=0.02)
    h.metrics.pairs, h.metrics.agreed = 2_400, 2_392
    h.metrics.confident_pairs, h.metrics.confident_flips = 1_310, 1
    h.tick()
    last = ramp_status(RampControl(h.states, h.ramps, h.clock))["last_evaluation"]
    gates = {g["name"]: g for g in last["gates"]}
    agreement, flips = gates["agreement_lower_bound"], gates["confident_flip_rate"]
    assert agreement["value"] == agreement_cs(2_392, 2_400, 0.98)[0]
    assert agreement["status"] == "pass"
    assert agreement["note"].startswith("anytime 95% CS [")
    assert flips["value"] == pytest.approx(1 / 1_310)
    assert flips["note"].startswith("1 of 1310 flipped at baseline margin >= 0.02 in the step's")
    script = (Path(__file__).parents[2] / "serve/dashboard/static/app.js").read_text()
    hints = script[script.index("const GATE_HINTS"):]
    assert all(f"{name}:" in hints[:hints.index("};")] for name in SHADOW_GATES)


# --- reading a whole step ---------------------------------------------------------------------


class CountingHashes(MemoryHashes):
    def __init__(self):
        super().__init__()
        self.reads: list[int] = []  # keys per read

    def hashes(self, keys):
        self.reads.append(len(keys))
        return super().hashes(keys)


def test_the_adapter_reads_settled_seconds_once_and_recent_ones_again():
    from rollout import FakeClock

    clock, hashes = FakeClock(10_000.0), CountingHashes()
    metrics = WindowsMetrics(Windows(hashes, "app", clock=clock), horizon_s=600, settle_s=10)

    def file(ts: float, outcomes) -> None:
        hashes.increment(merge_shadow([ShadowItem(ts, shadow_fields(outcomes))], "app"))

    file(9_700.5, [PairOutcome(True, 0.3)] * 10)
    assert metrics.agreement(600) == (10, 10)
    assert metrics.confident(600, 0.05) == (10, 0)
    assert hashes.reads == [600]  # one read for both gates of one evaluation
    clock.advance(5)
    file(10_003.5, [PairOutcome(False, 0.3)])  # a late increment, still within settle_s
    assert metrics.agreement(600) == (11, 10) and hashes.reads[-1] == 15  # 10 unsettled + 5 new
    file(9_700.5, [PairOutcome(False, 0.3)])  # far later than settle_s: missed, never doubled
    clock.advance(5)
    assert metrics.agreement(600) == (11, 10)
    clock.advance(600)  # the step's first seconds fall out of the span and out of memory
    assert metrics.agreement(600) == (0, 0)
    assert len(metrics._settled) <= 600
