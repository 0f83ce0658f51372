"""The model's answer (serve.common.answer): frozen, pickled across the Ray call, its stages in
order for `Server-Timing`, and the coalesced call's size set on a copy."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.gateway.exchange import batch_timing, server_timing

ANSWER = ModelAnswer(arm="optimized", model_version="bf16-x", outputs=[{"label": "sports"}],
                     tokens=7, batch=BatchShape(requests=3, items=5), queue=2,
                     timing=StageTiming(preprocess=1.0, queue=2.0, model=8.0, postprocess=0.5))


def test_it_survives_pickling_and_cannot_be_changed_in_place():
    assert pickle.loads(pickle.dumps(ANSWER)) == ANSWER
    with pytest.raises(dataclasses.FrozenInstanceError):
        ANSWER.arm = "baseline"  # type: ignore[misc]


def test_a_coalesced_answer_is_a_copy_with_the_call_size():
    shared = ANSWER.in_call(4)
    assert (shared.batch.call, ANSWER.batch.call) == (4, 1)
    assert dataclasses.replace(shared, batch=ANSWER.batch) == ANSWER


def test_server_timing_reads_the_stages_in_order_and_the_batch():
    assert list(ANSWER.timing.as_dict()) == ["preprocess", "queue", "model", "postprocess"]
    header = server_timing(ANSWER.timing.as_dict()) + batch_timing(ANSWER.in_call(2).batch)
    assert header == ('preprocess;dur=1.000, queue;dur=2.000, model;dur=8.000, '
                      'postprocess;dur=0.500, batch;desc="requests=3 items=5 call=2"')
