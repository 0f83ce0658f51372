"""The benchmark's figures from its raw measurements, and its three outputs: JSON, a markdown
table, a PNG chart.

Derived figures (per arm unless said otherwise):

- *saturation*: the concurrency level with the most inputs per second;
- *efficiency*: inputs/s at saturation / the in-process pipeline's best inputs/s at a batch size
  up to the gateway's `max_batch_size` (the most the gateway could merge), same machine, same run;
- *added latency*: gateway p50 at concurrency 1 - in-process p50 of one request's work (the
  batch size equal to the inputs per request);
- *bottleneck*: at saturation, each stage's share of one request's time: `preprocess`,
  `model / mean batch` (a forward is shared by its batch), `postprocess`, `gateway` (routing and
  transport between replicas), `http` (proxy, HTTP, client); the largest one is named. Queue
  wait is reported but is a symptom, not a stage that does work;
- *speedup* (optimized / baseline): in process per batch size (the whole pipeline, and the
  forward alone: on a GPU the tokenizer dominates the pipeline), at saturation, and at the same
  p99 bound (the best throughput of each arm over the levels whose p99 is within the bound;
  the bound defaults to the baseline's p99 at its saturation).
"""

from __future__ import annotations

import json
from pathlib import Path

ARMS = ("baseline", "optimized")


def _ratio(a, b):
    return a / b if a is not None and b else None


def _best_under(levels: list[dict], bound: float) -> float | None:
    fits = [lv["inputs_per_s"] for lv in levels
            if lv["p99_ms"] is not None and lv["p99_ms"] <= bound]
    return max(fits) if fits else None


def _ray_env(meta: dict) -> str:
    found = meta.get("ray_env")
    if not found:
        return "unknown (a running gateway)" if meta.get("mode") == "url" else "Serve's defaults"
    return ", ".join(f"`{k}={v}`" for k, v in sorted(found.items()))


def bottleneck(level: dict) -> dict:
    stages = level["stages_ms"]
    cost = {
        "preprocess": stages.get("preprocess"),
        "model": stages["model"] / level["mean_batch"] if "model" in stages and level["mean_batch"]
        else None,
        "postprocess": stages.get("postprocess"), "gateway": stages.get("gateway"),
        "http": level.get("http_ms"),
    }
    cost = {k: round(v, 3) for k, v in cost.items() if v is not None}
    stage = max(cost, key=cost.get) if cost else None
    return {"stage": stage, "per_request_ms": cost, "queue_p50_ms": level["queue_p50_ms"]}


