"""The ramp's agreement gate on shadow counters in a real Redis: it judges
every pair since the step started, past the plan's window_s, and no more than the counters'
retention. The arms are scripted; the shadow pairs go through the telemetry writer and are read
back per second as the controller reads them."""

from __future__ import annotations

import uuid

import pytest

from rollout.ramp import WindowsMetrics
from rollout.shadow import PairOutcome, ShadowItem, shadow_fields
from rollout.telemetry.redis_store import RedisTelemetry
from rollout.telemetry.windows import Windows
from tests.ramp_harness import PLAN, Harness, ScriptedMetrics


class RedisShadowMetrics(ScriptedMetrics):
    """Scripted arms; shadow gates read the real telemetry in Redis."""

    def __init__(self, telemetry: RedisTelemetry, app: str, clock, horizon_s: int):
        super().__init__()
        self.horizon_s = horizon_s
        self.shadow = WindowsMetrics(Windows(telemetry, app, clock=clock), horizon_s)

    def agreement(self, last_s):
        self.shadow_asked.append((last_s, None))
        return self.shadow.agreement(last_s)

    def confident(self, last_s, min_margin=0.05):
        return self.shadow.confident(last_s, min_margin)

    def slices(self, last_s):
        return self.shadow.slices(last_s)


@pytest.fixture
def telemetry(redis_url):
    sink = RedisTelemetry(redis_url, f"seq-{uuid.uuid4().hex[:8]}", window_ttl_s=3_600)
    yield sink
    sink.close()


def ramp_on(telemetry: RedisTelemetry, horizon_s: int = 3_600) -> Harness:
    h = Harness(dict(PLAN, window_s=60, failures_tolerated=0, gates={
        "agreement_lower_bound": 0.98, "min_agreement_pairs": 100}))
    h.metrics = RedisShadowMetrics(telemetry, telemetry.app, h.clock, horizon_s)
    h.controller = h.new_controller("c1")
    h.verdict()
    h.start()
    assert h.tick().kind == "advance"
    h.healthy()
    return h


def file_pairs(h: Harness, telemetry: RedisTelemetry, seconds: int, filed: list[int]) -> None:
    """5 shadow pairs per second over the last `seconds`, one in 250 a flip (99.6 %)."""
    now = int(h.clock.time())
    items = []
    for second in range(now - seconds + 1, now + 1):
        outcomes = []
        for _ in range(5):
            filed[0] += 1
            outcomes.append(PairOutcome(filed[0] % 250 != 0, 0.3))
        items.append(ShadowItem(second + 0.5, shadow_fields(outcomes)))
    telemetry.write(items)


def test_the_gate_passes_on_pairs_older_than_the_plan_window(telemetry):
    h = ramp_on(telemetry)
    filed = [0]
    file_pairs(h, telemetry, 1, filed)
    decisions = []
    for _ in range(40):
        decision = h.tick()
        file_pairs(h, telemetry, 5, filed)
        decisions.append(decision)
        if decision.kind == "advance":
            break
    advance = decisions[-1]
    assert advance.kind == "advance" and h.share == 5000
    [gate] = advance.gates
    assert gate.status == "pass" and gate.value >= 0.98
    pairs = int(gate.note.split(" of ")[1].split("/")[1].split(" ")[0])
    assert pairs > 60 * 5  # more than the plan's 60 s window holds: the whole step counted
    assert "in the step's" in gate.note
    held = [g for d in decisions[:-1] for g in d.gates]
    assert held and {g.status for g in held} == {"wait"}  # undecided until then, never failed
    assert h.ramp.failures == 0


def test_a_step_longer_than_the_retention_reads_only_what_is_kept(telemetry):
    h = ramp_on(telemetry, horizon_s=20)
    filed = [0]
    for _ in range(10):  # 50 s into the step, 250 pairs filed
        h.tick()
        file_pairs(h, telemetry, 5, filed)
    decision = h.tick()
    [gate] = decision.gates
    assert h.metrics.shadow_asked[-1] == (20, None)
    read, _ = h.metrics.shadow.agreement(20)
    assert 0 < read <= 100 < filed[0]  # 20 s of 5 pairs at most: the older ones are not read
    assert gate.status == "wait"
    assert gate.note == f"{read}/100 shadow pairs in the last 20s: telemetry retention"
