"""A two-node Ray cluster on this machine, for integration tests: real `ray start` processes.

Each node's Serve ingress (HAProxy in direct-ingress mode) binds the HTTP port on every
interface, so two nodes on one machine would collide. The worker node therefore runs in a
network namespace of its own, joined to the machine by a veth pair:

    root namespace: head node    10.231.0.1 (veth HOST_IF)
    namespace NS:   worker node  10.231.0.2 (veth, and its own loopback)

Both `ray start --block` processes run in sessions of their own (start_new_session), so the
test stops exactly what it started: the process groups, every process inside the namespace,
anything else in the sessions, then HAProxy processes that Ray left behind; never `ray stop`,
which stops every Ray cluster on the machine. Ray's files go to a private --temp-dir.

`TwoNodeCluster` needs root (network namespaces); `unavailable()` says why it cannot run here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from serve import ray_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HEAD_IP, WORKER_IP = "10.231.0.1", "10.231.0.2"
PREFIX = 24


def unavailable() -> str | None:
    """Why a two-node cluster cannot start on this machine, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (the worker node runs in its own namespace)"
    if shutil.which("ip") is None:
        return "`ip` not found: install Debian's iproute2 package"
    if shutil.which("redis-server") is None:
        return "redis-server not found: install Debian's redis-server package"
    probe = f"canary-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def auth_headers() -> dict[str, str]:
    """Ray 2.60's token authentication for the dashboard's REST API: the token that `ray start`
    keeps in ~/.ray/auth_token (or RAY_AUTH_TOKEN), as Ray's own clients send it."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if not token and path.exists():
        token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")


class Netns:
    """A network namespace with a veth pair: HEAD_IP on the host side, WORKER_IP inside."""

    def __init__(self, tag: str):
        self.name = f"canary-{tag}"
        self.host_if, self.inner_if = f"cnh{tag}"[:15], f"cnw{tag}"[:15]

    def create(self) -> Netns:
        taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        if f" {HEAD_IP}/" in taken:
            raise RuntimeError(f"{HEAD_IP} is already on an interface here: another two-node "
                               "test running, or one that was killed (`ip -o addr`)")
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if)
        _ip("link", "set", self.inner_if, "netns", self.name)
        _ip("addr", "add", f"{HEAD_IP}/{PREFIX}", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("addr", "add", f"{WORKER_IP}/{PREFIX}", "dev", self.inner_if, netns=self.name)
        _ip("link", "set", self.inner_if, "up", netns=self.name)
        _ip("link", "set", "lo", "up", netns=self.name)
        return self

    def pids(self) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def delete(self) -> None:
        # deleting the namespace deletes its end of the pair, and with it the host's end
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.host_if], capture_output=True)


def _kill(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _processes() -> dict[int, tuple[int, int, bytes]]:
    """pid -> (parent pid, session id, command line) of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            found[int(entry.name)] = (int(fields[1]), int(fields[3]),
                                      (entry / "cmdline").read_bytes())
        except (OSError, IndexError, ValueError):
            continue
    return found


def _session_and_descendants(leaders: set[int]) -> set[int]:
    """Every process in the sessions of `leaders`, and every descendant of those (a process
    that left the session with setsid still descends from it, until its parent dies)."""
    table = _processes()
    mine = {pid for pid, (_, sid, _) in table.items() if sid in leaders} | set(leaders)
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    return mine & set(table)


