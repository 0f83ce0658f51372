"""What the end-to-end part drives: a gateway given by URL, or a local app this process starts,
the arm every request goes to, and the order of the cells (`order`: with `--plain` and
`--peer`, each cell also on a plain Ray Serve deployment of the same model, ops.bench.plain,
and on each peer server, ops.bench.peers).

Arms are forced through the audited path (actor `bench`): the canary share is set to 0 % for
`baseline` or 100 % for `optimized` with the kill switch off, the gateway's cached state is
polled (bounded) until it routes accordingly, and the share and kill switch found at the start
are restored at the end, whatever happened. One app therefore serves both arms in turn; the
benchmark also checks every answer's `X-Canary-Arm`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import httpx

from ops.bench.endtoend import BenchError
from ops.load.processes import REPLICA_TITLE, rss_mib, titled
from rollout import BUCKETS, Rollout, RolloutError, Settings, open_store
from serve.ray_env import free_port

ACTOR = "bench"
APP = "bench"  # the local app's Serve application name
LOOPBACK = ("127.0.0.1", "localhost", "::1")
PLAIN = "plain"  # the plain Ray Serve deployment (ops.bench.plain) as a step's target


def order(arms: list[str], sizes: list[int], concurrency: list[int], *, plain: bool = False,
          peers: tuple[str, ...] | list[str] = ()) -> list[tuple[str, int, int]]:
    """The cells to measure, in order, as (target, texts per request, concurrency); a target is
    an arm, `PLAIN` or a peer server's name (ops.bench.peers).

    Without the plain deployment or peers: arm by arm, so an arm is forced once (few audited
    changes on a gateway given by URL). With them: cell by cell, the plain deployment first,
    then each peer, then each arm, so whatever else loads a shared machine meanwhile falls on
    every side of each ratio alike; an arm is then forced in every cell."""
    cells = [(size, c) for size in sizes for c in concurrency]
    if not plain and not peers:
        return [(arm, size, c) for arm in arms for size, c in cells]
    sides = (*((PLAIN,) if plain else ()), *peers, *arms)
    return [(who, size, c) for size, c in cells for who in sides]


def loopback_url(url: str) -> str:
    """The URL without a trailing slash; a BenchError unless it is http(s) on loopback."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BenchError(f"bad --url {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BenchError(f"bad --url {url!r}: give http://HOST:PORT")
    if parsed.host not in LOOPBACK:
        raise BenchError(f"refusing to load {parsed.host}: loopback only")
    return url.rstrip("/")


@contextlib.contextmanager
def redis_for(url: str | None) -> Iterator[str]:
    """`url`, or a throwaway `redis-server` on a free loopback port (no persistence)."""
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise BenchError("no REDIS_URL and no redis-server to start: install it or set one")
    port = free_port()
    folder = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", folder],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def local_app(settings: Settings) -> Iterator[str]:
    """The application of `settings` on a local Ray Serve, HTTP on a free loopback port."""
    import ray
    from ray import serve

    from serve import ray_env
    from serve.config import build

    ray_env.apply(throwaway=True)  # as ops/run.sh runs it, unless the environment says otherwise
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build(settings), name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


class ArmSwitch:
    """Forces every request to one arm through the audited path; `restore()` puts back the share
    and kill switch found when it was made."""

    def __init__(self, settings: Settings, url: str):
        self.url = url
        try:
            self.control = Rollout(open_store(settings))
            self.original = self.control.state()
        except RolloutError as exc:
            raise BenchError(f"cannot read the rollout state: {exc}") from None

    def force(self, arm: str, timeout: float = 30.0) -> None:
        try:
            self._force(arm, timeout)
        except RolloutError as exc:
            raise BenchError(f"cannot route all to {arm}: {exc}") from None
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise BenchError(f"{self.url}/v1/rollout did not answer as a gateway does: "
                             f"{type(exc).__name__}: {exc}") from None

    def _force(self, arm: str, timeout: float) -> None:
        want = BUCKETS if arm == "optimized" else 0
        deadline = time.monotonic() + timeout
        while True:
            state = self.control.state()
            if state.canary_bp != want:
                state = self.control.set_canary(want, actor=ACTOR, reason=f"bench: all {arm}")[1]
            if state.kill:
                state = self.control.unkill(actor=ACTOR, reason=f"bench: all {arm}")[1]
            served = httpx.get(f"{self.url}/v1/rollout", timeout=5).json()
            if (served["state"]["revision"] >= state.revision and not served["stale"]
                    and served["effective_percent"] * 100 == want):
                return
            if time.monotonic() > deadline:
                raise BenchError(f"the gateway never routed all to {arm}: {served['routing']}")
            time.sleep(0.2)

    def restore(self) -> None:
        now = self.control.state()
        if now.canary_bp != self.original.canary_bp:
            self.control.set_canary(self.original.canary_bp, actor=ACTOR,
                                    reason="bench over: restore share")
        if now.kill != self.original.kill:
            (self.control.kill if self.original.kill else self.control.unkill)(
                actor=ACTOR, reason="bench over: restore kill switch")
        self.control.store.close()


def process_memory(app: str | None) -> dict[str, float]:
    """RSS in MiB of the Serve replicas of application `app` (any application's replicas when
    None) on this machine, by process title and pid. Proxy and controller processes are left
    out: on a shared machine they cannot be told apart from other clusters'."""
    prefix = f"{REPLICA_TITLE}{app}:" if app else REPLICA_TITLE
    found = {}
    for pid, name in titled(prefix).items():
        value = rss_mib(pid)
        if value is not None:
            found[f"{name}[{pid}]"] = round(value, 1)
    return found
