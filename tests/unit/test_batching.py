"""Token-budgeted packing and out-of-memory splitting (serve.batching), with a fake forward."""

import pytest
import torch

from serve.batching import RowsDidNotFit, _Row, pack, run_budgeted


def fake_forward(calls, oom_over=None, oom_rows=()):
    """A forward that returns each row's length and first id, records the padded cost of each
    call, and raises an out-of-memory error over `oom_over` padded tokens or for `oom_rows`."""

    def forward(rows):
        cost = len(rows) * max(len(r) for r in rows)
        if (oom_over is not None and cost > oom_over) or any(r[0] in oom_rows for r in rows):
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        calls.append(cost)
        return torch.tensor([[len(r), r[0]] for r in rows], dtype=torch.float32)

    return forward


def test_pack_respects_the_padded_budget_and_keeps_every_row():
    rows = [_Row(0, i, [i] * n) for i, n in enumerate([3, 50, 7, 7, 20, 1, 64, 2])]
    chunks = pack(rows, max_batch_tokens=64)
    assert sorted(r.index for c in chunks for r in c) == list(range(8))
    for chunk in chunks:
        assert len(chunk) * max(len(r.ids) for r in chunk) <= 64
    # sorted by length: neighbours have similar lengths
    assert [len(r.ids) for c in chunks for r in c] == sorted(len(r.ids) for r in rows)


def test_results_come_back_in_request_and_row_order():
    requests = [[[1] * 5, [2] * 30], [[3] * 2], [[4] * 17, [5] * 1, [6] * 9]]
    calls = []
    answers = run_budgeted(requests, fake_forward(calls), max_batch_tokens=40)
    assert [a[:, 1].tolist() for a in answers] == [[1, 2], [3], [4, 5, 6]]
    assert [a[:, 0].tolist() for a in answers] == [[5, 30], [2], [17, 1, 9]]
    assert all(cost <= 40 for cost in calls) and len(calls) > 1


def test_out_of_memory_splits_the_chunk_and_retries_the_halves():
    requests = [[[i] * 8 for i in range(8)]]
    calls = []
    [answer] = run_budgeted(requests, fake_forward(calls, oom_over=16), max_batch_tokens=64)
    assert answer[:, 1].tolist() == list(range(8))
    assert calls == [16, 16, 16, 16]  # 64 -> 32 -> 16 padded tokens per forward


def test_a_row_that_never_fits_fails_only_its_request():
    requests = [[[1] * 4, [99] * 4, [2] * 4], [[3] * 4]]
    answers = run_budgeted(requests, fake_forward([], oom_rows={99}), max_batch_tokens=64)
    assert isinstance(answers[0], RowsDidNotFit) and answers[0].indexes == [1]
    assert "out of memory" in str(answers[0])
    assert answers[1][:, 1].tolist() == [3]


def test_other_errors_are_not_mistaken_for_out_of_memory():
    def broken(rows):
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        run_budgeted([[[1, 2]]], broken, max_batch_tokens=64)


def test_the_failure_survives_pickling_across_processes():
    import pickle

    failure = pickle.loads(pickle.dumps(RowsDidNotFit([1, 3], "out of memory even alone")))
    assert failure.indexes == [1, 3] and "inputs [1, 3]" in str(failure)
