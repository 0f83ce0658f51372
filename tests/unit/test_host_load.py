"""A remote model replica's small batches leave a saturated machine a core
(serve.replica.host_load, serve.replica.thread_share `yielding` / `beside_neighbours`)."""

from __future__ import annotations

import os

import pytest

from rollout.settings import Settings
from serve.replica.host_load import HostLoad, idle_s
from serve.replica.thread_share import (
    SATURATED_IDLE,
    SMALL_BATCH_TOKENS,
    UNSATURATED_IDLE,
    beside_neighbours,
    yielding,
)

STAT = """cpu  900 0 300 5000 100 0 10 0 0 0
cpu0 400 0 100 2000 50 0 5 0 0 0
cpu1 500 0 200 3000 50 0 5 0 0 0
cpu2 1 0 1 7000 0 0 0 0 0 0
intr 12345
"""


def test_idle_time_counts_idle_and_iowait_of_the_cpus_asked_for(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    ticks = os.sysconf("SC_CLK_TCK")
    assert idle_s([0, 1], str(stat)) == pytest.approx((2050 + 3050) / ticks)
    assert idle_s([2], str(stat)) == pytest.approx(7000 / ticks)  # not the `cpu` total line


def test_this_machines_idle_time_is_readable_and_grows():
    first = idle_s()
    assert first > 0 and idle_s() >= first


class Machine:
    """A clock and an idle-seconds counter a test advances: `run(seconds, idle_cores)`."""

    def __init__(self):
        self.now, self.idle = 100.0, 5000.0

    def run(self, seconds: float, idle_cores: float) -> None:
        self.now += seconds
        self.idle += seconds * idle_cores


def load_on(machine: Machine) -> HostLoad:
    return HostLoad(window_s=0.25, weight=0.5, read_idle_s=lambda: machine.idle,
                    clock=lambda: machine.now)


def test_idle_cores_are_a_moving_average_over_closed_windows():
    machine = Machine()
    load = load_on(machine)
    assert load.idle() is None  # the first reading opens a window
    machine.run(0.1, 2.0)
    assert load.idle() is None  # not a whole window yet
    machine.run(0.2, 0.0)
    assert load.idle() == pytest.approx(0.2 / 0.3)  # the first window is taken as it is
    machine.run(0.5, 0.0)
    assert load.idle() == pytest.approx(0.2 / 0.3 / 2)


def test_a_saturated_machine_gets_a_core_back_from_small_batches_until_one_is_idle_again():
    machine = Machine()
    load = load_on(machine)
    assert load.threads(2, 2, 100) == 2  # nothing measured yet: every thread
    machine.run(0.3, 0.0)
    assert load.threads(2, 2, 100) == 1 and load.yields
    assert load.threads(2, 2, SMALL_BATCH_TOKENS) == 2  # a large batch keeps its threads
    for _ in range(5):  # with the core left, half a core idle: still saturated for it
        machine.run(0.3, 0.5)
        assert load.threads(2, 2, 100) == 1
    for _ in range(5):
        machine.run(0.3, 1.5)
    assert load.threads(2, 2, 100) == 2 and not load.yields


@pytest.mark.parametrize("idle, was, expected", [
    (0.0, False, True), (SATURATED_IDLE - 0.01, False, True), (SATURATED_IDLE, False, False),
    (0.5, True, True), (UNSATURATED_IDLE - 0.01, True, True), (UNSATURATED_IDLE, True, False),
])
def test_yielding_starts_at_saturation_and_ends_once_a_core_is_idle(idle, was, expected):
    assert yielding(idle, was) is expected


@pytest.mark.parametrize("threads, cores, tokens, yields, expected", [
    (2, 2, 100, False, 2), (2, 2, 100, True, 1), (1, 2, 100, True, 1), (1, 1, 100, True, 1),
    (8, 16, 100, True, 8), (16, 16, 100, True, 15), (2, 2, SMALL_BATCH_TOKENS, True, 2),
])
def test_a_yielding_replica_runs_small_batches_on_a_core_fewer(threads, cores, tokens, yields,
                                                               expected):
    assert beside_neighbours(threads, cores, tokens, yields) == expected


def test_without_proc_stat_the_replica_keeps_its_threads():
    def unreadable():
        raise FileNotFoundError("/proc/stat")

    load = HostLoad(read_idle_s=unreadable)
    assert load.idle() is None and load.threads(2, 2, 100) == 2 and not load.readable


@pytest.fixture
def server_for(tmp_path_factory, monkeypatch):
    """A model server of a tiny encoder on a 2-core machine, built outside Serve."""
    from ray.serve.batching import _BatchQueue

    from serve.replica.model_server import ModelServer
    from tests.tiny_model import make_tiny_encoder

    monkeypatch.setattr(_BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests",
                        lambda self: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    model = str(make_tiny_encoder(tmp_path_factory.mktemp("enc")))

    def build(**overrides) -> ModelServer:
        settings = Settings(model_path=model, optimized_recipe="bf16", torch_threads=2,
                            telemetry_enabled=False, **overrides)
        return ModelServer.func_or_class(settings, "baseline")

    return build


def test_a_model_server_yields_on_a_saturated_machine_unless_turned_off_or_colocated(server_for):
    server = server_for()
    machine = Machine()
    server.host_load = load_on(machine)
    server.host_load.idle()
    machine.run(0.3, 0.1)
    assert server._batch_threads(100) == 1
    assert server._batch_threads(SMALL_BATCH_TOKENS) == 2
    server.loop_busy = lambda: False  # colocated: its own loop decides, not the machine
    assert server._batch_threads(100) == 2
    assert server_for(yield_to_neighbours=False).host_load is None
