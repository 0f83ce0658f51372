"""Admission by deadline (serve.gateway.admission): the predicted wait, the header's parsing and
cap, the memory cap, the door, and a request that leaves freeing its place at once."""

import pytest

from serve.gateway.admission import (
    BUSY_LOOP_SHARE,
    RATE_WINDOW_S,
    SHEDDING_S,
    Admission,
    ArmQueue,
    LoopLag,
    ShedSummary,
    requested_timeout_s,
    retry_after_s,
)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def measured(rate: float, forward_s: float = 0.02, clock: Clock | None = None) -> Admission:
    """An admission whose "baseline" arm has answered at `rate` rows per busy second, in
    forwards of one input taking `forward_s` (slower than that rate: several replicas)."""
    clock = clock or Clock()
    admission = Admission(ceiling=128, clock=clock)
    queue = admission.queue("baseline")
    rows = int(rate * RATE_WINDOW_S * 2)
    queue.add(rows, clock())
    clock.now += rows / rate
    queue.remove(rows, clock(), answered=True)
    queue.forwarded(forward_s, 1)
    assert queue.rate == pytest.approx(rate)
    return admission


def test_the_timeout_header_is_a_positive_whole_number_of_ms_capped_at_the_servers():
    assert requested_timeout_s(None, 10.0) == 10.0
    assert requested_timeout_s("250", 10.0) == 0.25
    assert requested_timeout_s(" 1000 ", 10.0) == 1.0
    assert requested_timeout_s("60000", 10.0) == 10.0  # capped


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "abc", "", "1e3", "٣", "9" * 20])
def test_anything_else_in_the_timeout_header_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="X-Request-Timeout-Ms"):
        requested_timeout_s(bad, 10.0)


def test_nothing_is_predicted_before_the_first_measurement():
    queue = ArmQueue()
    queue.add(500, 0.0)
    assert queue.rate is None and queue.predicted_s(1) == 0.0


def test_the_rate_is_rows_answered_per_busy_second():
    clock = Clock()
    queue = ArmQueue()
    queue.add(10, clock())
    clock.now += 0.1
    queue.remove(10, clock(), answered=True)
    clock.now += 5.0  # idle time does not count
    queue.add(10, clock())
    clock.now += 0.1
    queue.remove(10, clock(), answered=True)
    assert queue.busy_rate == pytest.approx(100.0)


def test_the_rate_is_that_of_a_full_batch_however_small_the_batches_measured_were():
    """Forwards of one input measured at low load do not hold a burst to their rate: a queue
    is served in full batches. Until other sizes are seen a full batch is taken to cost what
    the forwards seen cost (the optimistic side); full batches then correct it."""
    admission = Admission(ceiling=128, batch_rows=16)
    queue = admission.queue("baseline")
    for _ in range(5):
        queue.forwarded(0.3, 1)  # one input in 300 ms
    assert queue.rate == pytest.approx(16 / 0.3)
    assert queue.own_forward_s(1) == pytest.approx(0.3)
    for _ in range(60):
        queue.forwarded(0.6, 16)  # full batches take twice as long
    assert queue.rate == pytest.approx(16 / 0.6, rel=0.02)
    assert queue.own_forward_s(1) == pytest.approx(0.3, rel=0.05)  # the line through both
    queue.forwarded(1.2, 40)  # a forward that carried more than max_batch_size rows
    assert queue.fit.batch_rows == 40


def test_the_busy_rate_counts_every_replica_when_it_is_higher():
    queue = ArmQueue()
    queue.forwarded(0.1, 10)  # one replica: 100 rows/s
    queue.busy_rate = 250.0  # answered per busy second by several
    assert queue.rate == 250.0


def test_rows_that_were_not_answered_do_not_count_as_speed():
    clock = Clock()
    queue = ArmQueue()
    queue.add(10, clock())
    clock.now += 0.2
    queue.remove(10, clock(), answered=False)
    assert queue.rate is None


def test_the_predicted_wait_is_the_rows_ahead_at_the_rate_then_its_own_forward():
    admission = measured(rate=200.0, forward_s=0.05)
    queue = admission.queue("baseline")
    queue.add(100, 0.0)  # 100 rows ahead: 0.5 s at 200/s
    assert queue.predicted_s(1) == pytest.approx(0.5 + 0.05)
    assert queue.predicted_s(40) == pytest.approx(0.5 + 0.2)  # more than a full batch: at the rate


