"""CPU per answered request, process by process, of everything on a cell's path.

Which processes: this process's descendants (the local app's Ray processes under its raylet,
HAProxy under Serve's HAProxy manager, the peers' servers under their launcher), so another
Ray cluster or server on the same machine never counts, and this process itself, the load
client (the Ray driver too: its own threads are in it). Each gets a *role* from its command
line (`role`): `haproxy`, `proxy` (`ray::ProxyActor`), `gateway` and `model:<arm>` (replicas
of the local app, `ray::ServeReplica:<app>:<deployment>`), `plain` (the plain Serve replica),
`peer:<name>` (a peer server and its children), `client`; anything else is `other` (the Serve
controller, raylet, GCS, the ramp controller: work that is not per request).

How: `Probe` finds the processes of the roles a cell's target sends requests through before
the cell starts, reads each one's user + system CPU time (/proc/PID/stat, its threads included,
its children excluded) when the measured seconds start and again after their last answer
(ops.bench.endtoend: the same window as the cell's requests per second), and divides each
difference by the requests answered 200 in that window. A process that starts during the cell
is not seen; one that ends counts nothing.

The loop: each process's busiest thread over the window, read the same way per thread
(/proc/PID/task/TID/stat), is its `loop_ms` per request. In a gateway replica that thread is
its event loop (the ASGI app, admission, observation: what `loop_cpu_share` in the replica's
admission snapshot measures from inside); a second thread that outworked it (a colocated
model's compute thread) would be named instead, so `loop_ms` is reported for the remote
topology's gateway only (`summary`). Its figure in a single-process peer is that server's own
busiest thread, for comparison.

What the gateway adds (`summary`): the gateway path's total (HAProxy, proxy, gateway replicas,
model replicas) minus the model replicas'. The model replicas' own serving work (their
batching, their Ray calls, the shadow's comparisons) counts as model there. With the colocated
topology both arms run inside the gateway replicas: there are no model replicas, the addition
cannot be told apart from the forward, and only the total per process is reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ops.load.processes import REPLICA_TITLE, descendants, process_cpu_s, thread_cpu_s

CLIENT = "client"
GATEWAY = "gateway"
MODEL = "model:"
PEER = "peer:"
# the roles each kind of target sends its requests through, besides the load client
INGRESS = ("haproxy", "proxy")
REMOTE, COLOCATED = "remote", "colocated"


def role(command: str, app: str, plain_app: str | None = None,
         peers: dict[int, str] | None = None, pid: int | None = None) -> str:
    """The role of the process whose command line is `command` (module docstring); `peers`
    maps a peer server's launcher pid to its name, `pid` is this process's own."""
    if peers and pid in peers:
        return PEER + peers[pid]
    title = command.split(" ", 1)[0]
    if Path(title).name == "haproxy":
        return "haproxy"
    if title.startswith("ray::ProxyActor"):
        return "proxy"
    if title.startswith(REPLICA_TITLE):
        owner, _, deployment = title[len(REPLICA_TITLE):].partition(":")
        deployment = deployment.split(".")[0]
        if owner == plain_app:
            return "plain"
        if owner == app:
            if deployment == GATEWAY:
                return GATEWAY
            if deployment in ("baseline", "optimized"):
                return MODEL + deployment
    return "other"


def path_roles(target: str, roles: set[str]) -> set[str]:
    """The roles on the path of `target`: an arm of the gateway, `plain`, or `peer:<name>`."""
    if target.startswith(PEER):
        return {target}
    if target == "plain":
        return {*INGRESS, "plain"}
    return {*INGRESS, GATEWAY, *(r for r in roles if r.startswith(MODEL))}


@dataclass
class Probe:
    """CPU seconds of a cell's processes at the start and the end of its measured window;
    `processes` maps pid to (role, command line)."""

    processes: dict[int, tuple[str, str]]
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    threads_started: dict[int, dict[int, float]] = field(default_factory=dict)
    threads_ended: dict[int, dict[int, float]] = field(default_factory=dict)

    def start(self) -> None:
        self.started, self.threads_started = _read(self.processes)

    def stop(self) -> None:
        self.ended, self.threads_ended = _read(self.processes)

    def busiest_thread_s(self, pid: int) -> float | None:
        """The CPU seconds of `pid`'s busiest thread in the window (threads seen at both ends),
        None when none was."""
        before, after = self.threads_started.get(pid, {}), self.threads_ended.get(pid, {})
        spent = [after[tid] - before[tid] for tid in after.keys() & before.keys()]
        return max(spent) if spent else None


def _read(processes) -> tuple[dict[int, float], dict[int, dict[int, float]]]:
    found, threads = {}, {}
    for pid, (name, _) in processes.items():
        if (seconds := process_cpu_s(pid)) is not None:
            found[pid] = seconds
            if name != CLIENT:
                threads[pid] = thread_cpu_s(pid)
    return found, threads


def probe(target: str, app: str, plain_app: str | None = None,
          peers: dict[int, str] | None = None) -> Probe:
    """A Probe of the processes on `target`'s path and of this process (module docstring);
    `peers`: each peer server's launcher pid and name (its children are its own too)."""
    me = os.getpid()
    found = descendants(me)
    owner = {}  # a peer's children are the peer's
    for launcher, name in (peers or {}).items():
        owner[launcher] = name
        owner.update(dict.fromkeys(descendants(launcher), name))
    roles = {pid: role(command, app, plain_app, owner, pid) for pid, command in found.items()}
    wanted = path_roles(target, set(roles.values()))
    processes = {pid: (r, found[pid]) for pid, r in roles.items() if r in wanted}
    processes[me] = (CLIENT, "the load client (this process)")
    return Probe(processes)


