"""The gateway end to end: closed-loop load at fixed concurrency levels over loopback HTTP.

Algorithm: for each concurrency level `c`, `c` asyncio workers each send one prediction, wait
for its answer and send the next, for `seconds` after an unmeasured warm-up (so the offered load
adapts to what the gateway serves: this finds its throughput at that concurrency, not an
overload). Every answer is accounted for: 200s give a client latency and their `Server-Timing`
(stages in ms and the batch's size), any other status or a connection error is counted by kind.
Throughput counts answered 200s over the measured window only (from its start to the last
answer of a request sent in it). A worker whose request was shed (429 or 503) waits its
Retry-After before the next, as a well-behaved client does: resending at once would measure the
cost of refusing requests (the gateway sheds what would queue past its target,
serve.gateway.admission), not the goodput it serves. The load is ops.load's closed loop and client
(`Sender`, raw HTTP/1.1 on kept-alive connections, one per worker), the same for both targets.

Per level it reports the requests sent in the measured window (each ends as a 200 or as one
of the failures, so `failed` / `sent` is the exact share not answered), requests and inputs per
second, p50 / p95 / p99 client latency (nearest rank), the mean of each `Server-Timing` stage,
the distribution of batch sizes (in requests) the answers rode in, queue wait p50 / p99, and
`http_ms`: client latency minus the gateway's `total` (proxy, HTTP and the client itself). The
same generator drives the plain Ray Serve deployment of `--plain` and the peer servers of
`--peer` (no `Server-Timing` there). A `probe` (ops.bench.cpu) is read when the measured
window starts and after its last answer, so its CPU figures cover the same window.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple, Protocol

import httpx

from ops.load import Sender, Shot, closed_loop, drain, parse_server_timing
from rollout.agreement import percentile

STAGES = ("preprocess", "queue", "model", "postprocess", "gateway", "total")


class Door(NamedTuple):
    """A front door to load: its route, and the request body for some texts."""

    path: str
    body: Callable[[list[str]], dict]


class Probe(Protocol):
    """What is read at the edges of a level's measured window (ops.bench.cpu.Probe)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class BenchError(Exception):
    """The benchmark cannot run as asked (bad input, unreachable gateway); exit code 2."""


def check_reachable(url: str, timeout: float = 5.0) -> None:
    """A clear BenchError unless `url` answers `GET /healthz` with 200."""
    try:
        response = httpx.get(f"{url}/healthz", timeout=timeout)
    except httpx.HTTPError as exc:
        raise BenchError(
            f"cannot reach the gateway at {url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise BenchError(f"{url}/healthz answered {response.status_code}: is this the gateway?")


async def _level(url: str, texts: list[str], concurrency: int, seconds: float, warmup: float,
                 per_request: int, task: str, timeout: float, door: Door | None,
                 probe: Probe | None) -> dict:
    sender = Sender(url, timeout_s=timeout, connections=concurrency,
                    path=door.path if door else "/v1/predict",
                    capture=("retry-after", "server-timing", "x-canary-arm"))
    bodies = {}

    def body(n: int) -> bytes:
        start = n % len(texts)
        if start not in bodies:
            inputs = [texts[(start + k) % len(texts)] for k in range(per_request)]
            asked = door.body(inputs) if door else {"inputs": inputs, "task": task}
            bodies[start] = json.dumps(asked).encode()
        return bodies[start]

    shots: list[Shot] = []
    try:
        if probe:  # the measured window starts when the warm-up ends (closed_loop)
            asyncio.get_running_loop().call_later(warmup, probe.start)
        offered = await closed_loop(lambda n: sender(body(n), f"bench-{n}", per_request), shots,
                                    concurrency=concurrency, duration_s=seconds,
                                    warmup_s=warmup)
        window = max(await drain(offered), 1e-9)
        if probe:
            probe.stop()
    finally:
        await sender.aclose()
    samples = [_sample(shot) for shot in shots if shot.status == 200]
    failures = Counter(str(shot.status or "lost") for shot in shots if shot.status != 200)
    return summarize(samples, failures, concurrency=concurrency, window=window,
                     per_request=per_request, sent=offered.sent)


def _sample(shot: Shot) -> tuple[float, dict[str, float], int | None, str]:
    """(client latency ms, Server-Timing stages, batch size in requests, arm) of a 200."""
    stages, batch = parse_server_timing(shot.headers.get("server-timing", ""))
    return shot.latency_s * 1000, stages, batch, shot.headers.get("x-canary-arm", "")


def summarize(samples, failures: Counter, *, concurrency: int, window: float,
              per_request: int, sent: int | None = None) -> dict:
    """One level's figures (module docstring). `sent`: requests sent in the measured window;
    by default every answer and failure (each sent request ends as exactly one)."""
    latencies = [s[0] for s in samples]
    stage_means = {name: statistics.fmean(s[1][name] for s in samples if name in s[1])
                   for name in STAGES if any(name in s[1] for s in samples)}
    batches = Counter(s[2] for s in samples if s[2] is not None)
    queue = [s[1]["queue"] for s in samples if "queue" in s[1]]
    http = [s[0] - s[1]["total"] for s in samples if "total" in s[1]]

    def pct(values, q):
        return round(percentile(values, q), 3) if values else None

    return {
        "concurrency": concurrency, "inputs_per_request": per_request,
        "seconds": round(window, 3), "ok": len(samples),
        "sent": len(samples) + sum(failures.values()) if sent is None else sent,
        "failed": dict(failures), "arms": dict(Counter(s[3] for s in samples if s[3])),
        "rps": len(samples) / window, "inputs_per_s": len(samples) * per_request / window,
        "p50_ms": pct(latencies, 50), "p95_ms": pct(latencies, 95), "p99_ms": pct(latencies, 99),
        "stages_ms": {k: round(v, 3) for k, v in stage_means.items()},
        "http_ms": round(statistics.fmean(http), 3) if http else None,
        "batch_requests": {str(k): v for k, v in sorted(batches.items())},
        "mean_batch": (sum(k * v for k, v in batches.items()) / sum(batches.values())
                       if batches else None),
        "queue_p50_ms": pct(queue, 50), "queue_p99_ms": pct(queue, 99),
    }


def load(url: str, texts: list[str], concurrency: int, *, seconds: float, warmup: float = 1.0,
         per_request: int = 1, task: str = "classify", timeout: float = 30.0,
         door: Door | None = None, probe: Probe | None = None) -> dict:
    """One concurrency level (see the module docstring); `door`: another route and body
    than the native `POST /v1/predict` (`--protocol`: ops.bench.front_doors, a peer server);
    `probe`: started and stopped at the measured window's edges."""
    return asyncio.run(_level(url, texts, concurrency, seconds, warmup, per_request, task,
                              timeout, door, probe))
