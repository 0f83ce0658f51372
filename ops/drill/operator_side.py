"""The operator's side of the drill: the `rollout` CLI run as an operator runs it (a separate
process, timed from spawn to exit), and the rollout state as the gateway serves it.

The CLI inherits this process's environment (REDIS_URL, CANARY_APP_NAME) with the actor set to
`drill`, so every change the drill makes is audited as the drill's. Each change a scenario
makes is undone by the context manager that made it, whatever happened in between.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from ops.drill.client import DrillError

ACTOR = "drill"


def default_cli() -> list[str]:
    """The `rollout` script beside this Python, else on PATH, else `python -m ops.cli`."""
    beside = Path(sys.executable).with_name("rollout")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("rollout")
    return [found] if found else [sys.executable, "-m", "ops.cli"]


@dataclass(frozen=True)
class Cli:
    command: tuple[str, ...]
    timeout_s: float = 60.0

    @classmethod
    def parse(cls, text: str | None) -> Cli:
        return cls(tuple(shlex.split(text) if text else default_cli()))

    def run(self, *args: str) -> float:
        """Run `rollout ARGS`; its wall time in seconds. DrillError when it fails."""
        env = {**os.environ, "ROLLOUT_ACTOR": ACTOR}
        started = time.perf_counter()
        try:
            done = subprocess.run([*self.command, *args], env=env, capture_output=True,
                                  text=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise DrillError(f"`rollout {shlex.join(args)}` did not finish in {self.timeout_s:g} s"
                             ) from None
        except OSError as exc:
            raise DrillError(f"cannot run {self.command[0]}: {exc}") from None
        took = time.perf_counter() - started
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise DrillError(f"`rollout {shlex.join(args)}` exited {done.returncode}: {last}")
        return took

    def kill(self) -> float:
        return self.run("kill", "--reason", "drill")

    def unkill(self) -> float:
        return self.run("unkill", "--reason", "drill", "--yes")

    def canary(self, percent: float, reason: str) -> float:
        return self.run("canary", f"{percent:g}", "--reason", reason, "--yes")


def rollout_view(url: str) -> dict:
    """GET /v1/rollout of the gateway; DrillError when it does not answer as a gateway does."""
    try:
        view = httpx.get(f"{url}/v1/rollout", timeout=5, trust_env=False).json()
        view["state"]["kill"], view["canary_percent"]  # noqa: B018 - the fields the drill reads
        return view
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise DrillError(f"{url}/v1/rollout did not answer as a gateway does: "
                         f"{type(exc).__name__}: {exc}") from None


def wait_for_view(url: str, check, timeout_s: float = 10.0) -> bool:
    """Poll /v1/rollout (every 0.1 s, at most `timeout_s`) until `check(view)` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check(rollout_view(url)):
            return True
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def canary_at(cli: Cli, url: str, percent: float) -> Iterator[float]:
    """The canary share at `percent` inside the block, the share found before restored after;
    yields the share found before."""
    before = float(rollout_view(url)["canary_percent"])
    if before != percent:
        cli.canary(percent, "drill: burst at a fixed share")
        wait_for_view(url, lambda v: float(v["canary_percent"]) == percent)
    try:
        yield before
    finally:
        if float(rollout_view(url)["canary_percent"]) != before:
            cli.canary(before, "drill over: restore the share")


@contextlib.contextmanager
def kill_restored(cli: Cli, url: str, settle_s: float = 2.0) -> Iterator[bool]:
    """Inside the block the kill switch may be flipped; afterwards it is as it was found.
    Yields whether it was on. The gateway's copy of the state follows Redis within
    milliseconds: it is given `settle_s` to show the switch back before the drill flips it."""
    before = bool(rollout_view(url)["state"]["kill"])
    try:
        yield before
    finally:
        if not wait_for_view(url, lambda v: bool(v["state"]["kill"]) == before, timeout_s=settle_s):
            cli.kill() if before else cli.unkill()


def time_kills(cli: Cli, times: int) -> list[float]:
    """`rollout kill` `times` times, each followed by `rollout unkill`; the kills' wall times."""
    took = []
    for _ in range(times):
        took.append(cli.kill())
        cli.unkill()
    return took
