"""Benchmark the serving path: the in-process pipeline per variant and batch size, and the
gateway end to end per arm and concurrency, side by side in one run.

    python -m ops.bench                                  # local app, default model
    python -m ops.bench --seconds 3 --set max_batch_size=32 --out bench-results
    python -m ops.bench --url http://127.0.0.1:8000 --yes   # a running gateway (loopback only)
    python -m ops.bench --plain --inputs-per-request 1,8  # against plain Ray Serve, 2 sizes
    python -m ops.bench --protocol native,openai,oip --inputs-per-request 8  # the front doors
    python -m ops.bench --peer litserve,infinity --plain --workload short --inputs-per-request 1,8
    python -m ops.bench --task generate --model-path DIR   # a causal LM: in process and through
    #                                                       the gateway (ops.bench.generate_gateway)

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

`--protocol` also measures the front doors (serve.gateway.protocols) on the baseline arm, cell by
cell, and prints each one's texts/s against the native route's (ops.bench.front_doors).

`--peer litserve,infinity` also measures the same model folder behind other servers, started
here as subprocesses on loopback and stopped at the end (ops.bench.peers): LitServe (fp32
torch, its documented batching: 16 requests or 5 ms), Infinity's torch engine (fp32, batch 32)
and its ONNX engine on the folder laid out as the model's hub repository ships it, serving
`onnx/model_qint8_avx512_vnni.onnx` (built once from the packaged weights, cached under
~/.cache/canary-gateway/peers). `infinity-torch` or `infinity-onnx` names one engine. Cell by
cell (plain Serve, each peer, each arm) with the same load generator, task `embed` (the default
with `--peer`; another task is refused), it prints gateway ÷ the fastest peer per cell: the
fp32 peers (and plain Serve) for baseline, Infinity's int8 engine and the fastest fp32 peer for
optimized (ops.bench.peers.ratio). LitServe comes from the `peers` extra (`pip install -e
'.[peers]'`), Infinity from a virtualenv of its own (`--infinity-venv`, default
~/.cache/canary-gateway/peers/infinity-0.0.78); without them it says exactly how to install
them and exits 2.

`--workload short` sends generated texts of 12 tokens each (padding decides nothing, the cost of
a request decides everything); `mixed`, the default, the regression set's texts, 1-256 tokens
(ops.bench.workload).

Every cell also reports the CPU ms per request of each process on its path (HAProxy, Serve's
proxy, each gateway and model replica, plain Serve's replica, each peer's processes, the load
client), read from /proc at the edges of the measured seconds, and what the gateway adds beyond
its model replicas; with the colocated topology, the total per process (ops.bench.cpu).

Writes bench.json, bench.md and bench.png into `--out`, prints the markdown table and names
the bottleneck stage. Exit codes: 0 done, 1 some requests failed (see `failed`), 2 bad input or
an unreachable gateway / Redis.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
from pathlib import Path

from ops.bench import cells, endtoend, front_doors, peers, pipeline, report, target, workload
from ops.bench.endtoend import BenchError
from ops.bench.peers.infinity_peer import venv as infinity_venv
from ops.cli.types import key_value, positive_ints
from ops.load.processes import rss_mib
from serve import ray_env

DEFAULT_CONCURRENCY = [1, 8, 32, 64]


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
    _workload_options(p)
    p.add_argument("--batch-sizes", type=positive_ints, default=[1, 8, 16, 32],
                   help="in-process batch sizes (default 1,8,16,32)")
    p.add_argument("--rounds", type=int, default=3, help="in-process passes per arm and batch")
    p.add_argument("--threads", type=int, help="torch threads of the in-process part (default: "
                   "those of one model replica, CANARY_TORCH_THREADS or cores / 2, so both "
                   "sides run the same forward)")
    p.add_argument("--concurrency", type=positive_ints, default=DEFAULT_CONCURRENCY,
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
    _beside_options(p)
    p.add_argument("--out", default="bench-results", help="folder for bench.json/.md/.png")
    p.add_argument("--no-chart", action="store_true", help="no PNG (matplotlib not needed)")
    p.add_argument("--render", metavar="JSON", help="measure nothing: write bench.md and "
                   "bench.png into --out from an earlier bench.json (e.g. one from the GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _workload_options(p: argparse.ArgumentParser) -> None:
    """What the requests carry: the texts and the task."""
    p.add_argument("--workload", choices=workload.WORKLOADS, default="mixed",
                   help="mixed: the regression set's texts (1-256 tokens); short: generated "
                   "texts of 12 tokens each (default mixed)")
    p.add_argument("--texts", help="JSONL regression-set file whose texts make the mixed "
                   "workload (default: the shipped set)")
    p.add_argument("--inputs", type=int, default=128,
                   help="texts in the workload, evenly spaced over the set (default 128)")
    p.add_argument("--task", choices=("classify", "embed", "generate"),
                   help="default classify, embed with --peer (the peers embed only); generate: "
                   "a causal LM (--model-path), in process: the decode loop beside "
                   "transformers' generate() one request at a time, as a static batch and "
                   "its generate_batch (ops.bench.generate_loop), then each arm through a "
                   "local gateway, streamed (ops.bench.generate_gateway; --no-inprocess, "
                   "--no-gateway skip a part), at --concurrency (default 1,8,32)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="--task generate: tokens generated per request (default 64)")


def _beside_options(p: argparse.ArgumentParser) -> None:
    """What else is measured beside the gateway in the same run."""
    p.add_argument("--plain", action="store_true",
                   help="also measure a plain Ray Serve deployment of the same model, in the "
                   "same run with the same load generator, and print gateway ÷ plain per cell "
                   "(local app only)")
    p.add_argument("--peer", help="also measure the model behind peer servers, comma-separated: "
                   f"{', '.join([*peers.registry.FAMILIES, *peers.PEERS])} (local app only)")
    p.add_argument("--infinity-venv", type=Path, default=None,
                   help="the virtualenv Infinity runs from (default "
                   "~/.cache/canary-gateway/peers/infinity-0.0.78)")
    p.add_argument("--protocol", help="front doors to measure on baseline, comma-separated: "
                   f"{', '.join(front_doors.PROTOCOLS)} (with their variants: openai-base64, "
                   "oip-binary); each cell's figures beside the native route's")


def _checked_arms(args, p: argparse.ArgumentParser) -> None:
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or set(arms) - set(report.ARMS):
        p.error(f"--arms: choose from {', '.join(report.ARMS)}")
    args.arms = arms


def _checked(args, p: argparse.ArgumentParser) -> None:
    if args.inputs < 1 or args.rounds < 1 or (args.threads is not None and args.threads < 1):
        p.error("--inputs, --rounds and --threads must be >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.timeout <= 0:
        p.error("--seconds and --timeout must be positive, --warmup not negative")
    _checked_arms(args, p)
    if args.url and not args.yes and not args.no_gateway:
        p.error("--url changes that gateway's rollout state (restored afterwards): pass --yes")
    if args.plain and (args.url or args.no_gateway):
        p.error("--plain deploys beside the local app: drop --url and --no-gateway")
    _checked_peers(args, p)
    if args.protocol is not None:
        args.protocol = [x.strip() for x in args.protocol.split(",") if x.strip()]
        if not args.protocol or set(args.protocol) - set(front_doors.PROTOCOLS) \
                or args.no_gateway:
            p.error(f"--protocol: a comma list of {', '.join(front_doors.PROTOCOLS)}, "
                    "without --no-gateway")


def _generate(args, p: argparse.ArgumentParser) -> int:
    """`--task generate`: ops.bench.generate_loop on --model-path in process, then its arms
    through a local gateway (ops.bench.generate_gateway); the table and ratios in --out
    (generate.json, generate.md) and on stdout."""
    from ops.bench import generate_loop
    from serve.recipes.source import is_causal_lm

    if args.url or args.peer or args.plain or args.protocol or args.render:
        p.error("--task generate starts its own local app: drop --url, --peer, --plain, "
                "--protocol and --render")
    folder = Path(args.model_path or os.environ.get("CANARY_MODEL_PATH") or "")
    if not is_causal_lm(folder):
        p.error(f"--task generate: --model-path {folder} holds no causal LM "
                "(e.g. `python -m ops.generate.small_lm DIR`)")
    if args.max_tokens < 2:
        p.error("--max-tokens must be >= 2")
    if args.no_inprocess and args.no_gateway:
        p.error("--no-inprocess with --no-gateway leaves nothing to measure")
    _checked_arms(args, p)
    concurrency = [1, 8, 32] if args.concurrency == DEFAULT_CONCURRENCY else args.concurrency
    say = (lambda line: None) if args.quiet else (
        lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
    rows = [] if args.no_inprocess else generate_loop.measure(folder, concurrency,
                                                              args.max_tokens, say)
    if not args.no_gateway:
        try:
            rows += _generate_gateway(args, folder, concurrency, say)
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.json").write_text(json.dumps(
        {"model": str(folder), "cpu": _hardware(), "settings": dict(args.settings),
         "rows": rows}, indent=2) + "\n")
    from ops.bench.generate_gateway import ratios
    table = generate_loop.table(rows) + "".join(f"{line}\n" for line in ratios(rows))
    (out / "generate.md").write_text(table)
    print(table)
    return 0


def _generate_gateway(args, folder: Path, concurrency: list[int], say) -> list[dict]:
    """The arms through a local app of the settings (a throwaway Redis unless one is given)."""
    from transformers import AutoTokenizer

    from ops.bench import generate_gateway

    args.model_path = str(folder)
    with cells.local_gateway(args, _settings(args), say) as (local, url):
        switch = target.ArmSwitch(local, url)
        try:
            return generate_gateway.measure(
                url, AutoTokenizer.from_pretrained(folder), args.arms, switch, concurrency,
                args.max_tokens, say)
        finally:
            switch.restore()


def _checked_peers(args, p: argparse.ArgumentParser) -> None:
    """`--peer` names known peers, runs beside the local app, on task embed; `--texts` makes
    the mixed workload only."""
    if args.texts and args.workload == "short":
        p.error("--texts makes the mixed workload: drop it or --workload short")
    if args.peer is None:
        args.task = args.task or "classify"
        return
    try:
        args.peer = peers.expand(args.peer)
    except ValueError as exc:
        p.error(str(exc))
    if args.url or args.no_gateway:
        p.error("--peer measures beside the local app: drop --url and --no-gateway")
    if args.task not in (None, "embed"):
        p.error(f"--peer: the peer servers embed only; drop --task {args.task} or use "
                "--task embed")
    args.task = "embed"
    args.infinity_venv = args.infinity_venv or infinity_venv()


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


def _preflight(args, settings) -> str | None:
    """The gateway's URL (None: a local app), once the model folder, the peers and the gateway
    given by URL are found; a BenchError before anything starts otherwise."""
    from serve.recipes.source import model_dir

    try:
        model_dir(settings)
    except (FileNotFoundError, ImportError) as exc:
        raise BenchError(f"no model: {exc}") from None
    if args.peer:
        peers.check(args.peer, args.infinity_venv)
    url = target.loopback_url(args.url) if args.url else None
    if url and not args.no_gateway:
        endtoend.check_reachable(url)
    return url


def run(args, say) -> dict:
    import torch

    from serve.recipes.variants import Variant, VariantSettings

    settings = _settings(args)
    url = _preflight(args, settings)
    texts = workload.texts(args.workload, args.inputs, args.texts)
    result: dict = {"meta": {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": _hardware(), "torch": torch.__version__,
        "model": settings.model_path or "all-MiniLM-L6-v2 (packaged)",
        "inputs": len(texts), "inputs_per_request": args.inputs_per_request[0],
        "request_sizes": args.inputs_per_request, "task": args.task, "workload": args.workload,
        "plain": _plain_meta() if args.plain else None, "peers": _peers_meta(args),
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
        groups = VariantSettings(settings, settings, settings, settings)
        variants = {arm: Variant(groups, arm) for arm in args.arms}
        result["meta"]["recipes"] = {arm: v.recipe for arm, v in variants.items()}
        result["inprocess"] = pipeline.measure(variants, texts, args.batch_sizes,
                                               rounds=args.rounds, task=args.task, progress=say)
        result["memory"]["bench_process_mib"] = _rss_mib()
        result["memory"]["gpu_peak_mib"] = pipeline.peak_gpu_mib()
        del variants
        gc.collect()
    if not args.no_gateway:
        measured = cells.measure(args, settings, url, texts, say)
        result["gateway"], result["memory"]["serve"] = measured.arms, measured.memory
        if args.plain:
            result["plain"] = measured.plain
        if args.peer:
            result["peers"] = measured.peers
        result.update(_door_results(args, measured))
    result["summary"] = report.derive(result, p99_bound_ms=args.p99_bound_ms)
    return result


def _door_results(args, measured) -> dict:
    """`--protocol`: the doors' levels, and each door's own CPU per request in process."""
    if not args.protocol:
        return {}
    return {"protocols": measured.protocols, "protocols_codec": front_doors.codec_us(
        front_doors.doors(args.protocol, "m"), args.inputs_per_request[0])}


def _peers_meta(args) -> dict | None:
    """Each peer's server and recipe (`--peer`)."""
    if not args.peer:
        return None
    return {name: {"server": peers.PEERS[name].server, "recipe": peers.PEERS[name].recipe}
            for name in args.peer}


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
    if args.task == "generate":
        return _generate(args, p)
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
                                             *(result.get("peers") or {}).values(),
                                             result.get("plain") or []] for lv in levels)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
