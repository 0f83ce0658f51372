"""`serve run serve.config:app` as a user starts and stops it, for the end-to-end tests: its
environment, its start to the first 200, its stop, and the processes and listeners of the
session it runs in (Ray's processes and HAProxy included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from serve import local_start, ray_env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
URL = "http://127.0.0.1:8000"
# `auto` measures its candidates on the first start on a machine (serve.recipes.auto.choose):
# minutes once
FIRST_START_S = 600
STOP_S = 20  # Ctrl-C to exit, at most (it takes ~10 s on 2 cores)


def nothing_on_port_8000() -> None:
    with httpx.Client() as probe:
        try:
            probe.get(URL + "/healthz", timeout=0.5)
        except httpx.TransportError:
            return
    raise AssertionError("something already listens on 127.0.0.1:8000; stop it first")


def environment(redis_url: str, cache: Path, **extra: str) -> dict[str, str]:
    """What `ops/run.sh` exports before `serve run`, with `auto`'s cache in `cache`."""
    env = dict(os.environ, REDIS_URL=redis_url, PATH=f"{BIN}:{os.environ['PATH']}",
               PYTHONFAULTHANDLER="1",
               CANARY_AUTO_CHOICE_DIR=str(cache / "auto"), CANARY_ONNX_DIR=str(cache / "onnx"),
               **extra)
    ray_env.apply(env, throwaway=True)
    return env


def _hears_ctrl_c() -> None:
    """In the child before exec: SIGINT as in a terminal. A test run started in the background
    (`ops/test.sh &`, a CI runner) inherits SIGINT ignored; `serve run` hears it again itself
    (serve.local_start), and this keeps the test independent of that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(env: dict[str, str], log) -> subprocess.Popen:
    """`serve run serve.config:app` in a session of its own, its console in `log`."""
    return subprocess.Popen([str(BIN / "serve"), "run", "serve.config:app"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_hears_ctrl_c)


def first_200(proc: subprocess.Popen, client: httpx.Client, log_name: str,
              seconds: float = FIRST_START_S) -> float:
    """Seconds from now until `/v1/predict` answers 200 (the start counted by the caller)."""
    started = time.monotonic()
    while True:
        assert proc.poll() is None, f"serve run exited early, see {log_name}"
        try:
            if client.post("/v1/predict", json={"inputs": ["hello"]}).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        assert time.monotonic() - started < seconds, f"no 200 within {seconds} s, see {log_name}"
        time.sleep(0.25)


def ctrl_c(proc: subprocess.Popen, log_name: str) -> None:
    """Stops the gateway as Ctrl-C does; where it hangs, its stacks go to the log and it is
    killed."""
    stopping = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(STOP_S)
        print(f"\n[e2e] Ctrl-C to exit: {time.monotonic() - stopping:.1f} s")
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGABRT)  # PYTHONFAULTHANDLER: where it hangs, in the log
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        print(f"\n[e2e] serve run still running {STOP_S} s after Ctrl-C, killed; "
              f"its stacks are in {log_name}")


def session_processes(leader: int) -> list[int]:
    """Every process of the session `leader` started: Ray's, the replicas, HAProxy."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == leader:
                    found.append(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
    return found


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def is_haproxy(pid: int) -> bool:
    return command_of(pid).split(" ", 1)[0].endswith("haproxy")


def rss_mib(leader: int) -> float:
    """Resident memory of every process in the gateway's session, in MiB."""
    total = 0
    for pid in session_processes(leader):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def listeners(leader: int) -> list[tuple[int, str, str, int]]:
    """(pid, command, address, port) of each TCP listener of the session's processes."""
    return [(pid, command_of(pid), host, port) for pid in session_processes(leader)
            for host, port in local_start.listeners_of(pid)]
