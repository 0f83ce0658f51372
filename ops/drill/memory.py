"""The model replicas' resident memory on this machine, and whether it came back after a burst.

Replicas are found by process title (`ray::ServeReplica:<app>:<deployment>`) through
`ops.load.processes.serve_processes`; the model deployments are the ones whose name contains
`baseline` or `optimized`. Other Ray clusters on the same machine (a test run) have replicas of
the same names: pass the Serve application's name to count only the drilled gateway's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ops.load.processes import rss_mib, serve_processes

MODEL_DEPLOYMENTS = ("baseline", "optimized")


def replica_rss(app: str | None = None) -> dict[str, float]:
    """RSS in MiB of each model replica, by `<deployment>[<pid>]`."""
    found = {}
    for pid, title in serve_processes().items():
        if not title.startswith("ray::ServeReplica:"):
            continue
        parts = title.split(":")  # ray, , ServeReplica, app, deployment...
        owner, deployment = (parts[3], ":".join(parts[4:])) if len(parts) > 4 else ("", title)
        if app is not None and owner != app:
            continue
        if not any(name in deployment for name in MODEL_DEPLOYMENTS):
            continue
        value = rss_mib(pid)
        if value is not None:
            found[f"{deployment}[{pid}]"] = round(value, 1)
    return found


def growth_pct(before: dict[str, float], now: dict[str, float]) -> float | None:
    """The largest growth in percent of a replica's RSS over its value in `before` (a replica
    that shrank counts 0); None when no replica is in both."""
    common = [k for k in before if k in now and before[k] > 0]
    if not common:
        return None
    return max(max(0.0, (now[k] - before[k]) / before[k] * 100) for k in common)


async def watch_rss(before: dict[str, float], *, every_s: float = 5.0, up_to_s: float = 60.0,
                    tolerance_pct: float = 10.0,
                    sample: Callable[[], dict[str, float]] = replica_rss,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> dict:
    """Sample every `every_s` until every replica is within `tolerance_pct` of `before`, or
    `up_to_s` has passed. Returns the samples (seconds, MiB by replica), the seconds until it was
    back (None: not within `up_to_s`) and the last growth in percent. Nothing to watch without
    a replica in `before`."""
    if not before:
        return {"samples": [], "back_after_s": None, "growth_pct": None}
    start = clock()
    samples, back_after = [], None
    while True:
        now = sample()
        at = clock() - start
        samples.append({"t_s": round(at, 1), "mib": now})
        growth = growth_pct(before, now)
        if growth is not None and growth <= tolerance_pct:
            back_after = at
            break
        if at + every_s > up_to_s:
            break
        await sleep(every_s)
    return {"samples": samples, "back_after_s": back_after, "growth_pct": growth}
