"""`serve run serve.config:app` on a Ray of its own: what the start clears, checks and sets
before `serve run` deploys the application.

`serve run` calls `serve.config.app` before it starts Ray, and starts a local Ray unless it is
given a cluster (`--address`, `RAY_ADDRESS`, or a `ray start` cluster on this machine). When it
will start one (`starts_local_ray`), `start` does it instead, so that it can:

1. Stop what a killed gateway left: an HAProxy whose Ray is gone (serve.ray_env
   `orphaned_haproxies`) still holds the HTTP port and answers 500. Each one stopped is named on
   the console. An HAProxy of a live cluster is never touched.
2. Refuse a port held by anything else in one line naming the port and the process, before
   HAProxy fails on it with alerts and Serve with "HAProxy crashed during startup".
3. Keep the listeners on `listen_host` (the loopback by default): Ray's node on that address
   (Ray binds its own ports to its node's address), Serve's HTTP door and each gateway
   replica's server behind it there, HAProxy's stats and metrics pages there
   (serve.haproxy_launcher).
4. Stop the way Ctrl-C does on SIGTERM (a supervisor's stop), and on SIGINT even where the
   process inherited it ignored (a command started in the background of a script): Serve
   shuts down, HAProxy with it. Without this SIGTERM ends the process at once and Serve's
   proxy is killed with its HAProxy still running.

A cluster started elsewhere keeps its own environment and addresses (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rollout.settings import ServingSettings
from serve import ray_env
from serve.common.quiet import silence

# Seconds a SIGTERM waits to see whether Ray's own processes got it too
RAY_STOPPING_S = 1.0


def starts_local_ray() -> dict | None:
    """The runtime environment of `serve run` when this process is `serve run` and will start a
    Ray of its own on this machine, else None (another command, a cluster to join, Ray up)."""
    import click
    import ray

    context = click.get_current_context(silent=True)
    if context is None or context.info_name != "run" or ray.is_initialized():
        return None
    params = context.params
    from ray._private.services import canonicalize_bootstrap_address

    try:
        if canonicalize_bootstrap_address(params.get("address")) is not None:
            return None  # a cluster to join: its environment is its own
    except (ValueError, ConnectionError):
        return None  # an address Ray will refuse itself, with its own message
    from ray.serve.scripts import parse_runtime_env_args

    return parse_runtime_env_args(runtime_env=params.get("runtime_env"),
                                  runtime_env_json=params.get("runtime_env_json"),
                                  working_dir=params.get("working_dir")) or {}


def say(line: str) -> None:
    print(f"start: {line}", file=sys.stderr, flush=True)


def start(serving: ServingSettings, runtime_env: dict, log: Callable[[str], None] = say
          ) -> None:
    """Steps 1-4 of the module's docstring, then Ray and Serve started as `serve run` would."""
    import ray
    from ray import serve

    for pid, detail in reap(log):
        log(f"stopped HAProxy {pid}{detail}, left behind by a Ray cluster that is gone")
    environ = ray_env.apply()
    ray_env.haproxy_launch(os.environ, serving.listen_host)
    refuse_held_ports(serving.listen_host, wanted_ports(serving, environ))
    if is_loopback(serving.listen_host):
        node_on_loopback()
    ray.init(namespace="serve", runtime_env=runtime_env)
    stop_on_signals()
    serve.start(http_options={"host": serving.listen_host})
    # `serve run` starts Serve again next and is told, twice, that its (default) options
    # "will not be applied": the ones above are
    silence("ray.serve", "Connecting to existing Serve app in namespace")


