import uuid

import pytest

from rollout.idempotency import IdempotencyRecord, RedisIdempotencyStore
from tests.idempotency_contract import RESPONSE, IdempotencyContract


class TestRedisIdempotency(IdempotencyContract):
    @pytest.fixture
    def store(self, redis_url):
        store = RedisIdempotencyStore(redis_url, f"idem-{uuid.uuid4().hex[:6]}", ttl_s=60,
                                      pending_ttl_s=10)
        yield store
        store.close()


def test_records_carry_their_expiry(redis_url, redis_server):
    store = RedisIdempotencyStore(redis_url, "ttl", ttl_s=60, pending_ttl_s=10)
    client = redis_server.client()
    store.claim("k", "fp")
    assert 0 < client.pttl("rollout:ttl:idem:k") <= 10_000
    store.complete("k", IdempotencyRecord("fp", True, RESPONSE))
    assert 10_000 < client.pttl("rollout:ttl:idem:k") <= 60_000
    store.close()
    client.close()
