"""How busy this machine is: whether a model replica's small batches leave its neighbours a core.

In the remote topology on one machine, a model replica's forward shares the cores with the
gateway replica's event loop (parsing, routing, answering every request), HAProxy, Serve's proxy
and the other arm's replica. Once the machine is saturated, a small batch on every core waits
at each OpenMP barrier for a thread that a neighbour has descheduled, and its spinning threads
take CPU the neighbours need. The policy is serve.replica.thread_share `yielding` and
`beside_neighbours`; measured in docs/benchmarks.md, "Leaving the neighbours a core".

`HostLoad.idle()`: the idle time of the CPUs this process may run on (`/proc/stat`, each CPU's
line: idle and iowait), in cores, over windows of at least `window_s` (a moving average, `weight`
for the newest). Where `/proc/stat` cannot be read (not Linux) the machine counts as idle: the
replica keeps its threads. `CANARY_YIELD_TO_NEIGHBOURS=false` turns the policy off (a container
whose CPU quota is a part of a host: its idle time is the host's, not its own).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from serve.common.averages import WindowedRate
from serve.replica.thread_share import beside_neighbours, yielding

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def idle_s(cpus: Iterable[int] | None = None, stat: str = "/proc/stat") -> float:
    """Seconds the CPUs in `cpus` (default: those this process may run on) have been idle or
    waiting for I/O since boot."""
    wanted = {f"cpu{n}" for n in (os.sched_getaffinity(0) if cpus is None else cpus)}
    ticks = 0
    with open(stat) as lines:
        for line in lines:
            fields = line.split()
            if fields and fields[0] in wanted:
                ticks += int(fields[4]) + int(fields[5])
    return ticks / TICKS


class HostLoad:
    """The machine's idle cores (module docstring), and whether this replica's small batches
    leave it a core now (`threads`); the reader and the clock are injectable."""

    def __init__(self, window_s: float = 0.25, weight: float = 0.5, *,
                 read_idle_s: Callable[[], float] = idle_s,
                 clock: Callable[[], float] = time.monotonic):
        self.read_idle_s, self.clock = read_idle_s, clock
        self._cores = WindowedRate(window_s, weight)  # idle seconds per second
        self.yields = False
        self.readable = True

    @property
    def cores(self) -> float | None:
        """Idle cores, None until a window closed."""
        return self._cores.value

    def idle(self) -> float | None:
        """Idle cores over the last windows (sampled when a window has passed: cheap to call
        per batch); None until the first window closed or where /proc/stat cannot be read."""
        if not self.readable:
            return None
        try:
            wall, idle = self.clock(), self.read_idle_s()
        except (OSError, ValueError, IndexError):
            self.readable = False
            return None
        return self._cores.sample(wall, idle)

    def threads(self, threads: int, cores: int, tokens: int) -> int:
        """Threads for a batch of `tokens` (serve.replica.thread_share `beside_neighbours`)."""
        idle = self.idle()
        self.yields = idle is not None and yielding(idle, self.yields)
        return beside_neighbours(threads, cores, tokens, self.yields)
