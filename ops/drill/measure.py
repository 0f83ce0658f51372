"""Measure a running gateway's rollout behaviour (drills for a test or staging environment).

    python -m ops.drill.measure --yes kill  --flips 30 --workers 8
    python -m ops.drill.measure --yes share --keys 10000 --shares 1,10,50

(`python -m ops.drill.measure`, its name before ops.drill, still runs it.) The load is ops.load's
closed loop and client; a shed request waits its Retry-After.

Both change the rollout state through the audited path (actor `measure`) and restore the share
and kill switch they found when they finish. Loopback or staging gateways only.

kill: under constant load, flip the canary to 100 % and then `kill`, repeatedly. For each flip it
reports how long after `kill` returned the gateway still routed a request to the canary. A
request's routing moment is estimated as max(sent, received - gateway total from Server-Timing),
which is when the gateway started on it; the lag is 0 when no request routed after the kill.

share: set each share, send one request for each of N distinct routing keys, and report the
observed canary fraction next to the configured one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx

from ops.load import Sender, Shot, closed_loop, drain, parse_server_timing, pct
from rollout import Rollout, Settings, open_store, parse_percent

ACTOR = "measure"
CAPTURE = ("server-timing", "x-canary-arm", "retry-after")


def routed_at(shot: Shot) -> float:
    """When the gateway started on the request: max(sent, received - its Server-Timing total)."""
    received = shot.sent_at + shot.latency_s
    total = parse_server_timing(shot.headers.get("server-timing", ""))[0].get("total")
    return received if total is None else max(shot.sent_at, received - total / 1000)


def routed_since(shots: list[Shot], t: float) -> list[tuple[float, str]]:
    """(routed_at, arm) of the answered requests the gateway started on at or after `t`."""
    found = ((routed_at(s), s.headers.get("x-canary-arm", "")) for s in shots if s.status == 200)
    return [(at, arm) for at, arm in found if at >= t]


async def _wait_for_arm(shots: list[Shot], arm: str, since: float, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not any(a == arm for _, a in routed_since(shots, since)):
        if time.monotonic() > deadline:
            raise SystemExit(f"measure: traffic never reached the {arm} arm")
        await asyncio.sleep(0.01)


async def _flip(control: Rollout, shots: list[Shot]) -> float:
    """Canary to 100 %, then kill: ms from the kill's return to the last canary routing."""
    mark = time.monotonic()
    if control.state().canary_bp != 10_000:
        await asyncio.to_thread(control.set_canary, 10_000, actor=ACTOR,
                                reason="kill drill: canary to 100 %")
    await asyncio.to_thread(control.unkill, actor=ACTOR, reason="kill drill: arm")
    await _wait_for_arm(shots, "optimized", mark)
    await asyncio.sleep(0.3)
    await asyncio.to_thread(control.kill, actor=ACTOR, reason="kill drill: flip")
    returned = time.monotonic()
    await asyncio.sleep(0.5)
    late = [at for at, arm in routed_since(shots, returned) if arm == "optimized"]
    lag_ms = (max(late) - returned) * 1000 if late else 0.0
    print(f"last canary routing {lag_ms:7.1f} ms after kill returned ({len(late)} late "
          "requests)", file=sys.stderr)
    return lag_ms


async def measure_kill(control: Rollout, url: str, flips: int, workers: int) -> list[float]:
    """`flips` kills under a closed loop of `workers` clients (ops.load), each lag in ms."""
    sender = Sender(url, timeout_s=10, connections=workers, capture=CAPTURE)
    body = json.dumps({"inputs": ["measure"]}).encode()
    shots: list[Shot] = []
    stop = asyncio.Event()
    load = asyncio.create_task(closed_loop(lambda n: sender(body, f"load-{n}"), shots,
                                           concurrency=workers, duration_s=86_400, stop=stop))
    lags = []
    try:
        for flip in range(flips):
            print(f"flip {flip + 1:>3}/{flips}: ", end="", file=sys.stderr)
            lags.append(await _flip(control, shots))
    finally:
        stop.set()
        await drain(await load)
        await sender.aclose()
    ok = sum(s.status == 200 for s in shots)
    print(f"requests: {ok} answered, {len(shots) - ok} errors", file=sys.stderr)
    return lags


async def _arms(sender: Sender, keys: int, workers: int) -> list[str]:
    """One request for each routing key, `workers` at a time: the arm each was answered by."""
    body = json.dumps({"inputs": ["share"]}).encode()
    todo, arms = iter(range(keys)), []

    async def worker() -> None:
        for i in todo:
            shot = await sender(body, f"share-key-{i}")
            if shot.status != 200:
                raise SystemExit(f"measure: share-key-{i} was answered {shot.status or 'never'}")
            arms.append(shot.headers.get("x-canary-arm", ""))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return arms


def _wait_for_revision(client: httpx.Client, revision: int) -> None:
    deadline = time.monotonic() + 10
    while client.get("/v1/rollout").json()["state"]["revision"] < revision:
        if time.monotonic() > deadline:
            raise SystemExit("measure: the gateway never picked up the new share")
        time.sleep(0.02)


def measure_share(control: Rollout, url: str, keys: int, shares: list[int], workers: int):
    """For each share (basis points): (configured %, observed %) over `keys` routing keys."""
    results = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for bp in shares:
            _, state = control.set_canary(bp, actor=ACTOR, reason="share drill")
            _wait_for_revision(client, state.revision)
            arms = asyncio.run(_share_round(url, keys, workers))
            observed = arms.count("optimized") / keys
            results.append((bp / 100, observed * 100))
            print(f"share {bp / 100:g}%: observed {observed * 100:.2f}% of {keys} keys",
                  file=sys.stderr)
    return results


async def _share_round(url: str, keys: int, workers: int) -> list[str]:
    sender = Sender(url, timeout_s=10, connections=workers, capture=("x-canary-arm",))
    try:
        return await _arms(sender, keys, workers)
    finally:
        await sender.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.drill.measure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway")
    parser.add_argument("--workers", type=int, default=8, help="concurrent client threads")
    parser.add_argument("--yes", action="store_true",
                        help="confirm: this changes the rollout state (restored at the end)")
    sub = parser.add_subparsers(dest="what", required=True)
    kill = sub.add_parser("kill", help="kill-switch propagation under load")
    kill.add_argument("--flips", type=int, default=30)
    share = sub.add_parser("share", help="observed against configured canary share")
    share.add_argument("--keys", type=int, default=10_000)
    share.add_argument("--shares", default="1,10,50", help="comma-separated percentages")
    args = parser.parse_args(argv)
    if not args.yes:
        parser.error("this drill changes the rollout state: pass --yes on a test gateway")

    control = Rollout(open_store(Settings()))
    original = control.state()
    try:
        if args.what == "kill":
            lags = asyncio.run(measure_kill(control, args.url, args.flips, args.workers))
            print(f"kill propagation over {len(lags)} flips: p50 {statistics.median(lags):.1f} ms, "
                  f"p99 {pct(lags, 99):.1f} ms, max {max(lags):.1f} ms")
        else:
            shares = [parse_percent(s) for s in args.shares.split(",")]
            observations = measure_share(control, args.url, args.keys, shares, args.workers)
            for configured, observed in observations:
                print(f"configured {configured:g}% -> observed {observed:.2f}%")
    finally:
        now = control.state()
        if now.canary_bp != original.canary_bp:
            control.set_canary(original.canary_bp, actor=ACTOR, reason="drill over: restore share")
        if now.kill != original.kill:
            (control.kill if original.kill else control.unkill)(
                actor=ACTOR, reason="drill over: restore kill switch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
