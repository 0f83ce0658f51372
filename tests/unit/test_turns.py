"""Batches of model servers that share one compute thread, in the order their requests arrived
(serve.replica.turns)."""

import asyncio

from serve.replica.turns import Turns


def test_a_batch_waits_only_for_other_servers_requests_that_arrived_before_it():
    turns, baseline, optimized = Turns(), object(), object()
    first, later = object(), object()
    turns.queued(baseline, first, 1.0)
    turns.queued(baseline, later, 3.0)
    assert turns.behind(optimized, 2.0)  # the baseline's request of 1.0 came first
    assert not turns.behind(optimized, 0.5)  # nothing of the baseline's is older
    assert not turns.behind(baseline, 5.0)  # its own requests never hold a server back
    turns.left(baseline, first)
    assert not turns.behind(optimized, 2.0)
    turns.left(baseline, first)  # leaving twice is leaving once
    assert turns.behind(optimized, 4.0)


def test_a_waiting_batch_goes_when_the_older_request_leaves_and_not_before():
    turns, baseline, optimized, older = Turns(), object(), object(), object()

    async def scenario():
        turns.queued(baseline, older, 1.0)
        waiting = asyncio.ensure_future(turns.wait(optimized, 2.0))
        await asyncio.sleep(0.05)
        held = not waiting.done()
        turns.left(baseline, older)
        await asyncio.wait_for(waiting, 1.0)
        return held

    assert asyncio.run(scenario())


def test_a_cancelled_wait_leaves_nothing_behind():
    turns, baseline, optimized, older = Turns(), object(), object(), object()

    async def scenario():
        turns.queued(baseline, older, 1.0)
        waiting = asyncio.ensure_future(turns.wait(optimized, 2.0))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        turns.left(baseline, older)  # wakes nobody, raises nothing
        await turns.wait(optimized, 2.0)  # nothing older waits: at once

    asyncio.run(scenario())