class Node:
    """One `ray start --block` process, in a session of its own, logging to a file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path,
                 netns: str | None = None):
        self.name, self.log_path = name, log
        command = [str(BIN / "ray"), "start", "--block", *args]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]
        self.log = log.open("w")
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL to the node's whole process group (the raylet, its workers, HAProxy)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


class ClusterRedis:
    """A throwaway `redis-server` on HEAD_IP, which both nodes reach; password-protected."""

    password = "two-node-test-password"

    def __init__(self, where: Path):
        self.port = ray_env.free_port()
        self.dir = where
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--bind", HEAD_IP, "--port", str(self.port),
             "--requirepass", self.password, "--dir", str(where), "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{HEAD_IP}:{self.port}/0"

    def wait(self, timeout: float = 10.0) -> ClusterRedis:
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                client.close()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on {HEAD_IP}:{self.port} did not start"
                                       ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class TwoNodeCluster:
    """A head node (HEAD_IP, root namespace, with the dashboard for `serve deploy`) and a
    worker node (WORKER_IP, its own namespace), each with `cpus` logical CPUs.

    `env`: the environment of both `ray start` processes, so of every replica on either node
    (Ray's environment from serve.ray_env, REDIS_URL, CANARY_*). Ports on the head are all
    chosen free, so the cluster starts beside other Ray clusters on the machine."""

    def __init__(self, env: dict[str, str], *, cpus: float, tag: str | None = None,
                 start_timeout_s: float = 60.0):
        self.tag = tag or f"{os.getpid() % 100000}"
        self.env = env
        self.cpus = cpus
        self.start_timeout_s = start_timeout_s
        # short: Ray's unix sockets live under it (the limit is ~107 characters)
        self.temp = Path(tempfile.mkdtemp(prefix="cn2-", dir="/tmp"))
        self.netns = Netns(self.tag)
        self.gcs_port = ray_env.free_port()
        self.dashboard_port = ray_env.free_port()
        self.head: Node | None = None
        self.worker: Node | None = None
        self.redis: ClusterRedis | None = None

    @property
    def gcs_address(self) -> str:
        return f"{HEAD_IP}:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://{HEAD_IP}:{self.dashboard_port}"

    def start_network(self) -> TwoNodeCluster:
        """The namespace and veth pair, and Redis on HEAD_IP (before the nodes: their
        replicas read REDIS_URL)."""
        self.netns.create()
        self.redis = ClusterRedis(self.temp).wait()
        return self

    def start_nodes(self) -> TwoNodeCluster:
        free = ray_env.free_port
        head_args = [
            "--head", "--node-ip-address", HEAD_IP, "--port", str(self.gcs_port),
            "--num-cpus", str(self.cpus), "--num-gpus", "0", "--temp-dir", str(self.temp),
            "--include-dashboard", "true", "--dashboard-host", HEAD_IP,
            "--dashboard-port", str(self.dashboard_port),
            "--ray-client-server-port", str(free()),
            "--dashboard-agent-listen-port", str(free()),
            "--dashboard-agent-grpc-port", str(free()),
            "--runtime-env-agent-port", str(free()),
            "--metrics-export-port", str(free()),
            "--node-manager-port", str(free()), "--object-manager-port", str(free()),
            "--disable-usage-stats",
        ]
        self.head = Node("head", head_args, self.env, self.temp / "head.log")
        self._wait_for_nodes(1)
        worker_args = [
            "--address", self.gcs_address, "--node-ip-address", WORKER_IP,
            "--num-cpus", str(self.cpus), "--num-gpus", "0", "--disable-usage-stats",
        ]
        self.worker = Node("worker", worker_args, self.env, self.temp / "worker.log",
                           netns=self.netns.name)
        self._wait_for_nodes(2)
        return self

    def nodes(self) -> list[dict]:
        """The cluster's nodes as the dashboard lists them ([] until it answers)."""
        try:
            answer = httpx.get(f"{self.dashboard}/nodes?view=summary", timeout=2.0,
                               headers=auth_headers())
            return answer.json()["data"]["summary"]
        except (httpx.HTTPError, ValueError, KeyError):
            return []

    def alive_ips(self) -> set[str]:
        raylets = [node.get("raylet", {}) for node in self.nodes()]
        return {raylet.get("nodeManagerAddress") for raylet in raylets
                if raylet.get("state") == "ALIVE"}

    def _wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while len(self.alive_ips()) < count:
            for node in (self.head, self.worker):
                if node and node.proc.poll() is not None:
                    raise RuntimeError(f"ray start ({node.name}) exited:\n{node.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} node(s) not alive within {self.start_timeout_s} s:"
                                   f" {self.nodes()}\n{self.head.tail()}")
            time.sleep(0.5)

    # Serve, through its CLI and REST API on the head's dashboard

    def serve(self, *args: str, timeout: float = 120.0) -> str:
        done = subprocess.run([str(BIN / "serve"), *args, "--address", self.dashboard],
                              cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"serve {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def deploy(self, config: dict) -> None:
        path = self.temp / "serve-config.json"  # YAML is a superset of JSON
        path.write_text(json.dumps(config))
        self.serve("deploy", str(path))

    def applications(self) -> dict:
        """Serve's view (`GET /api/serve/applications/`): applications, deployments, replicas."""
        answer = httpx.get(f"{self.dashboard}/api/serve/applications/", timeout=5.0,
                           headers=auth_headers())
        answer.raise_for_status()
        return answer.json().get("applications", {})

    def pids(self) -> set[int]:
        """Every process of the cluster now: both nodes' sessions and descendants (raylets,
        GCS, dashboard, agents, replicas, HAProxy) and everything in the worker's namespace."""
        leaders = {node.proc.pid for node in (self.head, self.worker) if node}
        return _session_and_descendants(leaders) | set(self.netns.pids())

    # Stopping exactly what was started

    def kill_worker(self) -> None:
        """The worker node lost: SIGKILL to its process group and to everything in its
        namespace (the raylet, its workers and replicas, its HAProxy)."""
        self.worker.kill()
        for _ in range(3):
            pids = self.netns.pids()
            if not pids:
                break
            _kill(pids)
            time.sleep(0.2)

    def stop(self) -> None:
        leaders = {node.proc.pid for node in (self.head, self.worker) if node}
        everything = _session_and_descendants(leaders) if leaders else set()
        for node in (self.worker, self.head):
            if node:
                node.stop()
        _kill(_session_and_descendants(leaders) | everything | set(self.netns.pids()))
        if self.redis:
            self.redis.stop()
        self.netns.delete()
        time.sleep(0.2)
        ray_env.reap_orphaned_haproxies()  # HAProxy re-parented away from a killed Ray
        shutil.rmtree(self.temp, ignore_errors=True)
