"""Benchmark the serving path: the in-process pipeline per variant and batch size, and the
gateway end to end per arm and concurrency, side by side in one run.

    python -m ops.bench                                  # local app, default model
    python -m ops.bench --seconds 3 --set max_batch_size=32 --out bench-results
    python -m ops.bench --url http://127.0.0.1:8000 --yes   # a running gateway (loopback only)
    python -m ops.bench --plain --inputs-per-request 1,8  # against plain Ray Serve, 2 sizes
    python -m ops.bench --protocol native,openai,oip --inputs-per-request 8  # the front doors

Without `--url` it starts the application itself on a local Ray Serve (the settings of the
environment, `--model-path` and `--set KEY=VALUE` on top) with a throwaway Redis unless
`REDIS_URL` is set. Arms are forced one after the other by setting the canary share to 0 % or
100 % through the audited path (actor `bench`) and restored afterwards; with `--url` that
changes a running gateway's rollout state, hence `--yes`. The in-process part runs first, in
this process, with the same settings, texts and machine.

`--plain` also measures a plain Ray Serve deployment of the same model (ops.bench.plain:
`@serve.batch`, fp32, all cores) beside the local app, in the same Ray instance, with the same
load generator, cell by cell (the plain deployment, then each arm), and prints gateway ÷ plain
per request size, concurrency and arm, with each side's refused share (ops.bench.anchor).

`--protocol` also measures the front doors (serve.protocols) on the baseline arm, cell by cell,
and prints each one's texts/s against the native route's (ops.bench.front_doors).

Writes bench.json, bench.md and bench.png into `--out`, prints the markdown table and names
the bottleneck stage. Exit codes: 0 done, 1 some requests failed (see `failed`), 2 bad input or
an unreachable gateway / Redis.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.bench import endtoend, front_doors, pipeline, report, target
from ops.bench.endtoend import BenchError
from ops.cli.types import key_value, positive_ints
from ops.load.processes import rss_mib
from serve import ray_env


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ops.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running gateway (loopback only); default: start a local app")
    p.add_argument("--yes", action="store_true",
                   help="with --url: confirm that its rollout state may change (restored after)")
    p.add_argument("--redis-url", help="Redis of the rollout state, operator access (default: "
                   "REDIS_URL; local app without it: a throwaway redis-server)")
    p.add_argument("--model-path", help="model folder (default: CANARY_MODEL_PATH or the "
                   "packaged all-MiniLM-L6-v2)")
    p.add_argument("--set", dest="settings", type=key_value, action="append", default=[],
                   metavar="KEY=VALUE", help="a setting by field name, e.g. max_batch_size=32 "
                   "(repeatable; the local app and the in-process variants use it)")
    p.add_argument("--texts", help="JSONL regression-set file whose texts make the workload "
                   "(default: the shipped set)")
    p.add_argument("--inputs", type=int, default=128,
                   help="texts in the workload, evenly spaced over the set (default 128)")
    p.add_argument("--task", choices=("classify", "embed"), default="classify")
    p.add_argument("--batch-sizes", type=positive_ints, default=[1, 8, 16, 32],
                   help="in-process batch sizes (default 1,8,16,32)")
    p.add_argument("--rounds", type=int, default=3, help="in-process passes per arm and batch")
    p.add_argument("--threads", type=int, help="torch threads of the in-process part (default: "
                   "those of one model replica, CANARY_TORCH_THREADS or cores / 2, so both "
                   "sides run the same forward)")
    p.add_argument("--concurrency", type=positive_ints, default=[1, 8, 32, 64],
                   help="gateway concurrency levels (default 1,8,32,64)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per level")
    p.add_argument("--inputs-per-request", type=positive_ints, default=[1],
                   help="texts in each gateway request, or a comma list to sweep, e.g. 1,8 "
                   "(default 1; the per-arm figures use the first)")
    p.add_argument("--timeout", type=float, default=30.0, help="client timeout per request")
    p.add_argument("--arms", default="baseline,optimized", help="arms to measure, in order")
    p.add_argument("--p99-bound-ms", type=float,
                   help="bound of the speedup at equal p99 (default: baseline p99 at saturation)")
    p.add_argument("--no-inprocess", action="store_true", help="skip the in-process part")
    p.add_argument("--no-gateway", action="store_true", help="skip the end-to-end part")
    p.add_argument("--plain", action="store_true",
                   help="also measure a plain Ray Serve deployment of the same model, in the "
                   "same run with the same load generator, and print gateway ÷ plain per cell "
                   "(local app only)")
    p.add_argument("--protocol", help="front doors to measure on baseline, comma-separated: "
                   f"{', '.join(front_doors.PROTOCOLS)} (with their variants: openai-base64, "
                   "oip-binary); each cell's figures beside the native route's")
    p.add_argument("--out", default="bench-results", help="folder for bench.json/.md/.png")
    p.add_argument("--no-chart", action="store_true", help="no PNG (matplotlib not needed)")
    p.add_argument("--render", metavar="JSON", help="measure nothing: write bench.md and "
                   "bench.png into --out from an earlier bench.json (e.g. one from the GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _checked(args, p: argparse.ArgumentParser) -> None:
    if args.inputs < 1 or args.rounds < 1 or (args.threads is not None and args.threads < 1):
        p.error("--inputs, --rounds and --threads must be >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.timeout <= 0:
        p.error("--seconds and --timeout must be positive, --warmup not negative")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or set(arms) - set(report.ARMS):
        p.error(f"--arms: choose from {', '.join(report.ARMS)}")
    args.arms = arms
    if args.url and not args.yes and not args.no_gateway:
        p.error("--url changes that gateway's rollout state (restored afterwards): pass --yes")
    if args.plain and (args.url or args.no_gateway):
        p.error("--plain deploys beside the local app: drop --url and --no-gateway")
    if args.protocol is not None:
        args.protocol = [x.strip() for x in args.protocol.split(",") if x.strip()]
        if not args.protocol or set(args.protocol) - set(front_doors.PROTOCOLS) \
                or args.no_gateway:
            p.error(f"--protocol: a comma list of {', '.join(front_doors.PROTOCOLS)}, "
                    "without --no-gateway")


def _settings(args):
    from pydantic import ValidationError

    from rollout import Settings

    overrides = dict(args.settings)
    if args.model_path:
        overrides["model_path"] = args.model_path
    if args.redis_url:
        overrides["redis_url"] = args.redis_url
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BenchError(f"bad setting: {first['loc']}: {first['msg']}") from None


def _texts(args) -> list[str]:
    from serve.regression import RegressionSetError, load_set

    try:
        texts = load_set(args.texts).texts
    except RegressionSetError as exc:
        raise BenchError(str(exc)) from None
    step = max(1, len(texts) // args.inputs)
    return texts[::step][: args.inputs]


def _hardware() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    found = f"{cpu}, {os.cpu_count()} cores"
    if torch.cuda.is_available():
        found += f", {torch.cuda.get_device_name(0)}"
    return found


def run(args, say) -> dict:
    import torch

    from serve.variants import Variant, model_dir

    settings = _settings(args)
    try:
        model_dir(settings)
    except (FileNotFoundError, ImportError) as exc:
        raise BenchError(f"no model: {exc}") from None
    url = target.loopback_url(args.url) if args.url else None
    if url and not args.no_gateway:
        endtoend.check_reachable(url)
    texts = _texts(args)
    result: dict = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": _hardware(), "torch": torch.__version__,
        "model": settings.model_path or "all-MiniLM-L6-v2 (packaged)",
        "inputs": len(texts), "inputs_per_request": args.inputs_per_request[0],
        "request_sizes": args.inputs_per_request, "task": args.task,
        "plain": _plain_meta() if args.plain else None,
        "max_batch_size": settings.max_batch_size, "batch_wait_ms": settings.batch_wait_ms,
        "replica_threads": settings.threads_per_model(), "inprocess_threads": None,
        "mode": "url" if url else "local app",
        # Ray's own environment of the local app (serve.ray_env); unknown for a URL
        "ray_env": None if url else {k: v for k, v in ray_env.apply(dict(os.environ)).items()
                                     if k in ray_env.RAY_ENV},
        "settings": dict(args.settings), "seconds": args.seconds,
    }, "memory": {}}
    if not args.no_inprocess:
        torch.set_num_threads(args.threads or settings.threads_per_model())
        result["meta"]["inprocess_threads"] = torch.get_num_threads()
        say("loading both variants in process")
        variants = {arm: Variant(settings, arm) for arm in args.arms}
        result["meta"]["recipes"] = {arm: v.recipe for arm, v in variants.items()}
        result["inprocess"] = pipeline.measure(variants, texts, args.batch_sizes,
                                               rounds=args.rounds, task=args.task, progress=say)
        result["memory"]["bench_process_mib"] = _rss_mib()
        result["memory"]["gpu_peak_mib"] = pipeline.peak_gpu_mib()
        del variants
        gc.collect()
    if not args.no_gateway:
        measured = _gateway(args, settings, url, texts, say)
        result["gateway"], result["memory"]["serve"] = measured.arms, measured.memory
        if args.plain:
            result["plain"] = measured.plain
        result.update(_door_results(args, measured))
    result["summary"] = report.derive(result, p99_bound_ms=args.p99_bound_ms)
    return result


def _door_results(args, measured) -> dict:
    """`--protocol`: the doors' levels, and each door's own CPU per request in process."""
    if not args.protocol:
        return {}
    return {"protocols": measured.protocols, "protocols_codec": front_doors.codec_us(
        front_doors.doors(args.protocol, "m"), args.inputs_per_request[0])}


@dataclass
class Measured:
    """The end-to-end part: levels per arm and of the plain deployment, and the peak RSS (MiB)
    of the serve processes."""

    arms: dict[str, list[dict]]
    plain: list[dict] = field(default_factory=list)
    protocols: list[dict] = field(default_factory=list)  # --protocol: ops.bench.front_doors
    memory: dict[str, float] = field(default_factory=dict)


def _gateway(args, settings, url, texts, say) -> Measured:
    if url:
        return _levels(args, settings, url, texts, say)
    with target.redis_for(settings.redis_url if (args.redis_url or os.environ.get("REDIS_URL"))
                          else None) as redis_url:
        local = settings.model_copy(update={"redis_url": redis_url})
        say("starting the local app (Ray Serve)")
        with target.local_app(local) as local_url:
            if not args.plain:
                return _levels(args, local, local_url, texts, say, app=target.APP)
            from ops.bench import plain

            say("deploying plain Ray Serve beside it")
            with plain.deployed(local, local_url) as plain_url:
                return _levels(args, local, local_url, texts, say, app=target.APP,
                               plain_url=plain_url)


def _levels(args, settings, url, texts, say, app=None, plain_url=None) -> Measured:
    """Every cell in `target.order`, arms forced through the audited path and restored."""
    switch = target.ArmSwitch(settings, url)
    measured = Measured({arm: [] for arm in args.arms})
    steps = target.order(args.arms, args.inputs_per_request, args.concurrency,
                         plain=plain_url is not None)
    try:
        for who, size, c in steps:
            if who == target.PLAIN:
                level = _cell(args, plain_url, texts, c, size, target.PLAIN)
                measured.plain.append(level)
            else:
                switch.force(who)
                level = _cell(args, url, texts, c, size, app)
                measured.arms[who].append(level)
            say(f"{who if who == target.PLAIN else f'gateway {who}'} c={c}, {size} text(s) "
                f"per request: {level['rps']:.1f} req/s, p50 {level['p50_ms']} ms, p99 "
                f"{level['p99_ms']} ms, answered by {level['arms']}, failed {level['failed']} "
                f"of {level['sent']}")
            for name in (app, target.PLAIN) if plain_url else (app,):
                for process, mib in target.process_memory(name).items():
                    measured.memory[process] = max(mib, measured.memory.get(process, 0.0))
        if args.protocol:
            measured.protocols = _front_doors(args, switch, url, texts, say, app)
    finally:
        switch.restore()
    return measured


def _front_doors(args, switch, url: str, texts: list[str], say, app: str | None) -> list[dict]:
    """`--protocol`: every door asked for, on baseline, in each cell (ops.bench.front_doors)."""
    switch.force("baseline")
    named = front_doors.doors(args.protocol, front_doors.served_model(url))
    cells = [(size, c) for size in args.inputs_per_request for c in args.concurrency]
    return front_doors.measure(
        cells, named, lambda c, size, door: _cell(args, url, texts, c, size, app, door), say)


def _cell(args, url: str, texts: list[str], concurrency: int, size: int,
          app: str | None, door: endtoend.Door | None = None) -> dict:
    """One level on `url`, with the CPU per answered request of `app`'s replicas and of this
    process (the load generator)."""
    used, began = target.replica_cpu_s(app), time.monotonic()
    client = time.process_time()
    level = endtoend.load(url, texts, concurrency, seconds=args.seconds, warmup=args.warmup,
                          per_request=size, task=args.task, timeout=args.timeout, door=door)
    spent, elapsed = target.replica_cpu_s(app), time.monotonic() - began
    # CPU per second of load (warm-up included) / requests per second measured
    level["cpu_ms_per_request"] = {
        name: round((spent[name] - used.get(name, 0.0)) / elapsed * 1000 / level["rps"], 3)
        for name in spent if level["rps"]}
    if level["rps"]:
        level["client_cpu_ms_per_request"] = round(
            (time.process_time() - client) / elapsed * 1000 / level["rps"], 3)
    return level


def _plain_meta() -> dict:
    from ops.bench.plain import RECIPE, ROUTE

    return {"recipe": RECIPE, "threads": os.cpu_count(), "route": ROUTE}


def _load(path: str) -> dict:
    import json

    try:
        result = json.loads(Path(path).read_text())
        result["summary"] = report.derive(result)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"cannot render {path}: {type(exc).__name__}: {exc}") from None
    return result


def _rss_mib() -> float:
    return round(rss_mib(os.getpid()) or 0.0, 1)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    _checked(args, p)

    def say(line: str) -> None:
        if not args.quiet:
            print(f"bench: {line}", file=sys.stderr, flush=True)

    try:
        result = _load(args.render) if args.render else run(args, say)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.render:
        report.write_json(result, out / "bench.json")
    table = report.markdown(result)
    if result.get("protocols"):
        table += "\n## Front doors (baseline)\n\n" + front_doors.table(result["protocols"])
        table += "\n" + front_doors.codec_table(result.get("protocols_codec") or {})
    (out / "bench.md").write_text(table)
    if not args.no_chart and (result.get("gateway") or result.get("plain")):
        report.chart(result, out / "bench.png")
    print(table)
    for arm, s in result["summary"]["arms"].items():
        if s["bottleneck"]:
            neck = s["bottleneck"]
            print(f"{arm}: bottleneck at saturation is `{neck['stage']}` "
                  f"({neck['per_request_ms']} ms per request; queue p50 {neck['queue_p50_ms']} ms)")
    say(f"wrote {out}/bench.json, bench.md" + ("" if args.no_chart else ", bench.png"))
    failed = any(lv["failed"] for levels in [*(result.get("gateway") or {}).values(),
                                             result.get("plain") or []] for lv in levels)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
