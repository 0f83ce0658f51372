"""The order in which model servers that share one compute thread run their batches: that of
their requests' arrival.

In the colocated topology (serve.gateway.colocated) both arms' model servers run their forwards
on the process's one compute thread (serve.replica.compute), and each submits its next batch
only when its last one has ended. Submitted as they come, a batch of the faster arm admitted
behind seconds of the other arm's queued work ran right after the other arm's current batch, and
every request of the other arm queued before it waited that much longer than the admission had
predicted (serve.gateway.admission counts every arm's rows ahead with `shared_compute`): in a
burst of long requests a third of the compute thread's work was answered past its deadline.

So a server's batch waits for its turn (`Turns.wait`) while another server sharing the thread
still has a request waiting for a batch that arrived before the batch's oldest one. That cannot
wait for ever: a batch's own requests leave the wait list before it asks, and a server's waiting
requests arrived after those of its batch (Serve's batch queue is first in, first out), so of two
batches waiting for each other each would have to be older than the other.
"""

from __future__ import annotations

import asyncio


class Turns:
    """Requests waiting for a batch in each server that shares a compute thread, by arrival
    time (the caller's clock, `perf_counter`), and the batches waiting for their turn. Used
    from one event loop."""

    def __init__(self) -> None:
        self._waiting: dict[int, dict[int, float]] = {}  # id(server) -> {id(request): arrival}
        self._wakers: list[asyncio.Future] = []

    def queued(self, server: object, request: object, arrived: float) -> None:
        self._waiting.setdefault(id(server), {})[id(request)] = arrived

    def left(self, server: object, request: object) -> None:
        """`request` is in a batch, or gone: batches waiting behind it may go."""
        self._waiting.get(id(server), {}).pop(id(request), None)
        for waker in self._wakers:
            if not waker.done():
                waker.set_result(None)
        self._wakers.clear()

    def behind(self, server: object, oldest: float) -> bool:
        """Whether another server has a request waiting that arrived before `oldest`."""
        return any(arrived < oldest for other, waiting in self._waiting.items()
                   if other != id(server) for arrived in waiting.values())

    async def wait(self, server: object, oldest: float) -> None:
        """Until no other server has a request waiting that arrived before `oldest` (the
        arrival of the oldest request in `server`'s batch)."""
        while self.behind(server, oldest):
            waker = asyncio.get_running_loop().create_future()
            self._wakers.append(waker)
            await waker