def derive(result: dict, *, p99_bound_ms: float | None = None) -> dict:
    """The summary of a result (see the module docstring); missing parts give None."""
    inproc = result.get("inprocess") or []
    gateway = result.get("gateway") or {}
    meta = result["meta"]
    per_request, max_batch = meta["inputs_per_request"], meta["max_batch_size"]
    summary: dict = {"arms": {}, "speedup": {}}
    for arm in ARMS:
        rows = [r for r in inproc if r["arm"] == arm]
        eligible = [r for r in rows if r["batch"] <= max_batch] or rows
        ref = max(eligible, key=lambda r: r["throughput"]) if eligible else None
        one = next((r for r in rows if r["batch"] == per_request), None)
        levels = [lv for lv in gateway.get(arm, []) if lv["ok"]]
        sat = max(levels, key=lambda lv: lv["inputs_per_s"]) if levels else None
        c1 = next((lv for lv in levels if lv["concurrency"] == 1), None)
        summary["arms"][arm] = {
            "inprocess_best": ref and {"batch": ref["batch"], "throughput": ref["throughput"]},
            "saturation": sat and {"concurrency": sat["concurrency"],
                                   "inputs_per_s": sat["inputs_per_s"], "p99_ms": sat["p99_ms"]},
            "efficiency": _ratio(sat and sat["inputs_per_s"], ref and ref["throughput"]),
            "added_latency_ms": (c1["p50_ms"] - one["p50_ms"]) if c1 and one else None,
            "bottleneck": bottleneck(sat) if sat else None,
        }
    by_batch, forward = {}, {}
    for r in inproc:
        if r["arm"] == "optimized":
            base = next((b for b in inproc if b["arm"] == "baseline" and b["batch"] == r["batch"]),
                        None)
            if base:
                by_batch[str(r["batch"])] = r["throughput"] / base["throughput"]
                forward[str(r["batch"])] = _ratio(base["stages_ms"]["model"],
                                                  r["stages_ms"]["model"])
    summary["speedup"]["inprocess"] = by_batch
    summary["speedup"]["forward"] = forward  # the forward alone: no tokenizer, no postprocess
    sat = {arm: summary["arms"][arm]["saturation"] for arm in ARMS}
    if sat["baseline"] and sat["optimized"]:
        summary["speedup"]["saturation"] = (sat["optimized"]["inputs_per_s"]
                                            / sat["baseline"]["inputs_per_s"])
        bound = p99_bound_ms or sat["baseline"]["p99_ms"]
        best = {arm: _best_under([lv for lv in gateway[arm] if lv["ok"]], bound) for arm in ARMS}
        summary["speedup"]["at_p99_bound"] = {
            "bound_ms": bound, **best, "ratio": _ratio(best["optimized"], best["baseline"])}
    return summary


