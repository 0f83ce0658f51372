"""A peer server as a subprocess: on 127.0.0.1 on a free port, bounded in time, and always
stopped.

`server` starts the command in a session of its own (so a Ctrl-C in the terminal reaches only
the benchmark, which stops it), its output in a log file; waits, at most `START_TIMEOUT_S`,
until its health route answers 200 and one embedding request comes back with one vector per
text; and on leaving, whatever happened (an error, Ctrl-C, or SIGTERM, which the benchmark turns
into SystemExit while peers run), sends SIGTERM to its whole process group, waits up to
`STOP_TIMEOUT_S` for it, then SIGKILLs the group and waits for the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from ops.bench.endtoend import BenchError
from ops.bench.peers.registry import Launch, Peer
from ops.load.processes import stat_fields

START_TIMEOUT_S = 300.0  # Infinity's ONNX engine times two warm-up batches before it is ready
STOP_TIMEOUT_S = 15.0
# nothing is downloaded, no usage statistics are sent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
PROBE_TEXTS = ["a short sentence to embed", "and a second one"]


@dataclass(frozen=True)
class Running:
    """A started peer: its URL, the pid of the process it was started as (its children are
    its own too: ops.bench.cpu) and its log."""

    peer: Peer
    url: str
    pid: int
    log: Path


@contextlib.contextmanager
def server(peer: Peer, launch: Launch, log: Path, timeout: float = START_TIMEOUT_S
           ) -> Iterator[Running]:
    """`peer` started with `launch` (module docstring)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(peer.argv(launch), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=log.parent,
                                env={**os.environ, **OFFLINE}, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{launch.port}"
        _wait_ready(peer, proc, url, log, timeout)
        yield Running(peer, url, proc.pid, log)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to `proc`'s process group, SIGKILL to what is left of it after `STOP_TIMEOUT_S`;
    waits for `proc`, and (bounded) for the rest of the group to be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_alive(group: int) -> bool:
    """Whether a process of `group` still runs (zombies waiting for a reaper do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat.read_text())
        except (OSError, ValueError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _wait_ready(peer: Peer, proc: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise BenchError(f"peer {peer.name} exited with status {proc.returncode} before it "
                             f"was ready; {_tail(log)}")
        if _answers(peer, url):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"peer {peer.name} was not ready after {timeout:.0f} s; "
                             f"{_tail(log)}")
        time.sleep(0.5)


def _answers(peer: Peer, url: str) -> bool:
    """Whether `peer` answers its health route and one embedding request as it should."""
    try:
        if httpx.get(url + peer.health, timeout=5).status_code != 200:
            return False
        answer = httpx.post(url + peer.route, json=peer.body(PROBE_TEXTS), timeout=60)
    except httpx.HTTPError:
        return False
    if answer.status_code != 200:
        return False
    try:
        rows = peer.vectors(answer.json())
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"peer {peer.name} answered what it should not: {type(exc).__name__}: "
                         f"{exc}: {answer.text[:200]}") from None
    if len(rows) != len(PROBE_TEXTS) or not all(rows):
        raise BenchError(f"peer {peer.name} answered {len(rows)} vectors for "
                         f"{len(PROBE_TEXTS)} texts")
    return True


def _tail(log: Path, lines: int = 15) -> str:
    try:
        last = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        last = []
    return f"the last lines of {log}:\n  " + "\n  ".join(last)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) in the main thread inside the block, so that the peers'
    `finally` runs (Python's default ends the process at once); the handler found is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
