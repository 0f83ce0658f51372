"""The Redis ramp store: the shared contract on a real redis-server (leases expire for real)."""

from __future__ import annotations

import time
import uuid

import pytest

from rollout.ramp.redis_store import RedisRampStore
from rollout.redis_store import RedisStateStore
from tests.ramp_store_contract import Lapse, RampStoreContract

TTL_S = 0.3


class TestRedisRampStore(RampStoreContract):
    @pytest.fixture
    def stores(self, redis_url):
        app = f"ramp-{uuid.uuid4().hex[:10]}"
        states = RedisStateStore(redis_url, app, timeout_s=5.0)
        ramps = RedisRampStore(redis_url, app, timeout_s=5.0)
        yield states, ramps
        states.close()
        ramps.close()

    @pytest.fixture
    def lapse(self, stores):
        _, ramps = stores

        def run_out():  # bounded: the key expires TTL_S after its last renewal
            deadline = time.monotonic() + 10 * TTL_S
            while ramps.holder() is not None:
                assert time.monotonic() < deadline, "the lease never expired"
                time.sleep(0.02)

        return Lapse(TTL_S, run_out)