def node_on_loopback(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Starts the local Ray as a single-machine one, every port of its own on the loopback:
    Ray's switch for that (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the default on macOS and
    Windows) for the processes Ray starts, and its value, read when `ray` was imported, for
    this one. A value in the environment already wins. Returns whether the node is local."""
    from ray._private import ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    local = environ.setdefault(name, "0").lower() not in ("1", "true")  # Ray's reading
    ray_constants.ENABLE_RAY_CLUSTER = not local
    return local


def reap(log: Callable[[str], None] = say) -> list[tuple[int, str]]:
    """Stops every orphaned HAProxy (serve.ray_env `stop`); each as (pid, what it held)."""
    found = [(pid, _held(pid)) for pid in ray_env.orphaned_haproxies()]
    ray_env.stop([pid for pid, _ in found], log)
    return found


def _held(pid: int) -> str:
    ports = sorted(f"{host}:{port}" for host, port in listeners_of(pid))
    return f" (it held {', '.join(ports)})" if ports else ""


def wanted_ports(serving: ServingSettings, environ: dict[str, str]
                 ) -> list[tuple[int, str]]:
    """The ports this start binds on `listen_host`, as (port, what listens there)."""
    from ray.serve.config import HTTPOptions

    ports = [(HTTPOptions().port, "HTTP"), (serving.grpc_port, "gRPC")]
    if environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        ports += [(int(environ.get("RAY_SERVE_HAPROXY_STATS_PORT", 8404)), "HAProxy stats"),
                  (int(environ.get("RAY_SERVE_HAPROXY_METRICS_PORT", 9101)), "HAProxy metrics"),
                  (int(environ.get("RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", 8500)),
                   "Serve's fallback proxy")]
    return [(port, what) for port, what in ports if port]


class PortHeld(SystemExit):
    """A port the start needs is held by another process: the one line says which."""


def refuse_held_ports(host: str, ports: Iterable[tuple[int, str]]) -> None:
    for port, what in ports:
        if can_bind(host, port):
            continue
        holder = port_holder(port)
        raise PortHeld(
            f"start: port {port} ({what}) on {host} is held by {holder}: stop it and start "
            "again (`python -m serve.ray_env --reap` stops an HAProxy left behind by a gateway "
            "whose Ray is gone)")


def can_bind(host: str, port: int) -> bool:
    """Whether a listener could bind `host:port` now (with SO_REUSEADDR, as servers do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_holder(port: int, proc: Path = Path("/proc")) -> str:
    """Who listens on `port` (any address), in words: process id and command line."""
    inodes = {inode for _, listened, inode in _tcp_listeners(proc) if listened == port}
    for pid, cmdline in _socket_owners(inodes, proc):
        return f"process {pid} ({cmdline})"
    return "a process this user cannot see"


def listeners_of(pid: int, proc: Path = Path("/proc")) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket `pid` listens on."""
    links = _fd_links(proc / str(pid))
    return [(host, port) for host, port, inode in _tcp_listeners(proc)
            if f"socket:[{inode}]" in links]


def _tcp_listeners(proc: Path) -> list[tuple[str, int, str]]:
    """Every listening TCP socket of the host: (address, port, inode)."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.append((_address(address, width), int(port, 16), fields[9]))
    return found


def _address(hex_address: str, width: int) -> str:
    """An address of /proc/net/tcp (little-endian 32-bit words) in words."""
    raw = b"".join(bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, width, 8))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)  # an IPv4 client of a dual-stack socket
    return f"::ffff:{mapped}" if mapped else str(address)


def _socket_owners(inodes: set[str], proc: Path) -> Iterable[tuple[int, str]]:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        if not _fd_links(entry) & wanted:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        yield int(entry.name), cmdline[:160]


def _fd_links(process: Path) -> set[str]:
    """What each open file descriptor of `process` points at (those it may read)."""
    links = set()
    try:
        fds = list((process / "fd").iterdir())
    except OSError:
        return links
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own among them)
            links.add(os.readlink(fd))
    return links


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host == "localhost"
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def stop_on_signals() -> None:
    """SIGTERM stops the process the way Ctrl-C does (`serve run` then shuts Serve down,
    in-flight requests answered), unless Ray's own processes got it too (a stop of the whole
    process group or cgroup: nothing is left to drain, and Serve's shutdown would wait 30 s
    on a controller that is gone), when it exits at once; a second SIGTERM while it stops is
    ignored. SIGINT inherited ignored hears Ctrl-C again. Main thread only (Python's rule
    for handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop; a supervisor's SIGKILL ends it
        if ray_stopping():
            raise SystemExit(128 + signum)  # Ray's exit hook stops what is left of the node
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def ray_stopping(wait_s: float = RAY_STOPPING_S, node=None) -> bool:
    """Whether a process of the local Ray node (GCS, raylet, ...) exits within `wait_s`."""
    if node is None:
        from ray._private import worker

        node = worker._global_node
    if node is None:
        return True
    deadline = time.monotonic() + wait_s
    while not node.dead_processes():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
