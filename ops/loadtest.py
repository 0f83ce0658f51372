"""Open-loop load test and soak for a running gateway (loopback or staging only).

    python -m ops.loadtest --rate 400 --duration 20              # offer more than it can serve
    python -m ops.loadtest --rate 100 --requests 30000 --sample-memory   # soak with memory samples

Requests are sent at a fixed rate whether or not earlier ones were answered (open loop), so an
overloaded gateway must shed load rather than slow the client down. Every request is accounted
for: answered 2xx, answered with an explicit 413/422/429/503/504, or lost (no answer: connection
error or no response within --timeout). Bounded by --requests and --duration, whichever comes
first, and by --max-in-flight (sending pauses, and is counted, when that many are outstanding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rollout.agreement import percentile

EXPLICIT = {413, 422, 429, 503, 504}


def serve_processes() -> dict[int, str]:
    """PIDs of this machine's Ray Serve processes (proxy, replicas, controller) by name."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if name.startswith(("ray::ServeReplica", "ray::ProxyActor", "ray::ServeController")):
            found[int(proc.name)] = name
    return found


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class _Tally:
    """What the load test counted so far."""

    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # ms, of 200s
    retry_after: int = 0  # 429/503 answers that carried Retry-After
    in_flight: int = 0
    throttled: int = 0  # times sending paused at --max-in-flight
    memory: dict[str, list[float]] = field(default_factory=dict)  # process -> RSS MiB samples


async def _one(client: httpx.AsyncClient, tally: _Tally, i: int) -> None:
    """Send request `i` and count its answer (or its loss)."""
    started = time.monotonic()
    try:
        response = await client.post(
            "/v1/predict", json={"inputs": [f"load test input number {i}"]},
            headers={"X-Routing-Key": f"load-{i}"},
        )
        code = response.status_code
        tally.statuses[str(code)] += 1
        if code in (429, 503) and "retry-after" in response.headers:
            tally.retry_after += 1
        if code == 200:
            tally.latencies.append((time.monotonic() - started) * 1000)
    except httpx.HTTPError as exc:
        tally.statuses[f"lost:{type(exc).__name__}"] += 1
    finally:
        tally.in_flight -= 1


def _sample_memory(processes: dict[int, str], tally: _Tally) -> None:
    for pid, name in processes.items():
        value = rss_mib(pid)
        if value is not None:
            tally.memory.setdefault(f"{name}[{pid}]", []).append(value)


async def run(args) -> dict:
    tally = _Tally()
    processes = serve_processes() if args.sample_memory else {}
    limits = httpx.Limits(max_connections=args.max_in_flight, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout, limits=limits) as client:
        tasks = []
        start = time.monotonic()
        interval = 1 / args.rate
        next_memory = start
        for i in range(args.requests):
            now = time.monotonic()
            if now - start > args.duration:
                break
            if processes and now >= next_memory:
                _sample_memory(processes, tally)
                next_memory = now + args.memory_every
            while tally.in_flight >= args.max_in_flight:
                tally.throttled += 1
                await asyncio.sleep(interval)
            tally.in_flight += 1
            tasks.append(asyncio.create_task(_one(client, tally, i)))
            await asyncio.sleep(max(0.0, start + (i + 1) * interval - time.monotonic()))
        sent_for = time.monotonic() - start
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
    return _report(args, tally, len(tasks), sent_for, elapsed)


def _report(args, tally: _Tally, sent: int, sent_for: float, elapsed: float) -> dict:
    statuses = tally.statuses
    answered = sum(n for code, n in statuses.items() if not code.startswith("lost"))
    ok = statuses.get("200", 0)
    report = {
        "offered_rate": args.rate,
        "sent": sent,
        "sent_for_s": round(sent_for, 2),
        "elapsed_s": round(elapsed, 2),
        "answered": answered,
        "lost": sent - answered,
        "ok": ok,
        "shed_429_503": sum(statuses.get(str(code), 0) for code in (429, 503)),
        "shed_with_retry_after": tally.retry_after,
        "timeouts_504": statuses.get("504", 0),
        "other": {
            c: n
            for c, n in statuses.items()
            if c != "200" and (c.startswith("lost") or int(c) not in EXPLICIT)
        },
        "statuses": dict(statuses),
        "throughput_ok_per_s": round(ok / elapsed, 1) if elapsed else 0.0,
        "p50_ms": round(percentile(tally.latencies, 50), 1) if tally.latencies else None,
        "p99_ms": round(percentile(tally.latencies, 99), 1) if tally.latencies else None,
        "client_throttled": tally.throttled,
    }
    if tally.memory:
        report["memory_mib"] = {
            name: {"first": round(v[0], 1), "last": round(v[-1], 1), "max": round(max(v), 1),
                   "growth": round(v[-1] - v[0], 1), "samples": len(v)}
            for name, v in tally.memory.items()
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000",
                        help="the gateway (loopback or staging only)")
    parser.add_argument("--rate", type=float, default=200, help="requests offered per second")
    parser.add_argument("--requests", type=int, default=5_000, help="at most this many")
    parser.add_argument("--duration", type=float, default=30, help="at most this many seconds")
    parser.add_argument("--timeout", type=float, default=30, help="client timeout per request")
    parser.add_argument("--max-in-flight", type=int, default=512)
    parser.add_argument("--sample-memory", action="store_true",
                        help="sample RSS of this machine's Ray Serve processes")
    parser.add_argument("--memory-every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.requests < 1 or args.duration <= 0:
        parser.error("--rate, --requests and --duration must be positive")
    host = httpx.URL(args.url).host
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