def test_a_request_is_refused_only_when_it_would_miss_its_deadline():
    admission = measured(rate=200.0, forward_s=0.05)
    admission.queue("baseline").add(100, 0.0)
    assert admission.judge("baseline", 1, timeout_s=10.0) is None
    assert admission.judge("baseline", 1, timeout_s=0.6) is None
    refusal = admission.judge("baseline", 1, timeout_s=0.5)
    assert refusal is not None and refusal.retry_after == 1 and admission.shed == 1
    assert "0.55 s" in refusal.message("baseline")
    assert admission.judge("optimized", 1, timeout_s=0.01) is None  # its own queue: empty


def test_a_late_arm_is_told_apart_without_counting_a_shed():
    admission = measured(rate=200.0, forward_s=0.05)
    admission.queue("baseline").add(100, 0.0)  # 0.55 s until one more row is answered
    assert admission.late("baseline", 1, timeout_s=0.5)  # e.g. a canary's share of 1 s
    assert not admission.late("baseline", 1, timeout_s=0.6)
    assert admission.judge("baseline", 1, timeout_s=1.0) is None  # the whole deadline: fine
    assert admission.shed == 0


def test_retry_after_is_the_time_until_the_work_ahead_fits_the_deadline():
    assert retry_after_s(0.55, 0.5) == 1
    assert retry_after_s(3.2, 1.0) == 3
    assert retry_after_s(12.0, 10.0) == 2


def test_a_closed_loop_at_the_default_deadline_is_never_refused():
    from contextlib import ExitStack

    admission = measured(rate=150.0, forward_s=0.1)
    with ExitStack() as calls:
        for _ in range(64):  # 64 clients, one input each, all queued at once on one arm
            slot = calls.enter_context(admission.admitted())
            assert admission.judge("baseline", 1, timeout_s=10.0) is None
            calls.enter_context(slot.counted("baseline", 1))
        assert admission.shed == 0 and admission.queue("baseline").rows == 64
    assert admission.in_flight == 0 and admission.queue("baseline").rows == 0


def test_at_the_memory_cap_a_request_is_refused_at_once():
    admission = Admission(ceiling=2)
    with admission.admitted() as first, admission.admitted() as second:
        with admission.admitted() as third:
            assert first is not None and second is not None and third is None
        assert admission.door(10.0) == 1
    assert admission.in_flight == 0 and admission.shed == 1
    assert admission.door(10.0) is None


def test_a_client_that_leaves_frees_its_slot_and_its_rows_at_once():
    """Its task is cancelled mid-call: the block ends with CancelledError, and the next
    request's prediction no longer counts work nobody waits for."""
    import asyncio

    admission = measured(rate=100.0, forward_s=0.02)

    async def call(slot, forever: asyncio.Event):
        with slot.counted("baseline", 50):
            await forever.wait()

    async def main():
        forever = asyncio.Event()
        with admission.admitted() as slot:
            task = asyncio.create_task(call(slot, forever))
            await asyncio.sleep(0)
            assert admission.queue("baseline").rows == 50
            assert admission.judge("baseline", 1, timeout_s=0.3) is not None
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert admission.in_flight == 0 and admission.queue("baseline").rows == 0
        assert admission.judge("baseline", 1, timeout_s=0.3) is None

    asyncio.run(main())


def test_rows_of_a_failed_canary_call_move_to_the_baseline():
    admission = measured(rate=100.0)
    with admission.admitted() as slot:
        with pytest.raises(RuntimeError), slot.counted("optimized", 8):
            assert admission.queue("optimized").rows == 8
            raise RuntimeError("canary failed")
        with slot.counted("baseline", 8):
            assert admission.queue("optimized").rows == 0
            assert admission.queue("baseline").rows == 8
            slot.answered(0.04, 8)
    assert admission.queue("baseline").rows == 0
    assert admission.queue("baseline").fit.seen_rows == 8  # its forward was observed


def test_the_door_refuses_only_when_every_busy_arm_would_miss_the_deadline():
    admission = measured(rate=100.0, forward_s=0.02)
    admission.queue("baseline").add(200, 0.0)  # 2 s ahead
    assert admission.door(10.0) is None
    assert admission.door(1.0) == 2
    optimized = admission.queue("optimized")
    optimized.forwarded(0.01, 10)  # 1,000 rows/s
    optimized.add(10, 0.0)  # a busy arm that can still make it: the arm decides, later
    assert admission.door(1.0) is None


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        Admission(ceiling=0)


def test_the_snapshot_shows_each_arms_queue_and_prediction():
    admission = measured(rate=200.0, forward_s=0.05)
    admission.queue("baseline").add(100, 0.0)
    snap = admission.snapshot()
    assert snap["ceiling"] == 128 and snap["in_flight"] == 0 and snap["loop_lag_ms"] == 0
    assert snap["loop_cpu_share"] == 0
    assert snap["arms"]["baseline"] == {"rows": 100, "rate_per_s": 200.0, "forward_ms": 50.0,
                                        "predicted_ms": 550.0}


