"""Coalescing concurrent requests into shared model calls (serve.gateway.coalesce), against a
scripted `send` whose calls the test opens and closes."""

import asyncio
import pickle

import pytest

from serve.common.answer import CallFailed
from serve.gateway.coalesce import Coalescer


class ScriptedSend:
    """Records every call; each stays open until the test answers or fails it."""

    def __init__(self):
        self.calls: list[tuple[list, asyncio.Future]] = []
        self.cancelled: list[list] = []

    async def __call__(self, items: list) -> list:
        done = asyncio.get_running_loop().create_future()
        self.calls.append((items, done))
        try:
            return await done
        except asyncio.CancelledError:
            self.cancelled.append(items)
            raise

    def answer(self, index: int, answers: list | None = None) -> None:
        items, done = self.calls[index]
        done.set_result(answers if answers is not None else [f"answer:{i}" for i in items])

    def fail(self, index: int, exc: Exception) -> None:
        self.calls[index][1].set_exception(exc)


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def _run(coro):
    return asyncio.run(coro)


async def _slot_taken():
    """A coalescer with one call slot, taken by an open call for "x": (send, coalescer, x)."""
    send = ScriptedSend()
    c = Coalescer(send, calls=1, max_items=16)
    busy = asyncio.create_task(c.call("x", timeout=5))
    await _settle()
    return send, c, busy


def test_a_lone_request_is_sent_at_once_alone():
    async def main():
        send = ScriptedSend()
        c = Coalescer(send, calls=2, max_items=16)
        task = asyncio.create_task(c.call("a", timeout=5))
        await _settle()
        assert [items for items, _ in send.calls] == [["a"]]
        send.answer(0)
        assert await task == "answer:a"
        assert c.sent == 1 and c.waiting == 0
    _run(main())


def test_requests_arriving_while_all_calls_are_open_go_together_in_the_next():
    async def main():
        send = ScriptedSend()
        c = Coalescer(send, calls=2, max_items=16)
        first = [asyncio.create_task(c.call(x, timeout=5)) for x in ("a", "b")]
        await _settle()
        later = [asyncio.create_task(c.call(x, timeout=5)) for x in ("c", "d", "e")]
        await _settle()
        assert [items for items, _ in send.calls] == [["a"], ["b"]]
        assert c.waiting == 3
        send.answer(0)  # a slot frees: everything waiting goes as one call
        await _settle()
        assert [items for items, _ in send.calls][2] == ["c", "d", "e"]
        send.answer(1)
        send.answer(2)
        assert await asyncio.gather(*first, *later) == [f"answer:{x}" for x in "abcde"]
        assert c.sent == 3
    _run(main())


def test_a_full_call_is_sent_even_with_every_slot_open_and_calls_are_capped():
    async def main():
        send = ScriptedSend()
        c = Coalescer(send, calls=1, max_items=3)
        tasks = [asyncio.create_task(c.call(i, timeout=5)) for i in range(8)]
        await _settle()
        # 0 alone (slot free), then full calls of 3 at once; 2 left waiting for a slot
        assert [items for items, _ in send.calls] == [[0], [1, 2, 3], [4, 5, 6]]
        assert c.waiting == 1
        for i in range(3):
            send.answer(i)
        await _settle()
        assert [items for items, _ in send.calls][3] == [7]
        send.answer(3)
        assert await asyncio.gather(*tasks) == [f"answer:{i}" for i in range(8)]
    _run(main())


def test_a_failed_call_fails_each_of_its_requests_and_only_those():
    async def main():
        send, c, busy = await _slot_taken()
        rest = [asyncio.create_task(c.call(x, timeout=5)) for x in ("b", "c")]
        await _settle()
        send.fail(0, ConnectionError("replica died"))
        with pytest.raises(ConnectionError):
            await busy
        await _settle()
        send.answer(1)
        assert await asyncio.gather(*rest) == ["answer:b", "answer:c"]
    _run(main())


def test_one_requests_failure_inside_a_call_is_its_own():
    async def main():
        send, c, busy = await _slot_taken()
        tasks = [asyncio.create_task(c.call(x, timeout=5)) for x in ("a", "b", "c")]
        await _settle()
        send.answer(0)
        await _settle()
        send.answer(1, ["answer:a", CallFailed("RuntimeError", "boom"), "answer:c"])
        results = await asyncio.gather(busy, *tasks, return_exceptions=True)
        assert results[0] == "answer:x" and results[1] == "answer:a" and results[3] == "answer:c"
        assert isinstance(results[2], CallFailed) and results[2].kind == "RuntimeError"
    _run(main())


def test_a_wrong_number_of_answers_fails_the_call_instead_of_misdelivering():
    async def main():
        send, c, busy = await _slot_taken()
        tasks = [asyncio.create_task(c.call(x, timeout=5)) for x in ("a", "b")]
        await _settle()
        send.answer(0)
        await _settle()
        send.answer(1, ["only one"])
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) and "1 answers to a call of 2" in str(r)
                   for r in results)
        assert await busy == "answer:x"
    _run(main())


