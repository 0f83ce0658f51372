"""The telemetry sink (rollout.telemetry.sink): bounded, batched, never failing its caller."""

from __future__ import annotations

import threading

from rollout import TelemetrySink


class Writer:
    def __init__(self, fail: bool = False):
        self.batches: list[list] = []
        self.fail = fail

    def __call__(self, items):
        if self.fail:
            raise ConnectionError("redis is down")
        self.batches.append(list(items))


def test_items_are_written_in_batches_in_order():
    writer = Writer()
    sink = TelemetrySink(writer, capacity=100, max_batch=4)
    for i in range(10):
        assert sink.offer(i)
    assert sink.drain() == 10
    assert writer.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert sink.written == 10 and sink.pending == 0
    assert sink.dropped == {"full": 0, "error": 0}


def test_a_full_queue_drops_and_counts_without_blocking():
    writer = Writer()
    sink = TelemetrySink(writer, capacity=3)
    results = [sink.offer(i) for i in range(5)]
    assert results == [True, True, True, False, False]
    assert sink.dropped["full"] == 2
    sink.drain()
    assert writer.batches == [[0, 1, 2]]


def test_a_failing_writer_drops_and_counts_and_the_sink_recovers(caplog):
    writer = Writer(fail=True)
    sink = TelemetrySink(writer, capacity=100)
    for i in range(3):
        sink.offer(i)
    assert sink.drain() == 0  # never raises
    assert sink.dropped["error"] == 3
    writer.fail = False
    sink.offer("after")
    assert sink.drain() == 1
    assert writer.batches == [["after"]]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("write failed" in m for m in messages) == 1
    assert any("work again" in m for m in messages)


def test_the_thread_writes_what_is_offered_and_close_flushes_the_rest():
    written = threading.Event()
    batches = []

    def writer(items):
        batches.append(list(items))
        written.set()

    sink = TelemetrySink(writer, capacity=100, flush_s=0.01).start()
    sink.offer("a")
    assert written.wait(10), "the sink thread never wrote"
    sink.offer("b")
    sink.close()
    assert [item for batch in batches for item in batch] == ["a", "b"]
