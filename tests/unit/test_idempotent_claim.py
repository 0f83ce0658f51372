"""The gateway's hold on an `Idempotency-Key` (serve.idempotent `Idempotency.claim`), over the
in-memory store: a replay, a refusal, the response stored on success, and the key released in
one place however the block ends (an error response, a bug, a cancelled request)."""

from __future__ import annotations

import asyncio

import pytest

from rollout import FakeClock
from rollout.idempotency import MemoryIdempotencyStore
from rollout.settings import ServingSettings, StateSettings
from serve.errors import InProgress, InvalidInput, KeyReused
from serve.idempotent import Idempotency

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
