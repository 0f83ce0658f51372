"""serve.haproxy_launcher, the program Serve runs as HAProxy: binds on every interface moved to
the gateway's address, the real binary exec'd with HAProxy's arguments, and HAProxy stopped by
the kernel when the process that started it dies."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from serve import haproxy_launcher as launcher
from serve import ray_env

LAUNCHER = Path(launcher.__file__)
# the lines of Serve's HAProxy template that bind, as Ray 2.60 writes them
SERVE_CONFIG = """\
frontend prometheus
    bind :9101
frontend http_frontend
    bind *:8000
    bind 0.0.0.0:8001
    bind [::]:8002
    bind 10.0.0.5:8003
listen stats
  bind *:8404
  stats socket /tmp/haproxy-serve/node/admin.sock mode 666 level admin
"""


def test_each_bind_on_every_interface_moves_to_the_host_and_the_rest_stays():
    moved = launcher.rebind(SERVE_CONFIG, "127.0.0.1")
    assert [line.strip() for line in moved.splitlines() if "bind" in line] == [
        "bind 127.0.0.1:9101", "bind 127.0.0.1:8000", "bind 127.0.0.1:8001",
        "bind 127.0.0.1:8002", "bind 10.0.0.5:8003", "bind 127.0.0.1:8404"]
    assert "stats socket /tmp/haproxy-serve/node/admin.sock" in moved
    assert launcher.rebind(SERVE_CONFIG, "::1").count("bind ::1:") == 5


def test_the_config_is_the_file_after_dash_f():
    assert launcher.config_path(["-db", "-f", "/x/haproxy.cfg", "-sf", "12"]) == "/x/haproxy.cfg"
    assert launcher.config_path(["-db", "-f"]) is None
    assert launcher.config_path([]) is None


def _fake_haproxy(tmp_path: Path) -> Path:
    """A stand-in binary: records its arguments and the config it was given, then sleeps."""
    fake = tmp_path / "haproxy"
    fake.write_text("#!/bin/sh\n"
                    f'echo "$@" > {tmp_path}/argv\n'
                    f'cp "$3" {tmp_path}/seen.cfg\n'
                    "exec sleep 60\n")
    fake.chmod(0o755)
    return fake


def _env(binary, bind: str) -> dict[str, str]:
    return dict(os.environ, GATEWAY_HAPROXY_BINARY=str(binary), GATEWAY_HAPROXY_BIND=bind)


def _wait_for(path: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_the_real_binary_runs_with_haproxys_arguments_on_the_rebound_config(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(SERVE_CONFIG)
    proc = subprocess.Popen([str(LAUNCHER), "-db", "-f", str(config), "-dR"],
                            env=_env(_fake_haproxy(tmp_path), "127.0.0.1"))
    try:
        _wait_for(tmp_path / "argv")
        assert (tmp_path / "argv").read_text().split() == ["-db", "-f", str(config), "-dR"]
        _wait_for(tmp_path / "seen.cfg")
        assert "bind *:" not in (tmp_path / "seen.cfg").read_text()
        assert "bind 127.0.0.1:8404" in config.read_text()  # rewritten in place, for reloads
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep")  # exec, no fork
    finally:
        proc.kill()
        proc.wait()


def test_without_a_host_the_config_is_left_as_serve_wrote_it(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(SERVE_CONFIG)
    proc = subprocess.Popen([str(LAUNCHER), "-db", "-f", str(config)],
                            env=_env(_fake_haproxy(tmp_path), ""))
    try:
        _wait_for(tmp_path / "seen.cfg")
        assert config.read_text() == SERVE_CONFIG
    finally:
        proc.kill()
        proc.wait()


def test_no_binary_or_itself_is_refused_with_a_clear_line(tmp_path):
    for binary in ("", str(LAUNCHER)):
        done = subprocess.run([str(LAUNCHER), "-db"], env=_env(binary, "127.0.0.1"),
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2
        assert "GATEWAY_HAPROXY_BINARY names no HAProxy binary" in done.stderr


def test_haproxy_gets_sigterm_when_the_process_that_started_it_is_killed(tmp_path):
    """The parent starts the launcher and is SIGKILLed, as a Ray proxy is when its cluster is
    killed; the program the launcher exec'd exits on the kernel's SIGTERM."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"child = subprocess.Popen([{str(LAUNCHER)!r}, '-db', '-f', '/nonexistent'])\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        env=_env(_fake_haproxy(tmp_path), ""), stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    _wait_for(tmp_path / "argv")  # exec'd: the fake binary runs
    assert ray_env.alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while ray_env.alive(child):
        assert time.monotonic() < deadline, "HAProxy outlived the process that started it"
        time.sleep(0.05)