def test_sheds_reach_the_log_at_most_once_per_interval_with_their_count():
    clock = Clock()
    lines: list[str] = []
    admission = Admission(ceiling=4)
    summary = ShedSummary(admission, lines.append, every_s=10, clock=clock)
    for _ in range(5):
        summary.shed()
    assert lines == []
    clock.now += 10
    summary.shed()
    assert len(lines) == 1 and lines[0].startswith("shed 6 requests in the last 10 s")
    assert "nothing queued" in lines[0]


def test_the_loop_lag_is_how_late_a_timer_fires_while_the_loop_is_busy():
    import asyncio
    import time

    lag = LoopLag(every_s=0.005, weight=1.0)

    async def main():
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.02)
        assert lag.lag_s < 0.02
        time.sleep(0.1)  # the loop blocked, as under a flood of requests
        await asyncio.sleep(0.001)
        assert lag.lag_s >= 0.05
        task.cancel()

    asyncio.run(main())


def test_time_spent_waiting_for_the_loop_comes_off_the_deadline_at_the_door():
    admission = measured(rate=100.0, forward_s=0.02)
    admission.queue("baseline").add(80, 0.0)  # 0.8 s ahead + 20 ms
    assert admission.door(1.0) is None
    admission.loop.observe(1.0)  # requests wait ~0.3 s (weight 0.3) before any handler
    assert admission.door(1.0) == 1


def test_a_replica_is_shedding_for_a_second_after_each_refusal_wherever_it_refused():
    """`shedding()` (what a colocated model's batches ask before leaving the loop a core) is
    true within SHEDDING_S of the last refusal: at the memory cap, by the arm's deadline, or
    one reported from the door (`refused`)."""
    clock = Clock()
    admission = measured(rate=100, clock=clock)
    assert not admission.shedding()  # never refused
    admission.ceiling = 1
    held = admission.enter()
    assert admission.enter() is None  # at the memory cap
    assert admission.shedding() and admission.shed == 1
    clock.now += SHEDDING_S + 0.01
    assert not admission.shedding()
    admission.leave(held)
    admission.queue("baseline").add(500, clock())  # 5 s of work ahead
    assert admission.judge("baseline", 1, timeout_s=1.0) is not None
    assert admission.shedding() and admission.shed == 2
    clock.now += SHEDDING_S + 0.01
    admission.refused()  # a refusal at the door, reported by serve.gateway.ingress's caller
    assert admission.shedding() and admission.shed == 3


def test_the_loops_cpu_share_is_its_threads_cpu_time_over_wall_time_per_window():
    """`LoopLag.sample` (on the loop's thread) closes a window once `share_window_s` of wall
    time has passed, and averages the window's CPU seconds over its wall seconds in."""
    wall, cpu = Clock(), Clock()
    lag = LoopLag(share_window_s=0.25, share_weight=0.5, thread_time=cpu, clock=wall)
    lag.sample()  # the first window opens
    wall.now += 0.1
    cpu.now += 0.1
    lag.sample()
    assert lag.cpu_share == 0.0  # the window is not over yet
    wall.now += 0.4
    cpu.now += 0.3
    lag.sample()  # 0.4 CPU seconds over 0.5 wall seconds, half weight
    assert lag.cpu_share == pytest.approx(0.4)
    wall.now += 0.5
    lag.sample()  # an idle window
    assert lag.cpu_share == pytest.approx(0.2)
    wall.now += 0.5
    cpu.now += 2.0  # more CPU than wall time (a clock's granularity): one core at most
    lag.sample()
    assert lag.cpu_share == pytest.approx(0.6)


def test_the_loop_task_measures_the_cpu_its_own_thread_spends():
    import asyncio
    import time

    lag = LoopLag(every_s=0.005, share_window_s=0.05, share_weight=1.0)

    async def main():
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.2)
        idle = lag.cpu_share
        spun = time.thread_time() + 0.3
        while time.thread_time() < spun:  # the loop's thread computing, as when it parses
            pass
        await asyncio.sleep(0.01)
        task.cancel()
        return idle

    idle = asyncio.run(main())
    assert idle < BUSY_LOOP_SHARE
    assert lag.cpu_share > BUSY_LOOP_SHARE


