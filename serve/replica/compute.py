"""One compute thread per process: where a process builds, forwards and postprocesses its models.

torch's CPU kernels run on OpenMP (GNU libgomp in the CPU wheels), and every thread that opens a
parallel region gets a team of worker threads of its own. Once a process's libgomp threads
outnumber its cores, libgomp stops spinning at the end of a region and parks its threads on
futexes instead, so each of the hundreds of regions in a small model's forward pays a wake-up.
On the 2-core development machine (fp32 all-MiniLM-L6-v2, 2 threads, `docs/benchmarks.md`,
"One compute thread per process") a forward of one short text took 12.9 ms once a second team
existed, against 7.6 ms with one (8 texts: 28.3 against 21.0 ms), slower than on one thread.

A second team appears as soon as a second thread runs one parallel op: the model built and
warmed on the replica's start thread and forwarded on another, two arms' forward threads in one
process (serve.gateway.colocated), or one label-score matmul on the event loop (MKL's thread
count is process-wide, so `torch.set_num_threads(1)` on that thread does not keep it serial).

So every torch op of a process's models runs on the one thread of `executor()`: the variant's
build (the `auto` measurement included), each batch's forward and its requests' postprocessing.
Each arm sets its own thread count on that thread before its work (`ensure_threads`), so two arms
in one process keep their own counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

THREAD_NAME = "torch-compute"

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    """This process's compute thread (one worker, started on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        return _executor


def on_compute_thread() -> bool:
    return threading.current_thread().name.startswith(THREAD_NAME)


def run(function: Callable[..., T], *args) -> T:
    """`function(*args)` on the compute thread, waited for (called there: at once, in place)."""
    if on_compute_thread():
        return function(*args)
    return executor().submit(function, *args).result()


def ensure_threads(threads: int) -> None:
    """torch's intra-op thread count on the calling thread, set only when it differs (the
    count is the calling thread's; setting it is cheap but not free)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
