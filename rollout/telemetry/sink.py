"""A sink that takes telemetry off the request path: bounded, batched, and allowed to lose data.

`offer(item)` never blocks and never raises: it puts the item on a bounded queue, or, when the
queue is full, drops it and counts the drop (reason `full`). A daemon thread wakes every
`flush_s`, takes everything queued (up to `max_batch` items per write) and hands it to the
writer in one call. When the writer fails (Redis down, a timeout), that batch is dropped and
counted (reason `error`), the failure is logged once, and the thread goes on: telemetry may
lose data, serving never waits for it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

Writer = Callable[[Sequence[object]], None]


class TelemetrySink:
    def __init__(
        self,
        writer: Writer,
        *,
        capacity: int = 10_000,
        flush_s: float = 0.5,
        max_batch: int = 5_000,
        name: str = "telemetry-sink",
    ):
        self.writer = writer
        self.flush_s = flush_s
        self.max_batch = max_batch
        self.name = name
        self._queue: queue.Queue = queue.Queue(maxsize=capacity)
        self._lock = threading.Lock()
        self._dropped = {"full": 0, "error": 0}
        self._written = 0
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def offer(self, item: object) -> bool:
        """Queue `item` for the writer; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            with self._lock:
                self._dropped["full"] += 1
            return False

    @property
    def dropped(self) -> dict[str, int]:
        with self._lock:
            return dict(self._dropped)

    @property
    def written(self) -> int:
        with self._lock:
            return self._written

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def drain(self) -> int:
        """Write everything queued now, in the caller's thread; the number of items written."""
        done = 0
        while True:
            batch = []
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not batch:
                return done
            try:
                self.writer(batch)
            except Exception as exc:  # the sink must outlive any writer failure
                with self._lock:
                    self._dropped["error"] += len(batch)
                if not self._failing:
                    log.warning("%s: telemetry write failed, dropping: %s: %s",
                                self.name, type(exc).__name__, exc)
                self._failing = True
                return done
            with self._lock:
                self._written += len(batch)
            if self._failing:
                log.warning("%s: telemetry writes work again", self.name)
            self._failing = False
            done += len(batch)

    def start(self) -> TelemetrySink:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.drain()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread and make one last attempt to write what is queued."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.drain()
