"""serve.admission: the adaptive in-flight limit (AIMD on queueing)."""

from __future__ import annotations

import asyncio

import pytest

from serve.admission import AdaptiveLimit


def limit(at: float | None = 16, **kw):
    """A limit of 4..64, put at `at` (as if it had grown there)."""
    admission = AdaptiveLimit(**{"floor": 4, "ceiling": 64, "target_s": 0.05, **kw})
    if at is not None and admission.enabled:
        admission.limit = float(at)
    return admission


def test_it_starts_at_the_floor():
    assert limit(at=None).limit == 4


def fill(admission):
    slots = []
    while (slot := admission.try_enter()) is not None:
        slots.append(slot)
    return slots


def test_no_slot_over_the_limit():
    admission = limit()
    slots = fill(admission)
    assert len(slots) == 16 and admission.in_flight == 16
    assert admission.try_enter() is None
    admission.leave(slots.pop())
    assert admission.try_enter() is not None


def test_queueing_longer_than_target_and_a_forward_shrinks_the_limit_once_per_window():
    admission = limit()
    slots = fill(admission)
    for slot in slots:  # a whole batch answered late: one signal, not sixteen
        slot.answered(total_s=1.0, model_s=0.1, target_s=admission.target_s)
        admission.leave(slot)
    assert admission.limit == pytest.approx(16 * 0.9)
    for _ in range(200):  # sustained: down to the floor, never below
        slot = admission.try_enter()
        slot.answered(total_s=1.0, model_s=0.1, target_s=admission.target_s)
        admission.leave(slot)
    assert admission.limit == 4


def test_a_missed_deadline_cuts_the_limit_to_what_is_in_flight_at_once():
    admission = limit(at=40)
    slots = fill(admission)
    for slot in slots[10:]:  # 30 finish without telling anything
        admission.leave(slot)
    slots = slots[:10]
    slots[0].overloaded()
    admission.leave(slots[0])
    assert admission.limit == pytest.approx(10 * 0.9)  # 10 were in flight, this one included
    slots[1].overloaded()  # the same window: it still cuts, to what is in flight now
    admission.leave(slots[1])
    assert admission.limit == pytest.approx(9 * 0.9)
    for slot in slots[2:]:
        slot.overloaded()
        admission.leave(slot)
    assert admission.limit == 4  # never below the floor


def test_waiting_behind_one_forward_is_batching_not_a_queue():
    admission = limit()
    slot = admission.try_enter()
    slot.answered(total_s=0.8, model_s=0.4, target_s=admission.target_s)
    assert slot.congested is False
    slot.answered(total_s=0.09, model_s=0.01, target_s=admission.target_s)
    assert slot.congested is True


def _round(admission, total_s=0.02, model_s=0.015):
    for slot in fill(admission):
        slot.answered(total_s=total_s, model_s=model_s, target_s=admission.target_s)
        admission.leave(slot)


def test_the_limit_grows_while_it_binds_and_not_while_idle():
    admission = limit()
    admission.window = 1  # past slow start
    for _ in range(100):  # one at a time: the limit never binds
        slot = admission.try_enter()
        slot.answered(total_s=0.02, model_s=0.015, target_s=admission.target_s)
        admission.leave(slot)
    assert admission.limit == 16
    for _ in range(20):  # full and fast: about one more per round trip
        _round(admission)
    assert 20 < admission.limit < 64
    for _ in range(200):
        _round(admission)
    assert admission.limit == 64  # the ceiling: the memory cap


def test_until_the_first_decrease_it_grows_by_one_per_binding_answer():
    admission = limit(at=None)
    _round(admission)  # 4 admitted, 3 of them with at least half the limit in use: +3
    assert admission.limit == 7
    for _ in range(3):
        _round(admission)
    assert admission.limit > 12
    _round(admission, total_s=1.0, model_s=0.1)  # congested: one decrease, slow start ends
    after = admission.limit
    _round(admission)
    assert after < admission.limit < after + 1


def test_failures_that_say_nothing_about_load_leave_the_limit_alone():
    admission = limit()
    slot = admission.try_enter()
    admission.leave(slot)  # e.g. a 422: nothing reported
    assert admission.limit == 16 and admission.in_flight == 0


def test_disabled_the_limit_is_the_ceiling_and_fixed():
    admission = limit(enabled=False)
    slots = fill(admission)
    assert len(slots) == 64
    for slot in slots:
        slot.overloaded()
        admission.leave(slot)
    assert admission.limit == 64


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        limit(floor=0)
    with pytest.raises(ValueError):
        limit(floor=65)
    with pytest.raises(ValueError):
        limit(backoff=1.0)


