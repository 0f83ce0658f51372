"""Token-budgeted packing and out-of-memory splitting (serve.common.batching), with a fake
forward."""

import pytest
import torch

from serve.common.batching import Expired, Row, RowsDidNotFit, pack, run_budgeted


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
    rows = [Row(0, i, [i] * n) for i, n in enumerate([3, 50, 7, 7, 20, 1, 64, 2])]
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


def test_padded_widths_are_few_buckets_that_hold_the_row():
    from serve.common.batching import PAD_WIDTHS, padded_width

    widths = {padded_width(n) for n in range(1, 513)}
    assert widths == set(PAD_WIDTHS)  # 19 shapes up to 512 tokens
    for n in range(1, 700):
        w = padded_width(n)
        assert w >= n and w % 8 == 0
        assert n <= 48 or w <= n * 1.25 + 8  # past the small sizes, little padding
    assert padded_width(513) == 640


def test_a_long_row_is_split_from_short_ones_rather_than_padding_them():
    rows = [Row(0, i, [i] * 16) for i in range(15)] + [Row(0, 15, [15] * 256)]
    assert [len(c) for c in pack(rows, max_batch_tokens=8192)] == [16]  # one 16 x 256 forward
    chunks = pack(rows, max_batch_tokens=8192, split_tokens=256)
    assert [len(c) for c in chunks] == [15, 1]
    # small growth is cheaper than another forward: 16 -> 24 tokens for 3 rows stays together
    close = [Row(0, 0, [0] * 16), Row(0, 1, [1] * 16), Row(0, 2, [2] * 17)]
    assert [len(c) for c in pack(close, max_batch_tokens=8192, split_tokens=256)] == [3]


def test_splitting_keeps_results_in_order():
    requests = [[[1] * 200, [2] * 3], [[3] * 5, [4] * 150, [5] * 2]]
    calls = []
    answers = run_budgeted(requests, fake_forward(calls), max_batch_tokens=8192,
                           split_tokens=64)
    assert [a[:, 1].tolist() for a in answers] == [[1, 2], [3, 4, 5]]
    # the three short rows, then 150 and 200 together (buckets 160 -> 224: only 64 more
    # padding); the fake records unbucketed cost: rows x longest row
    assert calls == [3 * 5, 2 * 200]


def test_served_batches_sort_by_length_then_cut_by_batch_size():
    from serve.common.batching import padded_width, served_batches

    lengths = [40, 3, 250, 12, 3, 90, 7]
    batches = served_batches(lengths, 3)
    assert batches == [[1, 4, 6], [3, 0, 5], [2]]  # equal lengths keep their given order
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    widths = [padded_width(max(lengths[i] for i in batch)) for batch in batches]
    assert widths == [8, 96, 256]  # in set order the first batch alone would be padded to 256
    assert served_batches(lengths, 1) == [[1], [4], [6], [3], [0], [5], [2]]
    assert served_batches(lengths, 100) == [[1, 4, 6, 3, 0, 5, 2]]
    assert served_batches([], 4) == []
    with pytest.raises(ValueError, match="batch_size"):
        served_batches(lengths, 0)


def test_rows_of_an_expired_request_are_not_forwarded_from_the_next_chunk_on():
    """Request 1's deadline passes after the first forward: its rows in later chunks are
    dropped (its rows in the first chunk were wasted, one chunk at most), the others' are not."""
    requests = [[[1] * 8, [2] * 8], [[3] * 8, [4] * 40, [5] * 40], [[6] * 40]]
    calls, rows_forwarded = [], []
    forward = fake_forward(calls)

    def counting(rows):
        rows_forwarded.extend(r[0] for r in rows)
        return forward(rows)

    gone = {1: False}

    def expired(request):
        return gone.get(request, False)

    def after_first_call(rows):
        out = counting(rows)
        gone[1] = True
        return out

    answers = run_budgeted(requests, after_first_call, max_batch_tokens=40, expired=expired)
    assert isinstance(answers[1], Expired)
    assert answers[0][:, 1].tolist() == [1, 2] and answers[2][:, 1].tolist() == [6]
    assert 4 not in rows_forwarded and 5 not in rows_forwarded
    assert Expired().__reduce__()[0] is Expired  # crosses processes


def test_a_request_expired_before_the_first_chunk_costs_no_forward():
    calls = []
    answers = run_budgeted([[[1] * 4], [[2] * 4]], fake_forward(calls), max_batch_tokens=64,
                           expired=lambda r: r == 0)
    assert isinstance(answers[0], Expired) and answers[1][:, 1].tolist() == [2]
    assert calls == [4]  # one forward, of request 1's row alone


def test_exact_widths_pad_a_chunk_to_its_longest_row_and_the_budget_counts_that():
    from serve.common.batching import exact_width, pack

    rows = [Row(0, i, [1] * 12) for i in range(4)]
    # bucketed, 12 tokens cost 16 each: 4 x 16 = 64 > 60 splits; exactly 4 x 12 = 48 fits
    assert [len(c) for c in pack(rows, 60)] == [3, 1]
    assert [len(c) for c in pack(rows, 60, width_of=exact_width)] == [4]
    seen = []
    run_budgeted([[[1] * 12, [1] * 9]], lambda batch: seen.append(batch) or
                 torch.zeros(len(batch), 2), 64, width_of=exact_width)
    assert [[len(r) for r in b] for b in seen] == [[9, 12]]


def test_eager_cpu_recipes_take_exact_widths_and_the_rest_bucketed_ones():
    from serve.recipes import RECIPES

    exact = {name for name, spec in RECIPES.items() if spec.exact_shapes("cpu")}
    assert {"fp32", "bf16", "int8-dynamic", "accuracy-aware"} <= exact
    assert not exact & {"compiled", "onnx-fp32", "onnx-int8", "ov-int8", "ct2-int8"}
    assert not any(spec.exact_shapes("cuda") for spec in RECIPES.values())
