"""Realized efficiency on live traffic: the cost per input and the realized
speedup with its interval (rollout.efficiency), the counters a request adds to the windows
(rollout.telemetry.window_fields) and reads back (rollout.telemetry.window_stats), a replica's
measurement (serve.replica.cputime) and the `realized_speedup` ramp gate. Seeded, no Redis, no
Ray."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import random

import pytest

from rollout.efficiency import (
    CPU_FIELDS,
    MIN_REQUESTS,
    Z_GATE,
    Z_SHOWN,
    CpuSums,
    request_fields,
    speedup,
)
from rollout.ramp import PlanError, parse_plan
from rollout.ramp.gates import GATES_BY_NAME, judge_gates
from rollout.telemetry.windows import Attempt, MemoryHashes, RequestRecord, Windows, merge_fields
from rollout.telemetry.windows import aggregate as aggregate_arm
from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.replica.cputime import ForwardClock, burn_cpu, shares
from serve.telemetry.observe import attempt_from
from tests.ramp_harness import PLAN, Harness, ScriptedMetrics, stats


def sums(requests: list[tuple[float, int, int]], gpu: bool = False) -> CpuSums:
    """CpuSums of (cpu_s, rows, batch_requests) requests, added up as the windows add them."""
    totals: dict[str, float] = {}
    for cpu_s, rows, batch in requests:
        for name, amount in request_fields(cpu_s, rows, batch, gpu).items():
            totals[name] = totals.get(name, 0.0) + amount
    return CpuSums.from_totals(totals)


def arm_requests(rng: random.Random, per_input: float, n: int, *, noise: float = 0.2,
                 batch: int = 1) -> list[tuple[float, int, int]]:
    """`n` requests of 1-4 inputs at `per_input` seconds each, batches of `batch` requests
    sharing one noisy cost per input (log-normal, `noise` wide)."""
    out = []
    while len(out) < n:
        cost = per_input * math.exp(rng.gauss(0, noise) - noise * noise / 2)
        for _ in range(batch):
            rows = rng.randint(1, 4)
            out.append((cost * rows, rows, batch))
    return out[:n]


# --- the math -------------------------------------------------------------------------------------


def test_cost_per_1000_inputs_is_seconds_over_inputs():
    arm = sums([(0.010, 1, 1), (0.030, 3, 1), (0.020, 1, 2)])
    assert arm.per_input == pytest.approx(0.060 / 5)
    assert arm.per_1k == pytest.approx(12.0)
    assert (arm.requests, arm.device) == (3, "cpu")


def test_the_variance_is_the_ratio_estimators_expanded_from_the_counters():
    rng = random.Random(1)
    requests = arm_requests(rng, 0.004, 40)
    arm = sums(requests)
    m = arm.per_input
    n, rows = len(requests), sum(r for _, r, _ in requests)
    direct = sum((s - m * r) ** 2 for s, r, _ in requests) / (n * (n - 1) * (rows / n) ** 2)
    assert arm.rel_variance() == pytest.approx(direct / m ** 2, rel=1e-9)


def test_batch_mates_widen_the_interval_by_the_mean_batch_size():
    requests = arm_requests(random.Random(2), 0.004, 60)
    alone = sums(requests)
    batched = sums([(s, r, 4) for s, r, _ in requests])
    assert batched.design_effect == 4.0 and alone.design_effect == 1.0
    assert batched.rel_variance() == pytest.approx(4 * alone.rel_variance())


def test_the_speedup_is_baseline_over_optimized_with_an_interval_around_it():
    rng = random.Random(3)
    baseline = sums(arm_requests(rng, 0.006, 400))
    optimized = sums(arm_requests(rng, 0.002, 400))
    result = speedup(baseline, optimized)
    assert result.ratio == pytest.approx(baseline.per_input / optimized.per_input)
    assert 1 < result.lower < 3 < result.upper < 5
    assert result.confidence == pytest.approx(0.95, abs=1e-4)
    assert result.lower * result.upper == pytest.approx(result.ratio ** 2)  # symmetric in log
    wider = speedup(baseline, optimized, Z_GATE)
    assert wider.lower < result.lower and wider.upper > result.upper
    assert wider.confidence == pytest.approx(0.999, abs=1e-4)


@pytest.mark.parametrize("batch", [1, 6])
def test_the_95_percent_interval_covers_the_true_ratio_about_95_percent_of_the_time(batch):
    """Coverage over 400 simulated windows; with batches of 6 requests sharing one cost, only
    the design effect keeps it (without it the interval would be sqrt(6) times too narrow)."""
    rng = random.Random(10 + batch)
    covered = 0
    for _ in range(400):
        baseline = sums(arm_requests(rng, 0.006, 120, batch=batch))
        optimized = sums(arm_requests(rng, 0.002, 60, batch=batch))
        result = speedup(baseline, optimized)
        covered += result.lower <= 3.0 <= result.upper
    assert 0.92 <= covered / 400 <= (0.99 if batch == 1 else 1.0)


def test_without_the_design_effect_batched_requests_would_be_overconfident():
    """The check above can tell: the same simulation treating requests as independent."""
    rng = random.Random(16)
    covered = 0
    for _ in range(200):
        baseline = sums([(s, r, 1) for s, r, _ in arm_requests(rng, 0.006, 120, batch=6)])
        optimized = sums([(s, r, 1) for s, r, _ in arm_requests(rng, 0.002, 60, batch=6)])
        result = speedup(baseline, optimized)
        covered += result.lower <= 3.0 <= result.upper
    assert covered / 200 < 0.85


def test_what_cannot_be_divided_says_why():
    some = sums([(0.01, 1, 1), (0.02, 1, 1)])
    assert speedup(CpuSums(), some).note == "no measured baseline forwards"
    assert speedup(some, CpuSums()).note == "no measured optimized forwards"
    zero = sums([(0.0, 1, 1), (0.0, 1, 1)])
    assert speedup(some, zero).ratio is None and "optimized" in speedup(some, zero).note
    gpu = sums([(0.01, 1, 1), (0.02, 1, 1)], gpu=True)
    result = speedup(some, gpu)
    assert result.ratio is None and result.note == "cpu seconds on baseline, gpu on optimized"
    assert "cpu seconds on baseline" in result.text()


def test_one_request_gives_a_ratio_but_no_interval():
    assert MIN_REQUESTS == 2
    result = speedup(sums([(0.02, 1, 1)]), sums([(0.01, 1, 1), (0.01, 1, 1)]))
    assert result.ratio == pytest.approx(2.0) and result.lower is None
    assert result.text().startswith("2x (fewer than 2 requests;")


def test_the_text_and_json_forms():
    rng = random.Random(4)
    result = speedup(sums(arm_requests(rng, 0.006, 50)), sums(arm_requests(rng, 0.002, 40)))
    assert result.text().startswith(f"{result.ratio:.3g}x (95% CI {result.lower:.3g}-")
    assert result.text().endswith("; 50 baseline, 40 optimized requests)")
    doc = json.loads(json.dumps(result.as_dict()))
    assert doc["confidence"] == 0.95 and doc["z"] == Z_SHOWN and doc["baseline_n"] == 50


def test_mixed_devices_are_named():
    assert sums([(0.1, 1, 1)], gpu=True).device == "gpu"
    mixed = CpuSums.from_totals({**request_fields(0.1, 1, 1), "cpu_n": 2, "cpu_gpu": 1})
    assert mixed.device == "mixed" and CpuSums().device is None


# --- the windows ----------------------------------------------------------------------------------


def answered(arm: str, cpu_s: float | None, rows: int = 2, batch: int = 3) -> Attempt:
    return Attempt(arm, "ok", {"forward": 5.0}, batch, 0, 0.005, 0.0, cpu_s=cpu_s, rows=rows)


def test_an_answered_measured_call_adds_the_cpu_counters_to_the_arm_that_answered():
    record = RequestRecord("optimized", 200, 12.0, items=2, attempts=(
        Attempt("optimized", "error"), answered("baseline", 0.004)))
    merged = merge_fields([(100.5, record)], "app")
    baseline = merged["rollout:app:telemetry:win:baseline:100"]
    assert {name: baseline[name] for name in CPU_FIELDS} == {
        "cpu_s": 0.004, "cpu_rows": 2, "cpu_n": 1, "cpu_ss": 0.004 ** 2, "cpu_rs": 0.008,
        "cpu_rr": 4, "cpu_batch": 3, "cpu_gpu": 0}
    assert not any(name.startswith("cpu_") for name in
                   merged["rollout:app:telemetry:win:optimized:100"])


def test_an_unmeasured_call_adds_no_cpu_counters():
    record = RequestRecord("baseline", 200, 3.0, items=1, attempts=(answered("baseline", None),))
    [fields] = merge_fields([(5.0, record)], "app").values()
    assert fields["compute_s"] == 0.005 and not any(n.startswith("cpu_") for n in fields)


def test_seconds_of_windows_sum_into_the_arms_cpu_and_old_hashes_still_read():
    hashes = MemoryHashes()
    records = [(t, RequestRecord("optimized", 200, 3.0, items=2,
                                 attempts=(answered("optimized", 0.002 * (1 + t % 3)),)))
               for t in range(90, 100)]
    hashes.increment(merge_fields(records, "app"))
    hashes.data["rollout:app:telemetry:win:optimized:89"] = {"requests": 4, "ok": 4}  # old
    windows = Windows(hashes, "app", clock=type("C", (), {"time": staticmethod(lambda: 99.2)}))
    arm = windows.arm("optimized", 11)
    assert arm.requests == 14 and arm.cpu.requests == 10 and arm.cpu.rows == 20
    assert arm.cpu_per_1k == pytest.approx(sum(0.002 * (1 + t % 3) for t in range(90, 100))
                                           / 20 * 1000)
    old = aggregate_arm("baseline", [{"requests": "3", "ok": "3", "lat:40": "3"}], 60.0)
    assert old.cpu == CpuSums() and old.cpu_per_1k is None
    doc = json.loads(json.dumps(arm.as_dict()))
    assert doc["cpu_per_1k"] == pytest.approx(arm.cpu_per_1k) and doc["cpu"]["device"] == "cpu"


# --- the replica's side ---------------------------------------------------------------------------


def test_a_batch_is_shared_by_rows_among_the_requests_answered():
    from serve.common.batching import Expired, RowsDidNotFit

    assert shares(0.6, [1, 2, 3], ["a", "b", "c"]) == pytest.approx([0.1, 0.2, 0.3])
    got = shares(0.6, [1, 2, 3], ["a", Expired(), RowsDidNotFit([0], "oom")])
    assert got == [pytest.approx(0.6), None, None]
    assert shares(0.6, [2], [Expired()]) == [None]


def test_the_forward_clock_counts_cpu_seconds_spent_in_the_forward():
    clock = ForwardClock("cpu")
    result, seconds = clock.timed(lambda x: (burn_cpu(0.05), x)[1], "rows")
    assert result == "rows" and 0.05 <= seconds < 0.5
    _, idle = clock.timed(__import__("time").sleep, 0.05)  # waiting is no CPU
    assert idle < 0.02
    assert ForwardClock("cuda:0").gpu and not clock.gpu


def test_the_answer_carries_its_share_to_the_gateways_attempt():
    answer = ModelAnswer(arm="optimized", model_version="v", outputs=[], tokens=4,
                         batch=BatchShape(requests=2, items=5), queue=0,
                         timing=StageTiming(1.0, 1.0, 10.0, 1.0), cpu_s=0.003)
    assert pickle.loads(pickle.dumps(answer)) == answer
    attempt = attempt_from("optimized", answer.in_call(2), 2)
    assert (attempt.cpu_s, attempt.rows, attempt.gpu) == (0.003, 2, False)
    older = dataclasses.replace(answer, cpu_s=None)  # a replica that measured nothing
    assert attempt_from("optimized", older, 2).cpu_s is None


# --- the gate -------------------------------------------------------------------------------------


def arms(baseline_per_input: float, optimized_per_input: float, n: int = 200, *,
         baseline_n: int | None = None, seed: int = 5):
    rng = random.Random(seed)
    baseline = stats("baseline", 500)
    optimized = stats("optimized", 100)
    return (dataclasses.replace(baseline, cpu=sums(arm_requests(rng, baseline_per_input,
                                                                baseline_n or n))),
            dataclasses.replace(optimized, cpu=sums(arm_requests(rng, optimized_per_input, n))))


def judged(metrics: ScriptedMetrics, threshold: float = 1.5, min_samples: int = 10):
    plan = parse_plan(dict(PLAN, gates={"min_samples": min_samples,
                                        "realized_speedup": threshold}))
    ramp = type("R", (), {"plan": plan})()
    samples, [gate] = judge_gates(ramp, metrics, 60)
    return gate


@pytest.mark.parametrize(("baseline", "optimized", "n", "status"), [
    (0.006, 0.002, 200, "pass"),  # 3x, interval well above 1.5
    (0.002, 0.004, 200, "fail"),  # 0.5x: the optimized arm costs twice as much
    (0.003, 0.002, 200, "wait"),  # 1.5x: the threshold sits inside the interval
    (0.0031, 0.002, 12, "wait"),  # undecided on few requests
])
def test_the_gate_passes_fails_or_waits_on_its_interval(baseline, optimized, n, status):
    metrics = ScriptedMetrics()
    metrics.baseline, metrics.canary = arms(baseline, optimized, n)
    gate = judged(metrics)
    expected = speedup(metrics.baseline.cpu, metrics.canary.cpu, Z_GATE)
    assert gate.status == status and gate.value == pytest.approx(expected.ratio)
    assert gate.threshold == 1.5 and GATES_BY_NAME["realized_speedup"].op == ">="
    assert gate.note.startswith(f"99.9% CI [{expected.lower:.3g}, {expected.upper:.3g}] of "
                                f"{n}/{n} measured baseline/optimized requests")


def test_too_few_measured_requests_on_either_arm_wait():
    metrics = ScriptedMetrics()
    metrics.baseline, metrics.canary = arms(0.006, 0.002, 200, baseline_n=5)
    gate = judged(metrics)
    assert gate.status == "wait"
    assert gate.note == "5/200 measured baseline/optimized requests, 10 needed on each"
    metrics.baseline, metrics.canary = arms(0.006, 0.002, 5, baseline_n=200)
    assert judged(metrics).status == "wait"


def test_arms_that_measured_nothing_wait_and_say_so():
    metrics = ScriptedMetrics()
    metrics.canary = stats("optimized", 100)  # requests, but replicas of an older version
    gate = judged(metrics)
    assert gate.status == "wait" and gate.value is None
    assert gate.note == "no measured baseline forwards"


def test_the_plan_field_is_a_gate_of_its_own_and_must_be_positive():
    plan = parse_plan(dict(PLAN, gates={"realized_speedup": 1.2}))
    assert plan.gates.realized_speedup == 1.2
    for bad in (0, -1, 2000, "fast"):
        with pytest.raises(PlanError, match=r"gates\.realized_speedup: "):
            parse_plan(dict(PLAN, gates={"realized_speedup": bad}))
    with pytest.raises(PlanError, match="realized_speedup"):  # named among the gates to give
        parse_plan(dict(PLAN, gates={"min_samples": 5}))


def speedup_harness(threshold: float = 1.5) -> Harness:
    h = Harness(dict(PLAN, failures_tolerated=0, gates={"realized_speedup": threshold}))
    h.verdict()
    h.start()
    assert h.tick().kind == "advance"
    h.healthy()
    return h


def test_an_optimized_arm_that_costs_more_rolls_the_ramp_back():
    h = speedup_harness()
    h.metrics.baseline, h.metrics.canary = arms(0.002, 0.004)
    decision = h.run_until("rollback")
    assert h.share == 0 and h.ramp.status == "aborted"
    assert "realized_speedup" in decision.reason


def test_an_undecided_speedup_holds_the_climb_and_a_clear_one_lets_it_go_on():
    h = speedup_harness()
    h.metrics.baseline, h.metrics.canary = arms(0.003, 0.002)  # 1.5x: cannot say
    for _ in range(20):  # 100 s, past the step's 30 s soak
        decision = h.tick()
        assert decision.kind != "advance" and decision.kind != "rollback"
    assert h.share == 1_000 and h.ramp.failures == 0
    h.metrics.baseline, h.metrics.canary = arms(0.006, 0.002)
    assert h.run_until("advance").target_bp == 5_000


# --- what operators see ---------------------------------------------------------------------------


def measured_telemetry(now: float, *, price: float = 0.0):
    """Both arms answered: baseline at 6 ms CPU per input, optimized at 2 ms, 1-4 inputs each."""
    from rollout import MemoryTelemetry

    rng = random.Random(8)
    records = []
    for arm, per_input, n in (("baseline", 0.006, 120), ("optimized", 0.002, 60)):
        for cpu_s, rows, batch in arm_requests(rng, per_input, n, noise=0.1):
            attempt = Attempt(arm, "ok", {"forward": 3.0}, batch, 0, 0.003, 0.003 * price,
                              cpu_s=cpu_s, rows=rows)
            records.append((now - 1, RequestRecord(arm, 200, 5.0, rows, 10, (attempt,))))
    memory = MemoryTelemetry()
    memory.increment(merge_fields(records, "default"))
    return memory


def run_cli(*argv, telemetry, now: float):
    import io

    from ops import cli
    from rollout import FakeClock, MemoryStateStore

    out = io.StringIO()
    code = cli.main(list(argv), store=MemoryStateStore(), clock=FakeClock(now), stdout=out,
                    stderr=io.StringIO(), telemetry=telemetry)
    assert code == 0
    return out.getvalue()


def arm_table(out: str) -> dict[str, list[str]]:
    """The per-arm table's rows of `rollout status`, split into cells, by arm."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ARM"))
    return {line.split()[0]: line.split() for line in lines[at + 1:at + 3]}


