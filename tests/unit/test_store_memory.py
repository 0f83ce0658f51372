"""The in-memory state store runs the same contract as the Redis one."""

import pytest

from rollout import MemoryStateStore
from tests.store_contract import StoreContract


class TestMemoryStateStore(StoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStateStore()
