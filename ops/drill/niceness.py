"""The load generator's niceness, and the operator's thread that keeps the niceness the drill
was started with.

The client shares the CPUs with the gateway it measures: it runs at the Serve workers'
niceness (`apply_niceness`) so that it does not preempt the server, while what an operator runs
(the timed `rollout` commands) runs from `OperatorThread` at the niceness the drill started with.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ops.load.processes import serve_niceness

NICE_WHY = ("the load generator runs at the Serve workers' niceness, so it does not preempt the "
            "server it measures")


@dataclass(frozen=True)
class Niceness:
    used: int
    was: int
    why: str

    def figure(self) -> dict:
        return {"used": self.used, "was": self.was, "why": self.why}


def apply_niceness(asked: int | str, *, find: Callable[[], int | None] = serve_niceness,
                   nice: Callable[[int], int] = os.nice) -> Niceness:
    """Reach the niceness `asked` with os.nice: a number, `auto` (the Serve replicas', see
    `serve_niceness`) or `none` (unchanged). What was used, what it was, and why."""
    was = nice(0)
    if asked == "none":
        return Niceness(was, was, "--nice none: left as it was")
    if asked == "auto":
        target = find()
        if target is None:
            return Niceness(was, was, "auto: no Serve replica process found on this machine, "
                            "left as it was")
        why = f"auto, the Serve replicas' niceness: {NICE_WHY}"
    else:
        target, why = int(asked), f"--nice {asked}"
    if target != was:
        try:
            nice(target - was)
        except OSError:
            return Niceness(was, was, f"{why}; lowering it to {target} needs privilege, "
                            "left as it was")
    return Niceness(nice(0), was, why)


class OperatorThread(ThreadPoolExecutor):
    """One thread started before the drill raises its niceness. On Linux a niceness belongs to
    a thread, and a new thread or process takes its creator's: what runs or starts from this
    thread (the `rollout` commands timed as an operator runs them, a scenario's
    `asyncio.to_thread` work when it is the loop's default executor) keeps the niceness the
    drill was started with. `shutdown`, which `asyncio.run` calls on its default executor, keeps
    it for the next scenario; `close` ends it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="drill-operator")
        self.submit(int).result()  # its thread exists from now on

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Kept: see the class docstring."""

    def close(self) -> None:
        super().shutdown(wait=True)


_operator: OperatorThread | None = None


def start_operator_thread() -> OperatorThread:
    """The operator's thread, started now (call before changing the niceness)."""
    global _operator
    if _operator is None:
        _operator = OperatorThread()
    return _operator


def operator_thread() -> OperatorThread | None:
    return _operator


def as_operator(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` run in the operator's thread (see OperatorThread), here when there is none."""
    return _operator.submit(fn, *args).result() if _operator else fn(*args)