def test_over_the_limit_a_request_waits_for_a_slot_at_most_the_target_then_is_shed():
    async def scenario():
        admission = limit(target_s=0.2)
        slots = fill(admission)
        waiter = asyncio.create_task(admission.enter())
        await asyncio.sleep(0.05)
        assert admission.waiting == 1 and not waiter.done()
        admission.leave(slots.pop())  # a slot frees: the first waiter gets it
        got = await waiter
        assert got is not None and admission.in_flight == 16 and admission.waiting == 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        shed = await admission.enter()  # nobody leaves: shed after the target
        assert shed is None and 0.2 <= loop.time() - started < 0.5
        assert admission.shed == 1 and admission.waiting == 0

    asyncio.run(scenario())


def test_with_the_ceiling_admitted_or_waiting_a_request_is_shed_at_once():
    async def scenario():
        admission = limit(at=3, floor=2, ceiling=3, target_s=10)
        fill(admission)  # 3: the ceiling
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await admission.enter() is None
        assert loop.time() - started < 0.05

    asyncio.run(scenario())


def test_a_waiter_whose_client_goes_away_leaves_no_slot_taken():
    async def scenario():
        admission = limit(target_s=5)
        slots = fill(admission)
        waiter = asyncio.create_task(admission.enter())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert admission.waiting == 0
        for slot in slots:
            admission.leave(slot)
        assert admission.in_flight == 0

    asyncio.run(scenario())


def test_saturated_when_every_slot_is_taken_and_as_many_wait():
    async def scenario():
        admission = limit(at=4, floor=1, ceiling=8, target_s=5)
        fill(admission)
        assert not admission.saturated()
        waiters = [asyncio.create_task(admission.enter()) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert admission.saturated()
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert not admission.saturated()

    asyncio.run(scenario())


def test_sheds_reach_the_log_at_most_once_per_interval_with_their_count():
    from serve.admission import ShedSummary

    now = [100.0]
    lines: list[str] = []
    summary = ShedSummary(limit(), lines.append, every_s=10, clock=lambda: now[0])
    for _ in range(500):  # a storm within one interval: no line yet
        summary.shed()
        now[0] += 0.001
    assert lines == []
    now[0] = 111.0
    summary.shed()
    assert lines == ["shed 501 requests in the last 11 s "
                     "(admission limit 16, 0 in flight, 0 waiting)"]
    summary.shed()
    assert len(lines) == 1 and summary.count == 1


def test_admitted_gives_the_slot_back_however_the_block_ends():
    """The in-flight count as a context manager: left once, on an answer, an error or a
    cancelled request (the client went away), and nothing to leave when shed."""

    async def scenario():
        limit = AdaptiveLimit(floor=1, ceiling=1, target_s=0.0)
        async with limit.admitted() as slot:
            assert slot is not None and limit.in_flight == 1
            async with limit.admitted() as shed:  # over the ceiling: shed at once
                assert shed is None
        assert limit.in_flight == 0
        with pytest.raises(RuntimeError):
            async with limit.admitted():
                raise RuntimeError("a bug in the request path")
        assert limit.in_flight == 0
        entered = asyncio.Event()

        async def held():
            async with limit.admitted():
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(held())
        await entered.wait()
        assert limit.in_flight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert limit.in_flight == 0

    asyncio.run(scenario())


def test_the_wait_for_a_slot_follows_the_forwards_when_they_are_longer_than_the_target():
    admission = limit(target_s=0.05)
    assert admission.wait_s == 0.05  # nothing answered yet: the target
    for _ in range(40):  # forwards of 0.8 s (8-text requests on 2 cores)
        slot = admission.try_enter() or pytest.fail("no slot")
        slot.answered(total_s=0.9, model_s=0.8, target_s=admission.target_s)
        admission.leave(slot)
    assert 0.79 < admission.wait_s <= 0.8 and admission.snapshot()["wait_ms"] == round(
        admission.wait_s * 1000, 1)
    for _ in range(40):  # short forwards again: back to the target
        slot = admission.try_enter()
        slot.answered(total_s=0.02, model_s=0.01, target_s=admission.target_s)
        admission.leave(slot)
    assert admission.wait_s == 0.05
    shed = admission.try_enter()
    shed.overloaded()  # no forward learned from a refused or timed-out call
    admission.leave(shed)
    assert admission.wait_s == 0.05


def test_a_request_over_the_limit_waits_for_the_forward_in_progress_not_only_the_target():
    async def scenario():
        admission = limit(target_s=0.02)
        admission.forward_s = 0.3  # forwards of 0.3 s recently
        slots = fill(admission)
        waiter = asyncio.create_task(admission.enter())
        await asyncio.sleep(0.1)  # past the target, within a forward: still waiting
        assert not waiter.done() and admission.waiting == 1
        admission.leave(slots.pop())  # the forward ended: its slot goes to the waiter
        assert await waiter is not None and admission.shed == 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await admission.enter() is None  # nobody leaves: shed after one forward
        assert 0.3 <= loop.time() - started < 0.6 and admission.shed == 1

    asyncio.run(scenario())
