"""Measure a running gateway's rollout behaviour (drills for a test or staging environment).

    python -m ops.measure kill  --flips 30 --workers 8 --yes
    python -m ops.measure share --keys 10000 --shares 1,10,50 --yes

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
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from rollout import Rollout, Settings, open_store, parse_percent
from rollout.agreement import percentile

ACTOR = "measure"


def _routed_at(sent: float, received: float, server_timing: str) -> float:
    for part in server_timing.split(","):
        name, _, rest = part.strip().partition(";dur=")
        if name == "total" and rest:
            return max(sent, received - float(rest) / 1000)
    return received


class Load:
    """`workers` threads sending predictions in a loop, recording (routed_at, arm)."""

    def __init__(self, url: str, workers: int):
        self.url, self.workers = url, workers
        self.records: list[tuple[float, str]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)
        ]

    def _run(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                sent = time.monotonic()
                try:
                    response = client.post(
                        "/v1/predict", json={"inputs": ["measure"]},
                        headers={"X-Routing-Key": f"load-{worker}-{n}"},
                    )
                except httpx.HTTPError:
                    with self._lock:
                        self.errors += 1
                    continue
                received = time.monotonic()
                if response.status_code != 200:
                    with self._lock:
                        self.errors += 1
                    continue
                at = _routed_at(sent, received, response.headers.get("server-timing", ""))
                with self._lock:
                    self.records.append((at, response.headers["x-canary-arm"]))

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def since(self, t: float) -> list[tuple[float, str]]:
        with self._lock:
            return [r for r in self.records if r[0] >= t]


def _wait_for_arm(load: Load, arm: str, since: float, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not any(a == arm for _, a in load.since(since)):
        if time.monotonic() > deadline:
            raise SystemExit(f"measure: traffic never reached the {arm} arm")
        time.sleep(0.01)


def measure_kill(control: Rollout, url: str, flips: int, workers: int) -> list[float]:
    lags = []
    with Load(url, workers) as load:
        for flip in range(flips):
            mark = time.monotonic()
            if control.state().canary_bp != 10_000:
                control.set_canary(10_000, actor=ACTOR, reason="kill drill: canary to 100 %")
            control.unkill(actor=ACTOR, reason="kill drill: arm")
            _wait_for_arm(load, "optimized", mark)
            time.sleep(0.3)
            control.kill(actor=ACTOR, reason="kill drill: flip")
            returned = time.monotonic()
            time.sleep(0.5)
            late = [at for at, arm in load.since(returned) if arm == "optimized"]
            lag_ms = (max(late) - returned) * 1000 if late else 0.0
            lags.append(lag_ms)
            print(f"flip {flip + 1:>3}/{flips}: last canary routing {lag_ms:7.1f} ms after kill "
                  f"returned ({len(late)} late requests)", file=sys.stderr)
        print(f"requests: {len(load.records)} answered, {load.errors} errors", file=sys.stderr)
    return lags


def measure_share(control: Rollout, url: str, keys: int, shares: list[int], workers: int):
    results = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for bp in shares:
            _, state = control.set_canary(bp, actor=ACTOR, reason="share drill")
            deadline = time.monotonic() + 10
            while client.get("/v1/rollout").json()["state"]["revision"] < state.revision:
                if time.monotonic() > deadline:
                    raise SystemExit("measure: the gateway never picked up the new share")
                time.sleep(0.02)

            def one(i: int) -> str:
                response = client.post(
                    "/v1/predict", json={"inputs": ["share"]},
                    headers={"X-Routing-Key": f"share-key-{i}"},
                )
                response.raise_for_status()
                return response.headers["x-canary-arm"]

            with ThreadPoolExecutor(workers) as pool:
                arms = list(pool.map(one, range(keys)))
            observed = arms.count("optimized") / keys
            results.append((bp / 100, observed * 100))
            print(f"share {bp / 100:g}%: observed {observed * 100:.2f}% of {keys} keys",
                  file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.measure", description=__doc__,
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
            lags = measure_kill(control, args.url, args.flips, args.workers)
            print(f"kill propagation over {len(lags)} flips: p50 {statistics.median(lags):.1f} ms, "
                  f"p99 {percentile(lags, 99):.1f} ms, max {max(lags):.1f} ms")
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