def per_request(probe: Probe, answered: int) -> dict | None:
    """Each process's CPU ms per request answered in the window, by pid and summed by role,
    and the `summary` figures; None when nothing was answered or nothing read."""
    if not answered or not probe.started or not probe.ended:
        return None
    processes = []
    for pid, (name, command) in sorted(probe.processes.items()):
        if pid in probe.started and pid in probe.ended:
            spent = probe.ended[pid] - probe.started[pid]
            loop = probe.busiest_thread_s(pid)
            processes.append({"pid": pid, "role": name, "command": command[:120],
                              "cpu_s": round(spent, 3),
                              "ms_per_request": round(spent * 1000 / answered, 3),
                              "loop_ms": None if loop is None else round(
                                  loop * 1000 / answered, 3)})
    roles: dict[str, float] = {}
    for entry in processes:
        roles[entry["role"]] = roles.get(entry["role"], 0.0) + entry["ms_per_request"]
    loops = [p["loop_ms"] for p in processes if p["role"] == GATEWAY and p["loop_ms"] is not None]
    return {"answered": answered, "processes": processes,
            "roles": {k: round(v, 3) for k, v in sorted(roles.items())},
            **summary(roles, sum(loops) if loops else None)}


def summary(roles: dict[str, float], gateway_loop_ms: float | None = None) -> dict:
    """`server_ms` (every role but the client), `client_ms`, and for a gateway cell its
    `topology`, `added_ms` and `loop_ms` (the gateway replicas' busiest threads, summed)
    (module docstring; None when colocated or not a gateway cell)."""
    server = sum(v for k, v in roles.items() if k != CLIENT)
    found = {"server_ms": round(server, 3), "client_ms": roles.get(CLIENT)}
    if GATEWAY not in roles:
        return {**found, "topology": None, "added_ms": None, "loop_ms": None}
    model = [v for k, v in roles.items() if k.startswith(MODEL)]
    if not model:
        return {**found, "topology": COLOCATED, "added_ms": None, "loop_ms": None}
    return {**found, "topology": REMOTE, "added_ms": round(server - sum(model), 3),
            "loop_ms": None if gateway_loop_ms is None else round(gateway_loop_ms, 3)}
