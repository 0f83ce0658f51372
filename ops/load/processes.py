"""The server's processes on this machine, found by process title, and what /proc says of them:
resident memory, CPU time used, niceness. For the measurements that charge a server's memory
or CPU to the load it served, and for a load generator that runs at the server's niceness."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
SERVE_TITLES = ("ray::ServeReplica", "ray::ProxyActor", "ray::ServeController")
REPLICA_TITLE = "ray::ServeReplica:"


def titled(prefixes: str | tuple[str, ...], proc: Path = PROC) -> dict[int, str]:
    """PIDs of the processes whose title (first word of the command line) starts with one of
    `prefixes`, with that title."""
    found = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if title.startswith(prefixes):
            found[int(entry.name)] = title
    return found


def serve_processes() -> dict[int, str]:
    """PIDs of this machine's Ray Serve processes (proxy, replicas, controller) by title."""
    return titled(SERVE_TITLES)


def replica_pids(app: str) -> list[int]:
    """The processes of a Serve application's replicas on this machine."""
    return list(titled(f"{REPLICA_TITLE}{app}:"))


def rss_mib(pid: int) -> float | None:
    """Resident memory of `pid` in MiB, None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat line from field 3 (state) on. Field 2, the command in
    parentheses, may hold spaces and parentheses itself: fields are counted from the last `)`."""
    return stat[stat.rindex(")") + 1:].split()


def descendants(root: int, proc: Path = PROC) -> dict[int, str]:
    """The processes started under `root` (children, theirs, and so on), `root` excluded, with
    their command lines (arguments joined by spaces). Read from each process's parent in
    /proc/PID/stat; a process that ends meanwhile is left out."""
    parents: dict[int, list[int]] = {}
    try:
        entries = [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return {}
    for entry in entries:
        try:
            parent = int(stat_fields((entry / "stat").read_text())[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(parent, []).append(int(entry.name))
    found, todo = {}, list(parents.get(root, ()))
    while todo:
        pid = todo.pop()
        try:
            found[pid] = (proc / str(pid) / "cmdline").read_bytes().rstrip(b"\0").replace(
                b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        todo.extend(parents.get(pid, ()))
    return found


def process_cpu_s(pid: int, proc: Path = PROC) -> float | None:
    """User plus system CPU time of `pid` so far (all its threads; its children's not), None
    when it is gone."""
    return _stat_cpu_s(proc / str(pid) / "stat")


def _stat_cpu_s(stat: Path) -> float | None:
    """utime + stime of a /proc stat file (a process's or a thread's), None when it is gone."""
    try:
        fields = stat_fields(stat.read_text())
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, proc: Path = PROC) -> dict[int, float]:
    """User plus system CPU time so far of each thread of `pid`, by thread id; empty when the
    process is gone (a thread that ends meanwhile is left out)."""
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return {}
    found = {}
    for task in tasks:
        if (seconds := _stat_cpu_s(task / "stat")) is not None:
            found[int(task.name)] = seconds
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of the processes so far (those gone count nothing)."""
    ticks = 0
    for pid in pids:
        try:
            fields = stat_fields(Path(f"/proc/{pid}/stat").read_text())
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def stat_niceness(stat: str) -> int:
    """Field 19 (nice) of a /proc/PID/stat line."""
    return int(stat_fields(stat)[16])


def serve_niceness(proc: Path = PROC) -> int | None:
    """The niceness of this machine's Serve replica processes, the highest when they differ;
    None when none is found."""
    found = []
    for pid in titled(REPLICA_TITLE, proc):
        try:
            found.append(stat_niceness((proc / str(pid) / "stat").read_text()))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not a stat line
            continue
    return max(found, default=None)
