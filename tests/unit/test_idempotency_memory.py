import pytest

from rollout import FakeClock
from rollout.idempotency import IdempotencyRecord, MemoryIdempotencyStore, fingerprint
from tests.idempotency_contract import RESPONSE, IdempotencyContract


class TestMemoryIdempotency(IdempotencyContract):
    @pytest.fixture
    def store(self):
        return MemoryIdempotencyStore(ttl_s=60, pending_ttl_s=10, clock=FakeClock())


def test_pending_records_expire_sooner_than_completed_ones():
    clock = FakeClock()
    store = MemoryIdempotencyStore(ttl_s=60, pending_ttl_s=10, clock=clock)
    store.claim("crashed-owner", "fp")
    store.claim("served", "fp")
    store.complete("served", IdempotencyRecord("fp", True, RESPONSE))
    clock.advance(11)
    assert store.claim("crashed-owner", "fp") is None  # the abandoned claim expired
    assert store.claim("served", "fp").done
    clock.advance(50)
    assert store.claim("served", "fp") is None  # past the window: a new request


def test_fingerprint_separates_parts():
    assert fingerprint("ab", "c") != fingerprint("a", "bc")
    assert fingerprint("x") == fingerprint("x")
