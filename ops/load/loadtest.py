"""Open-loop load test and soak for a running gateway (loopback or staging only).

    python -m ops.load --rate 400 --duration 20              # offer more than it can serve
    python -m ops.load --rate 100 --requests 30000 --sample-memory   # soak with memory samples

(`python -m ops.load`, its name before ops.load, still runs it.)

Requests are sent at a fixed rate whether or not earlier ones were answered (ops.load's open
loop), so an overloaded gateway must shed load rather than slow the client down. Every request
is accounted for: answered 2xx, answered with an explicit 413/422/429/503/504, or lost (no
answer: connection error or no response within --timeout). Bounded by --requests and
--duration, whichever comes first; a send due while --max-in-flight are outstanding is skipped
and counted (`client_capped`), never queued.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from urllib.parse import urlsplit

from ops.load.loops import drain, open_loop
from ops.load.processes import rss_mib, serve_processes
from ops.load.sender import Sender, Shot
from ops.load.tally import pct, statuses

EXPLICIT = {413, 422, 429, 503, 504}


async def _sample_memory(every_s: float, memory: dict[str, list[float]]) -> None:
    """RSS of this machine's Serve processes every `every_s` until cancelled."""
    processes = serve_processes()
    while True:
        for pid, name in processes.items():
            value = rss_mib(pid)
            if value is not None:
                memory.setdefault(f"{name}[{pid}]", []).append(value)
        await asyncio.sleep(every_s)


async def run(args) -> dict:
    """Offer the load, wait for its last answers, and report (see `_report`)."""
    sender = Sender(args.url, timeout_s=args.timeout, connections=args.max_in_flight)
    memory: dict[str, list[float]] = {}
    sampler = (asyncio.create_task(_sample_memory(args.memory_every, memory))
               if args.sample_memory else None)
    shots: list[Shot] = []
    try:
        offered = await open_loop(
            lambda i: sender(json.dumps({"inputs": [f"load test input number {i}"]}).encode(),
                             f"load-{i}"),
            shots, rate=args.rate, duration_s=min(args.duration, args.requests / args.rate),
            max_in_flight=args.max_in_flight)
        elapsed = await drain(offered)
    finally:
        if sampler:
            sampler.cancel()
        await sender.aclose()
    return _report(args, shots, offered.sent, offered.sent_for_s, elapsed, offered.capped,
                   memory)


def _report(args, shots: list[Shot], sent: int, sent_for: float, elapsed: float, capped: int,
            memory: dict[str, list[float]]) -> dict:
    counts = statuses(shots)
    latencies = [s.latency_s * 1000 for s in shots if s.status == 200]
    answered = sent - counts.get("lost", 0)
    ok = counts.get("200", 0)
    report = {
        "offered_rate": args.rate,
        "sent": sent,
        "sent_for_s": round(sent_for, 2),
        "elapsed_s": round(elapsed, 2),
        "answered": answered,
        "lost": sent - answered,
        "ok": ok,
        "shed_429_503": sum(counts.get(str(code), 0) for code in (429, 503)),
        "shed_with_retry_after": sum(1 for s in shots if s.retry_after_s() > 0),
        "timeouts_504": counts.get("504", 0),
        "other": {c: n for c, n in counts.items()
                  if c != "200" and (c == "lost" or int(c) not in EXPLICIT)},
        "statuses": counts,
        "throughput_ok_per_s": round(ok / elapsed, 1) if elapsed else 0.0,
        "p50_ms": _round(pct(latencies, 50)),
        "p99_ms": _round(pct(latencies, 99)),
        "client_capped": capped,
    }
    if memory:
        report["memory_mib"] = {
            name: {"first": round(v[0], 1), "last": round(v[-1], 1), "max": round(max(v), 1),
                   "growth": round(v[-1] - v[0], 1), "samples": len(v)}
            for name, v in memory.items()
        }
    return report


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000",
                        help="the gateway (loopback or staging only)")
    parser.add_argument("--rate", type=float, default=200, help="requests offered per second")
    parser.add_argument("--requests", type=int, default=5_000, help="at most this many")
    parser.add_argument("--duration", type=float, default=30, help="at most this many seconds")
    parser.add_argument("--timeout", type=float, default=30, help="client timeout per request")
    parser.add_argument("--max-in-flight", type=int, default=512,
                        help="at most this many outstanding (a send due past it is skipped)")
    parser.add_argument("--sample-memory", action="store_true",
                        help="sample RSS of this machine's Ray Serve processes")
    parser.add_argument("--memory-every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.requests < 1 or args.duration <= 0 or args.max_in_flight < 1:
        parser.error("--rate, --requests, --duration and --max-in-flight must be positive")
    if urlsplit(args.url).scheme != "http":
        parser.error(f"--url {args.url}: give http://HOST:PORT (the load client speaks HTTP/1.1)")
    host = urlsplit(args.url).hostname
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if not loopback and not os.environ.get("LOADTEST_ALLOW_REMOTE"):
        parser.error(
            f"refusing to load {host}: loopback only (set LOADTEST_ALLOW_REMOTE=1 for staging)"
        )
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:<22} {value}")
    return 0 if report["lost"] == 0 and not report["other"] else 1


if __name__ == "__main__":
    sys.exit(main())
