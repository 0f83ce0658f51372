"""What the dashboard's hour-long charts cost to read, side by side in one run.

Fills an hour of one-second windows for both arms in a Redis of your choosing (its own app
namespace, deleted afterwards), then times, alternating round by round:

- `cold`:  `Windows.series(3600, 60)` with an empty step cache (the first page load: 7,200
           hashes in one pipelined round trip);
- `warm`:  the same with the dashboard's step cache (a refresh: only the open step is read);
- `arms`:  `Windows.arms(60)` (what `rollout status` reads), for scale.

    python -m ops.bench.series_cost --redis-url redis://127.0.0.1:6379/0 --rounds 10
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from rollout import Attempt, RequestRecord, Windows
from rollout.telemetry.redis_store import RedisTelemetry, WindowItem
from rollout.telemetry.series import StepCache
from rollout.telemetry.windows import telemetry_prefix

APP = "bench-series"


def fill(store: RedisTelemetry, now: int, rate: int) -> int:
    """`rate` requests a second on baseline and a tenth of that on optimized, for an hour."""
    rng, items = random.Random(7), []
    for second in range(now - 3_600, now):
        for i in range(rate + rate // 10):
            arm = "optimized" if i >= rate else "baseline"
            attempt = Attempt(arm, "ok", {"preprocess": 0.3, "queue": 1.0, "forward": 5.0,
                                          "postprocess": 0.1}, rng.randint(1, 8),
                              rng.randint(0, 4), 0.004, 0.000004)
            items.append(WindowItem(second + rng.random(), RequestRecord(
                arm, 200, rng.lognormvariate(3, 0.5), 1, 40, (attempt,))))
        if len(items) > 5_000:
            store.write(items)
            items = []
    store.write(items)
    return 3_600 * (rate + rate // 10)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.series_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=20, help="baseline requests per second")
    args = parser.parse_args(argv)
    store = RedisTelemetry(args.redis_url, APP, window_ttl_s=7_200)
    try:
        requests = fill(store, int(time.time()), args.rate)
        windows = Windows(store, APP)
        warm = StepCache()
        windows.series(3_600, 60, cache=warm)
        fields = sum(len(h) for h in store.hashes(
            [f"{telemetry_prefix(APP)}win:baseline:{int(time.time()) - 100}"]))
        times: dict[str, list[float]] = {"cold": [], "warm": [], "arms": []}
        for _ in range(args.rounds):
            times["cold"].append(timed(lambda: windows.series(3_600, 60, cache=StepCache())))
            times["warm"].append(timed(lambda: windows.series(3_600, 60, cache=warm)))
            times["arms"].append(timed(lambda: windows.arms(60)))
        median = {name: statistics.median(values) for name, values in times.items()}
        print(f"an hour of windows: {requests:,} requests, ~{fields} fields per hash, "
              f"{args.rounds} rounds (median ms)")
        for name, value in median.items():
            print(f"  {name:<5} {value:8.2f} ms   {value / median['arms']:6.2f}x arms(60)")
        print(f"  warm / cold: {median['warm'] / median['cold']:.3f}")
    finally:
        client = store._client
        for key in client.scan_iter(f"{telemetry_prefix(APP)}*", count=1_000):
            client.delete(key)
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
