"""The in-memory ramp store runs the same contract as the Redis one (lease time: a fake clock)."""

import pytest

from rollout import FakeClock, MemoryStateStore
from rollout.ramp import MemoryRampStore
from tests.ramp_store_contract import Lapse, RampStoreContract


class TestMemoryRampStore(RampStoreContract):
    @pytest.fixture
    def clock(self):
        return FakeClock()

    @pytest.fixture
    def stores(self, clock):
        states = MemoryStateStore()
        return states, MemoryRampStore(states, clock)

    @pytest.fixture
    def lapse(self, clock):
        return Lapse(15.0, lambda: clock.advance(15.0))