def write_json(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def _f(value, digits=1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def markdown(result: dict) -> str:
    meta, summary = result["meta"], result["summary"]
    out = [f"Run {meta['date']} on {meta['hardware']}; model `{meta['model']}`, "
           f"{meta['inputs_per_request']} input(s) per request, max_batch_size "
           f"{meta['max_batch_size']}, batch_wait_ms {meta['batch_wait_ms']}, torch threads "
           f"{meta['replica_threads']} per model replica and {meta['inprocess_threads']} in "
           f"process; settings {meta['settings'] or 'default'}; Ray environment "
           f"{_ray_env(meta)}.", ""]
    if result.get("inprocess"):
        out += ["In process (tokenize + forward + postprocess, no server):", "",
                "| arm | recipe | batch | inputs/s | p50 ms / batch | tokenize ms | forward ms "
                "| postprocess ms |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["inprocess"]:
            s = r["stages_ms"]
            out.append(f"| {r['arm']} | {r['recipe']} | {r['batch']} | {_f(r['throughput'])} | "
                       f"{_f(r['p50_ms'], 2)} | {_f(s['preprocess'], 2)} | {_f(s['model'], 2)} | "
                       f"{_f(s['postprocess'], 2)} |")
        out.append("")
    if result.get("gateway"):
        out += ["Gateway end to end (closed loop over loopback HTTP; stage means from "
                "`Server-Timing`):", "",
                "| arm | conc. | req/s | inputs/s | p50 ms | p95 ms | p99 ms | preprocess | queue "
                "| model | postprocess | gateway | http | mean batch | queue p99 | failed |",
                "| --- " * 16 + "|"]
        for arm, levels in result["gateway"].items():
            for lv in levels:
                s = lv["stages_ms"]
                out.append(
                    f"| {arm} | {lv['concurrency']} | {_f(lv['rps'])} | {_f(lv['inputs_per_s'])} "
                    f"| {_f(lv['p50_ms'])} | {_f(lv['p95_ms'])} | {_f(lv['p99_ms'])} | "
                    + " | ".join(_f(s.get(k), 2) for k in ("preprocess", "queue", "model",
                                                           "postprocess", "gateway"))
                    + f" | {_f(lv['http_ms'], 2)} | {_f(lv['mean_batch'], 2)} | "
                    f"{_f(lv['queue_p99_ms'])} | {sum(lv['failed'].values())} |")
        out.append("")
    out += ["| arm | efficiency | added latency at c=1 | saturation | bottleneck |",
            "| --- | --- | --- | --- | --- |"]
    for arm, s in summary["arms"].items():
        sat, neck = s["saturation"], s["bottleneck"]
        out.append(
            f"| {arm} | {_f(s['efficiency'], 2)} | {_f(s['added_latency_ms'], 2)} ms | "
            + (f"{_f(sat['inputs_per_s'])} inputs/s at c={sat['concurrency']}" if sat else "–")
            + " | " + (f"{neck['stage']} ({_f(neck['per_request_ms'][neck['stage']], 2)} ms of "
                       f"each request)" if neck and neck["stage"] else "–") + " |")
    speed = summary["speedup"]
    out += ["", "Optimized / baseline: in process "
            + ", ".join(f"batch {b}: {_f(v, 2)}×" for b, v in speed["inprocess"].items())
            + " (forward alone: "
            + ", ".join(f"{_f(v, 2)}×" for v in speed.get("forward", {}).values()) + ")"]
    if "saturation" in speed:
        bound = speed["at_p99_bound"]
        out[-1] += (f"; end to end at saturation {_f(speed['saturation'], 2)}×, at p99 ≤ "
                    f"{_f(bound['bound_ms'])} ms {_f(bound['ratio'], 2)}×.")
    cpu = [(arm, lv) for arm, levels in (result.get("gateway") or {}).items() for lv in levels
           if lv.get("cpu_ms_per_request")]
    if cpu:
        names = sorted({n for _, lv in cpu for n in lv["cpu_ms_per_request"]})
        out += ["", "CPU per answered request (ms; replicas from /proc, local app only; the "
                "load generator is the benchmark process, on the same cores; the proxy is not "
                "included):", "",
                "| arm | conc. | " + " | ".join(names) + " | load generator |",
                "| --- " * (len(names) + 3) + "|"]
        out += [f"| {arm} | {lv['concurrency']} | "
                + " | ".join(_f(lv["cpu_ms_per_request"].get(n), 2) for n in names)
                + f" | {_f(lv.get('client_cpu_ms_per_request'), 2)} |"
                for arm, lv in cpu]
    mem = result.get("memory", {})
    if mem:
        out += ["", "Memory: bench process (in-process models) "
                f"{_f(mem.get('bench_process_mib'))} MiB RSS; GPU peak "
                f"{_f(mem.get('gpu_peak_mib'))} MiB; serve processes (MiB RSS): "
                + ", ".join(f"{k} {v}" for k, v in sorted(mem.get("serve", {}).items()))]
    return "\n".join(out) + "\n"


def chart(result: dict, path: Path) -> None:
    """Latency (p50 solid, p99 dashed) against inputs/s per arm, one point per concurrency; the
    in-process best throughput of each arm as a dotted vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
    colors = {"baseline": "tab:blue", "optimized": "tab:orange"}
    for arm, levels in (result.get("gateway") or {}).items():
        levels = [lv for lv in levels if lv["ok"]]
        x = [lv["inputs_per_s"] for lv in levels]
        ax.plot(x, [lv["p50_ms"] for lv in levels], "o-", color=colors[arm], label=f"{arm} p50")
        ax.plot(x, [lv["p99_ms"] for lv in levels], "s--", color=colors[arm], label=f"{arm} p99")
        for lv in levels:
            ax.annotate(f"c={lv['concurrency']}", (lv["inputs_per_s"], lv["p99_ms"]),
                        textcoords="offset points", xytext=(3, 4), fontsize=7)
    for arm, s in result["summary"]["arms"].items():
        if s["inprocess_best"]:
            ax.axvline(s["inprocess_best"]["throughput"], color=colors[arm], linestyle=":",
                       label=f"{arm} in process, batch {s['inprocess_best']['batch']}")
    ax.set_xlabel("throughput (inputs/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"Gateway latency vs throughput ({result['meta']['hardware']})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
