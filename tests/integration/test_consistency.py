"""Result consistency: one input gives the same label, and embeddings within 1e-4 (max abs
difference) and cosine >= 0.9999, alone, inside a batch of mixed lengths, under concurrent
batching, and from a restarted replica."""

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import torch

TEXT = "The quarterly results beat expectations across every region"
TOLERANCE = 1e-4


def _embed(gw, inputs, index):
    response = gw.client.post("/v1/predict", json={"inputs": inputs, "task": "embed"})
    assert response.status_code == 200, response.text
    return torch.tensor(response.json()["outputs"][index]["embedding"])


def _label(gw, inputs, index):
    response = gw.client.post("/v1/predict", json={"inputs": inputs})
    return response.json()["outputs"][index]["label"]


def _same(a, b):
    assert (a - b).abs().max().item() <= TOLERANCE
    assert torch.nn.functional.cosine_similarity(a, b, dim=0).item() >= 0.9999


def test_alone_in_a_mixed_batch_and_under_concurrency(gw):
    alone = _embed(gw, [TEXT], 0)
    mixed = ["a", TEXT, " ".join(["padding words"] * 12), "b c"]
    _same(alone, _embed(gw, mixed, 1))
    assert _label(gw, [TEXT], 0) == _label(gw, mixed, 1)
    with ThreadPoolExecutor(8) as pool:  # merged into batches with other requests
        others = [
            pool.submit(_embed, gw, [f"other input {i} " * (i % 6 + 1)], 0) for i in range(12)
        ]
        together = [pool.submit(_embed, gw, [TEXT], 0) for _ in range(4)]
        for future in together:
            _same(alone, future.result())
        for future in others:
            future.result()


def test_same_result_after_the_replica_restarts(gw):
    from ray import serve

    before = _embed(gw, [TEXT], 0)
    label = _label(gw, [TEXT], 0)
    handle = serve.get_deployment_handle("baseline", app_name="canary")
    victim = handle.info.remote().result(timeout_s=30)["pid"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while True:
        time.sleep(0.5)
        try:
            if handle.info.remote().result(timeout_s=10)["pid"] != victim:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "baseline replica never came back"
    _same(before, _embed(gw, [TEXT], 0))
    assert _label(gw, [TEXT], 0) == label
