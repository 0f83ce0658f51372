"""`slow-bodies`: can clients that upload slowly hold the gateway?

1. The normal client unloaded: one short request at a time for `--unloaded-duration`.
2. For `--duration`: `--clients` raw connections send a POST's headers with a Content-Length
   larger than they will send, then one body byte every `--every` seconds (each reconnects when
   answered, so the pressure lasts); one chunked upload that never ends and one client that
   disconnects mid-body run beside them; the normal client keeps sending.
3. The gateway's `canary_requests_total` by status, before and after, from `GET /metrics`.

Goals: the normal client keeps >= 99 % success and p99 <= 3x unloaded; every slow
upload gets 408 within the body deadline (+ `--slack`); none goes unanswered; 0 x 500 recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from ops.cli.types import bounded_int, seconds
from ops.drill.client import SlowResult, Target, counter_by, counter_delta, slow_upload
from ops.drill.goals import Goal, Report, pct, ratio, share
from ops.drill.texts import short_body
from ops.load import Sender, measure_closed
from rollout.settings import Settings

NAME = "slow-bodies"
HELP = "slow uploads against a normal client: 408 in time, no 500s, the normal client unharmed"
REQUESTS_METRIC = "canary_requests_total"
DEFAULT_BODY_TIMEOUT = Settings.model_fields["body_timeout_s"].default


def add_arguments(parser) -> None:
    parser.add_argument("--clients", type=bounded_int(1, 1000), default=150,
                        help="slow-body connections held open at once (default 150, at most 1000)")
    parser.add_argument("--duration", type=seconds(), default=30.0,
                        help="seconds the slow clients and the normal client run (default 30)")
    parser.add_argument("--unloaded-duration", type=seconds(), default=10.0,
                        help="seconds the normal client runs alone first (default 10)")
    parser.add_argument("--body-timeout", type=seconds(), default=DEFAULT_BODY_TIMEOUT,
                        help="the gateway's CANARY_BODY_TIMEOUT_S (default %(default)s)")
    parser.add_argument("--slack", type=seconds(), default=1.0,
                        help="seconds past the body timeout a 408 may take (default 1)")
    parser.add_argument("--every", type=seconds(), default=1.0,
                        help="seconds between the slow clients' body bytes (default 1)")


async def run(target: Target, args) -> Report:
    report = Report(NAME)
    sender = Sender(target.url, timeout_s=10.0, connections=4)
    try:
        await sender(short_body(-1), "drill-warm-up")  # a connection's one-off costs, not timed
        unloaded = await _normal(sender, args.unloaded_duration)
        before = await _requests_by_status(target)
        during, slow, chunked, gone = await _under_slow_clients(target, sender, args)
        await asyncio.sleep(1.0)  # the gateway records a request after it ends
        after = await _requests_by_status(target)
    finally:
        await sender.aclose()
    deadline = args.body_timeout + args.slack
    recorded = counter_delta(before, after) if before is not None and after is not None else None
    _figures(report, unloaded, during, slow, chunked, gone, recorded, args)
    _goals(report, unloaded, during, slow, chunked, recorded, deadline)
    return report


async def _normal(sender: Sender, duration_s: float) -> dict:
    """One short request at a time for `duration_s`."""
    return await measure_closed(lambda n: sender(short_body(n), f"drill-normal-{n}"),
                                concurrency=1, duration_s=duration_s)


async def _requests_by_status(target: Target) -> dict[str, float] | None:
    """The gateway's request counter by status code; None without telemetry."""
    try:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            text = (await client.get(f"{target.url}/metrics")).text
    except httpx.HTTPError:
        return None
    return counter_by(text, REQUESTS_METRIC, "status") if REQUESTS_METRIC in text else None


async def _under_slow_clients(target: Target, sender: Sender, args):
    """The normal client, the slow clients, one endless chunked upload and one client that
    disconnects mid-body, all at once."""
    ends = time.monotonic() + args.duration
    give_up = args.body_timeout + args.slack + 10.0  # then it counts as unanswered

    async def slot(i: int) -> list[SlowResult]:
        results = []
        while True:
            connected = time.monotonic()
            results.append(await slow_upload(target.host, target.port, mode="length",
                                             every_s=args.every, give_up_s=give_up,
                                             key=f"drill-slow-{i}-{len(results)}"))
            if time.monotonic() >= ends:
                return results
            await asyncio.sleep(max(0.0, connected + args.every - time.monotonic()))

    normal = asyncio.create_task(_normal(sender, args.duration))
    chunked = asyncio.create_task(slow_upload(target.host, target.port, mode="chunked",
                                              every_s=args.every, give_up_s=give_up,
                                              key="drill-chunked"))
    gone = asyncio.create_task(slow_upload(target.host, target.port, mode="disconnect",
                                           every_s=args.every, give_up_s=give_up,
                                           key="drill-disconnect"))
    slots = await asyncio.gather(*(slot(i) for i in range(args.clients)))
    return await normal, [r for rs in slots for r in rs], await chunked, await gone


def _on_time(result: SlowResult, deadline: float) -> bool:
    return result.status == 408 and result.after_s is not None and result.after_s <= deadline


def _seen(result: SlowResult) -> str:
    return str(result.status) if result.outcome == "answered" else result.outcome


def _figures(report, unloaded, during, slow, chunked, gone, recorded, args) -> None:
    times = [r.after_s for r in slow if r.after_s is not None]
    report.figures.update({
        "unloaded normal client": _client(unloaded),
        "normal client under slow bodies": _client(during),
        "normal client statuses": during["statuses"],
        "slow connections / uploads": f"{args.clients} / {len(slow)}",
        "slow uploads answered": dict(sorted(Counter(_seen(r) for r in slow).items())),
        "answer after headers s (p50 / max)": [pct(times, 50), max(times, default=None)],
        "chunked upload": f"{_seen(chunked)} after {_secs(chunked.after_s)}",
        "disconnect mid-body": _seen(gone),
        "gateway requests by status (drill)": recorded if recorded is not None else "no /metrics",
    })
    if recorded is None:
        report.notes.append(f"no {REQUESTS_METRIC} on /metrics (telemetry off?): 500s not judged")
    report.notes.append("/metrics is one gateway replica's: with several, the count is partial")


def _client(figures: dict) -> str:
    ok = share(figures["counts"]["200"], figures["sent"])
    return (f"{figures['sent']} sent, {_num(ok)} % ok, p50 {_num(figures['p50_ms'])} ms, "
            f"p99 {_num(figures['p99_ms'])} ms")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _goals(report, unloaded, during, slow, chunked, recorded, deadline) -> None:
    report.goals += [
        Goal("normal client success", share(during["counts"]["200"], during["sent"]), ">=", 99,
             "%", if_missing=False),
        Goal("normal client p99 / unloaded p99", ratio(during["p99_ms"], unloaded["p99_ms"]),
             "<=", 3, "x", if_missing=False),
        Goal(f"slow uploads: 408 within {deadline:g} s",
             share(sum(_on_time(r, deadline) for r in slow), len(slow)), ">=", 100, "%",
             if_missing=False),
        Goal("slow uploads unanswered", sum(r.unanswered for r in slow), "<=", 0),
        Goal("chunked upload: 408 after s",
             chunked.after_s if chunked.status == 408 else None, "<=", deadline, "s",
             if_missing=False),
        Goal("500s recorded", None if recorded is None else recorded.get("500", 0), "<=", 0),
    ]
