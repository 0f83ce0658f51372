"""Concurrent requests for one arm, sent to its model deployment as one call.

Every Ray Serve handle call has a fixed CPU cost on both sides (serialization, routing, the
replica's request plumbing): on the 2-core reference machine about 1.4 ms in the gateway and
2 ms in the model replica, beside ~9 ms for the bf16 forward of one short text. So a gateway replica
keeps at most `calls` model calls per arm open (`gateway_coalesce_calls`); a request that finds
them all open waits for the next call, which carries every request waiting by then, up to
`max_items`, to the model's `predict_many`. The model replica queues and batches those requests
as if they had come one by one (serve.replica.model_server), so batching, timing and spans stay per
request.

- Nothing waits at low load: with a call slot free, a request is sent at once, alone.
- Batches form from the queue, as Serve's own `@serve.batch` forms them: when a call of `k`
  requests has just ended, its clients are probably about to send their next requests (a
  closed loop), so a call slot that it freed is held for at most `hold_s` until they wait
  too (`k` more than waited when it ended), then all go together. Without the hold, a closed
  loop of 8 clients on one call slot settles into calls of 1 and 7 requests in turn (those
  answered while a call was open come back to find the slot taken again), paying two forwards
  for every 8 inputs. A lone client (k = 1) is never held: its next request is sent at once.
- A full call (`max_items` requests) is sent at once, slot or not, so a busy gateway still
  spreads its load over several model replicas.
- Each request keeps its own deadline: when it passes, that request gets `TimeoutError` while
  the call goes on for the others; a call whose requests have all gone is cancelled.
- A call that fails fails each of its requests as a lone call would have (each then falls back
  on its own); the failure of one request inside a call (inputs that did not fit, a model
  error) comes back in its place and is that request's alone.

Invariant: a request is answered, failed or abandoned exactly once; requests wait only while
all `calls` slots are open, or at most `hold_s` after a call ended while fewer wait than it
carried.

Measured (docs/benchmarks-history.md): CPU per request fell from 3.9-4.5 to 2.0-2.6 ms in the
gateway and from 11.8-12.8 to 9.6-10.3 ms in the optimized model replica. One call per arm
beats two on a single model replica, because two calls make batches alternate small and large.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

# items of one call -> one answer per item, in order (an exception instance: that item failed)
Send = Callable[[list[Any]], Awaitable[list[Any]]]


class Coalescer:
    """Merges concurrent `call`s into calls of `send` (see the module docstring)."""

    def __init__(self, send: Send, *, calls: int, max_items: int, hold_s: float = 0.0):
        if calls < 1 or max_items < 1 or hold_s < 0:
            raise ValueError("calls and max_items must be at least 1, hold_s not negative")
        self._send = send
        self.calls, self.max_items, self.hold_s = calls, max_items, hold_s
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._open: dict[asyncio.Task, list[asyncio.Future]] = {}
        self.sent = 0  # calls of `send` so far
        self._expected = 0  # requests of the call that ended last, expected back soon
        self._hold_until = 0.0  # loop time until which a freed slot waits for them
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def call(self, item: Any, timeout: float) -> Any:
        """`item`'s answer; `TimeoutError` after `timeout` seconds, the call's or the item's
        own exception if it failed."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._dispatch()
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            if future.cancelled():  # timed out or the caller went away
                self._abandon(future)

    def _held(self) -> bool:
        """A freed slot waits for the clients of the call that just ended (module docstring);
        a timer dispatches when the hold ends."""
        if len(self._waiting) >= min(self._expected, self.max_items):
            return False
        loop = asyncio.get_running_loop()
        if loop.time() >= self._hold_until:
            return False
        if self._timer is None:
            self._timer = loop.call_at(self._hold_until, self._hold_over)
        return True

    def _hold_over(self) -> None:
        self._timer, self._expected = None, 0
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting and (len(self._open) < self.calls
                                 or len(self._waiting) >= self.max_items):
            if len(self._waiting) < self.max_items and self._held():
                return
            self._expected = 0
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch = self._waiting[:self.max_items]
            del self._waiting[:self.max_items]
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._open[task] = [future for _, future in batch]
            task.add_done_callback(self._closed)  # also runs for a task cancelled unstarted
            self.sent += 1

    def _closed(self, task: asyncio.Task) -> None:
        futures = self._open.pop(task, [])
        if self.hold_s > 0 and len(futures) > 1:
            self._expected = len(self._waiting) + len(futures)
            self._hold_until = asyncio.get_running_loop().time() + self.hold_s
        self._dispatch()

    def _abandon(self, future: asyncio.Future) -> None:
        for i, (_, waiting) in enumerate(self._waiting):
            if waiting is future:
                del self._waiting[i]
                return
        for task, futures in self._open.items():
            if future in futures and all(f.done() for f in futures):
                task.cancel()  # nobody is left to answer
                return

    async def _run(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        try:
            answers = await self._send([item for item, _ in batch])
            if len(answers) != len(batch):
                raise RuntimeError(f"{len(answers)} answers to a call of {len(batch)}")
        except Exception as exc:  # (cancelled: only when every request of the call has gone)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (_, future), answer in zip(batch, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
