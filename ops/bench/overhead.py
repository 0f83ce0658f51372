"""Measure what telemetry costs: throughput and latency with telemetry on against off, side by
side in one run.

    python -m ops.bench.overhead local [--rounds 6] [--seconds 8] [--workers 8] [--aa]
    python -m ops.bench.overhead urls --on http://host:8000 --off http://host:8001 [...]

(`python -m ops.bench.overhead`, its name before ops.bench, still runs it.)

`local` starts a local Ray Serve with two copies of the application on one HTTP port, `/a` and
`/b`, with the settings from the environment, telemetry on in one copy and off in the other, and
swaps them halfway, so that whatever favours one copy weighs on both sides (both copies need the
Redis of `REDIS_URL` and share its rollout state). `--aa` keeps telemetry off in both: the noise
floor of the method. `urls` drives two gateways you started yourself.

Either way the load alternates between the two sides in rounds (on, off, off, on, ...), so both
see the same machine; each round is a closed loop of `--workers` clients sending one-text
predictions for `--seconds`, after an unmeasured warm-up. It prints requests per second and p50
/ p99 latency per side (the load is ops.load's closed loop and client) and the overhead in
percent, pooled over all rounds and as the median over rounds of each "on" round against the
"off" round next to it. `local` also reports the CPU time the replicas (gateway and models,
from /proc) spent per request, the measure least disturbed by other load on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys

from ops.load import Sender, Shot, closed_loop, drain
from ops.load.processes import cpu_seconds, replica_pids
from serve.ray_env import free_port

TEXTS = ["The new GPU doubles inference speed", "A late goal decides the derby",
         "Parliament passes the budget", "Shares fall after the earnings call"]
BODIES = [json.dumps({"inputs": [text]}).encode() for text in TEXTS]


def run_round(url: str, seconds: float, workers: int) -> tuple[int, list[float], int]:
    """A closed loop for `seconds` (ops.load): (answered requests, their latencies in ms,
    errors)."""
    async def load() -> list[Shot]:
        sender = Sender(url, timeout_s=30, connections=workers)
        shots: list[Shot] = []
        try:
            offered = await closed_loop(lambda n: sender(BODIES[n % len(BODIES)], f"w{n}"),
                                        shots, concurrency=workers, duration_s=seconds)
            await drain(offered)
        finally:
            await sender.aclose()
        return shots

    shots = asyncio.run(load())
    latencies = [s.latency_s * 1000 for s in shots if s.status == 200]
    return len(latencies), latencies, len(shots) - len(latencies)


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] if ordered else float("nan")


def compare(phases, *, rounds: int, seconds: float, workers: int) -> dict:
    """Alternating rounds in each phase. `phases` yields ({side: url}, {side: pids} or None):
    the pids whose CPU time is charged to that side's requests."""
    results = {name: {"rps": [], "p50": [], "lat": [], "errors": 0, "cpu": 0.0, "cpu_n": 0}
               for name in ("on", "off")}
    for p, (urls, pids) in enumerate(phases):
        for url in urls.values():  # warm-up, not measured
            run_round(url, min(seconds, 3), workers)
        for r in range(rounds):
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                used = cpu_seconds(pids[name]) if pids else 0.0
                count, latencies, errors = run_round(urls[name], seconds, workers)
                res = results[name]
                if pids:
                    res["cpu"] += cpu_seconds(pids[name]) - used
                    res["cpu_n"] += count
                res["rps"].append(count / seconds)
                res["p50"].append(_q(latencies, 0.5))
                res["lat"].extend(latencies)
                res["errors"] += errors
                print(f"phase {p + 1} round {r + 1}/{rounds} telemetry {name:<3} "
                      f"({urls[name]}): {count / seconds:7.1f} req/s, "
                      f"p50 {_q(latencies, 0.5):6.2f} ms", file=sys.stderr)
    on_r, off_r = results["on"], results["off"]
    summary = {"paired": {  # each round's on against the off run next to it, then the median
        "rps": statistics.median(1 - a / b for a, b in zip(on_r["rps"], off_r["rps"],
                                                           strict=True)) * 100,
        "p50": statistics.median(a / b - 1 for a, b in zip(on_r["p50"], off_r["p50"],
                                                           strict=True)) * 100,
    }}
    for name, res in results.items():
        summary[name] = {
            "rps": sum(res["rps"]) / len(res["rps"]), "p50": _q(res["lat"], 0.5),
            "p99": _q(res["lat"], 0.99), "requests": len(res["lat"]), "errors": res["errors"],
            "cpu_ms": res["cpu"] * 1000 / res["cpu_n"] if res["cpu_n"] else None,
        }
    return summary


