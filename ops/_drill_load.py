"""Load shapes for the drill: closed loop (N clients, each sends when its last answer came),
open loop (a fixed rate, answered or not), the capacity pick, the recovery probe, and the
deterministic pseudo-English inputs of the long-input burst.

Both loops stop *sending* after their duration and hand back the requests still in flight, so a
scenario can start timing recovery the moment the load stops, while those drain. Every request
ends as a `Shot`: its status, or None when it got no answer (connection error, client timeout).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from ops._drill_report import pct

ANSWERED = ("200", "503", "504")  # what an overloaded gateway may answer
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "model data system time people new first year work way could after two made many then them "
    "these may like than other use only more most also any some very well over such our through "
    "where much before right good each those both under same while last might great between "
    "never city world small large market price water energy study report music game team player "
    "school health policy research network server request answer quickly slowly early later "
    "river mountain garden window letter morning evening history science language number"
).split()


def make_text(rng: random.Random, words: int = 200) -> str:
    """`words` words of pseudo-English: sentences of 6-16 words, capitalised, full stops."""
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(min(rng.randint(6, 16), words - len(out)))]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out += sentence
    return " ".join(out)


def make_texts(n: int, words: int = 200, seed: int = 15) -> list[str]:
    """`n` texts of `words` words, the same for the same arguments on every machine."""
    rng = random.Random(seed)
    return [make_text(rng, words) for _ in range(n)]


def batch_bodies(texts: list[str], per_request: int, count: int) -> list[bytes]:
    """`count` JSON request bodies of `per_request` texts each, taken round the list of texts."""
    return [json.dumps({"inputs": [texts[(i * per_request + j) % len(texts)]
                                   for j in range(per_request)]}).encode() for i in range(count)]


@dataclass(frozen=True)
class Shot:
    status: int | None  # None: no answer
    latency_s: float
    texts: int = 1


def bucket(status: int | None) -> str:
    """200 / 503 / 504 as themselves, any other code as `other`, no answer as `lost`."""
    if status is None:
        return "lost"
    return str(status) if str(status) in ANSWERED else "other"


def summarize(shots: list[Shot], elapsed_s: float) -> dict:
    """Counts per status bucket, every status seen, 200s and texts per second, p50/p99 of 200s."""
    ok = [s for s in shots if s.status == 200]
    latencies = [s.latency_s * 1000 for s in ok]
    counts = Counter(bucket(s.status) for s in shots)
    return {
        "sent": len(shots),
        "counts": {k: counts.get(k, 0) for k in (*ANSWERED, "other", "lost")},
        "statuses": dict(sorted(Counter(str(s.status or "lost") for s in shots).items())),
        "ok_per_s": len(ok) / elapsed_s if elapsed_s > 0 else None,
        "texts_per_s": sum(s.texts for s in ok) / elapsed_s if elapsed_s > 0 else None,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
    }


def pick_capacity(steps: list[dict]) -> dict | None:
    """The step with the most 200s per second (the fewest clients on a tie): capacity is the
    best goodput the gateway sustained, not the load that was offered."""
    measured = [s for s in steps if s.get("ok_per_s")]
    return max(measured, key=lambda s: (s["ok_per_s"], -s["concurrency"]), default=None)


class Sender:
    """POSTs bodies to /v1/predict with one httpx client; each call returns a Shot."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, connections: int = 256):
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits,
                                        trust_env=False)

    async def __call__(self, body: bytes, key: str, texts: int = 1) -> Shot:
        started = time.perf_counter()
        try:
            response = await self.client.post(
                "/v1/predict", content=body,
                headers={"Content-Type": "application/json", "X-Routing-Key": key})
            return Shot(response.status_code, time.perf_counter() - started, texts)
        except httpx.HTTPError:
            return Shot(None, time.perf_counter() - started, texts)

    async def aclose(self) -> None:
        await self.client.aclose()


def short_body(i: int) -> bytes:
    return json.dumps({"inputs": [f"drill input number {i}"]}).encode()


