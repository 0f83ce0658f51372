"""The contract of an IdempotencyStore; run against the in-memory twin and Redis."""

from __future__ import annotations

import threading

import pytest

from rollout.idempotency import Budget, IdempotencyRecord, IdempotencyStore

RESPONSE = {"status": 200, "body": {"outputs": [1]}, "headers": {"X-Canary-Arm": "baseline"}}


class IdempotencyContract:
    @pytest.fixture
    def store(self) -> IdempotencyStore:  # pragma: no cover - always overridden
        raise NotImplementedError

    def test_first_claim_owns_the_key(self, store):
        assert store.claim("k1", "fp-a") is None

    def test_second_claim_sees_the_pending_record(self, store):
        store.claim("k1", "fp-a")
        record = store.claim("k1", "fp-a")
        assert record == IdempotencyRecord("fp-a", False)

    def test_completed_record_is_replayed_with_its_fingerprint(self, store):
        store.claim("k1", "fp-a")
        store.complete("k1", IdempotencyRecord("fp-a", True, RESPONSE))
        record = store.claim("k1", "fp-b")
        assert record.done and record.response == RESPONSE and record.fingerprint == "fp-a"

    def test_release_lets_a_retry_own_the_key_again(self, store):
        store.claim("k1", "fp-a")
        store.release("k1")
        assert store.claim("k1", "fp-a") is None

    def test_keys_are_independent(self, store):
        store.claim("k1", "fp-a")
        assert store.claim("k2", "fp-a") is None

    def test_exactly_one_of_many_concurrent_claims_wins(self, store):
        winners, barrier = [], threading.Barrier(8)

        def claim():
            barrier.wait()
            if store.claim("race", "fp") is None:
                winners.append(1)

        threads = [threading.Thread(target=claim) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(winners) == 1

    def test_an_answer_over_the_record_cap_is_not_stored_and_frees_its_key(self, store):
        store.budget = Budget(max_record_bytes=1024, budget_bytes=1024 * 1024)
        big = {"status": 200, "body": {"outputs": ["x" * 2000]}, "headers": {}}
        store.claim("k1", "fp")
        assert store.complete("k1", IdempotencyRecord("fp", True, big)) is False
        assert store.claim("k1", "fp") is None  # a retry runs again
        assert store.complete("k1", IdempotencyRecord("fp", True, RESPONSE)) is True
        assert store.claim("k1", "fp").done

    def test_answers_past_the_budget_are_not_stored(self, store):
        record = IdempotencyRecord("fp", True, {"status": 200, "body": "x" * 600, "headers": {}})
        store.budget = Budget(max_record_bytes=1024, budget_bytes=1500)
        stored = []
        for key in ("a", "b", "c"):
            store.claim(key, "fp")
            stored.append(store.complete(key, record))
        assert stored == [True, True, False]
        assert store.claim("a", "fp").done and store.claim("c", "fp") is None
