"""The model deployment: one arm's variant behind dynamic batching, with per-stage timing.

Path of one request inside a replica: tokenize on the replica's event loop (fast, Rust) ->
queue into `@serve.batch`, which merges up to `max_batch_size` requests or waits at most
`batch_wait_ms` -> one forward of the merged, padded batch, then each request's postprocessing,
on the process's compute thread (serve.replica.compute; tokenizing the next requests on the event
loop overlaps it) -> the answer back on the event loop. Every response says
how long each stage took, how large its batch was and how many requests were queued ahead of it
(`queue`: requests waiting in this replica for a batch when it joined). Given the caller's trace
carrier, the replica records its spans into that trace afterwards (serve.telemetry.tracing).
`predict_many` takes the requests a gateway sent together (serve.gateway.coalesce) down the same
path, each on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from ray import serve

from rollout import open_store
from rollout.settings import ModelSettings, Settings
from serve.common.answer import BatchShape, CallFailed, ModelAnswer, StageTiming
from serve.common.batching import Expired, RowsDidNotFit, run_budgeted
from serve.recipes.auto.choose import describe
from serve.recipes.source import Encoded
from serve.recipes.variants import Variant, VariantSettings
from serve.replica import compute
from serve.replica.compute import ensure_threads
from serve.replica.cputime import ForwardClock, burn_cpu, shares
from serve.replica.faults import Faults
from serve.replica.host_load import HostLoad
from serve.replica.memory_trim import Trimmer, release_free_memory
from serve.replica.thread_share import ComputeFollower, beside_loop
from serve.replica.turns import Turns
from serve.telemetry.otel import Telemetry
from serve.telemetry.tracing import Marks, WallClock, record_model_spans


@dataclass
class _Queued:
    encoded: Encoded
    enqueued: float
    server: ModelServer
    task: str = "classify"
    deadline: float | None = None  # this process' time.monotonic(); past it, nobody waits
    waiting: bool = True

    def leave(self) -> None:
        """Out of the queue (into a batch, or cancelled); counted once."""
        if self.waiting:
            self.waiting = False
            self.server.waiting -= 1
            if self.server.turns is not None:
                self.server.turns.left(self.server, self)



def _expiry(deadlines: list[float | None], estimate_s: float):
    """A forward's test of its request `i` (called on the compute thread before each chunk,
    the first call at the forward's start): whether its deadline passes before the forward's
    estimated end (or now, once past it). Nobody would wait for that answer, and each chunk
    counts earlier ones once."""
    ends_at: float | None = None  # every answer waits for the end

    def expired(request: int) -> bool:
        nonlocal ends_at
        if ends_at is None:
            ends_at = time.monotonic() + estimate_s
        end = max(ends_at, time.monotonic())
        return deadlines[request] is not None and end >= deadlines[request]

    return expired

@dataclass
class _Forwarded:
    rows: torch.Tensor
    queue_ms: float
    model_ms: float
    batch_requests: int
    batch_items: int
    batch_id: int
    batch_start: float
    forward_start: float
    forward_end: float
    cpu_s: float | None = None  # its share of the batch's forward seconds (serve.replica.cputime)
    outputs: list[dict] | Exception | None = None  # postprocessed on the compute thread
    post_start: float = 0.0
    post_end: float = 0.0


def _carried(exc: BaseException) -> Exception:
    if isinstance(exc, (RowsDidNotFit, Expired)):
        return exc
    return CallFailed(type(exc).__name__, str(exc))


def startup_log(arm: str, console_fd: int = 2):
    """Progress of a long build (`auto` measuring, a runtime artifact, a plan): in the replica's
    log (Serve's logger), and on the process's own stderr, which Ray forwards to the console of
    `serve run` as it happens. Written to the file descriptor, not `sys.stderr`: in Serve's
    throughput mode a replica's `print` and `sys.stderr` go to Serve's logger, which is
    buffered and writes to files only, so a first start that measures for minutes would show
    nothing."""
    logger = logging.getLogger("ray.serve")

    def progress(step, value) -> None:
        line = f"{arm} model: {step if isinstance(step, str) else f'{step}: {value}'}"
        logger.info("%s", line)
        with contextlib.suppress(OSError):
            os.write(console_fd, (line + "\n").encode("utf-8", "replace"))

    return progress


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def startup_threads(settings: ModelSettings) -> int:
    """Torch threads while a replica builds its model (`auto` measuring its candidates, a
    calibrated recipe searching): every core, since no replica serves before its models are
    built, unless `CANARY_TORCH_THREADS` pins a count. Then the replica's share
    (`threads_per_model`). `rollout verify` measures on every core too, so both time the
    candidates alike."""
    return settings.torch_threads or (os.cpu_count() or 1)


@serve.deployment(name="model", health_check_period_s=10, health_check_timeout_s=30)
class ModelServer:
    def __init__(self, settings: Settings, arm: str):
        """The replica's composition root: `settings` holds every group (rollout.settings),
        and each component is handed the groups its signature names."""
        # in the gateway's process (serve.gateway.colocated `share_loop`): whether its event
        # loop is busy (shedding, or a share of a core), so that a batch with a backlog leaves
        # it a core
        self.loop_busy: Callable[[], bool] | None = None
        # in a process of its own: what its neighbours on the machine use (the remote topology)
        self.host_load = HostLoad() if settings.yield_to_neighbours else None
        share = settings.threads_per_model()
        self.arm = arm
        # built on the process's compute thread, where its forwards run (serve.replica.compute)
        self.variant = compute.run(
            self._build, VariantSettings(settings, settings, settings, settings),
            startup_threads(settings), share)
        self.threads = share
        self.max_batch_size, self.batch_wait_ms = settings.max_batch_size, settings.batch_wait_ms
        self.max_batch_tokens = settings.max_batch_tokens
        self.faults = Faults()  # none until `reconfigure` sets some (serve.replica.faults)
        self.forward_clock = ForwardClock(self.variant.device)
        self._compute_thread = compute.executor()
        self.waiting = 0  # requests queued for a batch in this replica
        # shared with the other arm's server on one compute thread (serve.gateway.colocated):
        # batches run in the order their requests arrived (serve.replica.turns)
        self.turns: Turns | None = None
        # `@serve.batch` on the method would keep one queue per class in a process: two arms
        # in one process (serve.gateway.colocated) would share their batches. One queue per server.
        self._batched = serve.batch(max_batch_size=16,
                                    batch_wait_timeout_s=0.005)(self._forward_batch)
        self._forwarding = 0  # batches on the compute thread
        self._forward_started = 0.0  # perf_counter when the running forward started
        self._forward_estimate_s = 0.0  # how long it probably takes
        self._s_per_token = 0.0  # seconds per token of the last forward
        self._batches = 0
        self.expired = 0  # requests dropped because their deadline passed before the forward
        # free memory goes back to the OS after a burst (serve.replica.memory_trim)
        self.trimmer = Trimmer()
        self.telemetry = Telemetry(settings, settings, "canary-model")
        self.reconfigure({})
        self.compute = None
        if settings.compute_follows_share and not settings.torch_threads:
            self.compute = ComputeFollower(
                open_store(settings), arm, os.cpu_count() or 1, self._threads_wanted,
                poll_s=settings.state_poll_s, staleness_s=settings.state_staleness_s,
            )
            self.compute.start()

    def _build(self, settings: VariantSettings, threads: int, share: int) -> Variant:
        """The arm's variant, on the compute thread: built on `threads` (every core:
        `startup_threads`), then left at the replica's `share`."""
        ensure_threads(threads)
        variant = Variant(settings, self.arm, progress=startup_log(self.arm))
        if variant.choice is not None:
            startup_log(self.arm)(describe(variant.choice), None)
        startup_log(self.arm)(f"{variant.recipe} runs as {variant.runs_as}", None)
        ensure_threads(share)
        if (resize := getattr(variant.model, "resize", None)) is not None:
            resize(share)
        return variant

    def _threads_wanted(self, threads: int) -> None:
        """serve.replica.thread_share asks for another thread count: applied on the compute
        thread, between batches (a runtime session is rebuilt with it there; torch's count is set
        before each of this arm's batches, as another arm may share the thread)."""
        self._compute_thread.submit(self._set_threads, threads)

    def take_turns(self, threads: int) -> None:
        """Share the process's compute thread with another arm's server (serve.gateway.colocated):
        their batches take turns on it, one at a time, so each runs on `threads` (every core,
        unless `CANARY_TORCH_THREADS` pins a count) whatever share of the traffic its arm
        carries, and the share is no longer followed. Waits until the count is applied."""
        if self.compute is not None:
            self.compute.stop()
            self.compute = None
        compute.run(self._set_threads, threads)

    def _set_threads(self, threads: int) -> None:
        resize = getattr(self.variant.model, "resize", None)
        if resize is not None:
            resize(threads)
        self.threads = threads

    def reconfigure(self, user_config: dict) -> None:
        """Live settings (Serve `user_config`, applied without a restart).

        `max_batch_size`, `batch_wait_ms`: the batching limits; `fault_*`: fault injection for
        drills and tests (serve.replica.faults), off unless set.
        """
        faults = Faults.parse(user_config)
        size = int(user_config.get("max_batch_size", self.max_batch_size))
        wait_ms = float(user_config.get("batch_wait_ms", self.batch_wait_ms))
        if size < 1 or not 0 <= wait_ms <= 1000:
            raise ValueError("max_batch_size must be >= 1 and batch_wait_ms within 0..1000")
        self._batched.set_max_batch_size(size)
        self._batched.set_batch_wait_timeout_s(wait_ms / 1000)
        self.max_batch_size, self.batch_wait_ms = size, wait_ms
        self.faults = faults

    def _forward(self, rows):
        """One forward, and the faults injected into it (out of memory, CPU spent first)."""
        if self.faults.out_of_memory(rows):
            raise torch.OutOfMemoryError(f"injected out of memory in the {self.arm} model")
        if self.faults.cpu_s:
            burn_cpu(self.faults.cpu_s)
        return self.variant.forward_rows(rows)

    def info(self) -> dict:
        return {
            "arm": self.arm,
            "pid": os.getpid(),
            "version": self.variant.version,
            "recipe": self.variant.recipe,
            "runs_as": self.variant.runs_as,
            "auto": describe(self.variant.choice) if self.variant.choice else None,
            "device": self.variant.device,
            "labels": list(self.variant.labels),
            "tasks": ["classify"] if self.variant.has_head else ["classify", "embed"],
            "tokenizer": self.variant.tokenizer_digest,
            "max_batch_size": self.max_batch_size,
            "threads": self.threads,
            "batch_wait_ms": self.batch_wait_ms,
            "expired": self.expired,
            "memory_trims": self.trimmer.trims,
        }

    def _batch_window(self) -> None:
        """How long the batch this request may start waits to fill (Serve's `@serve.batch`
        closes a batch after its first request waited that long, or when it is full).

        - Idle replica (nothing queued, no forward running): 0 — forward at once, as waiting
          could only add latency.
        - A forward running: what is probably left of it (its tokens at the last forward's
          seconds per token, minus the time it has run; at most 1 s), at least
          `batch_wait_ms` — one forward runs at a time, so the batch could not start earlier
          anyway, and closing it at the end of the forward lets every request that arrives
          meanwhile ride in it (batches grow with load instead of being cut every
          `batch_wait_ms` and queueing behind each other).
        - Otherwise (requests queued, none forwarding): `batch_wait_ms`.
        """
        wait = self.batch_wait_ms / 1000
        if self._forwarding:
            left = self._forward_estimate_s - (time.perf_counter() - self._forward_started)
            wait = max(wait, min(left, 1.0))
        elif self.waiting == 0:
            wait = 0.0
        self._batched.set_batch_wait_timeout_s(wait)

    async def predict(self, texts: list[str] | Encoded, task: str, trace: dict | None = None,
                      remaining_s: float | None = None) -> ModelAnswer:
        """`texts`, or their token ids from the gateway (`Encoded`, serve.gateway.preprocess).
        `trace`: the caller's W3C trace carrier (`traceparent`), to join its trace.
        `remaining_s`: the seconds left to the caller's deadline when it sent the call; the
        deadline is taken on this process' monotonic clock at arrival (no wall clock crosses
        processes, so clock skew between nodes neither expires nor extends a request). A
        request still waiting for its forward when it passes is dropped (`Expired`), not
        forwarded."""
        deadline = None if remaining_s is None else time.monotonic() + remaining_s
        clock = WallClock() if trace and self.telemetry.enabled else None
        marks = Marks(time.perf_counter())
        queue_length = self.waiting
        forwarded: _Forwarded | None = None
        try:
            encoded = self._encode_in_time(texts, deadline)
            marks.queued = time.perf_counter()
            forwarded = await self._ride_batch(
                _Queued(encoded, marks.queued, self, task, deadline))
            marks.batch_start, marks.forward_start, marks.forward_end = (
                forwarded.batch_start, forwarded.forward_start, forwarded.forward_end)
            if isinstance(forwarded.rows, (RowsDidNotFit, Expired)):
                raise forwarded.rows
            if isinstance(forwarded.outputs, Exception):
                raise forwarded.outputs
            marks.post_start, marks.done = forwarded.post_start, forwarded.post_end
            outputs = forwarded.outputs
        except BaseException as exc:
            if clock is not None:
                self._spans(trace, clock, marks, texts, task, queue_length, forwarded, exc)
            raise
        if clock is not None:
            self._spans(trace, clock, marks, texts, task, queue_length, forwarded)
        return self._answer(outputs, encoded, forwarded, marks, queue_length)

    def _encode_in_time(self, texts: list[str] | Encoded, deadline: float | None) -> Encoded:
        """The request's token ids (tokenized here unless the gateway did), or `Expired` when
        its deadline already passed."""
        encoded = texts if isinstance(texts, Encoded) else self.variant.encode(texts)
        if deadline is not None and time.monotonic() >= deadline:
            self.expired += 1
            raise Expired("the deadline passed before the request reached a batch")
        return encoded

    async def _ride_batch(self, item: _Queued) -> _Forwarded:
        """Queue for `@serve.batch` (counted in `waiting` until the batch takes it) and wait
        for the batch's forward."""
        self._batch_window()
        self.waiting += 1
        if self.turns is not None:
            self.turns.queued(self, item, item.enqueued)
        try:
            return await self._batched(item)
        finally:
            item.leave()

    def _postprocess(self, task: str, rows, encoded: Encoded | None = None) -> list[dict]:
        outputs = self.variant.postprocess(task, rows)
        return self.faults.postprocess(task, outputs, encoded, self.variant.tokenizer)

    def _batch_threads(self, tokens: int) -> int:
        """Threads for the batch starting now: the arm's, less the event loop's core while
        requests wait behind it and the loop, which serves the gateway in this process, is
        busy (`loop_busy`: colocated); in a process of its own, one fewer for a small batch
        (`tokens`) while the machine is saturated (serve.replica.host_load)."""
        cores = os.cpu_count() or 1
        if self.loop_busy is not None:
            if not self.loop_busy():
                return self.threads
            return beside_loop(self.threads, cores, self.waiting)
        if self.host_load is None:
            return self.threads
        return self.host_load.threads(self.threads, cores, tokens)

    def _computed(self, queued: list[_Queued], expired: Callable[[int], bool], threads: int):
        """A merged batch's work on the compute thread (serve.replica.compute): its forwards
        under the token budget, timed, then each answered request's postprocessing (label
        scores are a matmul: off the compute thread it would start a second OpenMP team).
        Returns the rows per request, the forwards' seconds, when this work started on the
        thread and when the forwards ended, and per request its outputs (or the exception that
        fails it alone) with when its postprocessing started and ended. `threads`: torch's
        count for it (`_batch_threads`)."""
        began = time.perf_counter()
        ensure_threads(threads)
        rows, forward_cpu_s = self.forward_clock.timed(
            run_budgeted, [item.encoded.ids for item in queued], self._forward,
            self.max_batch_tokens, self.variant.split_tokens, expired, self.variant.pad_width)
        forward_end = time.perf_counter()
        posts = []
        for item, row in zip(queued, rows, strict=True):
            start = time.perf_counter()
            if isinstance(row, Exception):
                posts.append((None, start, start))
                continue
            try:
                outputs = self._postprocess(item.task, row, item.encoded)
            except Exception as exc:  # this request's own failure (a task the model lacks)
                outputs = exc
            posts.append((outputs, start, time.perf_counter()))
        return rows, forward_cpu_s, began, forward_end, posts

    def _answer(self, outputs: list[dict], encoded: Encoded, forwarded: _Forwarded,
                marks: Marks, queue_length: int) -> ModelAnswer:
        preprocess = (encoded.preprocess_ms if encoded.preprocess_ms is not None
                      else _ms(marks.queued - marks.start))
        return ModelAnswer(
            arm=self.arm,
            model_version=self.variant.version,
            outputs=outputs,
            tokens=encoded.tokens,
            batch=BatchShape(requests=forwarded.batch_requests, items=forwarded.batch_items),
            queue=queue_length,
            timing=StageTiming(preprocess=preprocess, queue=forwarded.queue_ms,
                               model=forwarded.model_ms,
                               postprocess=_ms(marks.done - marks.post_start)),
            cpu_s=forwarded.cpu_s, gpu=self.forward_clock.gpu,
        )

    async def predict_many(self, calls: list[tuple]) -> list[ModelAnswer | Exception]:
        """Requests coalesced by a gateway (serve.gateway.coalesce): each `(texts, task, trace,
        remaining_s)` is answered as `predict` answers it alone, in the same queue and batches; a
        request's failure comes back in its place (inputs that did not fit as `RowsDidNotFit`,
        anything else as `CallFailed`), so it fails that request only."""
        answers = await asyncio.gather(*(self.predict(*call) for call in calls),
                                       return_exceptions=True)
        return [_carried(a) if isinstance(a, BaseException) else a.in_call(len(calls))
                for a in answers]

    def _spans(self, carrier, clock, marks, texts, task, queue_length, forwarded, error=None):
        batch = None if forwarded is None else {
            "requests": forwarded.batch_requests, "items": forwarded.batch_items,
            "id": forwarded.batch_id}
        items = len(texts.ids) if isinstance(texts, Encoded) else len(texts)
        attrs = {"canary.arm": self.arm, "canary.model_version": self.variant.version,
                 "canary.items": items, "canary.task": task}
        record_model_spans(self.telemetry.tracer, carrier, clock, marks, attrs,
                           queue_length=queue_length, batch=batch, error=error)

    async def _forward_batch(self, queued: list[_Queued]) -> list[_Forwarded]:
        """A batch `_batched` merged, forwarded on the compute thread under the token budget.

        In the colocated topology, where both arms share the thread, it first waits for the
        other arm's batches of requests that arrived before its own (`turns`,
        serve.replica.turns). Its model time runs from when the compute thread takes it up:
        that wait, and one behind another batch on the thread, count as queue. The admission's
        fit of forward time against rows (serve.gateway.admission `ForwardFit`) and the seconds
        per token estimating the next forward read the forward alone: the colocated admission
        counts the other arm's rows ahead itself (`shared_compute`)."""
        started = time.perf_counter()
        for item in queued:
            item.leave()
        self._batches += 1
        batch_id = self._batches
        if self.faults.delay_s:
            await asyncio.sleep(self.faults.delay_s)
        if self.faults.error:
            raise RuntimeError(f"injected fault in the {self.arm} model")
        batch = [item.encoded for item in queued]
        loop = asyncio.get_running_loop()
        submitted = time.perf_counter()
        if self.turns is not None:  # after the other arm's requests that arrived earlier
            await self.turns.wait(self, min(item.enqueued for item in queued))
        tokens = max(sum(item.tokens for item in batch), 1)
        self._forwarding += 1
        self._forward_started = submitted
        self._forward_estimate_s = estimate_s = self._s_per_token * tokens
        expired = _expiry([item.deadline for item in queued], estimate_s)
        try:
            rows, forward_cpu_s, forward_start, forward_end, posts = await loop.run_in_executor(
                self._compute_thread, self._computed, queued, expired, self._batch_threads(tokens))
        finally:
            self._forwarding -= 1
        self._forwarded(rows, tokens)
        self._s_per_token = (forward_end - forward_start) / tokens
        waited = max(0.0, forward_start - submitted)  # behind the other arm's batches
        model_ms = _ms(forward_end - started - waited)
        items = sum(len(item.ids) for item in batch)
        cpu = shares(forward_cpu_s, [len(item.ids) for item in batch], rows)
        return [
            _Forwarded(r, _ms(started - item.enqueued + waited), model_ms, len(queued), items,
                       batch_id, started, forward_start, forward_end, cpu_s, *post)
            for r, item, cpu_s, post in zip(rows, queued, cpu, posts, strict=True)
        ]

    def _forwarded(self, rows: list, tokens: int) -> None:
        """After a batch's forward: its expired requests counted, and free memory given back
        once the replica is idle after a burst."""
        self.expired += sum(isinstance(r, Expired) for r in rows)
        self.trimmer.forwarded(tokens)
        if self.waiting == 0 and self.trimmer.due():  # idle after a burst
            self.trimmer.done()
            self._compute_thread.submit(release_free_memory)

    def __del__(self):
        compute = getattr(self, "compute", None)
        if compute is not None:
            compute.stop()
        telemetry = getattr(self, "telemetry", None)
        if telemetry is not None:
            telemetry.shutdown()

    def check_health(self) -> None:
        if self.variant.model is None:
            raise RuntimeError("model not loaded")