@dataclass
class Offered:
    """What a loop sent: the requests still in flight when it stopped sending are in `pending`."""

    started: float
    sent_for_s: float = 0.0
    sent: int = 0
    capped: int = 0  # open loop: sends skipped because max_in_flight were outstanding
    pending: list[asyncio.Task] = field(default_factory=list)


async def closed_loop(fire: Callable[[int], Awaitable[Shot]], shots: list[Shot], *,
                      concurrency: int, duration_s: float) -> Offered:
    """`concurrency` clients, each sending `fire(n)` again as soon as it is answered, until
    `duration_s` has passed; the clients still waiting come back in `pending`."""
    offered = Offered(time.monotonic())
    deadline = offered.started + duration_s

    async def client(c: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            offered.sent += 1
            shots.append(await fire(c * 1_000_000 + n))
            n += 1

    tasks = [asyncio.create_task(client(c)) for c in range(concurrency)]
    await asyncio.wait(tasks, timeout=duration_s)
    offered.sent_for_s = time.monotonic() - offered.started
    offered.pending = [t for t in tasks if not t.done()]
    return offered


async def open_loop(fire: Callable[[int], Awaitable[Shot]], shots: list[Shot], *, rate: float,
                    duration_s: float, max_in_flight: int = 2_000) -> Offered:
    """`fire(n)` at `rate` per second for `duration_s`, whether or not earlier ones were answered;
    a send is skipped (and counted in `capped`) while `max_in_flight` are outstanding. A client
    that falls behind catches up in bursts but never sends past `duration_s`: `sent` says what
    it managed to offer."""
    offered = Offered(time.monotonic())
    ends = offered.started + duration_s
    in_flight: set[asyncio.Task] = set()

    async def one(n: int) -> None:
        shots.append(await fire(n))

    n = 0
    while (due := offered.started + n / rate) < ends:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if time.monotonic() >= ends:
            break
        n += 1
        if len(in_flight) >= max_in_flight:
            offered.capped += 1
            continue
        task = asyncio.create_task(one(n))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        offered.sent += 1
    offered.sent_for_s = time.monotonic() - offered.started
    offered.pending = list(in_flight)
    return offered


async def drain(offered: Offered) -> float:
    """Wait for the requests still in flight; seconds from the loop's start to the last answer."""
    if offered.pending:
        await asyncio.gather(*offered.pending)
    return time.monotonic() - offered.started


async def recovery_time(probe: Callable[[float], Awaitable[bool]], *, limit_s: float = 0.2,
                        every_s: float = 0.1, give_up_s: float = 60.0,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> float | None:
    """Seconds from now until `probe(limit_s)` (a small request answered 200 within `limit_s`)
    first succeeds, counted to the moment that probe was sent; a probe starts every `every_s`
    (or as soon as the last one gave up). None when none succeeded within `give_up_s`."""
    start = clock()
    while (sent := clock()) - start <= give_up_s:
        if await probe(limit_s):
            return sent - start
        await sleep(max(0.0, every_s - (clock() - sent)))
    return None


def small_probe(sender: Sender) -> Callable[[float], Awaitable[bool]]:
    """A probe for `recovery_time`: one short text, True when answered 200 within the limit."""
    count = 0

    async def probe(limit_s: float) -> bool:
        nonlocal count
        count += 1
        try:
            shot = await asyncio.wait_for(sender(short_body(count), f"drill-probe-{count}"),
                                          limit_s)
        except TimeoutError:
            return False
        return shot.status == 200 and shot.latency_s < limit_s

    return probe


async def measure_closed(fire: Callable[[int], Awaitable[Shot]], *, concurrency: int,
                         duration_s: float) -> dict:
    """A closed loop run to the end (the last answers included): its `summarize` figures."""
    shots: list[Shot] = []
    offered = await closed_loop(fire, shots, concurrency=concurrency, duration_s=duration_s)
    return {"concurrency": concurrency, **summarize(shots, await drain(offered))}
