"""One decode loop per arm: iteration-level batching of a causal LM.

Sequences are submitted from any thread and wait in order of arrival. Between two decode steps
the loop drops the sequences that finished, were cancelled or ran past their deadline (freeing
their KV cache at once), then admits waiting ones while the KV budget (serve.generative.kv) grants
them, up to `prefill_tokens` of prompt a step (so a burst of arrivals cannot stall the running
sequences for long). Where sequences are running, the joiners' prefill and the running rows'
decode step are one packed forward (serve.generative.batch `step_joining`); otherwise, or where
the model's architecture or the model itself cannot take a packed forward, the joiners are
prefilled together in one forward and join the running batch, and one decode step then gives
every running sequence its next token.
Each sequence hears of its tokens and its end through its own `emit`, called on the loop's
thread: an event per token (its text may be empty while a character or a possible stop string
is incomplete), then one that ends it.

Other work on the model (the shadow's teacher-forced scoring) is handed to the loop with `call`
and runs on its thread before the next step, so the loop's thread stays the replica's only
torch work.

A forward that runs out of memory fails the sequence it was for (a prefill of several is tried
again one by one), or the newest running sequence (a decode step, retried without it): the others
go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

from serve.generative.batch import PaddedBatch, packable, prefill
from serve.generative.kv import KvBudget, Row
from serve.generative.text import TextStream
from serve.generative.wire import Event, NeverFits, PromptTooLong, Sampling

__all__ = ["DecodeLoop", "Event", "NeverFits", "PromptTooLong", "Sampling", "Sequence"]

log = logging.getLogger(__name__)

@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    sampling: Sampling
    emit: Callable[[Event], None]
    deadline: float | None = None  # the loop's clock
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    finish: str | None = None
    text: TextStream | None = None
    generator: torch.Generator | None = None
    submitted: float = 0.0  # the loop's clock when it was submitted, and when its prefill began
    admitted: float = 0.0

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)

    def row(self) -> Row:
        return Row(self.length, self.sampling.max_tokens - len(self.generated))


class DecodeLoop:
    def __init__(self, model, tokenizer, budget: KvBudget, *, max_batch: int = 32,
                 prefill_tokens: int = 1024, packed: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.model, self.tokenizer, self.budget = model, tokenizer, budget
        # off for good once the model refuses a packed forward
        self.packed = packed and packable(model.config)
        self.max_batch, self.prefill_tokens, self.clock = max_batch, prefill_tokens, clock
        self.context = getattr(model.config, "max_position_embeddings", None) or 2048
        self.eos = _eos_ids(model, tokenizer)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.batch = PaddedBatch()
        self.jobs: deque[tuple[Callable[[], object], Future]] = deque()
        self._wake = threading.Condition()

    def submit(self, sequence: Sequence) -> Sequence:
        """Queues `sequence` (its `max_tokens` cut to the context left after its prompt).
        PromptTooLong or NeverFits where it can never run."""
        room = self.context - len(sequence.prompt)
        if room < 1 or not sequence.prompt:
            raise PromptTooLong(f"the prompt has {len(sequence.prompt)} tokens; this model's "
                                f"context holds {self.context} with at least one to generate")
        if sequence.sampling.max_tokens > room:
            sequence.sampling = replace(sequence.sampling, max_tokens=room)
        needed = len(sequence.prompt) + sequence.sampling.max_tokens
        if self.budget.never_fits(needed):
            raise NeverFits(f"prompt plus max_tokens is {needed} tokens; this replica's KV "
                            f"cache budget holds {self.budget.capacity_tokens} "
                            f"({self.budget.capacity_bytes:,} bytes)")
        sequence.text = TextStream(self.tokenizer, sequence.sampling.stop)
        sequence.submitted = self.clock()
        if sequence.sampling.seed is not None:
            sequence.generator = torch.Generator().manual_seed(sequence.sampling.seed)
        with self._wake:
            self.waiting.append(sequence)
            self._wake.notify()
        return sequence

    def call(self, job: Callable[[], object]) -> Future:
        """Runs `job` on the loop's thread before its next step; its result (or exception)
        comes in the returned future."""
        future: Future = Future()
        with self._wake:
            self.jobs.append((job, future))
            self._wake.notify()
        return future

    def cancel(self, sequence: Sequence) -> None:
        """The sequence ends ("cancelled") and frees its cache at the next step."""
        sequence.cancelled = True
        with self._wake:
            self._wake.notify()

    def run(self, stopping: threading.Event, idle_s: float = 0.05) -> None:
        """The loop's thread: steps while there is work, sleeps until a submit otherwise."""
        while not stopping.is_set():
            try:
                busy = self.step()
            except Exception as exc:  # a model that fails: its sequences end, the loop goes on
                log.exception("decode step failed")
                self.fail_all(f"the model failed: {type(exc).__name__}: {exc}")
                continue
            if not busy:
                with self._wake:
                    if not self.waiting and not self.running and not self.jobs:
                        self._wake.wait(idle_s)

    def step(self) -> bool:
        """One iteration: the jobs handed over, then leave, join, decode. Whether there was
        anything to do."""
        ran = self._jobs()
        self._leave()  # cancelled or late since the last step
        stepped = self._join()
        self._leave()  # those that ended on their first token (or this step's)
        if not self.running:
            return bool(self.waiting) or ran
        if not stepped:
            self._decode()
            self._leave()  # those that ended on this step's token: their cache is freed now
        return True

    def fail_all(self, error: str) -> None:
        """Ends every running sequence with `error` and empties the batch; waiting ones stay."""
        self._end_running("error", error)

    def end_all(self, finish: str) -> None:
        """Ends every sequence, running or waiting, as `finish` (the loop is stopped)."""
        self._end_running(finish)
        with self._wake:
            waiting, self.waiting = list(self.waiting), deque()
        for sequence in waiting:
            self._end(sequence, finish)

    def _end_running(self, finish: str, error: str | None = None) -> None:
        for sequence in self.running:
            self._end(sequence, finish, error)
        self.running, self.batch = [], PaddedBatch()
        self.budget.holds(0)

    def _jobs(self) -> bool:
        """Runs the jobs handed over since the last step; whether there were any."""
        ran = False
        while self.jobs:
            job, future = self.jobs.popleft()
            ran = True
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with torch.inference_mode():
                    future.set_result(job())
            except Exception as exc:  # the job's caller hears of it; the loop goes on
                future.set_exception(exc)
        return ran

    @property
    def sequences_waiting(self) -> int:
        return len(self.waiting)

    @property
    def sequences_running(self) -> int:
        return len(self.running)

    def _leave(self) -> None:
        now = self.clock()
        for sequence in list(self.waiting):
            if sequence.cancelled or _late(sequence, now):
                self.waiting.remove(sequence)
                self._end(sequence, "cancelled" if sequence.cancelled else "timeout")
        for sequence in self.running:
            if sequence.finish is None and (sequence.cancelled or _late(sequence, now)):
                self._end(sequence, "cancelled" if sequence.cancelled else "timeout")
        keep = [i for i, sequence in enumerate(self.running) if sequence.finish is None]
        if len(keep) < len(self.running):
            self.batch.keep(keep)
            self.running = [self.running[i] for i in keep]
        self.budget.holds(self.batch.rows * self.batch.width)

    def _join(self) -> bool:
        """Admits waiting sequences in order while the budget grants them, up to
        `prefill_tokens` of prompt a step (at least one sequence), prefilled together; whether
        the running sequences took this step's token too (a packed step)."""
        joining: list[Sequence] = []
        while self.waiting and len(self.running) + len(joining) < self.max_batch:
            sequence = self.waiting[0]
            rows = [s.row() for s in [*self.running, *joining]]
            width = max([self.batch.width, *(len(s.prompt) for s in joining)])
            if joining and sum(len(s.prompt) for s in joining) + len(sequence.prompt) \
                    > self.prefill_tokens:
                break
            if not self.budget.admits(rows, width, sequence.row()):
                break
            joining.append(self.waiting.popleft())
        if joining and self.running and self.packed and self._packed(joining):
            return True
        if joining:
            self._prefill(joining)
        return False

    def _packed(self, joining: list[Sequence]) -> bool:
        """The running rows' decode step and the joiners' prefill in one forward; False (the
        batch untouched) where that forward fails, and for good where the model refuses it
        for another reason than memory."""
        self._admitted(joining)
        try:
            with torch.inference_mode():
                logits = self.batch.step_joining(
                    self.model, [s.generated[-1] for s in self.running],
                    [s.length - 1 for s in self.running], [s.prompt for s in joining])
        except Exception as exc:
            if not _out_of_memory(exc):
                log.warning("packed prefill refused (%s: %s); prefill and decode apart from "
                            "now on", type(exc).__name__, exc)
                self.packed = False
            return False
        running = self.running
        self.running = [*running, *joining]
        self._take([*running, *joining], logits)
        self.budget.holds(self.batch.rows * self.batch.width)
        return True

    def _admitted(self, joining: list[Sequence]) -> None:
        """Notes when `joining`'s prefill began (their first token's queue and prefill times)."""
        began = self.clock()
        for sequence in joining:
            sequence.admitted = began

    def _prefill(self, joining: list[Sequence]) -> None:
        """Prefills `joining` in one forward and adds them to the batch; where that runs out
        of memory, one by one; a sequence whose own prefill fails ends with the error."""
        self._admitted(joining)
        try:
            with torch.inference_mode():
                cache, mask, logits = prefill(self.model, [s.prompt for s in joining])
        except Exception as exc:
            if len(joining) > 1 and _out_of_memory(exc):
                for sequence in joining:
                    self._prefill([sequence])
                return
            if not _out_of_memory(exc):
                log.exception("prefill failed")
            for sequence in joining:
                self._end(sequence, "error", f"out of memory in its prefill: {exc}"
                          if _out_of_memory(exc) else
                          f"the model failed: {type(exc).__name__}: {exc}")
            return
        self.batch.join(cache, mask)
        self.running += joining
        self._take(joining, logits)
        self.budget.holds(self.batch.rows * self.batch.width)

    def _decode(self) -> None:
        last = [s.generated[-1] for s in self.running]
        positions = [s.length - 1 for s in self.running]
        try:
            with torch.inference_mode():
                logits = self.batch.step(self.model, last, positions)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not _out_of_memory(exc):
                raise
            self._end(self.running[-1], "error", f"out of memory in a decode step: {exc}")
            return
        self._take(self.running, logits)
        self.budget.holds(self.batch.rows * self.batch.width)

    def _take(self, sequences: list[Sequence], logits: torch.Tensor) -> None:
        """Chooses each sequence's next token from its row of `logits` and tells it; ends
        those that are done."""
        greedy = logits.argmax(-1).tolist()
        now = self.clock()
        for sequence, row, token in zip(sequences, logits, greedy, strict=True):
            if sequence.sampling.temperature > 0:
                token = choose(row, sequence.sampling, sequence.generator)
            if token in self.eos and not sequence.sampling.ignore_eos:
                self._end(sequence, "stop")
                continue
            first = not sequence.generated
            sequence.generated.append(token)
            sequence.emit(Event(  # text may be "" (an incomplete character or stop string)
                text=sequence.text.push(token), token=token,
                queued_ms=(sequence.admitted - sequence.submitted) * 1000 if first else None,
                prefill_ms=(now - sequence.admitted) * 1000 if first else None))
            if sequence.text.stopped:
                self._end(sequence, "stop")
            elif len(sequence.generated) >= sequence.sampling.max_tokens:
                self._end(sequence, "length")

    def _end(self, sequence: Sequence, finish: str, error: str | None = None) -> None:
        """Marks the sequence finished (its row leaves at the next step) and tells it."""
        if sequence.finish is not None:
            return
        sequence.finish = finish
        rest = sequence.text.flush() if finish in ("stop", "length") else ""
        sequence.emit(Event(text=rest, finish=finish, error=error,
                            prompt_tokens=len(sequence.prompt),
                            completion_tokens=len(sequence.generated)))


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token: the most likely at temperature 0, else a draw from the distribution at
    `temperature`, cut to the smallest set of tokens holding `top_p` of it."""
    if sampling.temperature <= 0:
        return int(logits.argmax())
    probabilities = (logits.float() / sampling.temperature).softmax(-1)
    if sampling.top_p < 1:
        ordered, order = probabilities.sort(descending=True)
        before = ordered.cumsum(-1) - ordered  # the mass of the tokens more likely than each
        ordered[before >= sampling.top_p] = 0
        probabilities = torch.zeros_like(probabilities).scatter(0, order, ordered)
    return int(torch.multinomial(probabilities, 1, generator=generator))


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list | tuple) else [value] if value is not None
                   else [])
    return ids


def _late(sequence: Sequence, now: float) -> bool:
    return sequence.deadline is not None and now >= sequence.deadline


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text \
        or "can't allocate memory" in text