def test_a_loop_is_busy_while_shedding_or_while_it_spends_a_share_of_a_core():
    """`loop_busy()` (what a colocated model's batches ask before leaving the loop a core)."""
    clock = Clock()
    admission = measured(rate=100, clock=clock)
    assert not admission.loop_busy()
    wall, cpu = Clock(), Clock()
    admission.loop = LoopLag(share_window_s=0.1, share_weight=1.0, thread_time=cpu, clock=wall)

    def spend(share: float) -> None:  # one window of a second at that share of a core
        admission.loop.sample()
        wall.now += 1.0
        cpu.now += share
        admission.loop.sample()

    spend(BUSY_LOOP_SHARE)
    assert admission.loop_busy()
    spend(BUSY_LOOP_SHARE - 0.01)
    assert not admission.loop_busy()
    admission.refused()
    assert admission.loop_busy()
    clock.now += SHEDDING_S + 0.01
    assert not admission.loop_busy()


def test_arms_that_share_one_compute_thread_count_each_others_rows_ahead():
    """`shared_compute` (the colocated topology): the other arm's rows ahead, at its rate,
    come before this arm's answer, in the judgement, the canary's lateness, the door and the
    snapshot; without it (remote arms) each arm's own queue alone."""
    def two_arms(shared: bool) -> Admission:
        clock = Clock()
        admission = Admission(ceiling=128, clock=clock, shared_compute=shared)
        for arm in ("baseline", "optimized"):
            queue = admission.queue(arm)
            rows = int(100 * RATE_WINDOW_S * 2)
            queue.add(rows, clock())
            clock.now += rows / 100
            queue.remove(rows, clock(), answered=True)
            queue.forwarded(0.02, 1)
        admission.queue("baseline").add(50, clock())  # 0.5 s ahead
        admission.queue("optimized").add(80, clock())  # 0.8 s ahead
        return admission

    alone, shared = two_arms(False), two_arms(True)
    assert alone.predicted_s("optimized", 1) == pytest.approx(0.82)
    assert shared.predicted_s("optimized", 1) == pytest.approx(1.32)
    assert shared.predicted_s("baseline", 1) == pytest.approx(1.32)
    assert alone.judge("optimized", 1, timeout_s=1.0) is None
    refusal = shared.judge("optimized", 1, timeout_s=1.0)
    assert refusal is not None and refusal.predicted_s == pytest.approx(1.32)
    assert not alone.late("baseline", 1, 1.0) and shared.late("baseline", 1, 1.0)
    assert alone.door(1.0) is None and shared.door(1.0) == 1
    assert shared.snapshot()["arms"]["optimized"]["predicted_ms"] == pytest.approx(1320.0)
    assert alone.snapshot()["arms"]["optimized"]["predicted_ms"] == pytest.approx(820.0)


def test_rows_count_from_the_judgement_and_come_back_when_no_call_follows():
    """`Slot.reserve` counts a judged request's rows at once; its call takes them over
    (counted once), a call on another arm (the baseline fallback) moves them, and leaving the
    slot without a call gives them back."""
    admission = measured(rate=100)
    queue = admission.queue("baseline")
    slot = admission.enter()
    slot.reserve("baseline", 40)
    assert queue.rows == 40
    with slot.counted("baseline", 40):
        assert queue.rows == 40  # not twice
    assert queue.rows == 0 and slot.reserved is None

    slot.reserve("optimized", 10)
    with slot.counted("baseline", 10):  # a reroute to the baseline
        assert queue.rows == 10 and admission.queue("optimized").rows == 0
    slot.reserve("baseline", 25)
    admission.leave(slot)  # the request ended before its call (an error, the client gone)
    assert queue.rows == 0 and admission.in_flight == 0


def test_on_one_compute_thread_the_arm_with_the_faster_forward_answers_sooner():
    """`Admission.sooner`: with `shared_compute` both arms wait behind the same rows ahead, so
    the one with the faster forward answers first; remote arms are never compared (True)."""
    def two_arms(shared: bool) -> Admission:
        clock = Clock()
        admission = Admission(ceiling=128, clock=clock, shared_compute=shared)
        for arm, rate, forward_s in (("baseline", 100, 0.02), ("optimized", 400, 0.005)):
            queue = admission.queue(arm)
            rows = int(rate * RATE_WINDOW_S * 2)
            queue.add(rows, clock())
            clock.now += rows / rate
            queue.remove(rows, clock(), answered=True)
            queue.forwarded(forward_s, 1)
        admission.queue("optimized").add(240, clock())  # 0.6 s ahead
        return admission

    shared, alone = two_arms(True), two_arms(False)
    assert shared.predicted_s("optimized", 1) == pytest.approx(0.605)
    assert shared.predicted_s("baseline", 1) == pytest.approx(0.62)
    assert shared.sooner("optimized", "baseline", 1)
    assert not shared.sooner("baseline", "optimized", 1)
    assert alone.sooner("baseline", "optimized", 1) and alone.sooner("optimized", "baseline", 1)
