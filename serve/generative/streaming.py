"""A decode loop on a thread of its own, streamed to asyncio: what a model replica runs per arm.

`Runner.stream` submits a sequence and yields its events (serve.generative.decode.Event) as the
loop produces them. A consumer that stops reading (the client went away, the stream was
closed) cancels its sequence, which leaves the batch and frees its KV cache at the next step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from serve.generative.decode import DecodeLoop, Event, Sampling, Sequence


class Runner:
    def __init__(self, loop: DecodeLoop):
        self.loop = loop
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=loop.run, args=(self._stopping,),
                                        name="decode-loop", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the loop's thread runs."""
        return self._thread.is_alive()

    async def stream(self, prompt: list[int], sampling: Sampling,
                     deadline: float | None = None) -> AsyncIterator[Event]:
        """The sequence's events, its last one with `finish` set. PromptTooLong or NeverFits
        (serve.generative.decode) before the first where it can never run."""
        events: asyncio.Queue[Event] = asyncio.Queue()
        here = asyncio.get_running_loop()

        def emit(event: Event) -> None:  # on the decode thread
            try:
                here.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the consumer's event loop is closed: nobody reads on
                sequence.cancelled = True

        sequence = Sequence(prompt, sampling, emit, deadline=deadline)
        self.loop.submit(sequence)
        try:
            while True:
                event = await events.get()
                yield event
                if event.finish is not None:
                    return
        finally:
            if sequence.finish is None:
                self.loop.cancel(sequence)

    async def complete(self, prompt: list[int], sampling: Sampling,
                       deadline: float | None = None) -> tuple[str, list[int], Event]:
        """The whole answer: its text, its tokens and its last event."""
        pieces, tokens = [], []
        async for event in self.stream(prompt, sampling, deadline):
            pieces.append(event.text)
            if event.token is not None:
                tokens.append(event.token)
            last = event
        return "".join(pieces), tokens, last

    async def call(self, job):
        """`job()` run on the loop's thread between two steps (DecodeLoop.call)."""
        return await asyncio.wrap_future(self.loop.call(job))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the loop's thread; running sequences end as cancelled."""
        self._stopping.set()
        self._thread.join(timeout_s)
        self.loop.end_all("cancelled")
