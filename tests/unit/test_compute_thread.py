"""One compute thread per process (serve.replica.compute): where every torch op of its models
runs, and how an arm's thread count is set there."""

import threading

import pytest
import torch

from serve.replica import compute


def test_one_compute_thread_per_process():
    assert compute.executor() is compute.executor()
    names = {compute.run(lambda: threading.current_thread().name) for _ in range(5)}
    assert names == {compute.THREAD_NAME + "_0"}
    assert not compute.on_compute_thread()


def test_a_call_from_the_compute_thread_runs_in_place_rather_than_waiting_on_itself():
    def nested():
        return compute.run(lambda: (compute.on_compute_thread(), 42))

    assert compute.executor().submit(nested).result(timeout=10) == (True, 42)


def test_an_error_on_the_compute_thread_reaches_the_caller():
    def fails():
        raise ValueError("this model is a classifier")

    with pytest.raises(ValueError, match="classifier"):
        compute.run(fails)
    assert compute.run(lambda: 1) == 1  # the thread goes on


def test_an_arms_thread_count_is_set_on_the_compute_thread_only():
    here = torch.get_num_threads()

    def set_and_read(threads):
        compute.ensure_threads(threads)
        return torch.get_num_threads()

    assert compute.run(set_and_read, 1) == 1
    assert compute.run(set_and_read, 2) == 2
    assert torch.get_num_threads() == here
