"""Compute follows the share: a model replica's threads follow the traffic its arm carries.

Each model replica's forward takes `threads` CPU threads (torch's intra-op pool, or an ONNX
Runtime / CTranslate2 session's). A fixed `cores / 2` each leaves half the machine idle when one
arm carries the traffic (the baseline below 50 %, the optimized arm after promotion).

Policy (`threads_for`, pure): the arm that carries a share `f` of the traffic gets
`round(cores * f)` threads, clamped to [1, cores]. Invariants:

- every arm keeps at least one thread, so the arm at 0 % still answers shadow calls and the
  baseline is never without compute when a kill switch sends it everything;
- the share counted is the one routed: 0 while the kill switch is on, and 0 while this
  replica's copy of the state is stale or was never read (the gateway's fail-safe routes all
  to baseline then, so the baseline must have the cores);
- at 50 % both arms get half the cores; the two counts never exceed `cores + 1` (an arm at a
  small share keeps its one thread on top: it is mostly idle, and its pool does not spin).

Beside an event loop (`beside_loop`, pure): in the colocated topology (serve.gateway.colocated)
the forward runs in the gateway's own process, whose event loop parses, routes, sheds and answers
every request. While that loop is busy and requests wait behind a batch, the batch runs on at
most `cores - 1` threads, leaving the loop a core; otherwise on all its threads. Busy
(serve.gateway.admission `loop_busy`): the gateway is shedding (it refused a request within the
last second), or the loop's thread spent at least `BUSY_LOOP_SHARE` (a quarter) of a core over
its last windows. Both measured on 2 cores (Intel Xeon with amx_bf16, amx_int8, avx512_bf16,
avx512_vnni), colocated, canary 0 %:

- shedding (`python -m ops.drill overload --duration 10`): a batch on both threads while the
  loop shed the excess took 30-80 ms for 16 short texts against ~20 ms in a closed loop (each
  OpenMP barrier waits for the thread the loop has descheduled): goodput was 182-189 200s/s at
  2x and 5x capacity, with 504s; leaving the loop a core, 253-306, none;
- the loop's share (`python -m ops.bench --workload short --set topology=colocated`, two
  interleaved rounds): with single short texts the loop spends 0.29-0.41 of a core, and at
  concurrency 64 (a backlog behind every batch) leaving it a core answered 317-321 / 446-486
  texts/s (baseline / optimized) against 263-283 / 328-330, at 3.5 CPU ms per request
  against 4.9; with 8-text requests it spends 0.12-0.17 and the batches keep both threads
  (on any backlog they lost 15-35 % at concurrency 64), and at concurrency 8 nothing waits
  behind a batch (one thread there cost 10-15 %).

Mechanism (`ComputeFollower`): the replica watches the rollout state (rollout.watcher, pub/sub
plus a poll, as a gateway does) and, when the count for its arm changes, asks the replica to
apply it (in its forward thread, between batches: torch's thread count is per thread, and a
runtime session is rebuilt with the new count there).

Beside busy neighbours (`yielding`, `beside_neighbours`, pure): in the remote topology a model
replica's neighbours on its machine (the gateway, HAProxy, the other arm) are other processes.
Once the machine is saturated (under `SATURATED_IDLE` idle cores, serve.replica.host_load), a
small batch (under `SMALL_BATCH_TOKENS`) runs on one thread fewer, as a colocated batch leaves
its loop a core: on two threads it costs up to 40 % more CPU, which the neighbours need, and
each OpenMP barrier waits for a thread they descheduled. It takes the core back once one is
idle (`UNSATURATED_IDLE`). Whether requests wait behind the batch does not matter here: the
gateway sends one coalesced call per arm at a time, so in a closed loop of single texts every
waiting request rides the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rollout.state import BUCKETS
from rollout.watcher import StateWatcher

log = logging.getLogger(__name__)


def threads_for(arm: str, effective_bp: int, cores: int) -> int:
    """Threads of `arm` ("baseline" or "optimized") when the optimized arm is routed
    `effective_bp` basis points of the traffic, on a replica with `cores` CPUs."""
    optimized = effective_bp / BUCKETS
    share = optimized if arm == "optimized" else 1 - optimized
    return max(1, min(cores, round(cores * share)))


def beside_loop(threads: int, cores: int, backlog: int) -> int:
    """Threads of a batch in a process whose event loop also serves the requests and is busy:
    `threads`, but at most `cores - 1` (at least 1) while `backlog` requests wait behind it."""
    if backlog <= 0:
        return threads
    return max(1, min(threads, cores - 1))


# a batch of fewer tokens gains little from a second thread and costs more CPU: fp32
# all-MiniLM-L6-v2 on 2 cores, 16 short texts (~220 tokens) 3.2 CPU ms per text on two threads
# against 2.3 on one; 64 (~900 tokens) 2.25 against 2.5 (docs/benchmarks.md)
SMALL_BATCH_TOKENS = 512
# idle cores under which the machine counts as saturated, and over which a replica that left
# its neighbours a core takes it back (a core left free shows as idle while they do not use it)
SATURATED_IDLE, UNSATURATED_IDLE = 0.25, 0.75


def yielding(idle: float, was: bool) -> bool:
    """Whether a remote model replica's small batches leave its machine a core, given the
    machine's `idle` cores and whether they did so far (`was`): from saturation until a core
    is idle again."""
    return idle < (UNSATURATED_IDLE if was else SATURATED_IDLE)


def beside_neighbours(threads: int, cores: int, tokens: int, yields: bool) -> int:
    """Threads of a batch of `tokens` in a process of its own: `threads`, but at most `cores - 1`
    (at least 1) for a small batch while the replica `yields` (`yielding`)."""
    if not yields or tokens >= SMALL_BATCH_TOKENS:
        return threads
    return max(1, min(threads, cores - 1))


class ComputeFollower:
    """Calls `apply(threads)` whenever the thread count for `arm` changes (module docstring)."""

    def __init__(self, store, arm: str, cores: int, apply: Callable[[int], object], *,
                 poll_s: float, staleness_s: float, clock=None):
        self.arm, self.cores, self.apply = arm, cores, apply
        self.threads: int | None = None
        self.watcher = StateWatcher(store, poll_s=poll_s, staleness_s=staleness_s, clock=clock,
                                    heartbeat=self.check, heartbeat_s=0.0)

    def wanted(self) -> int:
        view = self.watcher.view()
        routed = 0 if view.stale or not view.loaded else view.state.effective_bp
        return threads_for(self.arm, routed, self.cores)

    def check(self) -> None:
        """Apply the count the current view asks for, if it changed (runs in the watcher)."""
        wanted = self.wanted()
        if wanted != self.threads:
            log.info("%s model: %d threads for its share of the traffic", self.arm, wanted)
            self.threads = wanted
            self.apply(wanted)

    def start(self) -> None:
        self.watcher.start()
        self.check()

    def stop(self) -> None:
        self.watcher.stop(timeout=1)