def test_a_request_past_its_deadline_leaves_while_the_call_goes_on_for_the_others():
    async def main():
        send, c, busy = await _slot_taken()
        short = asyncio.create_task(c.call("short", timeout=0.05))
        patient = asyncio.create_task(c.call("patient", timeout=5))
        await _settle()
        send.answer(0)
        await _settle()
        assert [items for items, _ in send.calls][1] == ["short", "patient"]
        with pytest.raises(TimeoutError):
            await short
        assert send.cancelled == []  # "patient" still needs the call
        send.answer(1)
        assert await patient == "answer:patient"
        assert await busy == "answer:x"
    _run(main())


def test_a_request_that_times_out_while_waiting_is_never_sent():
    async def main():
        send, c, busy = await _slot_taken()
        with pytest.raises(TimeoutError):
            await c.call("late", timeout=0.02)
        assert c.waiting == 0
        send.answer(0)
        assert await busy == "answer:x"
        await _settle()
        assert [items for items, _ in send.calls] == [["x"]]
    _run(main())


def test_a_call_whose_requests_all_left_is_cancelled_and_frees_its_slot():
    async def main():
        send = ScriptedSend()
        c = Coalescer(send, calls=1, max_items=16)
        gone = asyncio.create_task(c.call("gone", timeout=5))
        await _settle()
        gone.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await gone
        await _settle()
        assert send.cancelled == [["gone"]]
        nxt = asyncio.create_task(c.call("next", timeout=5))
        await _settle()
        assert [items for items, _ in send.calls][-1] == ["next"]
        send.answer(len(send.calls) - 1)
        assert await nxt == "answer:next"
    _run(main())


def test_limits_and_the_carried_failure_cross_processes():
    with pytest.raises(ValueError):
        Coalescer(ScriptedSend(), calls=0, max_items=4)
    with pytest.raises(ValueError):
        Coalescer(ScriptedSend(), calls=1, max_items=0)
    failed = pickle.loads(pickle.dumps(CallFailed("OutOfMemoryError", "too big")))
    assert (failed.kind, failed.message) == ("OutOfMemoryError", "too big")
    assert str(failed) == "OutOfMemoryError: too big"


def test_a_freed_slot_waits_for_the_clients_of_the_call_that_ended_so_batches_fill():
    """A closed loop: the call of 7 ends while 1 request waits; the freed slot is held until
    the 7 are back (not sent with the 1 alone), then all 8 go in one call."""
    async def main():
        send = ScriptedSend()
        c = Coalescer(send, calls=1, max_items=16, hold_s=1.0)
        first = [asyncio.create_task(c.call(f"a{i}", timeout=5)) for i in range(7)]
        await _settle()  # "a0" alone (the slot was free), a1..a6 wait
        send.answer(0)
        await _settle()  # a1..a6 go together
        late = asyncio.create_task(c.call("late", timeout=5))
        await _settle()
        send.answer(1)
        await _settle()
        assert len(send.calls) == 2  # held: only "late" waits, 6 are expected back
        again = [asyncio.create_task(c.call(f"b{i}", timeout=5)) for i in range(6)]
        await _settle()
        assert [len(items) for items, _ in send.calls] == [1, 6, 7]
        send.answer(2)
        await asyncio.gather(*first, late, *again)

    _run(main())


def test_the_hold_ends_after_hold_s_and_a_lone_client_is_never_held():
    async def main():
        send = ScriptedSend()
        c = Coalescer(send, calls=1, max_items=16, hold_s=0.05)
        pair = [asyncio.create_task(c.call(x, timeout=5)) for x in ("x", "y")]
        await _settle()
        send.answer(0)
        await _settle()
        send.answer(1)  # a call of 1 ("y") ends: nobody is expected back for it
        await asyncio.gather(*pair)
        lone = asyncio.create_task(c.call("z", timeout=5))
        await _settle()
        assert [items for items, _ in send.calls][-1] == ["z"]  # sent at once
        send.answer(2)
        await lone
        # a call of 2 ends with nobody waiting: one request alone is held at most hold_s
        three = [asyncio.create_task(c.call(x, timeout=5)) for x in ("o", "p", "q")]
        await _settle()
        send.answer(3)
        await _settle()
        assert send.calls[-1][0] == ["p", "q"]
        send.answer(4)
        await asyncio.gather(*three)
        straggler = asyncio.create_task(c.call("s", timeout=5))
        await _settle()
        sent = len(send.calls)
        assert sent == 5  # x, y, z, o, [p, q]: "s" is held
        await asyncio.sleep(0.08)
        assert len(send.calls) == sent + 1 and send.calls[-1][0] == ["s"]
        send.answer(len(send.calls) - 1)
        await straggler

    _run(main())
