"""What a model replica's forwards cost: the seconds of compute each merged batch took, given to
its requests by their rows (rollout.efficiency turns them into cost per input and the realized
speedup).

- **CPU replica**: `time.process_time()` before and after the batch's forwards, read in the
  forward thread. It is the whole process's CPU time, so it counts torch's intra-op threads
  (and a runtime's own pool: OpenVINO, ONNX Runtime, CTranslate2), which `thread_time()` would
  miss. It also counts whatever else the process ran meanwhile: the event loop tokenizing or
  postprocessing other requests (when the gateway does not tokenize: serve.gateway.preprocess) and
  Ray's own threads. That is small next to a forward, and both arms pay it alike; it nudges
  the ratio towards 1, never away from it. One forward runs at a time per replica (one forward
  thread), so no second is counted twice.
- **CUDA replica**: GPU seconds, from two CUDA events recorded on the forward thread's current
  stream around the forwards (the time the stream took between them, idle gaps included;
  cheap: the forward synchronizes anyway to bring its rows back). The CPU time of a GPU forward
  would measure kernel launches, not the work.

A batch's seconds are shared among the requests that got an answer, by rows: the work spent on
rows of requests that failed (out of memory, expired) is charged to those answered, as it is
what answering them cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


class ForwardClock:
    """Times a batch's forwards, in the forward thread: CPU seconds, or GPU seconds on CUDA."""

    def __init__(self, device: str):
        self.gpu = str(device).startswith("cuda")

    def timed(self, forward: Callable[..., T], *args) -> tuple[T, float]:
        """`forward(*args)` and the seconds it cost (see the module docstring)."""
        if self.gpu:
            return _gpu_timed(forward, *args)
        start = time.process_time()
        result = forward(*args)
        return result, time.process_time() - start


def _gpu_timed(forward: Callable[..., T], *args) -> tuple[T, float]:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = forward(*args)
    end.record()
    end.synchronize()
    return result, start.elapsed_time(end) / 1000


def shares(seconds: float, rows: Sequence[int], results: Sequence[object]) -> list[float | None]:
    """Each request's share of a batch's `seconds` by its `rows`, among those whose result is
    not an exception; None for the others (they are not answered)."""
    answered = [not isinstance(result, BaseException) for result in results]
    total = sum(n for n, ok in zip(rows, answered, strict=True) if ok)
    if total <= 0:
        return [None] * len(rows)
    return [seconds * n / total if ok else None
            for n, ok in zip(rows, answered, strict=True)]


def burn_cpu(seconds: float) -> None:
    """Spin this thread for `seconds` of CPU time: a forward made slower on purpose
    (`fault_cpu_ms`, for drills and tests)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