def report(summary: dict, workers: int) -> str:
    on, off = summary["on"], summary["off"]
    lines = [f"{'telemetry':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'requests':>9} "
             f"{'errors':>7}   ({workers} concurrent clients)"]
    for name in ("off", "on"):
        s = summary[name]
        lines.append(f"{name:<10} {s['rps']:>8.1f} {s['p50']:>8.2f} {s['p99']:>8.2f} "
                     f"{s['requests']:>9} {s['errors']:>7}")
    tput = (off["rps"] - on["rps"]) / off["rps"] * 100
    p50 = (on["p50"] - off["p50"]) / off["p50"] * 100
    if on["cpu_ms"] is not None:
        cpu = (on["cpu_ms"] - off["cpu_ms"]) / off["cpu_ms"] * 100
        lines.append(f"replica CPU per request: off {off['cpu_ms']:.2f} ms, on {on['cpu_ms']:.2f} "
                     f"ms ({cpu:+.1f} %)")
    paired = summary["paired"]
    lines.append(f"overhead, pooled:        throughput {tput:+.1f} % (lower with telemetry), "
                 f"p50 {p50:+.1f} % (higher with telemetry)")
    lines.append(f"overhead, paired median: throughput {paired['rps']:+.1f} %, "
                 f"p50 {paired['p50']:+.1f} %  (median over rounds of on vs the adjacent off)")
    return "\n".join(lines)




def local_phases(model_path: str | None, same: bool = False):
    """Two copies of the application on a local Ray Serve, `/a` and `/b`; phase 1 with
    telemetry on `/a`, phase 2 redeployed with telemetry on `/b`, so that whatever favours one
    copy (placement, route order) weighs on both sides equally. `same`: telemetry off on both
    (an A/A run: the noise floor of the method)."""
    import ray
    from ray import serve

    from rollout import Settings
    from serve.config import build

    overrides = {"model_path": model_path} if model_path else {}
    base = Settings(gateway_num_cpus=0.25, model_num_cpus=0.25, **overrides)
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for on_app, off_app in (("a", "b"), ("b", "a")):
        for app in ("a", "b"):
            settings = base.model_copy(update={"telemetry_enabled": app == on_app and not same})
            serve.run(build(settings), name=f"telemetry-{app}", route_prefix=f"/{app}")
        apps = {"on": on_app, "off": off_app}
        yield ({side: f"http://127.0.0.1:{port}/{app}" for side, app in apps.items()},
               {side: replica_pids(f"telemetry-{app}") for side, app in apps.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6,
                        help="measured rounds per side and phase (local: two phases)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one round")
    parser.add_argument("--workers", type=int, default=8, help="concurrent clients")
    sub = parser.add_subparsers(dest="where", required=True)
    local = sub.add_parser("local", help="start both applications on a local Ray Serve")
    local.add_argument("--model-path", help="model folder (default: CANARY_MODEL_PATH or the "
                                            "packaged all-MiniLM-L6-v2)")
    local.add_argument("--aa", action="store_true",
                       help="telemetry off on both copies: measures the method's noise floor")
    urls = sub.add_parser("urls", help="two running gateways")
    urls.add_argument("--on", required=True, help="gateway with telemetry on")
    urls.add_argument("--off", required=True, help="gateway with CANARY_TELEMETRY_ENABLED=false")
    args = parser.parse_args(argv)

    if args.where == "local":
        phases = local_phases(args.model_path, same=args.aa)
    else:
        phases = [({"on": args.on.rstrip("/"), "off": args.off.rstrip("/")}, None)]
    try:
        summary = compare(phases, rounds=args.rounds, seconds=args.seconds,
                          workers=args.workers)
    finally:
        if args.where == "local":
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    print(report(summary, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
