"""The gateway's hold on an `Idempotency-Key` (serve.gateway.idempotent `Idempotency.claim`), over
the in-memory store: a replay, a refusal, the response stored on success, and the key released in
one place however the block ends (an error response, a bug, a cancelled request)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollout import FakeClock
from rollout.errors import StoreRefused
from rollout.idempotency import Budget, MemoryIdempotencyStore
from rollout.settings import ServingSettings, StateSettings
from rollout.watcher import error_kind
from serve.common.errors import InProgress, InvalidInput, KeyReused
from serve.gateway.idempotent import Idempotency

RESPONSE = {"status": 200, "body": {"arm": "baseline"}, "headers": {"X-Request-ID": "r1"}}


@pytest.fixture
def idem() -> Idempotency:
    idempotency = Idempotency(StateSettings(), ServingSettings())
    idempotency.store = MemoryIdempotencyStore(ttl_s=60, pending_ttl_s=10, clock=FakeClock())
    return idempotency


def test_a_completed_claim_is_replayed_to_a_retry(idem):
    async def scenario():
        async with idem.claim("k1", "classify", ["a"]) as claim:
            assert claim.replay is None
            claim.complete(RESPONSE)
        async with idem.claim("k1", "classify", ["a"]) as again:
            assert again.replay == RESPONSE

    asyncio.run(scenario())


def test_a_key_is_refused_while_served_and_for_other_inputs(idem):
    async def scenario():
        async with idem.claim("k1", "classify", ["a"]):
            with pytest.raises(InProgress):
                async with idem.claim("k1", "classify", ["a"]):
                    pass
        async with idem.claim("k2", "classify", ["a"]) as claim:
            claim.complete(RESPONSE)
        with pytest.raises(KeyReused):
            async with idem.claim("k2", "classify", ["b"]):
                pass
        with pytest.raises(InvalidInput):
            async with idem.claim("not a key!", "classify", ["a"]):
                pass

    asyncio.run(scenario())


@pytest.mark.parametrize("ending", ["no response", "error", "cancelled"])
def test_an_unfinished_claim_is_released_so_a_retry_runs(idem, ending):
    inside = asyncio.Event()

    async def held():
        async with idem.claim("k1", "classify", ["a"]):
            inside.set()
            if ending == "error":
                raise RuntimeError("a bug in the request path")
            if ending == "cancelled":
                await asyncio.sleep(60)

    async def scenario():
        task = asyncio.create_task(held())
        await inside.wait()
        if ending == "cancelled":
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async with idem.claim("k1", "classify", ["a"]) as retry:  # owned again: not InProgress
            assert retry.replay is None

    asyncio.run(scenario())


def test_without_a_key_or_a_store_the_block_runs_without_deduplication(idem):
    class Down(MemoryIdempotencyStore):
        def claim(self, key, fingerprint):
            from rollout import RolloutError

            raise RolloutError("redis down")

    async def scenario():
        async with idem.claim(None, "classify", ["a"]) as claim:
            assert claim.replay is None
        idem.store = Down(ttl_s=60, pending_ttl_s=10)
        async with idem.claim("k1", "classify", ["a"]) as claim:
            claim.complete(RESPONSE)  # nothing stored, nothing raised

    asyncio.run(scenario())


class SlowClaims(MemoryIdempotencyStore):
    """Claims that take until `landed` is set to reach the store, as a slow Redis would."""

    def __init__(self):
        super().__init__(ttl_s=60, pending_ttl_s=10, clock=FakeClock())
        self.started, self.landed = threading.Event(), threading.Event()
        self.claimed = threading.Event()

    def claim(self, key, fingerprint):
        self.started.set()
        self.landed.wait(5)
        try:
            return super().claim(key, fingerprint)
        finally:
            self.claimed.set()


def test_a_client_that_leaves_during_its_claim_leaves_no_pending_record(idem):
    idem.store = slow = SlowClaims()

    async def scenario():
        task = asyncio.create_task(idem.begin("k1", "fp"))
        await asyncio.to_thread(slow.started.wait, 5)
        task.cancel()  # the client went away while the claim was on its way
        with pytest.raises(asyncio.CancelledError):
            await task
        slow.landed.set()
        await asyncio.to_thread(slow.claimed.wait, 5)
        for _ in range(200):  # the landed claim is released in the background
            if slow._live("k1") is None:
                break
            await asyncio.sleep(0.01)
        assert slow._live("k1") is None
        assert await idem.begin("k1", "fp") == (None, True)  # a retry owns the key

    asyncio.run(scenario())


@pytest.mark.parametrize("fault", [
    StoreRefused("OOM command not allowed when used memory > 'maxmemory'", "OOM"),
    StoreRefused("READONLY You can't write against a read only replica.", "READONLY"),
    ValueError("a record this version cannot read"),
])
def test_a_store_that_answers_with_an_error_serves_without_deduplication(idem, fault, caplog):
    class Refusing(MemoryIdempotencyStore):
        def claim(self, key, fingerprint):
            raise fault

        def complete(self, key, record):
            raise fault

    async def scenario():
        idem.store = Refusing(ttl_s=60, pending_ttl_s=10)
        for _ in range(3):
            async with idem.claim("k1", "classify", ["a"]) as claim:
                assert claim.replay is None
                claim.complete(RESPONSE)

    asyncio.run(scenario())
    assert idem.skipped == {error_kind(fault): 3}
    assert sum("without deduplication" in r.getMessage() for r in caplog.records) == 1


def test_an_answer_over_budget_is_served_and_counted(idem):
    idem.store = MemoryIdempotencyStore(ttl_s=60, pending_ttl_s=10, clock=FakeClock(),
                                        budget=Budget(max_record_bytes=1024, budget_bytes=10**6))

    async def scenario():
        async with idem.claim("k1", "embed", ["a"]) as claim:
            claim.complete({"status": 200, "body": "x" * 4096, "headers": {}})
        async with idem.claim("k1", "embed", ["a"]) as again:
            assert again.replay is None  # not stored: the retry runs

    asyncio.run(scenario())
    assert idem.skipped == {"over budget": 1}