def test_status_shows_cpu_seconds_per_1000_inputs_and_the_realized_speedup():
    now = 1_700_000_000.0
    telemetry = measured_telemetry(now)
    out = run_cli("status", telemetry=telemetry, now=now).splitlines()
    header = next(line for line in out if line.startswith("ARM")).split()
    assert header[-3:] == ["CPU", "S/1K", "COST/1K"]
    rows = arm_table("\n".join(out))
    doc = json.loads(run_cli("status", "--json", telemetry=telemetry, now=now))
    traffic = doc["traffic"]
    for arm in ("baseline", "optimized"):
        per_1k = traffic["arms"][arm]["cpu_per_1k"]
        assert float(rows[arm][-3]) == pytest.approx(per_1k, rel=1e-3)
        assert rows[arm][-3:] == [f"{per_1k:.4g}", f"{per_1k:.4g}", "cpu-s"]  # never 0
    assert traffic["arms"]["baseline"]["cpu_per_1k"] == pytest.approx(6.0, rel=0.1)
    efficiency = traffic["efficiency"]
    assert efficiency["lower"] < 3.0 < efficiency["upper"] and efficiency["confidence"] == 0.95
    line = next(line for line in out if line.startswith("realized speedup"))
    assert line == ("realized speedup (baseline / optimized CPU s per input): "
                    f"{efficiency['ratio']:.3g}x (95% CI {efficiency['lower']:.3g}-"
                    f"{efficiency['upper']:.3g}; 120 baseline, 60 optimized requests)")


def test_a_priced_cost_column_shows_the_price_and_no_measurement_shows_a_dash():
    now = 1_700_000_000.0
    out = run_cli("status", telemetry=measured_telemetry(now, price=3.6), now=now)
    baseline = arm_table(out)["baseline"]
    assert baseline[-1] == "10.800000" and "cpu-s" not in out  # 0.0108 per call
    from rollout import MemoryTelemetry

    unmeasured = MemoryTelemetry()
    unmeasured.increment(merge_fields([(now - 1, RequestRecord(
        "baseline", 200, 5.0, 1, 3, (answered("baseline", None),)))], "default"))
    out = run_cli("status", telemetry=unmeasured, now=now)
    assert arm_table(out)["baseline"][-2:] == ["-", "-"]
    assert ("realized speedup (baseline / optimized CPU s per input): - (no measured baseline "
            "forwards; 0 baseline, 0 optimized requests)") in out
    doc = json.loads(run_cli("status", "--json", telemetry=unmeasured, now=now))
    assert doc["traffic"]["efficiency"]["ratio"] is None
