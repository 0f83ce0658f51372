"""What `serve run serve.config:app` does before it starts a Ray of its own
(serve.local_start): held ports refused in one line naming the holder, the orphans a killed
gateway left stopped, Ray's node kept on the loopback, and SIGTERM and an inherited ignored
SIGINT heard as Ctrl-C. Ray is never started here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import click
import pytest

from rollout.settings import Settings
from serve import local_start


@pytest.fixture
def listening():
    """A socket of this process listening on a loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_held_port_fails_the_start_in_one_line_naming_port_and_process(listening):
    assert not local_start.can_bind("127.0.0.1", listening)
    assert ("127.0.0.1", listening) in local_start.listeners_of(os.getpid())
    with pytest.raises(local_start.PortHeld) as refused:
        local_start.refuse_held_ports("127.0.0.1", [(listening, "HAProxy stats")])
    line = str(refused.value)
    assert "\n" not in line
    assert f"port {listening} (HAProxy stats) on 127.0.0.1 is held by process {os.getpid()}" in line
    assert isinstance(refused.value, SystemExit)  # `serve run` exits 1 with the line, no trace


def test_free_ports_pass(listening):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    local_start.refuse_held_ports("127.0.0.1", [(free, "HTTP")])


def test_proc_net_tcp_addresses_read_as_written():
    assert local_start._address("0100007F", 8) == "127.0.0.1"
    assert local_start._address("00000000", 8) == "0.0.0.0"
    assert local_start._address("0000000000000000FFFF00000100007F", 32) == "::ffff:127.0.0.1"
    assert local_start._address("00000000000000000000000001000000", 32) == "::1"


def test_loopback_addresses():
    assert all(map(local_start.is_loopback, ["127.0.0.1", "::1", "localhost", "127.1.2.3",
                                             "::ffff:127.0.0.1", "[::1]"]))
    assert not any(map(local_start.is_loopback, ["0.0.0.0", "::", "10.0.0.5", "gateway.lan"]))


def test_the_ports_a_start_binds_follow_the_settings_and_haproxy():
    settings = Settings(grpc_port=0)
    assert local_start.wanted_ports(settings, {}) == [(8000, "HTTP")]
    haproxy = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_STATS_PORT": "18404"}
    assert local_start.wanted_ports(Settings(grpc_port=8001), haproxy) == [
        (8000, "HTTP"), (8001, "gRPC"), (18404, "HAProxy stats"), (9101, "HAProxy metrics"),
        (8500, "Serve's fallback proxy")]


def test_the_local_node_is_on_the_loopback_unless_the_environment_says_otherwise(monkeypatch):
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    env: dict[str, str] = {}
    assert local_start.node_on_loopback(env)
    assert env == {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    assert ray_constants.ENABLE_RAY_CLUSTER is False  # this process's reading, for the driver
    assert not local_start.node_on_loopback({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"})
    assert ray_constants.ENABLE_RAY_CLUSTER is True


class _Node:
    def __init__(self, dead_after: float | None):
        self.dead_at = None if dead_after is None else time.monotonic() + dead_after

    def dead_processes(self):
        return [("raylet", None)] if self.dead_at and time.monotonic() >= self.dead_at else []


def test_a_sigterm_to_ray_too_is_seen_by_its_processes_exiting():
    assert local_start.ray_stopping(1.0, _Node(dead_after=0.1))
    started = time.monotonic()
    assert not local_start.ray_stopping(0.2, _Node(dead_after=None))
    assert time.monotonic() - started < 1


def test_orphans_are_stopped_with_sigkill_for_one_that_ignores_sigterm(monkeypatch):
    polite = subprocess.Popen(["sleep", "60"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print(1, flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    stubborn.stdout.readline()  # its handler is in place
    monkeypatch.setattr(local_start.ray_env, "orphaned_haproxies",
                        lambda: [polite.pid, stubborn.pid])
    monkeypatch.setattr(local_start.ray_env, "REAP_GRACE_S", 0.5)
    said: list[str] = []
    found = local_start.reap(said.append)
    assert [pid for pid, _ in found] == [polite.pid, stubborn.pid]
    assert polite.wait(5) == -signal.SIGTERM and stubborn.wait(5) == -signal.SIGKILL
    assert said == [f"HAProxy {stubborn.pid} did not exit on SIGTERM; killing it"]


def test_only_serve_run_starting_its_own_ray_is_a_local_start(monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever an earlier test left
    assert local_start.starts_local_ray() is None  # no command: a test, a notebook
    params = {"address": None, "runtime_env": None, "runtime_env_json": None,
              "working_dir": None}
    with click.Context(click.Command("run"), info_name="run") as context:
        context.params.update(params)
        assert local_start.starts_local_ray() == {}
        context.params["address"] = "10.0.0.5:6379"  # a cluster to join
        assert local_start.starts_local_ray() is None
    with click.Context(click.Command("deploy"), info_name="deploy") as context:
        context.params.update(params)
        assert local_start.starts_local_ray() is None


SIGNALS = textwrap.dedent("""
    import signal, sys, time
    from serve import local_start
    local_start.ray_stopping = lambda: sys.argv[1] == "ray-too"
    local_start.stop_on_signals()
    print("ready", flush=True)
    try:
        time.sleep(30)
    except KeyboardInterrupt:
        print("Ctrl-C", flush=True)
        signal.raise_signal(signal.SIGTERM)  # a second one while it stops: ignored
        print("stopped", flush=True)
""")


def _child(case: str, ignore_sigint: bool = False) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", SIGNALS, case], stdout=subprocess.PIPE, text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint
        else None)
    assert child.stdout.readline() == "ready\n"
    return child


def test_sigterm_is_heard_as_ctrl_c_once():
    child = _child("serve-only")
    child.send_signal(signal.SIGTERM)
    assert child.communicate(timeout=10)[0] == "Ctrl-C\nstopped\n"
    assert child.returncode == 0


def test_sigterm_to_ray_too_exits_at_once():
    child = _child("ray-too")
    child.send_signal(signal.SIGTERM)
    assert child.communicate(timeout=10)[0] == ""
    assert child.returncode == 128 + signal.SIGTERM


def test_sigint_inherited_ignored_is_heard_again():
    child = _child("serve-only", ignore_sigint=True)
    child.send_signal(signal.SIGINT)
    assert child.communicate(timeout=10)[0].startswith("Ctrl-C\n")
